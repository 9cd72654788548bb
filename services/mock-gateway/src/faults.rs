//! Fault injection: what a flaky payment provider does to its clients.
//!
//! - `latency_ms`: added before any work;
//! - `fail_rate`: 503 **before** committing (nothing charged; a retry is safe);
//! - `timeout_after_commit_rate`: commit the charge, then hang past the
//!   client's timeout — the ambiguous case, where only the idempotency key
//!   makes the client's retry safe.

use std::sync::RwLock;

use axum::extract::State;
use axum::Json;
use rand::Rng;
use serde::{Deserialize, Serialize};

use crate::AppState;

/// Fault settings.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, clap::Args)]
pub struct Faults {
    /// Latency added to every charge/refund, in milliseconds.
    #[arg(long, env = "GATEWAY_LATENCY_MS", default_value_t = 0)]
    #[serde(default)]
    pub latency_ms: u64,
    /// Probability (0..=1) of a 503 before committing.
    #[arg(long, env = "GATEWAY_FAIL_RATE", default_value_t = 0.0)]
    #[serde(default)]
    pub fail_rate: f64,
    /// Probability (0..=1) of committing, then hanging for `hang_ms`.
    #[arg(long, env = "GATEWAY_TIMEOUT_AFTER_COMMIT_RATE", default_value_t = 0.0)]
    #[serde(default)]
    pub timeout_after_commit_rate: f64,
    /// Refuse every refund (422, stored under its key): the refund that
    /// cannot be made, which sends an order to manual review.
    #[arg(long, env = "GATEWAY_REFUSE_REFUNDS", default_value_t = false, action = clap::ArgAction::Set)]
    #[serde(default)]
    pub refuse_refunds: bool,
    /// How long a "timeout after commit" hangs, in milliseconds.
    #[arg(long, env = "GATEWAY_HANG_MS", default_value_t = 30_000)]
    #[serde(default = "default_hang")]
    pub hang_ms: u64,
}

impl Faults {
    /// Whether any fault is on (`hang_ms` alone is none).
    pub fn any(&self) -> bool {
        self.latency_ms > 0 || self.fail_rate > 0.0 || self.timeout_after_commit_rate > 0.0 || self.refuse_refunds
    }
}

fn default_hang() -> u64 {
    30_000
}

/// The current faults, changeable at run time.
#[derive(Debug)]
pub struct FaultSwitch(RwLock<Faults>);

impl FaultSwitch {
    /// Starts with `faults`.
    pub fn new(faults: Faults) -> Self {
        Self(RwLock::new(faults))
    }

    /// A snapshot of the current faults.
    pub fn current(&self) -> Faults {
        self.0.read().expect("faults lock").clone()
    }

    fn set(&self, faults: Faults) {
        *self.0.write().expect("faults lock") = faults;
    }

    /// Rolls the dice for a fault with probability `rate`.
    pub fn roll(rate: f64) -> bool {
        rate > 0.0 && rand::thread_rng().gen_bool(rate.clamp(0.0, 1.0))
    }
}

/// `GET /admin/faults`.
pub async fn get(State(state): State<AppState>) -> Json<Faults> {
    Json(state.faults.current())
}

/// `PUT /admin/faults` — replaces the faults.
pub async fn put(State(state): State<AppState>, Json(faults): Json<Faults>) -> Json<Faults> {
    tracing::warn!(?faults, "faults changed");
    state.faults.set(faults.clone());
    Json(faults)
}
