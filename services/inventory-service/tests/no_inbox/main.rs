//! The inventory-inbox negative control (`UNSAFE_NO_INBOX`, test builds
//! only) moves `inbox_misses_total`: a redelivered command passes the
//! switched-off inbox, the reservation per order stops it, and the counter
//! the `InboxMisses` alert watches rises — with the row beside it. Its own
//! binary: a switch is set once per process.

use contract::{Envelope, Message};
use kafka::consumer::Handled;
use uuid::Uuid;

#[tokio::test]
async fn a_command_redelivered_past_a_switched_off_inbox_is_counted_as_a_miss() {
    switches::Switches {
        no_inbox: true,
        ..Default::default()
    }
    .install("inventory-service", &[switches::Switch::NoInbox])
    .unwrap();
    let db = testkit::TempDb::new("eo_inv_noinbox");
    let pool = inventory_service::connect(db.url(), 4).await.unwrap();
    sqlx::query("INSERT INTO stock (sku, available) VALUES ('A', 5)")
        .execute(&pool)
        .await
        .unwrap();
    let reserve = Envelope::new(
        Uuid::new_v4(),
        &Message::ReserveStock {
            sku: "A".into(),
            quantity: 1,
        },
        None,
    );
    let labels = [
        ("consumer", "inventory-service"),
        ("caught_by", "reservation per order"),
    ];
    assert_eq!(telemetry::metrics::get("inbox_misses_total", &labels), 0.0);
    for _ in 0..2 {
        // Both "new": the inbox is off.
        let handled = inventory_service::stock::handle(&pool, reserve.clone()).await.unwrap();
        assert_eq!(handled, Handled::Applied);
    }
    assert_eq!(telemetry::metrics::get("inbox_misses_total", &labels), 1.0);
    let (misses, available): (i64, i32) =
        sqlx::query_as("SELECT (SELECT count(*) FROM inbox_misses), (SELECT available FROM stock WHERE sku = 'A')")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!((misses, available), (1, 4), "one miss recorded, one unit reserved");
    pool.close().await;
}
