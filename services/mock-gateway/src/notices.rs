//! The mock notifier: a provider of customer notices that, like many real
//! ones (e-mail, SMS), takes no idempotency key and simply records every
//! request it receives. Each `POST /v1/notices` is one more notice; the
//! table it writes is the ground truth of how many a customer got.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Extension;

use crate::ledger::GatewayError;
use crate::AppState;

pub use gateway_client::api::NoticeRequest;

/// `POST /v1/notices` — records the notice, whatever came before: no key,
/// no deduplication.
#[utoipa::path(
    post,
    path = "/v1/notices",
    tag = "notifier",
    request_body = NoticeRequest,
    responses(
        (status = 202, description = "Received (one more notice, every time)"),
        (status = 400, description = "Malformed body", body = service_kit::problem::Problem, content_type = "application/problem+json"),
        service_kit::problem::responses::NoCredential,
        crate::grants::NoGrant,
        (status = 422, description = "Text too long, or with a NUL", body = service_kit::problem::Problem, content_type = "application/problem+json"),
        service_kit::problem::responses::Internal,
    )
)]
pub async fn create(
    State(state): State<AppState>,
    Extension(caller): Extension<idempotency::Scope>,
    body: axum::body::Bytes,
) -> Result<Response, GatewayError> {
    let req: NoticeRequest = crate::ledger::parse(&body)?;
    if req.text.chars().count() > 1000 || req.text.contains('\0') {
        return Err(GatewayError::Unprocessable(
            "text is at most 1000 characters, none of them NUL".into(),
        ));
    }
    sqlx::query("INSERT INTO notices (order_id, client_id, text) VALUES ($1, $2, $3)")
        .bind(req.order_id)
        .bind(&caller.0)
        .bind(&req.text)
        .execute(&state.pool)
        .await?;
    telemetry::metrics::incr("gateway_notices_received_total", &[]);
    Ok(StatusCode::ACCEPTED.into_response())
}
