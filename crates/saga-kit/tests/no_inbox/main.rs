//! `reply_all` with the inbox switched off (the `inventory-inbox` and
//! `payment-inbox` negative controls; its own binary: a switch is set once
//! per process): the replies go to the outbox, and no copy of them is kept
//! — with the inbox off nothing would ever answer a repeat from it.
//! Written for a mutant `cargo mutants` left alive on 006442c
//! (`kept.is_empty() || !inbox::keeps_replies()` → `&&`): applied by hand,
//! it fails this.

use contract::{Envelope, Message};
use uuid::Uuid;

#[tokio::test]
async fn switched_off_the_inbox_keeps_no_copy_of_a_reply() {
    switches::Switches {
        no_inbox: true,
        ..Default::default()
    }
    .install("saga-kit", &[switches::Switch::NoInbox])
    .unwrap();
    let (_db, pool) = testkit::TempDb::with_pool("eo_saga_noinbox", 2, vec![outbox::migrator(), inbox::migrator()])
        .await
        .unwrap();
    let order = Uuid::new_v4();
    let command = Envelope::new(
        order,
        &Message::ReserveStock {
            sku: "A".into(),
            quantity: 1,
        },
        None,
    );
    let reply = Envelope::new(order, &Message::StockReserved, Some(&command));
    let mut tx = pool.begin().await.unwrap();
    saga_kit::emit::reply_all(&mut tx, "test-consumer", &[(Message::StockReserved, reply)])
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let count = |table: &'static str| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(&format!("SELECT count(*) FROM {table}"))
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    assert_eq!(count("outbox").await, 1, "the reply is sent");
    assert_eq!(count("inbox_replies").await, 0, "and no copy kept");
    pool.close().await;
}
