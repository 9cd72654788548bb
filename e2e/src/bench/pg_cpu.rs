//! PostgreSQL's CPU split by whom it worked for. One server holds the
//! system's three databases, the gateway stand-in's and the driver's
//! queries; "postgres" in the all-processes figure is all of them. Each
//! backend is a process of its own, so its CPU (`/proc/<pid>/stat`) is
//! charged to its database and role as `pg_stat_activity` names them:
//!
//! - a service's role (or an autovacuum worker) on `orders`, `inventory` or
//!   `payments`: that database — **the system's**;
//! - the server's own processes with no database (WAL writer, checkpointer,
//!   background writer, the launchers): **shared**, the system's too (the
//!   stand-in's share of WAL is small, and counting it errs high);
//! - anything on the gateway's database, and any role that is not a
//!   service's (the driver's latency and queue reads, as the superuser):
//!   **not the system's**.
//!
//! What no backend was seen doing — the postmaster, a backend that came and
//! went between two samples — is the rest of the server's processes' CPU:
//! reported as `unattributed` and counted as the system's (erring high).

use std::collections::BTreeMap;
use std::time::Duration;

use sqlx::{Connection as _, PgConnection, Row as _};

use crate::{Service, Stack};

/// How often backends are listed: a backend that lives shorter than this is
/// `unattributed`.
const EVERY: Duration = Duration::from_millis(100);

/// The label of the server's processes no database is named for.
pub const SHARED: &str = "postgres: shared (WAL, checkpoints, launchers)";
/// The label of what the samples did not see.
pub const UNATTRIBUTED: &str = "postgres: unattributed (postmaster, short-lived backends)";
/// The label of the gateway stand-in's database.
pub const GATEWAY: &str = "postgres: the gateway stand-in's database";
/// The label of the driver's queries.
pub const DRIVER: &str = "postgres: the driver's queries";

/// Who a backend works for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backend {
    /// Its database (`None`: a server process of no database).
    pub database: Option<String>,
    /// Its role (`None`: not a client's: autovacuum, a server process).
    pub role: Option<String>,
    /// `pg_stat_activity.backend_type`.
    pub kind: String,
}

/// The databases and roles of one stack, to charge a [`Backend`] to.
#[derive(Debug, Clone)]
pub struct Owners {
    /// Full database name → the label of the system's database.
    pub system: BTreeMap<String, String>,
    /// The gateway stand-in's database.
    pub gateway: String,
    /// The services' roles (the relay's too; not the gateway's).
    pub roles: Vec<String>,
}

impl Owners {
    /// The stack's databases and roles.
    pub fn of(stack: &Stack) -> Self {
        Self {
            system: ["orders", "inventory", "payments"]
                .into_iter()
                .map(|db| (stack.db_name(db), format!("postgres: {db}")))
                .collect(),
            gateway: stack.db_name("gateway"),
            roles: [Service::OrderApi, Service::Inventory, Service::Payment, Service::Relay]
                .into_iter()
                .filter_map(|s| stack.db_role(s).map(str::to_owned))
                .collect(),
        }
    }

    /// The label `backend`'s CPU is charged to.
    pub fn label(&self, backend: &Backend) -> String {
        let Some(db) = &backend.database else {
            return SHARED.to_owned();
        };
        if *db == self.gateway {
            return GATEWAY.to_owned();
        }
        let a_service = match &backend.role {
            Some(role) => self.roles.contains(role),
            None => backend.kind == "autovacuum worker",
        };
        match self.system.get(db) {
            Some(label) if a_service => label.clone(),
            _ => DRIVER.to_owned(),
        }
    }

    /// Whether `label` is the system's own.
    pub fn is_system(&self, label: &str) -> bool {
        label == SHARED || label == UNATTRIBUTED || self.system.values().any(|l| l == label)
    }
}

/// Lists the server's backends every 100 ms until finished.
pub struct Sampler {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<BTreeMap<u32, (String, f64, f64)>>,
    owners: Owners,
    server_before: f64,
}

impl Sampler {
    /// Starts listing `stack`'s backends (as the superuser, on `orders`).
    pub fn start(stack: &Stack) -> Self {
        let (url, owners) = (stack.db_url("orders"), Owners::of(stack));
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let task = tokio::spawn({
            let owners = owners.clone();
            async move { sample(&url, &owners, stopped).await }
        });
        Self {
            stop,
            task,
            owners,
            server_before: server_seconds(),
        }
    }

    /// Stops, and returns CPU milliseconds per order by label over the
    /// sampled window, for `orders` orders.
    pub async fn finish(self, orders: usize) -> BTreeMap<String, f64> {
        let _ = self.stop.send(());
        let seen = self.task.await.unwrap_or_default();
        let server = server_seconds() - self.server_before;
        split(&seen, server, orders)
    }

    /// Of [`Sampler::finish`]'s split, the system's own milliseconds per order.
    pub fn system_ms(owners: &Owners, split: &BTreeMap<String, f64>) -> f64 {
        split
            .iter()
            .filter(|(l, _)| owners.is_system(l))
            .map(|(_, ms)| ms)
            .sum()
    }

    /// The stack's owners, for [`Sampler::system_ms`].
    pub fn owners(&self) -> &Owners {
        &self.owners
    }
}

/// CPU seconds of every process named `postgres` now.
fn server_seconds() -> f64 {
    testkit::process::cpu_seconds_by_command()
        .get("postgres")
        .copied()
        .unwrap_or(0.0)
}

/// Per label, ms per order: each backend's CPU from its first sample (0 if
/// it began after the first listing) to its last; the server's processes'
/// CPU over the window that no backend accounts for is [`UNATTRIBUTED`].
pub fn split(seen: &BTreeMap<u32, (String, f64, f64)>, server_secs: f64, orders: usize) -> BTreeMap<String, f64> {
    let per = |secs: f64| secs * 1000.0 / orders.max(1) as f64;
    let mut out: BTreeMap<String, f64> = BTreeMap::new();
    let mut attributed = 0.0;
    for (label, first, last) in seen.values() {
        let used = (last - first).max(0.0);
        attributed += used;
        *out.entry(label.clone()).or_default() += per(used);
    }
    out.insert(UNATTRIBUTED.to_owned(), per((server_secs - attributed).max(0.0)));
    out
}

/// pid → (label, CPU seconds at its first sample, at its last).
async fn sample(
    url: &str,
    owners: &Owners,
    mut stop: tokio::sync::oneshot::Receiver<()>,
) -> BTreeMap<u32, (String, f64, f64)> {
    let mut seen: BTreeMap<u32, (String, f64, f64)> = BTreeMap::new();
    let Ok(mut conn) = PgConnection::connect(url).await else {
        return seen;
    };
    let mut first_listing = true;
    loop {
        if let Ok(rows) = sqlx::query(
            "SELECT pid, datname::text AS db, usename::text AS role, coalesce(backend_type, '') AS kind
             FROM pg_stat_activity",
        )
        .fetch_all(&mut conn)
        .await
        {
            for row in rows {
                let pid = row.get::<i32, _>("pid") as u32;
                let cpu = testkit::process::cpu_seconds_of(pid);
                let backend = Backend {
                    database: row.get("db"),
                    role: row.get("role"),
                    kind: row.get("kind"),
                };
                let entry = seen.entry(pid).or_insert_with(|| {
                    let start = if first_listing { cpu } else { 0.0 };
                    (owners.label(&backend), start, cpu)
                });
                entry.2 = entry.2.max(cpu);
            }
            first_listing = false;
        }
        tokio::select! {
            _ = &mut stop => break,
            _ = tokio::time::sleep(EVERY) => {}
        }
    }
    let _ = conn.close().await;
    seen
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owners() -> Owners {
        Owners {
            system: [("b_orders", "postgres: orders"), ("b_inventory", "postgres: inventory")]
                .into_iter()
                .map(|(a, b)| (a.to_owned(), b.to_owned()))
                .collect(),
            gateway: "b_gateway".into(),
            roles: vec!["b_order_api".into(), "b_outbox_relay".into()],
        }
    }

    fn backend(db: Option<&str>, role: Option<&str>, kind: &str) -> Backend {
        Backend {
            database: db.map(str::to_owned),
            role: role.map(str::to_owned),
            kind: kind.to_owned(),
        }
    }

    #[test]
    fn each_backend_is_charged_to_whom_it_works_for() {
        let o = owners();
        let label = |db, role, kind| o.label(&backend(db, role, kind));
        assert_eq!(
            label(Some("b_orders"), Some("b_order_api"), "client backend"),
            "postgres: orders"
        );
        assert_eq!(
            label(Some("b_inventory"), Some("b_outbox_relay"), "client backend"),
            "postgres: inventory"
        );
        assert_eq!(label(Some("b_orders"), None, "autovacuum worker"), "postgres: orders");
        assert_eq!(label(Some("b_orders"), Some("postgres"), "client backend"), DRIVER);
        assert_eq!(label(Some("b_gateway"), Some("b_order_api"), "client backend"), GATEWAY);
        assert_eq!(label(None, None, "checkpointer"), SHARED);
        assert!(o.is_system("postgres: orders") && o.is_system(SHARED) && o.is_system(UNATTRIBUTED));
        assert!(!o.is_system(DRIVER) && !o.is_system(GATEWAY));
    }

    #[test]
    fn a_backend_counts_its_window_and_the_rest_is_unattributed() {
        let seen: BTreeMap<u32, (String, f64, f64)> = [
            (1, ("postgres: orders".to_owned(), 10.0, 12.0)),
            (2, ("postgres: orders".to_owned(), 0.0, 1.0)),
            (3, (DRIVER.to_owned(), 5.0, 5.5)),
        ]
        .into_iter()
        .collect();
        let split = split(&seen, 4.0, 1000);
        assert_eq!(split["postgres: orders"], 3.0, "2 s + 1 s over 1,000 orders");
        assert_eq!(split[DRIVER], 0.5);
        assert_eq!(split[UNATTRIBUTED], 0.5, "4 s of the server, 3.5 s seen");
        assert_eq!(Sampler::system_ms(&owners(), &split), 3.5);
    }
}
