//! inventory-service's handler against a real PostgreSQL: idempotent per
//! event (inbox) and per order (reservation key), and never negative.

use std::sync::Arc;

use contract::{Envelope, Message};
use kafka::consumer::Handled;
use sqlx::PgPool;
use testkit::TempDb;
use uuid::Uuid;

struct Db {
    pool: PgPool,
    /// Dropped with this value, also when the test panics.
    _db: TempDb,
}

impl Db {
    async fn new(stock: i32) -> Self {
        let db = TempDb::new("eo_inv");
        let pool = inventory_service::connect(db.url(), 8).await.unwrap();
        sqlx::query("INSERT INTO stock (sku, available) VALUES ('A', $1)")
            .bind(stock)
            .execute(&pool)
            .await
            .unwrap();
        Self { pool, _db: db }
    }

    async fn available(&self) -> i32 {
        sqlx::query_scalar("SELECT available FROM stock WHERE sku = 'A'")
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }

    async fn count(&self, sql: &str) -> i64 {
        sqlx::query_scalar(sql).fetch_one(&self.pool).await.unwrap()
    }

    /// Closes the pool; the database goes with `_db`.
    async fn drop(self) {
        self.pool.close().await;
    }
}

fn reserve(order: Uuid, quantity: i32) -> Envelope {
    Envelope::new(
        order,
        &Message::ReserveStock {
            sku: "A".into(),
            quantity,
        },
        None,
    )
}

#[tokio::test]
async fn the_same_event_twice_is_one_effect_and_two_equal_events_are_two() {
    let db = Db::new(10).await;
    // Contract, part 1: the same event (same event_id) delivered twice.
    let first = reserve(Uuid::new_v4(), 2);
    assert_eq!(
        inventory_service::stock::handle(&db.pool, first.clone()).await.unwrap(),
        Handled::Applied
    );
    assert_eq!(
        inventory_service::stock::handle(&db.pool, first.clone()).await.unwrap(),
        Handled::Duplicate
    );
    assert_eq!(db.available().await, 8, "reserved once");
    // Part 2: two events with equal payloads and different ids (two orders
    // for the same SKU and quantity) are two business facts.
    let (a, b) = (reserve(Uuid::new_v4(), 3), reserve(Uuid::new_v4(), 3));
    assert_eq!(a.payload, b.payload);
    inventory_service::stock::handle(&db.pool, a).await.unwrap();
    inventory_service::stock::handle(&db.pool, b).await.unwrap();
    assert_eq!(db.available().await, 2, "both applied");
    assert_eq!(
        db.count("SELECT count(*) FROM outbox").await,
        3,
        "one reply per applied reservation"
    );
    db.drop().await;
}

#[tokio::test]
async fn a_second_reserve_for_the_same_order_under_a_new_event_id_is_a_no_op() {
    let db = Db::new(10).await;
    let order = Uuid::new_v4();
    inventory_service::stock::handle(&db.pool, reserve(order, 4))
        .await
        .unwrap();
    // A different event (new id) asking to reserve for the same order again.
    assert_eq!(
        inventory_service::stock::handle(&db.pool, reserve(order, 4))
            .await
            .unwrap(),
        Handled::Applied
    );
    assert_eq!(db.available().await, 6, "stock decremented once per order");
    assert_eq!(db.count("SELECT count(*) FROM outbox").await, 1, "no second reply");
    // Release is idempotent per order too.
    let release = || Envelope::new(order, &Message::ReleaseStock, None);
    inventory_service::stock::handle(&db.pool, release()).await.unwrap();
    inventory_service::stock::handle(&db.pool, release()).await.unwrap();
    assert_eq!(db.available().await, 10, "released once");
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_instances_handling_one_event_at_once_apply_it_once() {
    let db = Arc::new(Db::new(100).await);
    let event = reserve(Uuid::new_v4(), 1);
    let results = futures::future::join_all((0..10).map(|_| {
        let (db, event) = (db.clone(), event.clone());
        async move { inventory_service::stock::handle(&db.pool, event).await.unwrap() }
    }))
    .await;
    assert_eq!(
        results.iter().filter(|h| **h == Handled::Applied).count(),
        1,
        "{results:?}"
    );
    assert_eq!(db.available().await, 99);
    assert_eq!(db.count("SELECT count(*) FROM inbox").await, 1);
    Arc::into_inner(db).unwrap().drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_orders_for_the_last_unit_never_drive_stock_negative() {
    let db = Arc::new(Db::new(1).await);
    futures::future::join_all((0..12).map(|_| {
        let db = db.clone();
        async move {
            inventory_service::stock::handle(&db.pool, reserve(Uuid::new_v4(), 1))
                .await
                .unwrap()
        }
    }))
    .await;
    assert_eq!(db.available().await, 0);
    assert_eq!(
        db.count("SELECT count(*) FROM reservations WHERE status = 'RESERVED'")
            .await,
        1
    );
    assert_eq!(
        db.count("SELECT count(*) FROM reservations WHERE status = 'REJECTED'")
            .await,
        11
    );
    let rejected = db
        .count("SELECT count(*) FROM outbox WHERE envelope->>'event_type' = 'StockRejected'")
        .await;
    assert_eq!(rejected, 11, "every loser is told");
    Arc::into_inner(db).unwrap().drop().await;
}

#[tokio::test]
async fn an_unexpected_message_type_is_permanent_and_writes_nothing() {
    let db = Db::new(1).await;
    let wrong = Envelope::new(Uuid::new_v4(), &Message::StockReserved, None);
    let err = inventory_service::stock::handle(&db.pool, wrong).await.unwrap_err();
    assert!(matches!(err, kafka::consumer::HandleError::Permanent(_)));
    assert_eq!(db.count("SELECT count(*) FROM inbox").await, 0, "rolled back");
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn batches_touching_skus_in_opposite_orders_never_deadlock_and_conserve_stock() {
    let db = Db::new(1_000).await;
    sqlx::query("INSERT INTO stock (sku, available) VALUES ('B', 1000)")
        .execute(&db.pool)
        .await
        .unwrap();
    let on = |sku: &str| {
        Envelope::new(
            Uuid::new_v4(),
            &Message::ReserveStock {
                sku: sku.into(),
                quantity: 1,
            },
            None,
        )
    };
    // Two partitions' lanes, each applying batches that touch A and B in
    // opposite orders: the batch reads the stock it may touch locked, in
    // SKU order, then writes each SKU's new count once. Without that lock
    // two batches read the same count and one's write is lost (tried: with
    // `FOR UPDATE` dropped from the read, the count below is off); locked
    // in another order they would wait on each other in a
    // cycle and PostgreSQL would abort one.
    let mut reserved = Vec::new();
    for _ in 0..20 {
        let forward = vec![on("A"), on("B"), on("A")];
        let backward = vec![on("B"), on("A"), on("B")];
        reserved.extend(forward.iter().chain(&backward).map(|e| e.order_id));
        let (f, b) = tokio::join!(
            inventory_service::stock::handle_batch(&db.pool, traced(forward)),
            inventory_service::stock::handle_batch(&db.pool, traced(backward)),
        );
        assert_eq!(f.expect("forward batch"), vec![Handled::Applied; 3]);
        assert_eq!(b.expect("backward batch"), vec![Handled::Applied; 3]);
    }
    let left: i64 = db.count("SELECT sum(available)::int8 FROM stock").await;
    assert_eq!(left, 2_000 - 120, "one unit per reservation");
    // Releases in a batch find their SKUs through the reservations.
    let releases: Vec<_> = reserved[..6]
        .iter()
        .map(|o| Envelope::new(*o, &Message::ReleaseStock, None))
        .collect();
    let handled = inventory_service::stock::handle_batch(&db.pool, traced(releases))
        .await
        .unwrap();
    assert_eq!(handled, vec![Handled::Applied; 6]);
    assert_eq!(db.count("SELECT sum(available)::int8 FROM stock").await, 2_000 - 114);
    assert_eq!(
        db.count("SELECT count(*) FROM outbox").await,
        126,
        "one reply per command"
    );
    db.drop().await;
}

/// Envelopes as the consumer hands them over, each with its span.
fn traced(envelopes: Vec<Envelope>) -> Vec<kafka::consumer::Traced<Envelope>> {
    envelopes
        .into_iter()
        .map(|message| kafka::consumer::Traced {
            message,
            span: tracing::Span::none(),
            position: None,
            producer: None,
            header_event_id: None,
        })
        .collect()
}

#[test]
fn the_openapi_document_is_the_committed_one() {
    testkit::openapi::check_committed(
        "inventory-service",
        &inventory_service::openapi_json(),
        &["/stock", "/stock/{sku}"],
        &[],
    );
}

#[tokio::test]
async fn a_repeated_command_is_answered_again_with_its_first_reply() {
    let db = Db::new(10).await;
    let command = reserve(Uuid::new_v4(), 2);
    let handle = |e: Envelope| inventory_service::stock::handle(&db.pool, e);
    assert_eq!(handle(command.clone()).await.unwrap(), Handled::Applied);
    let first: (Uuid, String) = sqlx::query_as("SELECT event_id, event_type FROM outbox")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(first.1, "StockReserved");
    sqlx::query("DELETE FROM outbox") // published: the relay settles a row by deleting it
        .execute(&db.pool)
        .await
        .unwrap();
    // The order's saga lost the reply and re-sent the command under its id.
    assert_eq!(handle(command.clone()).await.unwrap(), Handled::Duplicate);
    let rows: Vec<(Uuid, bool)> = sqlx::query_as("SELECT event_id, parked_at IS NULL FROM outbox")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(rows, [(first.0, true)], "the same reply, pending again");
    assert_eq!(db.available().await, 8, "reserved once");
    db.drop().await;
}

/// `PUT /stock/{sku}` is idempotent by its contract: it sets the count,
/// never adds to it, so the same request twice — a retry after an answer
/// lost on the way — leaves what one left, and needs no key. (A charge
/// cannot be written so: "take 25.00" twice is two charges, which is why
/// the gateway's call carries a key; docs/faq.md.) Checked against the
/// removal: an upsert that adds (`available = stock.available +
/// EXCLUDED.available`) leaves 24 (10 + 7 + 7) and fails.
#[tokio::test]
async fn the_same_put_twice_leaves_what_one_put_left() {
    use axum::extract::{Path, State};
    let db = Db::new(10).await;
    for _ in 0..2 {
        let status = inventory_service::http::set(
            State(db.pool.clone()),
            axum::Extension(service_kit::Scope("operator".into())),
            Path("A".to_owned()),
            axum::body::Bytes::from_static(br#"{"available": 7}"#),
        )
        .await
        .unwrap();
        assert_eq!(status, axum::http::StatusCode::NO_CONTENT);
    }
    assert_eq!(db.available().await, 7, "set, not added: the repeat changed nothing");
    // Each change is in the audit trail: who, what, and what it was before.
    let trail: Vec<(String, String, String, String)> =
        sqlx::query_as("SELECT actor, action, subject, detail FROM audit_log ORDER BY id")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    let event = |detail: &str| ("operator".into(), "stock.set".into(), "A".into(), detail.into());
    assert_eq!(trail, [event("available 7 (was 10)"), event("available 7 (was 7)")]);
    db.drop().await;
}

/// Each command this service consumes, repeated under its event id after
/// its replies were published, gets what `contract::repeats::ON_REPEAT`
/// (docs/contract.md, "What a repeat gets") says: its first replies again,
/// under their first ids, and no second movement of stock.
#[tokio::test]
async fn every_command_repeated_gets_what_the_contract_says() {
    use contract::repeats::{OnRepeat, ON_REPEAT};
    let ours: Vec<_> = ON_REPEAT
        .iter()
        .filter(|r| r.consumer == contract::topics::consumers::INVENTORY.name)
        .collect();
    assert_eq!(ours.len(), 2, "{ours:?}");
    for r in ours {
        let db = Db::new(10).await;
        let handle = |e: Envelope| inventory_service::stock::handle(&db.pool, e);
        let order = Uuid::new_v4();
        let command = match r.event_type {
            "ReserveStock" => reserve(order, 2),
            "ReleaseStock" => {
                assert_eq!(handle(reserve(order, 2)).await.unwrap(), Handled::Applied);
                Envelope::new(order, &Message::ReleaseStock, None)
            }
            other => panic!("no case for {other}"),
        };
        let replies = || async {
            sqlx::query_scalar::<_, Uuid>("SELECT event_id FROM outbox ORDER BY id")
                .fetch_all(&db.pool)
                .await
                .unwrap()
        };
        sqlx::query("DELETE FROM outbox").execute(&db.pool).await.unwrap();
        assert_eq!(handle(command.clone()).await.unwrap(), Handled::Applied);
        let first = replies().await;
        assert!(!first.is_empty(), "{}: a reply", r.event_type);
        let stock = db.available().await;
        // Published: the relay settles a row by deleting it.
        sqlx::query("DELETE FROM outbox").execute(&db.pool).await.unwrap();
        assert_eq!(handle(command).await.unwrap(), Handled::Duplicate, "{}", r.event_type);
        let again = replies().await;
        match r.on_repeat {
            OnRepeat::StoredReplies => assert_eq!(again, first, "{}: the first replies again", r.event_type),
            OnRepeat::Nothing => assert!(again.is_empty(), "{}: nothing", r.event_type),
        }
        assert_eq!(db.available().await, stock, "{}: no second movement", r.event_type);
        db.drop().await;
    }
}
