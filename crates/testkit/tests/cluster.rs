//! A run's own PostgreSQL: created, crashed (SIGKILL to the whole server)
//! and started again through crash recovery, with what it committed intact.

use sqlx::Connection as _;
use testkit::postgres::cluster::Cluster;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_server_recovers_with_every_committed_row() {
    testkit::postgres::ensure().await.unwrap();
    let dir = std::env::temp_dir().join(format!("eo-pg-{}", uuid::Uuid::new_v4().simple()));
    let mut pg = Cluster::create(&dir, "").unwrap();
    let first = pg.start().await.unwrap();
    let url = format!("{}/postgres", pg.url());
    let mut c = sqlx::PgConnection::connect(&url).await.unwrap();
    sqlx::query("CREATE TABLE acked (n int PRIMARY KEY)")
        .execute(&mut c)
        .await
        .unwrap();
    for n in 0..500 {
        sqlx::query("INSERT INTO acked VALUES ($1)")
            .bind(n)
            .execute(&mut c)
            .await
            .unwrap();
    }
    let offset = pg.log_len();
    let crashed = pg.crash().unwrap();
    assert_eq!((crashed.pid, crashed.signal), (first, Some(9)));
    assert!(
        sqlx::query("SELECT 1").execute(&mut c).await.is_err(),
        "the backend died with its postmaster"
    );
    let second = pg.start().await.unwrap();
    assert_ne!(first, second);
    assert!(
        pg.recovered_since(offset),
        "no crash recovery in {}",
        pg.log_path().display()
    );
    let mut c = sqlx::PgConnection::connect(&url).await.unwrap();
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM acked")
        .fetch_one(&mut c)
        .await
        .unwrap();
    assert_eq!(n, 500, "every acknowledged commit survived the crash");
    drop(pg);
    std::fs::remove_dir_all(&dir).unwrap();
}
