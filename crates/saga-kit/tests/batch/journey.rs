//! What a participant serves and grants beside its consumer: its part of
//! an order's journey (`saga_kit::journey`: what its outbox sent for the
//! order, which asked events its inbox applied) on `GET /journey/{order_id}`,
//! and the relay's privileges on its outbox (`ParticipantArgs::grant_relay`).

use axum::body::Body;
use axum::http::{Request, StatusCode};
use clap::Parser as _;
use tower::ServiceExt as _;

use super::*;

async fn get(pool: &PgPool, uri: &str) -> (StatusCode, serde_json::Value) {
    let response = saga_kit::journey::router(pool.clone())
        .oneshot(Request::get(uri).body(Body::empty()).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap();
    (status, serde_json::from_slice(&bytes).unwrap_or_default())
}

#[tokio::test]
async fn the_journey_route_shows_what_the_outbox_sent_and_the_inbox_applied() {
    let (_db, pool) = world().await;
    let order = Uuid::new_v4();
    let command = reserve(order);
    // Applied from offset 7, answered with a reply in the same transaction.
    let (mut tx, fresh) = begin(&pool, "c", &[at(&command, 7)]).await.unwrap();
    saga_kit::emit::emit(&mut tx, order, &Message::StockReserved, Some(&command))
        .await
        .unwrap();
    commit(tx, &fresh).await.unwrap();
    let never = Uuid::new_v4();
    let (status, part) = get(&pool, &format!("/journey/{order}?events={},{never}", command.event_id)).await;
    assert_eq!(status, StatusCode::OK);
    let sent = part["sent"].as_array().unwrap();
    assert_eq!(sent.len(), 1, "{part}");
    assert_eq!(sent[0]["event_type"], "StockReserved");
    let received = part["received"].as_array().unwrap();
    assert_eq!(received.len(), 1, "{part}");
    assert_eq!(received[0]["event_id"], command.event_id.to_string());
    assert_eq!(received[0]["offset"], 7);
    let (status, _) = get(&pool, &format!("/journey/{order}?events=not-an-id")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

/// A participant's settings, as its binary parses them.
#[derive(clap::Parser)]
struct Cli {
    #[command(flatten)]
    participant: saga_kit::participant::ParticipantArgs,
}

#[tokio::test]
async fn the_relay_role_setting_grants_the_relay_its_outbox() {
    let (_db, pool) = world().await;
    let role = format!("eo_relay_{}", Uuid::new_v4().simple());
    sqlx::query(&format!("CREATE ROLE {role}"))
        .execute(&pool)
        .await
        .unwrap();
    let cli = Cli::try_parse_from(["participant", "--kafka-plaintext", "--relay-role", &role]).unwrap();
    cli.participant.grant_relay(&pool).await.unwrap();
    // Which privileges exactly: outbox's own test of `outbox::grant_relay`;
    // here, that the participant's setting reaches it.
    let granted: bool = sqlx::query_scalar("SELECT has_table_privilege($1, 'outbox', 'DELETE')")
        .bind(&role)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(granted, "the relay's role may settle the outbox's rows");
    sqlx::raw_sql(&format!(
        "REVOKE ALL ON outbox, outbox_published FROM {role}; DROP ROLE {role}"
    ))
    .execute(&pool)
    .await
    .unwrap();
}
