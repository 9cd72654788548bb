//! Card numbers stop at the vault: the order keeps a token and the last
//! four digits; a card this process has tokenised needs no vault call; a
//! new card while the vault is down is a 503 that stores nothing.

use std::time::Duration;

use crate::{TestApi, ORDER};

#[tokio::test]
async fn the_order_keeps_a_token_and_a_known_card_needs_no_vault() {
    let api = TestApi::start(Duration::from_secs(3600)).await;
    let first = api.post("/orders", "card-1", None, ORDER).await;
    assert_eq!(first.status, 201);
    let shown = first.json();
    assert_eq!(shown["card_last4"], "4242");
    assert!(
        shown.get("card").is_none() && shown.get("card_token").is_none(),
        "{shown}"
    );
    let (card, token): (Option<String>, Option<String>) = sqlx::query_as("SELECT card, card_token FROM orders")
        .fetch_one(&api.pool)
        .await
        .unwrap();
    assert_eq!(card, None, "no number stored");
    assert!(token.is_some_and(|t| t.starts_with("tok_")));

    // The vault goes away.
    api.gateway.cancel();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let known = api.post("/orders", "card-2", None, ORDER).await;
    assert_eq!(
        known.status,
        201,
        "a remembered card: {}",
        String::from_utf8_lossy(&known.body)
    );
    let other = ORDER.replace("4242424242424242", "5555555555554444");
    let unknown = api.post("/orders", "card-3", None, &other).await;
    assert_eq!(unknown.status, 503, "{}", String::from_utf8_lossy(&unknown.body));
    assert_eq!(unknown.content_type.as_deref(), Some("application/problem+json"));
    assert!(unknown.retry_after);
    // The cause stays in the log: no host, port or gateway error in the body.
    let detail = unknown.json()["detail"].as_str().unwrap_or_default().to_owned();
    assert_eq!(detail, "the card vault is unavailable: nothing was stored, retry later");
    assert_eq!(api.counts().await.0, 2, "the refused order stored nothing");
    api.stop().await;
}
