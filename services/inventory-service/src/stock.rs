//! Reserve / release, each idempotent per order, and the stock endpoints.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use contract::topics::consumers::INVENTORY;
use contract::{Envelope, Message};
use kafka::consumer::{HandleError, Handled, Traced};
use serde::{Deserialize, Serialize};
use service_kit::problem::Problem;
use sqlx::{PgConnection, PgPool};

/// Handles one inventory command.
pub async fn handle(pool: &PgPool, envelope: Envelope) -> Result<Handled, HandleError> {
    saga_kit::consumer::handle_one(envelope, |one| handle_batch(pool, one)).await
}

/// A command this service understands.
enum Command<'a> {
    Reserve { sku: &'a str, quantity: i32 },
    Release,
}

/// Handles a partition's queued commands, in order, in one transaction:
/// one multi-row inbox insert, the stock rows the batch may touch locked in
/// SKU order (so two batches never wait on each other in a cycle), then each
/// new command applied with its reply in the outbox. All commit together or
/// none does.
pub async fn handle_batch(pool: &PgPool, batch: Vec<Traced<Envelope>>) -> Result<Vec<Handled>, HandleError> {
    let envelopes: Vec<&Envelope> = batch.iter().map(|t| &t.message).collect();
    let messages = envelopes
        .iter()
        .map(|e| e.message())
        .collect::<Result<Vec<_>, _>>()
        .map_err(HandleError::permanent)?;
    let commands = messages
        .iter()
        .map(|m| match m {
            Message::ReserveStock { sku, quantity } => Ok(Command::Reserve {
                sku,
                quantity: *quantity,
            }),
            Message::ReleaseStock => Ok(Command::Release),
            other => Err(HandleError::Permanent(format!(
                "unexpected message {other:?} on inventory.commands"
            ))),
        })
        .collect::<Result<Vec<_>, _>>()?;
    saga_kit::consumer::apply_batch(
        pool,
        INVENTORY.name,
        &batch,
        &(envelopes, commands),
        |conn, (envelopes, commands)| {
            Box::pin(async move {
                if envelopes.len() > 1 {
                    lock_stock(conn, envelopes, commands).await?;
                }
                Ok::<_, outbox::Error>(())
            })
        },
        |conn, envelope, (_, commands), i| Box::pin(apply(conn, envelope, &commands[i])),
    )
    .await
}

/// Locks, in SKU order, every stock row the batch may update: the SKUs it
/// reserves and those of the reservations it releases.
async fn lock_stock(conn: &mut PgConnection, envelopes: &[&Envelope], commands: &[Command<'_>]) -> sqlx::Result<()> {
    let mut skus = Vec::new();
    let mut releasing = Vec::new();
    for (envelope, command) in envelopes.iter().zip(commands) {
        match command {
            Command::Reserve { sku, .. } => skus.push(sku.to_string()),
            Command::Release => releasing.push(envelope.order_id),
        }
    }
    sqlx::query(
        "SELECT 1 FROM stock WHERE sku IN (
             SELECT unnest($1::text[]) UNION SELECT sku FROM reservations WHERE order_id = ANY($2))
         ORDER BY sku FOR UPDATE",
    )
    .bind(&skus)
    .bind(&releasing)
    .execute(conn)
    .await?;
    Ok(())
}

/// Applies one new command and puts its reply, if any, in the outbox.
#[tracing::instrument(skip_all, fields(order_id = %envelope.order_id, event_type = %envelope.event_type, event_id = %envelope.event_id))]
async fn apply(conn: &mut PgConnection, envelope: &Envelope, command: &Command<'_>) -> Result<(), outbox::Error> {
    let reply = match command {
        Command::Reserve { sku, quantity } => reserve(conn, envelope, sku, *quantity).await?,
        Command::Release => release(conn, envelope).await?,
    };
    if let Some(reply) = reply {
        saga_kit::emit::emit(conn, envelope.order_id, &reply, Some(envelope)).await?;
    }
    Ok(())
}

/// Reserves stock for the order once. The reservation's primary key (order
/// id) decides: a second ReserveStock for the same order — even under a new
/// event id, even concurrently — finds the row and does nothing.
async fn reserve(conn: &mut PgConnection, env: &Envelope, sku: &str, quantity: i32) -> sqlx::Result<Option<Message>> {
    if quantity <= 0 {
        return Ok(Some(Message::StockRejected {
            reason: "invalid_quantity".into(),
        }));
    }
    let claimed = sqlx::query(
        "INSERT INTO reservations (order_id, sku, quantity, status) VALUES ($1, $2, $3, 'RESERVED')
         ON CONFLICT (order_id) DO NOTHING",
    )
    .bind(env.order_id)
    .bind(sku)
    .bind(quantity)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    if claimed == 0 {
        tracing::info!("order already has a reservation; reserve is a no-op");
        telemetry::metrics::incr("inventory_repeat_commands_total", &[("command", "reserve")]);
        inbox::note_miss(
            conn,
            INVENTORY.name,
            env.event_id,
            env.order_id,
            "reservation per order",
        )
        .await?;
        return Ok(None);
    }
    // The conditional decrement is atomic: concurrent orders for the last
    // unit serialise on the stock row and only one sees available >= quantity.
    let taken = sqlx::query(
        "UPDATE stock SET available = available - $2, updated_at = now() WHERE sku = $1 AND available >= $2",
    )
    .bind(sku)
    .bind(quantity)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    if taken == 1 {
        telemetry::metrics::incr("inventory_reserved_total", &[]);
        return Ok(Some(Message::StockReserved));
    }
    sqlx::query("UPDATE reservations SET status = 'REJECTED', updated_at = now() WHERE order_id = $1")
        .bind(env.order_id)
        .execute(&mut *conn)
        .await?;
    telemetry::metrics::incr("inventory_rejected_total", &[]);
    Ok(Some(Message::StockRejected {
        reason: "out_of_stock".into(),
    }))
}

/// Releases the order's reservation once: only a RESERVED row moves to
/// RELEASED, and the row lock of that UPDATE serialises concurrent releases.
async fn release(conn: &mut PgConnection, env: &Envelope) -> sqlx::Result<Option<Message>> {
    let released: Option<(String, i32)> = sqlx::query_as(
        "UPDATE reservations SET status = 'RELEASED', updated_at = now()
         WHERE order_id = $1 AND status = 'RESERVED' RETURNING sku, quantity",
    )
    .bind(env.order_id)
    .fetch_optional(&mut *conn)
    .await?;
    let Some((sku, quantity)) = released else {
        tracing::info!("no reserved stock for order; release is a no-op");
        telemetry::metrics::incr("inventory_repeat_commands_total", &[("command", "release")]);
        inbox::note_miss(
            conn,
            INVENTORY.name,
            env.event_id,
            env.order_id,
            "release once per reservation",
        )
        .await?;
        return Ok(None);
    };
    sqlx::query("UPDATE stock SET available = available + $2, updated_at = now() WHERE sku = $1")
        .bind(&sku)
        .bind(quantity)
        .execute(&mut *conn)
        .await?;
    telemetry::metrics::incr("inventory_released_total", &[]);
    Ok(Some(Message::StockReleased))
}

/// Stock level of one SKU.
#[derive(Debug, Serialize, Deserialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct StockLevel {
    /// SKU.
    pub sku: String,
    /// Units available.
    pub available: i32,
    /// Units held by live reservations.
    pub reserved: i64,
}

fn unavailable(e: sqlx::Error) -> Problem {
    tracing::error!(error = %e, "stock query failed");
    Problem::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "/problems/unavailable",
        "Database unavailable",
        "the stock database did not answer; retry",
    )
}

/// `GET /stock` — available and reserved units per SKU.
#[utoipa::path(
    get,
    path = "/stock",
    tag = "stock",
    responses(
        (status = 200, description = "Every SKU with its available and reserved units", body = Vec<StockLevel>),
        (status = 401, description = "No or wrong operator credential", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Database unavailable", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn list(State(pool): State<PgPool>) -> Result<Json<Vec<StockLevel>>, Problem> {
    sqlx::query_as(
        "SELECT s.sku, s.available,
                COALESCE((SELECT sum(quantity) FROM reservations r WHERE r.sku = s.sku AND r.status = 'RESERVED'), 0)::int8 AS reserved
         FROM stock s ORDER BY s.sku",
    )
    .fetch_all(&pool)
    .await
    .map(Json)
    .map_err(unavailable)
}

/// Body of `PUT /stock/{sku}`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetStock {
    /// New available count (0..=2147483647; the bench seeds two billion).
    #[schema(minimum = 0, maximum = 2_147_483_647)]
    pub available: i32,
}

/// `PUT /stock/{sku}` — sets the available count (seeding and tests).
#[utoipa::path(
    put,
    path = "/stock/{sku}",
    tag = "stock",
    params(("sku" = String, Path, description = "stock keeping unit (1..=64 characters)")),
    request_body = SetStock,
    responses(
        (status = 204, description = "Set"),
        (status = 400, description = "Malformed JSON", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No or wrong operator credential", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid count or SKU", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Database unavailable", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn set(
    State(pool): State<PgPool>,
    Path(sku): Path<String>,
    body: axum::body::Bytes,
) -> Result<StatusCode, Problem> {
    let refuse =
        |status: StatusCode, kind: &'static str, detail: String| Problem::new(status, kind, "Invalid request", detail);
    let body: SetStock = service_kit::problem::parse_json(&body).map_err(Problem::from)?;
    if body.available < 0 {
        return Err(refuse(
            StatusCode::UNPROCESSABLE_ENTITY,
            "/problems/unprocessable",
            "available must be >= 0".into(),
        ));
    }
    if sku.is_empty() || sku.len() > 64 {
        return Err(refuse(
            StatusCode::UNPROCESSABLE_ENTITY,
            "/problems/unprocessable",
            "sku must be 1..=64 characters".into(),
        ));
    }
    sqlx::query(
        "INSERT INTO stock (sku, available) VALUES ($1, $2)
         ON CONFLICT (sku) DO UPDATE SET available = EXCLUDED.available, updated_at = now()",
    )
    .bind(&sku)
    .bind(body.available)
    .execute(&pool)
    .await
    .map_err(unavailable)?;
    Ok(StatusCode::NO_CONTENT)
}
