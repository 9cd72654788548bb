//! What each caller may do at the gateway (`GATEWAY_GRANTS`): a known
//! credential is not enough — order-api tokenises cards, sends notices and
//! looks up operations; payment-service charges, refunds and looks up. A
//! caller's request on a route it has no grant for is refused with a 403
//! (`api_refusals_total{reason="forbidden"}`), before its handler runs.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use service_kit::problem::Problem;

/// One thing a caller may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Permission {
    /// `POST /v1/tokens`.
    Tokenise,
    /// `POST /v1/charges`.
    Charge,
    /// `POST /v1/refunds`.
    Refund,
    /// `GET /v1/operations/{key}` and `GET /v1/ledger` (within `GATEWAY_READERS`).
    Read,
    /// `POST /v1/notices`.
    Notify,
}

impl Permission {
    const ALL: [Permission; 5] = [
        Permission::Tokenise,
        Permission::Charge,
        Permission::Refund,
        Permission::Read,
        Permission::Notify,
    ];

    /// Its name in `GATEWAY_GRANTS`.
    pub fn name(self) -> &'static str {
        match self {
            Permission::Tokenise => "tokenise",
            Permission::Charge => "charge",
            Permission::Refund => "refund",
            Permission::Read => "read",
            Permission::Notify => "notify",
        }
    }
}

service_kit::problem_response!(
    /// 403 of a route the caller has no grant for.
    NoGrant,
    403,
    "The caller has no grant for this route (GATEWAY_GRANTS)"
);

/// The grants of the two services of the saga.
pub const DEFAULT: &str = "order-api=tokenise+read+notify,payment-service=charge+refund+read";

/// Each caller's permissions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grants(Arc<BTreeMap<String, BTreeSet<Permission>>>);

impl Grants {
    /// Whether `caller` may do `what`.
    pub fn allows(&self, caller: &str, what: Permission) -> bool {
        self.0.get(caller).is_some_and(|p| p.contains(&what))
    }
}

impl Default for Grants {
    fn default() -> Self {
        DEFAULT.parse().expect("the default grants parse")
    }
}

impl std::str::FromStr for Grants {
    type Err = String;

    /// `caller=permission+permission[,caller=…]`.
    fn from_str(s: &str) -> Result<Self, String> {
        let mut grants = BTreeMap::new();
        for entry in s.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let (caller, list) = entry
                .split_once('=')
                .filter(|(c, _)| !c.is_empty())
                .ok_or_else(|| format!("{entry:?}: each grant is caller=permission+permission"))?;
            let mut permissions = BTreeSet::new();
            for name in list.split('+').map(str::trim) {
                let p = Permission::ALL.into_iter().find(|p| p.name() == name).ok_or_else(|| {
                    let known: Vec<_> = Permission::ALL.iter().map(|p| p.name()).collect();
                    format!("{caller}: unknown permission {name:?} (known: {})", known.join(", "))
                })?;
                permissions.insert(p);
            }
            if grants.insert(caller.to_owned(), permissions).is_some() {
                return Err(format!("{caller}: granted twice"));
            }
        }
        Ok(Self(Arc::new(grants)))
    }
}

/// The middleware of a route that needs `what`: runs after the bearer
/// check (which names the caller).
pub async fn require(State((grants, what)): State<(Grants, Permission)>, req: Request, next: Next) -> Response {
    let caller = req
        .extensions()
        .get::<idempotency::Scope>()
        .map(|s| s.0.clone())
        .unwrap_or_default();
    if grants.allows(&caller, what) {
        return next.run(req).await;
    }
    telemetry::metrics::incr("api_refusals_total", &[("reason", "forbidden")]);
    Problem::new(
        StatusCode::FORBIDDEN,
        "/problems/forbidden",
        "Forbidden",
        format!("caller {caller:?} has no grant to {}", what.name()),
    )
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::{Grants, Permission};

    #[test]
    fn the_default_grants_split_the_work_between_the_two_services() {
        let g = Grants::default();
        assert!(g.allows("order-api", Permission::Tokenise));
        assert!(!g.allows("order-api", Permission::Charge));
        assert!(!g.allows("order-api", Permission::Refund));
        assert!(g.allows("payment-service", Permission::Charge));
        assert!(g.allows("payment-service", Permission::Read));
        assert!(!g.allows("payment-service", Permission::Tokenise));
        assert!(!g.allows("someone", Permission::Read));
    }

    #[test]
    fn malformed_grants_are_refused_with_the_reason() {
        for (text, says) in [
            ("order-api", "caller=permission"),
            ("order-api=fly", "unknown permission"),
            ("a=read,a=charge", "granted twice"),
        ] {
            let e = text.parse::<Grants>().unwrap_err();
            assert!(e.contains(says), "{text}: {e}");
        }
    }
}
