//! Order endpoints.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use idempotency::StoredResponse;
use messaging::Message;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::http::idempotent::{self, client_scope};
use crate::http::ApiError;
use crate::orders::{self, HistoryEntry, NewOrder, Order};
use crate::saga::{self, Input};
use crate::AppState;

/// Body of `POST /orders`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateOrder {
    /// Stock keeping unit (1..=64 characters).
    pub sku: String,
    /// Units (1..=1000).
    pub quantity: i32,
    /// Total in cents (> 0).
    pub amount_cents: i64,
    /// Card token (12..=19 digits). `4000000000000002` is always declined.
    pub card: String,
}

impl CreateOrder {
    fn validate(self) -> Result<NewOrder, ApiError> {
        let mut problems = Vec::new();
        if self.sku.is_empty() || self.sku.len() > 64 {
            problems.push("sku must be 1..=64 characters");
        }
        if !(1..=1000).contains(&self.quantity) {
            problems.push("quantity must be between 1 and 1000");
        }
        if self.amount_cents <= 0 {
            problems.push("amount_cents must be positive");
        }
        if !(12..=19).contains(&self.card.len()) || !self.card.bytes().all(|b| b.is_ascii_digit()) {
            problems.push("card must be 12..=19 digits");
        }
        if !problems.is_empty() {
            return Err(ApiError::Unprocessable(problems.join("; ")));
        }
        Ok(NewOrder {
            sku: self.sku,
            quantity: self.quantity,
            amount_cents: self.amount_cents,
            card: self.card,
        })
    }
}

/// Parses a JSON body: syntax errors are 400, shape errors (missing or
/// mistyped fields) 422. Nothing is written for either.
pub fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| match e.classify() {
        serde_json::error::Category::Data => ApiError::Unprocessable(format!("invalid order: {e}")),
        _ => ApiError::BadRequest(format!("malformed JSON body: {e}")),
    })
}

fn parse_id(raw: &str) -> Result<Uuid, ApiError> {
    Uuid::parse_str(raw).map_err(|_| ApiError::NotFound)
}

/// An order with its saga history.
#[derive(Debug, Serialize)]
pub struct OrderView {
    /// The order.
    #[serde(flatten)]
    pub order: Order,
    /// Saga steps, oldest first.
    pub history: Vec<HistoryEntry>,
}

/// `POST /orders` — requires `Idempotency-Key`; 201 with the order.
pub async fn create(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Result<Response, ApiError> {
    let request: CreateOrder = parse_json(&body)?;
    let client = client_scope(&headers)?;
    let work: idempotent::Work = Box::new(move |conn| {
        Box::pin(async move {
            let new = request.validate()?;
            let order = orders::insert(conn, &client, &new).await?;
            let first = Message::ReserveStock {
                sku: order.sku.clone(),
                quantity: order.quantity,
            };
            outbox::emit(conn, order.id, &first, None)
                .await
                .map_err(anyhow::Error::from)?;
            fail::fail_point!("order_api::before_commit", |_| std::process::abort());
            telemetry::metrics::incr("orders_created_total", &[]);
            tracing::info!(order_id = %order.id, "order placed");
            Ok(StoredResponse::json(StatusCode::CREATED, &order, "application/json")
                .with_header("location", format!("/orders/{}", order.id)))
        })
    });
    idempotent::execute(&state, &headers, "POST", "/orders", &body, work).await
}

/// `GET /orders/{id}` — the order and its saga history.
pub async fn show(State(state): State<AppState>, Path(id): Path<String>) -> Result<Response, ApiError> {
    let id = parse_id(&id)?;
    let mut conn = state.pool.acquire().await?;
    let order = orders::get(&mut conn, id).await?.ok_or(ApiError::NotFound)?;
    let history = orders::history(&mut conn, id).await?;
    Ok(Json(OrderView { order, history }).into_response())
}

/// `POST /orders/{id}/cancel` — requires `Idempotency-Key`. A CONFIRMED
/// order is refunded and its stock released (202); an order already being
/// cancelled or cancelled answers 200; any other status 409.
pub async fn cancel(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let id = parse_id(&id)?;
    let path = format!("/orders/{id}/cancel");
    let work: idempotent::Work = Box::new(move |conn| {
        Box::pin(async move {
            let order = orders::lock(conn, id).await?.ok_or(ApiError::NotFound)?;
            use crate::saga::Status::*;
            let status = match order.status {
                Refunding | Cancelling | Cancelled => StatusCode::OK,
                Confirmed => {
                    saga::apply(conn, &order, Input::CancelRequested, None).await?;
                    StatusCode::ACCEPTED
                }
                other => {
                    return Err(ApiError::Conflict(format!(
                        "order is {}; only CONFIRMED orders can be cancelled",
                        other.as_str()
                    )))
                }
            };
            let order = orders::get(conn, id).await?.ok_or(ApiError::NotFound)?;
            Ok(StoredResponse::json(status, &order, "application/json"))
        })
    });
    idempotent::execute(&state, &headers, "POST", &path, &body, work).await
}
