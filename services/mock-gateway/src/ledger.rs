//! Charges, refunds and the ledger.

use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::{DateTime, Utc};
use idempotency::{Begun, Outcome, StoredResponse};
use serde::{Deserialize, Serialize};
use service_kit::problem::{Problem, PROBLEM_JSON};
use sqlx::{PgConnection, Postgres, Transaction};
use uuid::Uuid;

use crate::faults::{FaultSwitch, Faults};
use crate::AppState;

service_kit::problem_response!(
    /// 503 of a fault injected before the commit (test builds): nothing stored.
    FaultBeforeCommit,
    503,
    "Unavailable before commit (injected fault): retry"
);

/// Errors of the gateway API.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// Malformed request.
    #[error("{0}")]
    BadRequest(String),
    /// Valid syntax, refused content (stored under the key).
    #[error("{0}")]
    Unprocessable(String),
    /// Refused by the Idempotency-Key layer (bad key, in flight, reused).
    #[error(transparent)]
    Refused(#[from] idempotency::Refused),
    /// Injected or real unavailability before commit: retry is safe.
    #[error("gateway temporarily unavailable")]
    Unavailable,
    /// Anything else.
    #[error("internal error")]
    Internal(#[from] anyhow::Error),
}

/// A request under `Idempotency-Key`, refused the way the gateway refuses.
pub type Idempotent = idempotency::Idempotent<GatewayError>;

service_kit::internal_errors!(GatewayError: idempotency::Error, sqlx::Error);

impl GatewayError {
    fn problem(&self) -> Problem {
        let (status, kind) = match self {
            Self::BadRequest(_) => (StatusCode::BAD_REQUEST, "/problems/bad-request"),
            Self::Unprocessable(_) => (StatusCode::UNPROCESSABLE_ENTITY, "/problems/unprocessable"),
            Self::Refused(r) => (r.status(), r.problem_type()),
            Self::Unavailable => (StatusCode::SERVICE_UNAVAILABLE, "/problems/unavailable"),
            Self::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "/problems/internal"),
        };
        Problem::new(status, kind, "Gateway error", self.to_string())
    }
}

impl IntoResponse for GatewayError {
    fn into_response(self) -> Response {
        if let Self::Internal(e) = &self {
            tracing::error!(error = ?e, "gateway request failed");
        }
        self.problem().into_response()
    }
}

pub use gateway_client::api::{ChargeRequest, EntryKind, EntryStatus, Movement, RefundRequest, MAX_AMOUNT_CENTS};

/// A ledger entry.
#[derive(Debug, Clone, Serialize, Deserialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct LedgerEntry {
    /// Entry id.
    pub id: Uuid,
    /// Charge or refund.
    pub kind: EntryKind,
    /// Order.
    pub order_id: Uuid,
    /// Amount in cents.
    pub amount_cents: i64,
    /// How it ended.
    pub status: EntryStatus,
    /// Client that asked.
    pub client_id: String,
    /// Key it came with.
    pub idempotency_key: String,
    /// When.
    pub created_at: DateTime<Utc>,
}

/// `POST /v1/charges` — captures, or declines the token of card
/// [`crate::DECLINED_CARD`] (402); an unknown token is a 422.
#[utoipa::path(
    post,
    path = "/v1/charges",
    tag = "gateway",
    request_body = ChargeRequest,
    params(idempotency::KeyHeader),
    responses(
        (status = 201, description = "Captured (or replayed)", body = Movement),
        service_kit::problem::responses::NoCredential,
        crate::grants::NoGrant,
        (status = 402, description = "Declined by the issuer (stored under the key)", body = Movement),
        service_kit::problem::responses::MalformedBodyOrKey,
        service_kit::problem::responses::KeyInFlight,
        (status = 422, description = "Invalid amount, unknown card token, or the key reused with another body", body = service_kit::problem::Problem, content_type = "application/problem+json"),
        service_kit::problem::responses::Internal,
        FaultBeforeCommit,
    )
)]
pub async fn charge(State(state): State<AppState>, request: Idempotent) -> Result<Response, GatewayError> {
    let req: ChargeRequest = parse(&request.body)?;
    valid_amount(req.amount_cents)?;
    let faults = state.faults.current();
    let mut tx = match begin(&state, &request, &faults).await? {
        Begun::New(tx) => tx,
        Begun::Answered(outcome) => return Ok(idempotency::respond(outcome)?),
    };
    let charged = record_charge(&mut tx, &req, &request).await;
    complete(&state, &request, &faults, tx, charged).await
}

/// The charge of `req` under the request's key, in its transaction: the
/// movement, declined or captured; an unknown card token is refused.
async fn record_charge(
    conn: &mut PgConnection,
    req: &ChargeRequest,
    request: &Idempotent,
) -> Result<StoredResponse, GatewayError> {
    let (client, key) = (&request.scope, &request.key);
    // No token has a NUL, and PostgreSQL cannot even compare a text with one.
    if req.card_token.contains('\0') {
        return Err(GatewayError::Unprocessable("unknown card token".into()));
    }
    let Some((id, status)) = insert_charge(conn, &req.card_token, req.order_id, req.amount_cents, client, key).await?
    else {
        return Err(GatewayError::Unprocessable("unknown card token".into()));
    };
    let code = if status == EntryStatus::Declined {
        StatusCode::PAYMENT_REQUIRED
    } else {
        StatusCode::CREATED
    };
    telemetry::metrics::incr("gateway_charges_total", &[("status", status.as_str())]);
    Ok(StoredResponse::json(code, &Movement { id, status }, "application/json"))
}

#[utoipa::path(
    post,
    path = "/v1/refunds",
    tag = "gateway",
    request_body = RefundRequest,
    params(idempotency::KeyHeader),
    responses(
        (status = 201, description = "Refunded (or replayed)", body = Movement),
        service_kit::problem::responses::NoCredential,
        crate::grants::NoGrant,
        service_kit::problem::responses::MalformedBodyOrKey,
        service_kit::problem::responses::KeyInFlight,
        (status = 422, description = "More than the captured amount, refused by the issuer, or the key reused with another body", body = service_kit::problem::Problem, content_type = "application/problem+json"),
        service_kit::problem::responses::Internal,
        FaultBeforeCommit,
    )
)]
/// `POST /v1/refunds` — refunds part or all of an order's captured charges;
/// refunds beyond what was captured are refused (422).
pub async fn refund(State(state): State<AppState>, request: Idempotent) -> Result<Response, GatewayError> {
    let req: RefundRequest = parse(&request.body)?;
    let faults = state.faults.current();
    let mut tx = match begin(&state, &request, &faults).await? {
        Begun::New(tx) => tx,
        Begun::Answered(outcome) => return Ok(idempotency::respond(outcome)?),
    };
    let refunded = record_refund(&mut tx, &req, &request, faults.refuse_refunds).await;
    complete(&state, &request, &faults, tx, refunded).await
}

/// An amount a charge or refund may move: 1 to [`MAX_AMOUNT_CENTS`].
fn valid_amount(cents: i64) -> Result<(), GatewayError> {
    if (1..=MAX_AMOUNT_CENTS).contains(&cents) {
        return Ok(());
    }
    Err(GatewayError::Unprocessable(format!(
        "amount_cents must be 1 to {MAX_AMOUNT_CENTS}, not {cents}"
    )))
}

/// The refund of `req` under the request's key, in its transaction, with
/// the order's ledger rows locked so concurrent refunds cannot overdraw;
/// more than the caller captured for the order (or an injected refusal) is
/// refused. Only the caller's own movements count: another client's
/// charge of the same order id is not the caller's to refund.
async fn record_refund(
    conn: &mut PgConnection,
    req: &RefundRequest,
    request: &Idempotent,
    refuse: bool,
) -> Result<StoredResponse, GatewayError> {
    if refuse {
        telemetry::metrics::incr("gateway_injected_faults_total", &[("fault", "refuse_refund")]);
        return Err(GatewayError::Unprocessable("refund refused by the issuer".into()));
    }
    valid_amount(req.amount_cents)?;
    let (captured, refunded): (i64, i64) = sqlx::query_as(
        "SELECT COALESCE(sum(amount_cents) FILTER (WHERE kind = 'charge' AND status = 'captured'), 0)::int8,
                COALESCE(sum(amount_cents) FILTER (WHERE kind = 'refund'), 0)::int8
         FROM (SELECT * FROM ledger WHERE order_id = $1 AND client_id = $2 FOR UPDATE) l",
    )
    .bind(req.order_id)
    .bind(&request.scope)
    .fetch_one(&mut *conn)
    .await?;
    // Checked: no sum of amounts may wrap, whatever the ledger holds.
    if refunded
        .checked_add(req.amount_cents)
        .is_none_or(|total| total > captured)
    {
        return Err(GatewayError::Unprocessable(format!(
            "refund of {} exceeds the refundable {}",
            req.amount_cents,
            captured.saturating_sub(refunded)
        )));
    }
    let (client, key) = (&request.scope, &request.key);
    let id = insert(
        conn,
        EntryKind::Refund,
        req.order_id,
        req.amount_cents,
        EntryStatus::Refunded,
        client,
        key,
    )
    .await?;
    telemetry::metrics::incr("gateway_refunds_total", &[]);
    Ok(StoredResponse::json(
        StatusCode::CREATED,
        &Movement {
            id,
            status: EntryStatus::Refunded,
        },
        "application/json",
    ))
}

/// `GET /v1/ledger` and `GET /v1/operations/{key}` query: whose entries.
#[derive(Debug, Clone, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct LedgerQuery {
    /// The caller whose movements to read (default: the authenticated
    /// caller; another only under a `GATEWAY_READERS` grant).
    pub client: Option<String>,
    /// Entries after this entry id (the previous page's `next_after`).
    pub after: Option<Uuid>,
    /// Page size, 1..=500 (default 100).
    pub limit: Option<i64>,
}

/// One page of the ledger.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct LedgerPage {
    /// Entries, oldest first (ids are time-ordered UUIDv7).
    pub entries: Vec<LedgerEntry>,
    /// Pass as `after` for the next page; absent on the last.
    pub next_after: Option<Uuid>,
}

/// The owner whose movements the caller asked for, if it may read them.
fn owner(state: &AppState, caller: &idempotency::Scope, asked: Option<String>) -> Result<String, Problem> {
    let owner = asked.unwrap_or_else(|| caller.0.clone());
    if state.readers.may_read(&caller.0, &owner) {
        return Ok(owner);
    }
    Err(Problem::new(
        StatusCode::FORBIDDEN,
        "/problems/forbidden",
        "Not allowed",
        format!("{} may not read the movements of {owner}", caller.0),
    ))
}

#[utoipa::path(
    get,
    path = "/v1/ledger",
    tag = "gateway",
    params(LedgerQuery),
    responses(
        (status = 200, description = "A page of the caller's movements, oldest first", body = LedgerPage),
        service_kit::problem::responses::BadQuery,
        service_kit::problem::responses::NoCredential,
        (status = 403, description = "No read grant (GATEWAY_GRANTS), or another caller's movements without a GATEWAY_READERS grant", body = service_kit::problem::Problem, content_type = "application/problem+json"),
        service_kit::problem::responses::Internal,
    )
)]
/// `GET /v1/ledger` — the caller's movements, a page at a time.
pub async fn list(
    State(state): State<AppState>,
    axum::Extension(caller): axum::Extension<idempotency::Scope>,
    query: Result<axum::extract::Query<LedgerQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, GatewayError> {
    let axum::extract::Query(query) = query.map_err(|e| GatewayError::BadRequest(e.body_text()))?;
    let owner = match owner(&state, &caller, query.client) {
        Ok(o) => o,
        Err(refused) => return Ok(refused.into_response()),
    };
    let limit = query.limit.unwrap_or(100);
    if !(1..=500).contains(&limit) {
        return Err(GatewayError::BadRequest("limit must be 1..=500".into()));
    }
    let entries: Vec<LedgerEntry> = sqlx::query_as(
        "SELECT id, kind, order_id, amount_cents, status, client_id, idempotency_key, created_at
         FROM ledger WHERE client_id = $1 AND ($2::uuid IS NULL OR id > $2)
         ORDER BY id LIMIT $3",
    )
    .bind(&owner)
    .bind(query.after)
    .bind(limit)
    .fetch_all(&state.pool)
    .await?;
    let next_after = (entries.len() as i64 == limit)
        .then(|| entries.last().map(|e| e.id))
        .flatten();
    Ok(Json(LedgerPage { entries, next_after }).into_response())
}

/// `GET /v1/operations/{key}` — what the gateway did under Idempotency-Key
/// `key` of the calling client (or, under a grant, of `client`): the
/// movement, or 404 when nothing was committed under it (never asked,
/// refused before commit, or still in flight). Reconciliation asks this
/// instead of guessing.
#[utoipa::path(
    get,
    path = "/v1/operations/{key}",
    tag = "gateway",
    params(
        ("key" = String, Path, description = "the Idempotency-Key the operation was made with"),
        ("client" = Option<String>, Query, description = "whose key (default: the caller; another only under a GATEWAY_READERS grant)"),
    ),
    responses(
        (status = 200, description = "The movement made under the key", body = LedgerEntry),
        service_kit::problem::responses::BadQuery,
        service_kit::problem::responses::NoCredential,
        (status = 403, description = "No read grant (GATEWAY_GRANTS), or another caller's key without a GATEWAY_READERS grant", body = service_kit::problem::Problem, content_type = "application/problem+json"),
        (status = 404, description = "Nothing committed under the key", body = service_kit::problem::Problem, content_type = "application/problem+json"),
        service_kit::problem::responses::Internal,
    )
)]
pub async fn operation(
    State(state): State<AppState>,
    axum::Extension(caller): axum::Extension<idempotency::Scope>,
    axum::extract::Path(key): axum::extract::Path<String>,
    query: Result<axum::extract::Query<LedgerQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, GatewayError> {
    let axum::extract::Query(query) = query.map_err(|e| GatewayError::BadRequest(e.body_text()))?;
    let client = match owner(&state, &caller, query.client) {
        Ok(o) => o,
        Err(refused) => return Ok(refused.into_response()),
    };
    // No key has a NUL (PostgreSQL cannot compare a text with one): none found.
    let entry: Option<LedgerEntry> = if key.contains('\0') {
        None
    } else {
        sqlx::query_as(
            "SELECT id, kind, order_id, amount_cents, status, client_id, idempotency_key, created_at
             FROM ledger WHERE client_id = $1 AND idempotency_key = $2 ORDER BY created_at, id LIMIT 1",
        )
        .bind(&client)
        .bind(&key)
        .fetch_optional(&state.pool)
        .await?
    };
    telemetry::metrics::incr(
        "gateway_operation_lookups_total",
        &[("found", if entry.is_some() { "true" } else { "false" })],
    );
    Ok(match entry {
        Some(e) => Json(e).into_response(),
        None => Problem::new(
            StatusCode::NOT_FOUND,
            "/problems/not-found",
            "No such operation",
            format!("nothing was committed under key {key:?} for client {client:?}"),
        )
        .into_response(),
    })
}

/// Parses a request body; the error names the field, never the value.
pub(crate) fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, GatewayError> {
    service_kit::problem::parse_json(body)
        .map_err(|e| GatewayError::BadRequest(format!("invalid body: {}", e.detail())))
}

async fn insert(
    conn: &mut PgConnection,
    kind: EntryKind,
    order_id: Uuid,
    amount_cents: i64,
    status: EntryStatus,
    client: &str,
    key: &str,
) -> Result<Uuid, GatewayError> {
    let id = Uuid::now_v7();
    sqlx::query(
        "INSERT INTO ledger (id, kind, order_id, amount_cents, status, client_id, idempotency_key)
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
    )
    .bind(id)
    .bind(kind)
    .bind(order_id)
    .bind(amount_cents)
    .bind(status)
    .bind(client)
    .bind(key)
    .execute(conn)
    .await?;
    Ok(id)
}

/// Records a charge on the card behind `token` — declined when the issuer
/// declines every charge on that card, captured otherwise — reading the
/// card and writing the entry in one statement. `None` when the vault never
/// issued `token` (nothing written).
async fn insert_charge(
    conn: &mut PgConnection,
    token: &str,
    order_id: Uuid,
    amount_cents: i64,
    client: &str,
    key: &str,
) -> Result<Option<(Uuid, EntryStatus)>, GatewayError> {
    let id = Uuid::now_v7();
    let status: Option<EntryStatus> = sqlx::query_scalar(
        "INSERT INTO ledger (id, kind, order_id, amount_cents, status, client_id, idempotency_key)
         SELECT $1, $2, $3, $4, CASE WHEN t.declines THEN $5 ELSE $6 END, $7, $8
         FROM card_tokens t WHERE t.token = $9
         RETURNING status",
    )
    .bind(id)
    .bind(EntryKind::Charge)
    .bind(order_id)
    .bind(amount_cents)
    .bind(EntryStatus::Declined)
    .bind(EntryStatus::Captured)
    .bind(client)
    .bind(key)
    .bind(token)
    .fetch_optional(conn)
    .await?;
    Ok(status.map(|status| (id, status)))
}

/// A keyed request's start, with the configured faults around it: the
/// latency, the claim of its key ([`idempotency::begin`]), and an injected
/// failure before anything is written (nothing stored: the retry runs).
async fn begin(state: &AppState, request: &Idempotent, faults: &Faults) -> Result<Begun<'static>, GatewayError> {
    if faults.latency_ms > 0 {
        tokio::time::sleep(Duration::from_millis(faults.latency_ms)).await;
    }
    let begun = idempotency::begin(&state.pool, request.keyed()).await?;
    if let Begun::New(tx) = begun {
        if FaultSwitch::roll(faults.fail_rate) {
            telemetry::metrics::incr("gateway_injected_faults_total", &[("fault", "fail_before_commit")]);
            tx.rollback().await?;
            return Err(GatewayError::Unavailable);
        }
        return Ok(Begun::New(tx));
    }
    Ok(begun)
}

/// A keyed request's end: the movement, or a refusal that is the request's
/// final answer (422, stored under the key like a movement), stored and
/// committed ([`idempotency::finish`]); any other error rolls back, so the
/// retry runs again. Then the injected hang past the client's timeout.
async fn complete(
    state: &AppState,
    request: &Idempotent,
    faults: &Faults,
    tx: Transaction<'static, Postgres>,
    result: Result<StoredResponse, GatewayError>,
) -> Result<Response, GatewayError> {
    let (pool, ttl) = (&state.pool, state.key_ttl);
    let outcome = idempotency::finish(pool, tx, request.keyed(), ttl, result, |e: &GatewayError| {
        matches!(e, GatewayError::Unprocessable(_)).then(|| {
            let p = e.problem();
            StoredResponse::json(p.status_code(), &p, PROBLEM_JSON)
        })
    })
    .await?;
    if matches!(outcome, Outcome::Completed(_)) && FaultSwitch::roll(faults.timeout_after_commit_rate) {
        telemetry::metrics::incr("gateway_injected_faults_total", &[("fault", "timeout_after_commit")]);
        tracing::warn!("committed; now hanging past the client's timeout");
        tokio::time::sleep(Duration::from_millis(faults.hang_ms)).await;
    }
    Ok(idempotency::respond(outcome)?)
}
