//! The stack's own PostgreSQL crashed on purpose: every process of the
//! server SIGKILLed at once, then started again through crash recovery.

use std::time::Duration;

use super::{Service, Stack};

/// What a crash and restart of the stack's PostgreSQL did, as seen from
/// outside the server: the old postmaster's end, the recovery in its log,
/// the new one accepting, and the services' readiness around it.
#[derive(Debug, Clone)]
pub struct PostgresRestarted {
    /// The killed postmaster and the signal that ended it.
    pub killed: testkit::postgres::cluster::Crashed,
    /// The postmaster accepting connections now.
    pub new_pid: u32,
    /// The server log after the crash shows a completed crash recovery.
    pub recovered: bool,
    /// Services that answered not-ready while the server was down.
    pub unready_while_down: Vec<Service>,
    /// Services ready again afterwards without being restarted.
    pub ready_again: Vec<Service>,
}

impl PostgresRestarted {
    /// Whether the crash is evident: the postmaster died of SIGKILL, the
    /// log shows recovery, another postmaster accepts connections.
    pub fn evident(&self) -> bool {
        self.killed.signal == Some(9) && self.recovered && self.new_pid != self.killed.pid
    }
}

impl std::fmt::Display for PostgresRestarted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names = |v: &[Service]| v.iter().map(|s| s.name()).collect::<Vec<_>>().join(", ");
        write!(
            f,
            "postmaster pid {} ended by signal {:?} with its backends; crash recovery in the log: {}; pid {} accepts; \
             not ready while down: [{}]; ready again without a restart: [{}]",
            self.killed.pid,
            self.killed.signal,
            self.recovered,
            self.new_pid,
            names(&self.unready_while_down),
            names(&self.ready_again)
        )
    }
}

/// The services whose readiness is watched around a database crash.
const WATCHED: [Service; 5] = [
    Service::Gateway,
    Service::Inventory,
    Service::Payment,
    Service::OrderApi,
    Service::Relay,
];

impl Stack {
    /// How the services reach PostgreSQL: `unix socket <dir>` or `tcp
    /// <host:port>` (a bench records it with its figures).
    pub fn postgres_transport(&self) -> String {
        let rest = self
            .opts
            .pg_base
            .split_once("://")
            .map_or(&*self.opts.pg_base, |(_, r)| r);
        let host = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
        match host.strip_prefix("%2F") {
            Some(path) => {
                let dir = path.rsplit_once(':').map_or(path, |(d, _)| d);
                format!("unix socket /{}", dir.replace("%2F", "/"))
            }
            None => format!("tcp {host}"),
        }
    }

    /// Whether this stack runs its own PostgreSQL (it can crash it).
    pub fn owns_postgres(&self) -> bool {
        self.postgres.is_some()
    }

    /// Crashes the stack's own PostgreSQL (SIGKILL to every process of the
    /// server), leaves it down for `down` while the services' readiness is
    /// asked, starts it (crash recovery) and waits up to 60 s for every
    /// running service to be ready again by itself.
    pub async fn crash_postgres(&mut self, down: Duration) -> anyhow::Result<PostgresRestarted> {
        let pg = self
            .postgres
            .as_mut()
            .ok_or_else(|| anyhow::anyhow!("this stack uses a shared PostgreSQL"))?;
        let offset = pg.log_len();
        let killed = pg.crash()?;
        let end = tokio::time::Instant::now() + down;
        let mut unready_while_down = Vec::new();
        while tokio::time::Instant::now() < end {
            let mut probes = tokio::task::JoinSet::new();
            for s in WATCHED.into_iter().filter(|s| !unready_while_down.contains(s)) {
                let (http, url) = (self.http.clone(), format!("{}/health/ready", self.admin_url(s)));
                probes.spawn(async move {
                    let answer = http.get(url).timeout(Duration::from_secs(2)).send().await;
                    (s, matches!(answer, Ok(r) if r.status().as_u16() == 503))
                });
            }
            while let Some(Ok((s, unready))) = probes.join_next().await {
                if unready {
                    unready_while_down.push(s);
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let pg = self.postgres.as_mut().expect("checked above");
        let new_pid = pg.start().await?;
        let recovered = pg.recovered_since(offset);
        let mut ready_again = Vec::new();
        for s in WATCHED {
            if self.is_running(s) && self.wait_ready(s, Duration::from_secs(60)).await.is_ok() {
                ready_again.push(s);
            }
        }
        Ok(PostgresRestarted {
            killed,
            new_pid,
            recovered,
            unready_while_down,
            ready_again,
        })
    }
}
