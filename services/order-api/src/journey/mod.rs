//! One order's journey, on the admin port: `GET /orders/{id}/journey` (JSON)
//! and `GET /journey?order={id}` (a page drawing it as a timeline). Every
//! step the order took, from the databases that hold it: its states
//! (order-api's history), each message an outbox wrote for it and when the
//! relay published it, each inbox that applied one — where in the log the
//! applied copy was read and how many redeliveries of it were absorbed —
//! payment-service's operations and what the gateway recorded under their
//! keys, and the trace. order-api reads its own database; the participants
//! answer for theirs on their admin ports (`saga_kit::journey`,
//! payment-service's `GET /payments/{order_id}`).

use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::Json;
use chrono::{DateTime, Utc};
use saga_kit::journey::{Part, PaymentRecord, Received, Sent};
use serde::Serialize;
use service_kit::problem::Problem;
use uuid::Uuid;

use crate::AppState;

pub mod recent;

/// Where the parts of a journey are, besides order-api's own database.
#[derive(Debug, Clone, clap::Args)]
pub struct JourneyArgs {
    /// inventory-service's admin endpoints (its `ADMIN_ADDR`), e.g.
    /// `http://inventory-service:9181`; unset: the journey leaves its part out.
    #[arg(long, env = "INVENTORY_ADMIN_URL")]
    pub inventory_admin_url: Option<String>,
    /// payment-service's admin endpoints (its `ADMIN_ADDR`).
    #[arg(long, env = "PAYMENT_ADMIN_URL")]
    pub payment_admin_url: Option<String>,
    /// Jaeger's UI, for the journey page's link to the order's trace.
    #[arg(long, env = "JAEGER_UI_URL", default_value = "http://127.0.0.1:16686")]
    pub jaeger_ui_url: String,
    /// Where an operator's browser reaches this admin port, such as
    /// `http://127.0.0.1:9180`; set, every answer about one order on the
    /// API carries `Link: <…/journey?order=<id>>; rel="journey"`.
    #[arg(long, env = "JOURNEY_PUBLIC_URL")]
    pub public_url: Option<String>,
    /// order-api's credential at the participants' admin ports (each one's
    /// `ADMIN_READERS` names it); unset: their parts are refused and the
    /// journey says so.
    #[arg(
        long,
        env = "PARTICIPANTS_ADMIN_KEY",
        value_name = "PARTICIPANTS_ADMIN_KEY",
        hide_env_values = true
    )]
    pub participants_admin_key: Option<service_kit::Secret>,
    /// Journeys drawn at once; one more is answered 503 with `Retry-After`
    /// at once: each fans out to two participants and the gateway.
    #[arg(long, env = "JOURNEY_MAX_IN_FLIGHT", default_value_t = 4)]
    pub journey_max_in_flight: usize,
}

/// The admin router's state: order-api's own, and where the rest is.
#[derive(Clone)]
pub struct Sources {
    state: AppState,
    args: JourneyArgs,
    http: reqwest::Client,
    in_flight: std::sync::Arc<tokio::sync::Semaphore>,
}

impl Sources {
    /// The sources of `state`'s journeys.
    pub fn new(state: AppState, args: JourneyArgs) -> Self {
        let http = reqwest::Client::builder()
            .timeout(std::time::Duration::from_secs(3))
            .build()
            .expect("an HTTP client with a timeout builds");
        let in_flight = std::sync::Arc::new(tokio::sync::Semaphore::new(args.journey_max_in_flight.max(1)));
        Self {
            state,
            args,
            http,
            in_flight,
        }
    }
}

/// A step of the journey.
#[derive(Debug, Clone, Serialize)]
pub struct Step {
    /// When it happened.
    pub at: DateTime<Utc>,
    /// The process that took it.
    pub service: &'static str,
    /// `state`, `sent`, `published`, `received`, `payment` or `gateway`.
    pub kind: &'static str,
    /// What happened, in a line.
    pub what: String,
    /// The message it concerns.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event_id: Option<Uuid>,
    /// The message's topic.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub topic: Option<String>,
    /// Where in the log the applied copy was read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partition: Option<i32>,
    /// Its offset there.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub offset: Option<i64>,
    /// Copies delivered again and absorbed by the inbox.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redeliveries: Option<i32>,
    /// A gateway Idempotency-Key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

impl Step {
    fn new(at: DateTime<Utc>, service: &'static str, kind: &'static str, what: String) -> Self {
        Self {
            at,
            service,
            kind,
            what,
            event_id: None,
            topic: None,
            partition: None,
            offset: None,
            redeliveries: None,
            key: None,
        }
    }
}

/// An order's journey.
#[derive(Debug, Clone, Serialize)]
pub struct Journey {
    /// The order as it is now.
    pub order: crate::orders::Order,
    /// Its trace, from the trace context its first message carries.
    pub trace_id: Option<String>,
    /// The trace in Jaeger's UI.
    pub trace_url: Option<String>,
    /// Every step, oldest first.
    pub steps: Vec<Step>,
    /// Parts that could not be read (a participant not configured or not
    /// answering): the journey is whole only when this is empty.
    pub missing: Vec<String>,
}

/// `GET /orders/{id}/journey`: at most `JOURNEY_MAX_IN_FLIGHT` at once.
pub async fn show(State(src): State<Sources>, Path(id): Path<Uuid>) -> Response {
    let Ok(_permit) = src.in_flight.clone().try_acquire_owned() else {
        telemetry::metrics::incr("api_refusals_total", &[("reason", "journeys_in_flight")]);
        let mut busy = Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "/problems/overloaded",
            "Overloaded",
            "as many journeys as allowed are being drawn; try again in a second",
        )
        .into_response();
        busy.headers_mut()
            .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
        return busy;
    };
    match of(&src, id).await {
        Ok(Some(j)) => Json(j).into_response(),
        Ok(None) => (StatusCode::NOT_FOUND, format!("no order {id}")).into_response(),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("orders database: {e}")).into_response(),
    }
}

/// `GET /journey?order={id}`: the page.
pub async fn page() -> impl IntoResponse {
    ([(header::CACHE_CONTROL, "no-store")], Html(include_str!("page.html")))
}

/// The journey of order `id` (None: no such order).
pub async fn of(src: &Sources, id: Uuid) -> sqlx::Result<Option<Journey>> {
    let pool = &src.state.pool;
    let mut conn = pool.acquire().await?;
    let Some(order) = crate::orders::get(&mut conn, id).await? else {
        return Ok(None);
    };
    let history = crate::orders::history(&mut conn, id).await?;
    drop(conn);
    let commands = saga_kit::journey::sent(pool, id).await?;
    // The trace context of the order's first message: version, trace id, span id, flags.
    let trace_id = commands
        .iter()
        .find_map(|s| s.traceparent.as_deref())
        .and_then(|t| t.split('-').nth(1))
        .map(str::to_owned);
    let mut missing = Vec::new();
    let ids: Vec<Uuid> = commands.iter().map(|s| s.event_id).collect();
    let inventory = src
        .part(
            src.args.inventory_admin_url.as_deref(),
            "inventory-service",
            id,
            &ids,
            &mut missing,
        )
        .await;
    let payment = src
        .part(
            src.args.payment_admin_url.as_deref(),
            "payment-service",
            id,
            &ids,
            &mut missing,
        )
        .await;
    let replies: Vec<Uuid> = inventory.sent.iter().chain(&payment.sent).map(|s| s.event_id).collect();
    let saga_received = saga_kit::journey::received(pool, &replies).await?;
    let payments = src.payments(id, &mut missing).await;

    let mut steps: Vec<Step> = history
        .iter()
        .map(|h| {
            let from = h.from_status.map_or("—", crate::orders::Status::as_str);
            let what = if h.applied {
                format!("{from} → {} ({})", h.to_status.as_str(), h.cause)
            } else {
                format!("{} ignored in {from}: not legal there", h.cause)
            };
            let mut step = Step::new(h.at, "order-api", "state", what);
            step.event_id = h.event_id;
            step
        })
        .collect();
    for (service, part) in [
        (
            "order-api",
            &Part {
                sent: commands,
                received: saga_received,
            },
        ),
        ("inventory-service", &inventory),
        ("payment-service", &payment),
    ] {
        steps.extend(part.sent.iter().flat_map(|s| sent_steps(service, s)));
        steps.extend(part.received.iter().map(|r| received_step(service, r)));
    }
    for p in &payments {
        let mut step = Step::new(
            p.created_at,
            "payment-service",
            "payment",
            format!(
                "{} of {} cents recorded PENDING, then the gateway called",
                p.kind, p.amount_cents
            ),
        );
        step.key = Some(p.idempotency_key.clone());
        steps.push(step);
        let answer = match src.state.gateway.lookup(&p.idempotency_key).await {
            Ok(Some(op)) => format!("ledger entry {}: {:?} {:?}", op.id, op.kind, op.status),
            Ok(None) => "nothing recorded under this key".to_owned(),
            Err(e) => {
                missing.push(format!("mock-gateway: {e}"));
                "not readable now".to_owned()
            }
        };
        let settled = match p.reconciled_at {
            Some(_) => "settled by the reconciler's look-up",
            None => "settled by the call's answer",
        };
        let mut step = Step::new(
            p.updated_at,
            "mock-gateway",
            "gateway",
            format!(
                "{} {}: {answer}; {settled} after {} call(s)",
                p.kind, p.status, p.attempts
            ),
        );
        step.key = Some(p.idempotency_key.clone());
        steps.push(step);
    }
    steps.sort_by_key(|s| s.at);
    let trace_url = trace_id
        .as_ref()
        .map(|t| format!("{}/trace/{t}", src.args.jaeger_ui_url.trim_end_matches('/')));
    Ok(Some(Journey {
        order,
        trace_id,
        trace_url,
        steps,
        missing,
    }))
}

fn sent_steps(service: &'static str, s: &Sent) -> Vec<Step> {
    let mut written = Step::new(
        s.created_at,
        service,
        "sent",
        format!("{} written to the outbox", s.event_type),
    );
    written.event_id = Some(s.event_id);
    written.topic = Some(s.topic.clone());
    let mut out = vec![written];
    if let Some(at) = s.published_at {
        let retried = if s.attempts > 1 {
            format!(" after {} attempts", s.attempts)
        } else {
            String::new()
        };
        // Marked once the broker acknowledged it: a copy published before a
        // crash of the relay may have been applied before this mark.
        let what = format!("{} marked published{retried}", s.event_type);
        let mut published = Step::new(at, "outbox-relay", "published", what);
        published.event_id = Some(s.event_id);
        published.topic = Some(s.topic.clone());
        out.push(published);
    }
    out
}

fn received_step(service: &'static str, r: &Received) -> Step {
    let absorbed = match r.redeliveries {
        0 => String::new(),
        n => format!("; {n} redelivered cop{} absorbed", if n == 1 { "y" } else { "ies" }),
    };
    let mut step = Step::new(
        r.processed_at,
        service,
        "received",
        format!("applied by {}, with its inbox row{absorbed}", r.consumer),
    );
    step.event_id = Some(r.event_id);
    step.partition = r.partition;
    step.offset = r.offset;
    step.redeliveries = Some(r.redeliveries);
    step
}

impl Sources {
    /// A participant's part, or an empty one named in `missing`.
    async fn part(&self, base: Option<&str>, name: &str, id: Uuid, events: &[Uuid], missing: &mut Vec<String>) -> Part {
        let Some(base) = base else {
            missing.push(format!("{name}: no admin URL configured"));
            return Part::default();
        };
        let events: Vec<String> = events.iter().map(Uuid::to_string).collect();
        let url = format!("{}/journey/{id}", base.trim_end_matches('/'));
        match self.get_json(&url, &[("events", events.join(","))]).await {
            Ok(part) => part,
            Err(e) => {
                missing.push(format!("{name}: {e}"));
                Part::default()
            }
        }
    }

    /// payment-service's operations for the order.
    async fn payments(&self, id: Uuid, missing: &mut Vec<String>) -> Vec<PaymentRecord> {
        let Some(base) = self.args.payment_admin_url.as_deref() else {
            return Vec::new();
        };
        let url = format!("{}/payments/{id}", base.trim_end_matches('/'));
        self.get_json(&url, &[]).await.unwrap_or_else(|e| {
            missing.push(format!("payment-service's operations: {e}"));
            Vec::new()
        })
    }

    async fn get_json<T: serde::de::DeserializeOwned>(&self, url: &str, query: &[(&str, String)]) -> anyhow::Result<T> {
        let mut get = self.http.get(url).query(query);
        if let Some(key) = &self.args.participants_admin_key {
            get = get.bearer_auth(key.expose());
        }
        let r = get.send().await?;
        anyhow::ensure!(r.status().is_success(), "{url} answered {}", r.status());
        Ok(r.json().await?)
    }
}
