//! The negative control's inbox (`UNSAFE_NO_INBOX`; feature
//! `negative-controls`, `inbox::negative_controls::turn_off`):
//! every delivery is new and nothing is recorded — what the chaos suite's
//! inventory-inbox, payment-inbox and order-saga-inbox runs switch on. Its
//! own binary: a control is set once per process.

use inbox::Recorded;
use uuid::Uuid;

#[tokio::test]
async fn switched_off_the_inbox_reports_every_delivery_as_new_and_records_nothing() {
    inbox::negative_controls::turn_off();
    let (_db, pool) = testkit::TempDb::with_pool("eo_inbox_off", 2, vec![inbox::migrator()])
        .await
        .unwrap();
    let mut conn = pool.acquire().await.unwrap();
    let id = Uuid::new_v4();
    for _ in 0..2 {
        assert_eq!(inbox::record(&mut conn, "c", id).await.unwrap(), Recorded::New);
    }
    let batch = inbox::record_batch(&mut conn, "c", &[id.into(), id.into()])
        .await
        .unwrap();
    assert_eq!(batch, [Recorded::New, Recorded::New]);
    assert!(inbox::seen(&mut conn, "c", &[id]).await.unwrap().is_empty());
    // No row to keep replies under: none kept, and no error.
    let reply = inbox::Reply {
        reply_id: Uuid::new_v4(),
        topic: "t".into(),
        message_key: "k".into(),
        event_type: "Reply".into(),
        body: "{}".into(),
        traceparent: None,
    };
    inbox::record_replies(&mut conn, "c", &[(id, reply)]).await.unwrap();
    assert!(inbox::replies_of(&mut conn, "c", &[id]).await.unwrap().is_empty());
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM inbox")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    assert_eq!(rows, 0);
    drop(conn);
    pool.close().await;
}
