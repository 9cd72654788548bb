//! The three endings of the saga, with exact ledger and stock checks.

use std::collections::BTreeMap;

use e2e::demo::{self, Kind, Mix};
use sqlx::Connection;
use uuid::Uuid;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_ending_of_the_saga_over_real_processes() {
    let stack = crate::stack("saga").await;
    let outcome = demo::run(
        &stack,
        Mix {
            payable: 24,
            declined: 3,
            out_of_stock: 3,
        },
    )
    .await
    .expect("demo runs");
    println!("{}", outcome.summary());
    outcome.check_endings().expect("endings");

    // Per order, straight from the gateway's ledger.
    let mut db = sqlx::PgConnection::connect(&stack.db_url("gateway")).await.unwrap();
    let rows: Vec<(Uuid, String, String)> = sqlx::query_as("SELECT order_id, kind, status FROM ledger")
        .fetch_all(&mut db)
        .await
        .unwrap();
    let mut per_order: BTreeMap<Uuid, Vec<(String, String)>> = BTreeMap::new();
    for (id, kind, status) in rows {
        per_order.entry(id).or_default().push((kind, status));
    }
    let mut confirmed = 0;
    for (kind, order) in &outcome.orders {
        let entries = per_order.get(&order.id).cloned().unwrap_or_default();
        match kind {
            Kind::Payable => {
                assert_eq!(order.status, "CONFIRMED");
                assert_eq!(
                    entries,
                    vec![("charge".to_owned(), "captured".to_owned())],
                    "order {}",
                    order.id
                );
                confirmed += 1;
            }
            Kind::Declined => {
                assert_eq!(order.status, "CANCELLED");
                assert_eq!(order.cancel_reason.as_deref(), Some("payment_declined"));
                assert_eq!(
                    entries,
                    vec![("charge".to_owned(), "declined".to_owned())],
                    "order {}",
                    order.id
                );
            }
            Kind::OutOfStock => {
                assert_eq!(order.status, "CANCELLED");
                assert_eq!(order.cancel_reason.as_deref(), Some("out_of_stock"));
                assert!(
                    entries.is_empty(),
                    "out-of-stock order {} reached the gateway",
                    order.id
                );
            }
        }
    }
    assert!(confirmed >= 20);

    // Declined orders had their stock reserved and then given back: what is
    // gone from WIDGET/GADGET is exactly what the confirmed orders took.
    for (sku, (initial, available, reserved)) in &outcome.audit.stock {
        let taken: i64 = outcome
            .orders
            .iter()
            .filter(|(k, o)| *k == Kind::Payable && &o.sku == sku)
            .map(|(_, o)| i64::from(o.quantity))
            .sum();
        assert_eq!(initial - available, taken, "{sku}");
        assert_eq!(*reserved, taken, "{sku}");
    }
    assert!(outcome.replays > 0, "deliberate retries were not replayed");
    crate::metrics::check_pages(&stack).await;
    // Every message the run produced matches its type's JSON Schema.
    let checked = crate::contract::check_topics(&stack).await;
    assert!(checked >= 4 * 24, "only {checked} messages checked");
    stack.shutdown(true).await.unwrap();
}
