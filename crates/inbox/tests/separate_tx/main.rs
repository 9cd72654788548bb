//! The negative control `UNSAFE_INBOX_SEPARATE_TX` (feature
//! `negative-controls`, `inbox::negative_controls::commit_apart`): the
//! inbox rows of a begun batch commit on their own, before the effect —
//! what the chaos suite's inbox-separate-tx run switches on. Its own
//! binary: a control is set once per process.

use uuid::Uuid;

#[tokio::test]
async fn switched_on_the_inbox_rows_are_durable_before_the_effect_commits() {
    inbox::negative_controls::commit_apart();
    let (_db, pool) = testkit::TempDb::with_pool("eo_inbox_apart", 2, vec![inbox::migrator()])
        .await
        .unwrap();
    let id = Uuid::new_v4();
    let (tx, fresh) = inbox::begin_batch(&pool, "c", &[id.into()]).await.unwrap();
    assert_eq!(fresh.indices(), [0]);
    // The effect's transaction dies (a crash): the event stays "processed".
    drop(tx);
    let (tx, fresh) = inbox::begin_batch(&pool, "c", &[id.into()]).await.unwrap();
    assert!(fresh.is_empty(), "the redelivery is absorbed with no effect behind it");
    tx.rollback().await.unwrap();
    pool.close().await;
}
