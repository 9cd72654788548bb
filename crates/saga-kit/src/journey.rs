//! One order's footprint in one service's database, as its admin endpoint
//! `GET /journey/{order_id}?events=…` answers it: the messages its outbox
//! wrote for the order (keyed by the order id), and which of the given
//! events its inbox applied — where in the log the applied copy was read,
//! and how many redeliveries of it the inbox absorbed. order-api's
//! `GET /orders/{id}/journey` asks every participant and draws the whole.

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::Json;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use uuid::Uuid;

/// A message the service's outbox wrote for the order.
#[derive(Debug, Clone, Serialize, Deserialize, sqlx::FromRow)]
pub struct Sent {
    /// Its event id: the inbox key of whoever consumes it.
    pub event_id: Uuid,
    /// Its type (`ReserveStock`, `StockReserved`, …).
    pub event_type: String,
    /// The topic it goes to.
    pub topic: String,
    /// Written, with the effect that caused it.
    pub created_at: DateTime<Utc>,
    /// Acknowledged by the broker (None: not yet, or parked).
    pub published_at: Option<DateTime<Utc>>,
    /// Publish attempts (above 1: the relay crashed or the broker refused).
    pub attempts: i32,
    /// The W3C trace context it carries.
    pub traceparent: Option<String>,
}

/// An event the service's inbox applied.
#[derive(Debug, Clone, Serialize, Deserialize, sqlx::FromRow)]
pub struct Received {
    /// The consumer (group) that applied it.
    pub consumer: String,
    /// The event id.
    pub event_id: Uuid,
    /// When its effect committed, with this row.
    pub processed_at: DateTime<Utc>,
    /// Where the applied copy was read (None: handed over by hand).
    pub partition: Option<i32>,
    /// Its offset in that partition.
    pub offset: Option<i64>,
    /// Copies of it delivered again and absorbed by the inbox.
    pub redeliveries: i32,
}

/// One service's part of an order's journey.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Part {
    /// What its outbox wrote for the order.
    pub sent: Vec<Sent>,
    /// Which of the asked events its inbox applied.
    pub received: Vec<Received>,
}

/// A payment operation payment-service recorded for the order
/// (`GET /payments/{order_id}` on its admin port): the gateway's record is
/// under its key.
#[derive(Debug, Clone, Serialize, Deserialize, sqlx::FromRow)]
pub struct PaymentRecord {
    /// `charge` or `refund`.
    pub kind: String,
    /// The gateway's Idempotency-Key for it.
    pub idempotency_key: String,
    /// Amount in cents.
    pub amount_cents: i64,
    /// `PENDING`, `CAPTURED`, `DECLINED`, `REFUNDED` or `FAILED`.
    pub status: String,
    /// Gateway calls made for it.
    pub attempts: i32,
    /// Recorded PENDING, before the gateway was called.
    pub created_at: DateTime<Utc>,
    /// Last changed: settled, or reconciled.
    pub updated_at: DateTime<Utc>,
    /// Settled by the reconciler's look-up rather than by the call's answer.
    pub reconciled_at: Option<DateTime<Utc>>,
}

/// The messages `pool`'s outbox wrote for `order_id`, in the order written:
/// those published (their records in `outbox_published`) and those still
/// pending in `outbox` (a message re-sent after its publication shows as
/// published, with its latest time).
pub async fn sent(pool: &PgPool, order_id: Uuid) -> sqlx::Result<Vec<Sent>> {
    sqlx::query_as(
        "SELECT DISTINCT ON (created_at, event_id)
                event_id, event_type, topic, created_at, published_at, attempts, traceparent
         FROM (SELECT event_id, event_type, topic, created_at, published_at, attempts, traceparent, 0 AS pick
               FROM outbox_published WHERE message_key = $1
               UNION ALL
               SELECT event_id, event_type, topic, created_at, NULL, attempts, traceparent, 1
               FROM outbox WHERE message_key = $1) AS s
         ORDER BY created_at, event_id, pick",
    )
    .bind(order_id.to_string())
    .fetch_all(pool)
    .await
}

/// Which of `events` `pool`'s inbox applied, with the redeliveries absorbed.
pub async fn received(pool: &PgPool, events: &[Uuid]) -> sqlx::Result<Vec<Received>> {
    sqlx::query_as(
        "SELECT i.consumer, i.event_id, i.processed_at, i.source_partition AS partition,
                i.source_offset AS offset, COALESCE(r.redeliveries, 0) AS redeliveries
         FROM inbox i LEFT JOIN inbox_redeliveries r USING (consumer, event_id)
         WHERE i.event_id = ANY($1) ORDER BY i.processed_at",
    )
    .bind(events)
    .fetch_all(pool)
    .await
}

/// `?events=<id>,<id>…`: the events to look for in the inbox.
#[derive(Debug, Deserialize)]
pub struct Events {
    /// Comma-separated event ids.
    #[serde(default)]
    pub events: String,
}

/// `GET /journey/{order_id}?events=…` for an admin router with the
/// service's pool as its state.
pub async fn part(
    State(pool): State<PgPool>,
    Path(order_id): Path<Uuid>,
    Query(q): Query<Events>,
) -> Result<Json<Part>, (StatusCode, String)> {
    let events = q
        .events
        .split(',')
        .filter(|s| !s.is_empty())
        .map(str::parse)
        .collect::<Result<Vec<Uuid>, _>>()
        .map_err(|e| (StatusCode::BAD_REQUEST, format!("events: {e}")))?;
    let unavailable = |e: sqlx::Error| (StatusCode::SERVICE_UNAVAILABLE, format!("database: {e}"));
    Ok(Json(Part {
        sent: sent(&pool, order_id).await.map_err(unavailable)?,
        received: received(&pool, &events).await.map_err(unavailable)?,
    }))
}

/// The route `GET /journey/{order_id}` on `pool`, to merge into the
/// service's admin router.
pub fn router(pool: PgPool) -> axum::Router {
    axum::Router::new()
        .route("/journey/{order_id}", axum::routing::get(part))
        .with_state(pool)
}
