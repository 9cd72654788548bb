//! Order endpoints.

use crate::gateway::CardToken;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use axum::Json;
use idempotency::{Begun, Outcome, StoredResponse};
use serde::{Deserialize, Serialize};
use sqlx::pool::PoolConnection;
use sqlx::{PgConnection, Postgres, Row as _, Transaction};
use uuid::Uuid;

use crate::http::admission::Deadline;
use crate::http::{ApiError, Problem};
use crate::orders::{self, HistoryEntry, NewOrder, Order, Status};
use crate::saga::{self, Input};
use crate::AppState;

service_kit::problem_response!(
    /// 401: no API key, or one the API does not know (or revoked).
    NoApiKey,
    401,
    "No API key, or an unknown or revoked one"
);
service_kit::problem_response!(
    /// 429: the client's rate limit.
    RateLimited,
    429,
    "Over the client's request rate (Retry-After)"
);
service_kit::problem_response!(
    /// 503: overloaded (no place in flight, or the request's deadline
    /// passed before its transaction), or the API key could not be checked.
    ServiceUnavailable,
    503,
    "Overloaded (`/problems/overloaded`: at the limit of requests in flight, or the deadline passed before the work began), or the API key could not be checked now: nothing stored; retry after Retry-After"
);
service_kit::problem_response!(
    /// 404: no such order — or another client's, which is not told apart.
    OrderNotFound,
    404,
    "No such order, or another client's (the two are not told apart)"
);

/// A request under `Idempotency-Key`, refused the way this API refuses.
pub type Idempotent = idempotency::Idempotent<ApiError>;

/// Largest order total accepted, in cents (one million in currency units):
/// the most the gateway moves in one charge.
pub const MAX_AMOUNT_CENTS: i64 = gateway_client::api::MAX_AMOUNT_CENTS;
/// Largest quantity accepted.
pub const MAX_QUANTITY: i32 = 1_000;

/// Body of `POST /orders`.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateOrder {
    /// Stock keeping unit (1..=64 characters, no control characters).
    #[schema(
        min_length = 1,
        max_length = 64,
        pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]*$",
        example = "WIDGET"
    )]
    pub sku: String,
    /// Units (1..=1000).
    #[schema(minimum = 1, maximum = 1000, example = 2)]
    #[serde(deserialize_with = "whole_number")]
    pub quantity: i32,
    /// Total in cents (1..=100000000).
    #[schema(minimum = 1, maximum = 100_000_000, example = 2500)]
    #[serde(deserialize_with = "whole_number")]
    pub amount_cents: i64,
    /// Card number: 12..=19 digits, in groups separated by spaces or
    /// dashes if you like (`4242 4242 4242 4242`); the separators are
    /// dropped before anything else sees it. `4000000000000002` is always declined.
    #[schema(pattern = "^[0-9][0-9 -]{10,36}[0-9]$", example = "4242424242424242")]
    pub card: String,
}

/// The digits of a card number as a person types it — spaces and dashes
/// between the digits dropped — when they are 12..=19 digits.
pub fn card_digits(card: &str) -> Option<String> {
    let digits: String = card.chars().filter(|c| !matches!(c, ' ' | '-')).collect();
    let plausible = (12..=19).contains(&digits.len())
        && digits.bytes().all(|b| b.is_ascii_digit())
        && card.starts_with(|c: char| c.is_ascii_digit())
        && card.ends_with(|c: char| c.is_ascii_digit());
    plausible.then_some(digits)
}

/// An integer field as JSON Schema means it: any number without a fraction,
/// so `2` and `2.0` are the same quantity; `2.5` or one out of the type's
/// range is a 422.
fn whole_number<'de, D, T>(de: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: TryFrom<i64>,
{
    use serde::de::Error as _;
    let n = serde_json::Number::deserialize(de)?;
    let whole = n
        .as_i64()
        .or_else(|| {
            n.as_f64()
                .filter(|f| f.fract() == 0.0 && f.abs() < 9.0e15)
                .map(|f| f as i64)
        })
        .ok_or_else(|| D::Error::custom(format!("expected a whole number, got {n}")))?;
    T::try_from(whole).map_err(|_| D::Error::custom(format!("{whole} is out of range")))
}

impl CreateOrder {
    /// Checks every field; the card's digits, once valid (the number is
    /// still in `self.card`).
    fn validate(&self) -> Result<String, ApiError> {
        let mut problems = Vec::new();
        if self.sku.is_empty() || self.sku.chars().count() > 64 {
            problems.push("sku must be 1..=64 characters");
        }
        // PostgreSQL text cannot hold NUL; no control character is a SKU
        // (schemathesis found the NUL as a 500).
        if self.sku.chars().any(char::is_control) {
            problems.push("sku must not contain control characters");
        }
        if !(1..=MAX_QUANTITY).contains(&self.quantity) {
            problems.push("quantity must be between 1 and 1000");
        }
        if !(1..=MAX_AMOUNT_CENTS).contains(&self.amount_cents) {
            problems.push("amount_cents must be between 1 and 100000000");
        }
        let digits = card_digits(&self.card);
        if digits.is_none() {
            problems.push("card must be 12..=19 digits (spaces or dashes between them allowed)");
        }
        match digits {
            Some(digits) if problems.is_empty() => Ok(digits),
            _ => Err(ApiError::Unprocessable(problems.join("; "))),
        }
    }

    /// The order to store: the card number replaced by the gateway's token
    /// and its last four digits.
    fn with(self, token: CardToken) -> NewOrder {
        NewOrder {
            sku: self.sku,
            quantity: self.quantity,
            amount_cents: self.amount_cents,
            card_token: token.token,
            card_last4: token.last4,
        }
    }
}

/// The vault's token of a card this process has not tokenised before.
async fn tokenise_new(gateway: &crate::gateway::Client, digits: &str) -> Result<CardToken, ApiError> {
    gateway.tokenise(digits).await.map_err(|e| match e {
        crate::gateway::Error::Unavailable(e) => {
            // The cause (a host, a refused credential) is the operator's, not the client's.
            tracing::warn!(error = %e, "card vault unavailable");
            ApiError::Unavailable("the card vault is unavailable: nothing was stored, retry later".into())
        }
        crate::gateway::Error::Refused(e) => ApiError::Unprocessable(format!("card refused by the vault: {e}")),
    })
}

/// Parses a JSON body: syntax errors are 400, shape errors (missing or
/// mistyped fields) 422, naming the field and never the value (a `card`
/// sent as a number is not echoed). Nothing is written for either.
pub fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    use service_kit::problem::JsonError;
    service_kit::problem::parse_json(body).map_err(|e| match e {
        JsonError::Data(d) => ApiError::Unprocessable(format!("invalid order: {d}")),
        JsonError::Syntax(d) => ApiError::BadRequest(d),
    })
}

fn parse_id(raw: &str) -> Result<Uuid, ApiError> {
    Uuid::parse_str(raw).map_err(|_| ApiError::NotFound)
}

/// An order with its saga history.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct OrderView {
    /// The order.
    #[serde(flatten)]
    pub order: Order,
    /// Saga steps, oldest first.
    pub history: Vec<HistoryEntry>,
}

/// `POST /orders` — requires `Idempotency-Key`; 201 with the order.
#[utoipa::path(
    post,
    path = "/orders",
    tag = "orders",
    request_body = CreateOrder,
    params(idempotency::KeyHeader),
    responses(
        (status = 201, description = "Created (or replayed: `Idempotent-Replayed: true`)", body = Order,
         headers(("Location" = String, description = "/orders/{id}"))),
        (status = 400, description = "Malformed JSON or Idempotency-Key", body = Problem, content_type = "application/problem+json"),
        NoApiKey,
        service_kit::problem::responses::TooLarge,
        service_kit::problem::responses::IncompleteBody,
        RateLimited,
        (status = 409, description = "The same key is still being processed (Retry-After)", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid fields, or the key reused with another body", body = Problem, content_type = "application/problem+json"),
        (status = 500, description = "Internal error (nothing stored; retry with the key)", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Overloaded (`/problems/overloaded`: at the limit of requests in flight, or the deadline passed before the work began), the card vault is unavailable, or the API key could not be checked: nothing stored; retry with the key after Retry-After", body = Problem, content_type = "application/problem+json"),
    )
)]
///
/// A body that does not parse or validate (400/422) is refused before the
/// key is claimed: nothing is stored under the key, so the client can fix
/// the body and retry with the same key (Stripe's rule).
///
/// Under admission control ([`crate::http::admission`]): the card's token
/// and a database connection are taken within the request's deadline;
/// then the transaction — key claimed, order and command written, answer
/// stored — runs to its end whatever the client does.
pub async fn create(
    State(state): State<AppState>,
    Extension(deadline): Extension<Deadline>,
    request: Idempotent,
) -> Result<Response, ApiError> {
    let body = parse_json::<CreateOrder>(&request.body)?;
    let digits = body.validate()?;
    // The number goes to the vault and no further: the order keeps the token.
    let token = match state.gateway.cached(&digits) {
        Some(token) => token,
        None => {
            // A card the vault must see: a retry of a completed request is
            // answered first, without a vault call, and only new work
            // spends the client's allowance of new cards. The connection
            // of that look-up goes back before the vault is called: a slow
            // vault holds no connection of the pool.
            let mut conn = deadline.within(state.pool.acquire()).await??;
            if let Some(outcome) = idempotency::answered(&mut conn, request.keyed()).await? {
                return Ok(idempotency::respond(outcome)?);
            }
            if let Err(refused) = state.auth.allow_declines(&mut conn, &request.scope).await? {
                return Ok(refused.into_response());
            }
            drop(conn);
            if let Err(refused) = state.auth.allow_new_card(&request.scope) {
                return Ok(refused.into_response());
            }
            deadline.within(tokenise_new(&state.gateway, &digits)).await??
        }
    };
    let conn = deadline.within(state.pool.acquire()).await??;
    deadline.commit(create_in(state, conn, request, body.with(token))).await
}

/// The order's transaction on `conn`: the key claimed (or its answer
/// replayed), the order and its first command written, the answer stored.
async fn create_in(
    state: AppState,
    mut conn: PoolConnection<Postgres>,
    request: Idempotent,
    new: NewOrder,
) -> Result<Response, ApiError> {
    // NEGATIVE CONTROL ONLY (UNSAFE_OUTBOX_AFTER_COMMIT, test builds): the
    // command leaves the order's transaction and is written after it.
    let dual_write = switches::on(switches::Switch::OutboxAfterCommit);
    if !dual_write {
        if let Some(answered) = place_at_once(&state, &mut conn, &request, &new).await? {
            return Ok(answered);
        }
    }
    // The key was taken (a retry, or an expired key), or the negative
    // control: the longer flow, which answers a taken key.
    let mut tx = match idempotency::begin(&mut *conn, request.keyed()).await? {
        Begun::New(tx) => tx,
        Begun::Answered(outcome) => return Ok(idempotency::respond(outcome)?),
    };
    let placed = place(&mut tx, &request.scope, &new, !dual_write).await;
    let unwritten = placed.as_ref().ok().and_then(|(_, command)| command.clone());
    let answered = complete(&state, &request, tx, placed.map(|(response, _)| response)).await;
    match unwritten {
        Some(command) if answered.as_ref().is_ok_and(|r| r.status() == StatusCode::CREATED) => {
            write_apart(&state.pool, command).await?;
            answered
        }
        _ => answered,
    }
}

/// A new order in one round trip ([`idempotency::at_once`]): its key and
/// answer, the order, its first history row and the command it waits on,
/// written by one statement — one transaction — when the key is new. The
/// answer is known before the statement: the service mints the order's
/// ids and its timestamps. `None` when the key was taken: nothing written,
/// the caller runs the longer flow, which answers a taken key.
async fn place_at_once(
    state: &AppState,
    conn: &mut PgConnection,
    request: &Idempotent,
    new: &NewOrder,
) -> Result<Option<Response>, ApiError> {
    let command_id = Uuid::now_v7();
    let order = orders::unsaved(Uuid::now_v7(), &request.scope, new, command_id);
    let first = saga::transitions::command(&order, Status::Pending).expect("PENDING waits on a command");
    let mut envelope = saga_kit::emit::envelope(order.id, &first, None, &tracing::Span::current());
    envelope.event_id = command_id;
    let command = saga_kit::emit::outbox_event(first.topic(), &envelope);
    let response = created(&order);
    // The one statement is the order's transaction: a crash before its
    // answer leaves all of it or none, and this is the last moment before.
    fail::fail_point!(CRASH_BEFORE_COMMIT, |_| telemetry::crash_point(CRASH_BEFORE_COMMIT));
    let sql = format!(
        "WITH {}, {} SELECT count(*) FROM o",
        idempotency::at_once::KEY_CTE,
        *orders::PLACE_CTES
    );
    let statement = idempotency::at_once::bind(sqlx::query(&sql), request.keyed(), state.idempotency_ttl, &response);
    let placed: i64 = orders::bind_place(statement, &order, &command)
        .fetch_one(&mut *conn)
        .await?
        .get(0);
    if placed == 0 {
        return Ok(None);
    }
    fail::fail_point!(CRASH_AFTER_COMMIT_BEFORE_RESPONSE, |_| telemetry::crash_point(
        CRASH_AFTER_COMMIT_BEFORE_RESPONSE
    ));
    placed_order(&order);
    Ok(Some(idempotency::respond(Outcome::Completed(response))?))
}

/// The answer to a new order: 201, the order, its location.
fn created(order: &Order) -> StoredResponse {
    StoredResponse::json(StatusCode::CREATED, order, "application/json")
        .with_header("location", format!("/orders/{}", order.id))
}

/// What a placed order leaves in metrics and the per-order log.
fn placed_order(order: &Order) {
    telemetry::metrics::incr("orders_created_total", &[]);
    tracing::debug!(target: telemetry::trace::PER_ORDER, order_id = %order.id, "order placed");
}

/// A command of a new order, not yet written: order id, command, event id.
type Unwritten = (Uuid, contract::Message, Uuid);

/// The order and the command it waits on, in the request's transaction:
/// the response to store under its key. Without `with_command` (only the
/// negative control), the command is returned unwritten instead.
async fn place(
    conn: &mut PgConnection,
    client: &str,
    new: &orders::NewOrder,
    with_command: bool,
) -> Result<(StoredResponse, Option<Unwritten>), ApiError> {
    let (id, command_id) = (Uuid::now_v7(), Uuid::now_v7());
    let order = orders::insert_with(conn, id, client, new, Some(command_id)).await?;
    // The command a PENDING order waits on, built where every state's is.
    let first = saga::transitions::command(&order, Status::Pending).expect("PENDING waits on a command");
    let unwritten = if with_command {
        saga_kit::emit::emit_as(conn, id, &first, None, command_id).await?;
        None
    } else {
        Some((id, first, command_id))
    };
    fail::fail_point!(CRASH_BEFORE_COMMIT, |_| telemetry::crash_point(CRASH_BEFORE_COMMIT));
    placed_order(&order);
    Ok((created(&order), unwritten))
}

/// NEGATIVE CONTROL ONLY: the dual write the outbox forbids — the command
/// of an order already committed, in a transaction of its own. A crash
/// before it (the suite's crash after the commit) loses the command for
/// good: only the deadline's re-send ever puts it in the log.
async fn write_apart(pool: &sqlx::PgPool, (id, command, command_id): Unwritten) -> anyhow::Result<()> {
    let mut tx = pool.begin().await?;
    saga_kit::emit::emit_as(&mut tx, id, &command, None, command_id).await?;
    tx.commit().await?;
    Ok(())
}

/// Crash point (failpoints builds): abort inside the order's transaction,
/// before it commits — the retry with the same key must execute, once.
pub const CRASH_BEFORE_COMMIT: &str = "order_api::before_commit";
/// Crash point (failpoints builds): abort after the order committed, before
/// the response is sent — the retry with the same key must be a replay.
pub const CRASH_AFTER_COMMIT_BEFORE_RESPONSE: &str = "order_api::after_commit_before_response";

/// Stores the request's answer under its key and commits it with the work
/// ([`idempotency::finish`]), then answers: the response, or the refusal.
/// Domain outcomes (2xx, 404, 409, 422) are stored with the key;
/// infrastructure errors roll everything back, so a retry runs again.
async fn complete(
    state: &AppState,
    request: &Idempotent,
    tx: Transaction<'_, Postgres>,
    result: Result<StoredResponse, ApiError>,
) -> Result<Response, ApiError> {
    let (pool, ttl) = (&state.pool, state.idempotency_ttl);
    let outcome = idempotency::finish(pool, tx, request.keyed(), ttl, result, |e: &ApiError| {
        e.is_final().then(|| e.to_stored())
    })
    .await?;
    if matches!(outcome, Outcome::Completed(_)) {
        fail::fail_point!(CRASH_AFTER_COMMIT_BEFORE_RESPONSE, |_| telemetry::crash_point(
            CRASH_AFTER_COMMIT_BEFORE_RESPONSE
        ));
    }
    Ok(idempotency::respond(outcome)?)
}

/// `GET /orders/{id}` — the order and its saga history.
#[utoipa::path(
    get,
    path = "/orders/{id}",
    tag = "orders",
    params(("id" = uuid::Uuid, Path, description = "order id")),
    responses(
        (status = 200, description = "The order and its saga history", body = OrderView),
        NoApiKey,
        OrderNotFound,
        RateLimited,
        service_kit::problem::responses::Internal,
        ServiceUnavailable,
    )
)]
pub async fn show(
    State(state): State<AppState>,
    axum::Extension(client): axum::Extension<idempotency::Scope>,
    Extension(deadline): Extension<Deadline>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let id = parse_id(&id)?;
    let mut conn = deadline.within(state.pool.acquire()).await??;
    let order = orders::get(&mut conn, id).await?.ok_or(ApiError::NotFound)?;
    if order.client_id != client.0 {
        // Not 403: that would tell a client another client's order exists.
        return Err(ApiError::NotFound);
    }
    let history = orders::history(&mut conn, id).await?;
    Ok(Json(OrderView { order, history }).into_response())
}

#[utoipa::path(
    post,
    path = "/orders/{id}/cancel",
    tag = "orders",
    params(
        ("id" = uuid::Uuid, Path, description = "order id"),
        idempotency::KeyHeader,
    ),
    responses(
        (status = 202, description = "Cancel of a CONFIRMED order started: refund, then stock released", body = Order),
        (status = 200, description = "Already being cancelled or cancelled", body = Order),
        (status = 400, description = "Malformed Idempotency-Key", body = Problem, content_type = "application/problem+json"),
        NoApiKey,
        OrderNotFound,
        service_kit::problem::responses::TooLarge,
        service_kit::problem::responses::IncompleteBody,
        RateLimited,
        (status = 409, description = "Not cancellable in its state, or the key in flight", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "The key reused with another request", body = Problem, content_type = "application/problem+json"),
        service_kit::problem::responses::Internal,
        ServiceUnavailable,
    )
)]
/// `POST /orders/{id}/cancel` — requires `Idempotency-Key`. A CONFIRMED
/// order is refunded and its stock released (202); an order already being
/// cancelled or cancelled answers 200; any other status 409.
pub async fn cancel(
    State(state): State<AppState>,
    Extension(deadline): Extension<Deadline>,
    Path(id): Path<String>,
    request: Idempotent,
) -> Result<Response, ApiError> {
    let id = parse_id(&id)?;
    let mut conn = deadline.within(state.pool.acquire()).await??;
    deadline
        .commit(async move {
            let mut tx = match idempotency::begin(&mut *conn, request.keyed()).await? {
                Begun::New(tx) => tx,
                Begun::Answered(outcome) => return Ok(idempotency::respond(outcome)?),
            };
            let cancelled = cancel_order(&mut tx, id, &request.scope).await;
            complete(&state, &request, tx, cancelled).await
        })
        .await
}

/// The cancel of order `id` for `client`, in the request's transaction: a
/// CONFIRMED order starts its refund (202), one already being cancelled or
/// cancelled answers 200, any other state is a conflict.
async fn cancel_order(conn: &mut PgConnection, id: Uuid, client: &str) -> Result<StoredResponse, ApiError> {
    let order = orders::lock(conn, id).await?.ok_or(ApiError::NotFound)?;
    if order.client_id != client {
        return Err(ApiError::NotFound);
    }
    let status = match order.status {
        Status::Refunding | Status::Cancelling | Status::Cancelled => StatusCode::OK,
        Status::Confirmed => {
            saga::advance(conn, &order, Input::CancelRequested, None).await?;
            StatusCode::ACCEPTED
        }
        other @ (Status::Pending | Status::AwaitingPayment | Status::ManualReview) => {
            return Err(ApiError::Conflict(format!(
                "order is {}; only CONFIRMED orders can be cancelled",
                other.as_str()
            )))
        }
    };
    let order = orders::get(conn, id).await?.ok_or(ApiError::NotFound)?;
    Ok(StoredResponse::json(status, &order, "application/json"))
}

#[cfg(test)]
mod tests {
    use super::card_digits;

    #[test]
    fn a_card_number_may_be_typed_in_groups_and_is_kept_as_its_digits() {
        for typed in [
            "4242424242424242",
            "4242 4242 4242 4242",
            "4242-4242-4242-4242",
            "4242 - 4242 4242-4242",
        ] {
            assert_eq!(card_digits(typed).as_deref(), Some("4242424242424242"), "{typed:?}");
        }
        for wrong in [
            "",
            " 4242424242424242",
            "4242424242424242-",
            "4242x4242424242424242",
            "4242 4242",
            "4242.4242.4242.4242",
        ] {
            assert_eq!(card_digits(wrong), None, "{wrong:?}");
        }
    }
}
