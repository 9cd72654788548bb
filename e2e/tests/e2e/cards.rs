//! No card number kept (issue 15): after a run — payable, declined and
//! refunded orders, plus one order written before tokenisation with its
//! number in clear — no database table and no topic message holds a test
//! card number. The vault keeps an HMAC fingerprint, the orders a token and
//! the last four digits, `ChargePayment` the token. Nor can one be
//! recovered: every stored 64-hex value (Idempotency-Key fingerprints, the
//! vault's card fingerprints, key hashes) is tried against every number
//! that fits a test card's BIN and last four ([`brute`]).

mod brute;

use std::time::{Duration, Instant};

use e2e::driver::{new_key, Client, OrderRequest, DECLINED_CARD, GOOD_CARD};
use e2e::stack::Service;
use sqlx::Connection as _;

/// Every row of every table of `db`, as text.
async fn dump(stack: &e2e::Stack, db: &str) -> String {
    let mut c = sqlx::PgConnection::connect(&stack.db_url(db)).await.unwrap();
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT quote_ident(table_name) FROM information_schema.tables
         WHERE table_schema = 'public' AND table_type = 'BASE TABLE'",
    )
    .fetch_all(&mut c)
    .await
    .unwrap();
    assert!(!tables.is_empty(), "{db} has tables");
    let mut text = String::new();
    for t in tables {
        // bytea columns (stored responses) as text, so a number inside shows.
        let rows: Vec<String> = sqlx::query_scalar(&format!(
            "SELECT convert_from(convert_to(t::text, 'UTF8'), 'UTF8') FROM {t} t"
        ))
        .fetch_all(&mut c)
        .await
        .unwrap();
        text.push_str(&rows.join("\n"));
    }
    let bodies: Vec<Vec<u8>> = sqlx::query_scalar("SELECT body FROM idempotency_keys")
        .fetch_all(&mut c)
        .await
        .unwrap_or_default();
    for b in bodies {
        text.push_str(&String::from_utf8_lossy(&b));
    }
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_database_or_topic_holds_a_card_number_after_a_run() {
    let mut stack = crate::stack("cards").await;
    // Orders from before tokenisation, their numbers in clear — the first
    // (in backfill order) a value the vault refuses, which must not stop
    // the backfill of the rows after it.
    let (refused, legacy) = (uuid::Uuid::now_v7(), uuid::Uuid::now_v7());
    let mut orders = sqlx::PgConnection::connect(&stack.db_url("orders")).await.unwrap();
    for (id, card) in [(refused, "12-34"), (legacy, GOOD_CARD)] {
        sqlx::query(
            "INSERT INTO orders (id, client_id, sku, quantity, amount_cents, card, status)
             VALUES ($1, 'legacy', 'WIDGET', 1, 100, $2, 'CONFIRMED')",
        )
        .bind(id)
        .bind(card)
        .execute(&mut orders)
        .await
        .unwrap();
    }
    // The start-up backfill tokenises it.
    stack.restart(Service::OrderApi).await.unwrap();
    let started = Instant::now();
    loop {
        let (card, last4): (Option<String>, Option<String>) =
            sqlx::query_as("SELECT card, card_last4 FROM orders WHERE id = $1")
                .bind(legacy)
                .fetch_one(&mut orders)
                .await
                .unwrap();
        if card.is_none() {
            assert_eq!(last4.as_deref(), Some("4242"));
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "legacy card not tokenised");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let parked: Option<String> = sqlx::query_scalar("SELECT card_parked FROM orders WHERE id = $1")
        .bind(refused)
        .fetch_one(&mut orders)
        .await
        .unwrap();
    assert!(
        parked.as_deref().is_some_and(|p| p.contains("refused by the vault")),
        "the refused row is parked: {parked:?}"
    );
    let kept: Option<String> = sqlx::query_scalar("SELECT card FROM orders WHERE id = $1")
        .bind(refused)
        .fetch_one(&mut orders)
        .await
        .unwrap();
    assert_eq!(kept, None, "a parked value is not kept in clear");
    // The operator's list names it.
    let review = std::process::Command::new(stack.options().bin_dir.join("order-api"))
        .args(["review", "list"])
        .env("DATABASE_URL", stack.db_url("orders"))
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&review.stdout);
    assert!(review.status.success(), "{}", String::from_utf8_lossy(&review.stderr));
    assert!(
        listed
            .lines()
            .any(|l| l.starts_with(&refused.to_string()) && l.contains("card parked")),
        "order-api review list does not name the parked order:\n{listed}"
    );

    let client = Client::new(&stack, Duration::from_secs(5)).unwrap();
    client.seed_stock("WIDGET", 100).await.unwrap();
    let mut ids = Vec::new();
    // As a person types it: in groups; the separators are dropped before
    // the number goes anywhere.
    let grouped = "4242 4242-4242 4242";
    assert_eq!(grouped.replace([' ', '-'], ""), GOOD_CARD);
    for card in [GOOD_CARD, GOOD_CARD, DECLINED_CARD, grouped] {
        let req = OrderRequest {
            sku: "WIDGET".into(),
            quantity: 1,
            amount_cents: 300,
            card: card.into(),
        };
        let order = client
            .place_order(&new_key(), &req, Duration::from_secs(10))
            .await
            .unwrap();
        let shown: serde_json::Value =
            serde_json::from_str(&client.post_order(&new_key(), &req).await.unwrap().body).unwrap();
        assert_eq!(
            shown["card_last4"],
            card[card.len() - 4..],
            "the API shows the last four only"
        );
        assert!(shown.get("card").is_none() && shown.get("card_token").is_none());
        ids.push(order.id);
        ids.push(shown["id"].as_str().unwrap().parse().unwrap());
    }
    client.wait_terminal(&ids, Duration::from_secs(60)).await.unwrap();
    let tokens: Vec<String> = sqlx::query_scalar("SELECT card_token FROM orders WHERE id = ANY($1) ORDER BY id")
        .bind([ids[0], ids[6]].to_vec())
        .fetch_all(&mut orders)
        .await
        .unwrap();
    assert_eq!(tokens.len(), 2);
    assert_eq!(tokens[0], tokens[1], "the grouped number is the same card, one token");
    assert_eq!(client.cancel(&new_key(), ids[0]).await.unwrap().status, 202);
    client.wait_terminal(&ids, Duration::from_secs(60)).await.unwrap();

    let mut stored = std::collections::BTreeSet::new();
    for db in ["orders", "inventory", "payments", "gateway"] {
        let text = dump(&stack, db).await;
        for card in [GOOD_CARD, DECLINED_CARD, grouped] {
            assert!(!text.contains(card), "database {db} holds card number {card}");
        }
        stored.extend(brute::hex64(&text));
    }
    // What an attacker holding the databases (not the secrets) reads next
    // to each fingerprint: the order the stored response shows.
    let bodies: Vec<Vec<u8>> = sqlx::query_scalar("SELECT body FROM idempotency_keys")
        .fetch_all(&mut orders)
        .await
        .unwrap();
    let seen: std::collections::BTreeSet<brute::Seen> = bodies
        .iter()
        .filter_map(|b| serde_json::from_slice::<serde_json::Value>(b).ok())
        .filter_map(|v| {
            Some(brute::Seen {
                sku: v["sku"].as_str()?.to_owned(),
                quantity: v["quantity"].as_i64()?,
                amount_cents: v["amount_cents"].as_i64()?,
                last4: v["card_last4"].as_str()?.to_owned(),
            })
        })
        .collect();
    let fingerprints: Vec<String> = sqlx::query_scalar("SELECT fingerprint FROM idempotency_keys")
        .fetch_all(&mut orders)
        .await
        .unwrap();
    assert!(fingerprints.len() >= 6, "{} fingerprints stored", fingerprints.len());
    assert!(
        fingerprints.iter().all(|f| stored.contains(f)),
        "the scan covers every fingerprint"
    );
    assert_eq!(seen.len(), 2, "both cards' orders are readable: {seen:?}");
    let seen: Vec<brute::Seen> = seen.into_iter().collect();
    for card in [GOOD_CARD, DECLINED_CARD] {
        let (found, tried) = tokio::task::block_in_place(|| brute::recover(&card[..6], &seen, &stored));
        assert!(tried >= 100_000, "{tried} numbers tried");
        assert!(
            found.is_empty(),
            "card numbers recovered from stored hashes by brute force: {found:?}"
        );
        println!(
            "cards: {tried} numbers with BIN {} and a last four seen tried against {} stored hashes: none found",
            &card[..6],
            stored.len()
        );
    }
    let mut messages = 0;
    for topic in contract::topics::ALL
        .into_iter()
        .flat_map(|t| [t.to_owned(), kafka::dead_letter_topic(t)])
    {
        let brokers = stack.kafka();
        let group = format!("cards-{}", uuid::Uuid::new_v4());
        let topic2 = topic.clone();
        let read = tokio::task::spawn_blocking(move || {
            kafka::read_topic(
                &brokers,
                &topic2,
                &group,
                rdkafka::Offset::Beginning,
                Duration::from_secs(2),
            )
            .map(|(messages, _)| messages)
        })
        .await
        .unwrap()
        .unwrap_or_default();
        for m in &read {
            use rdkafka::message::{Headers as _, Message as _};
            let mut text = String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned();
            if let Some(h) = m.headers() {
                for header in h.iter() {
                    text.push_str(&String::from_utf8_lossy(header.value.unwrap_or_default()));
                }
            }
            for card in [GOOD_CARD, DECLINED_CARD] {
                assert!(!text.contains(card), "a message on {topic} holds card number {card}");
            }
            if text.contains("ChargePayment") {
                assert!(text.contains("tok_"), "ChargePayment carries a token: {text}");
            }
            messages += 1;
        }
    }
    assert!(messages >= 6 * 4, "only {messages} messages scanned");
    // Nor a log line of any service (the refused legacy value is logged as
    // a refusal, never its number).
    for s in [
        Service::OrderApi,
        Service::Inventory,
        Service::Payment,
        Service::Gateway,
        Service::Relay,
    ] {
        let log = std::fs::read_to_string(stack.log_path(s)).unwrap();
        assert!(!log.is_empty(), "{} logged something", s.name());
        for card in [GOOD_CARD, DECLINED_CARD, grouped] {
            assert!(!log.contains(card), "{}'s log holds card number {card}", s.name());
        }
    }
    stack.shutdown(true).await.unwrap();
}
