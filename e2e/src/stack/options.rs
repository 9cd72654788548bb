//! How a stack is started: where its files, databases and binaries are.

use std::path::PathBuf;

use anyhow::Context;

use super::Service;
#[cfg(doc)]
use super::Stack;
#[cfg(doc)]
use crate::proxy::FaultProxy;

/// How to start a stack.
#[derive(Debug, Clone)]
pub struct StackOptions {
    /// Logs (one file per process) and the broker's data live here.
    pub run_dir: PathBuf,
    /// Database name prefix: databases are `<prefix>_orders` etc. (`orders` when empty).
    pub db_prefix: String,
    /// Server part of the PostgreSQL URL, e.g. `postgres://postgres@127.0.0.1:5432`.
    pub pg_base: String,
    /// Directory holding the service binaries.
    pub bin_dir: PathBuf,
    /// Use the documented fixed ports instead of free ones.
    pub fixed_ports: bool,
    /// Also print every log line to the console, prefixed by the process name.
    pub echo: bool,
    /// Extra environment per service (faults, feature switches).
    pub extra_env: Vec<(Service, String, String)>,
    /// Route payment-service → gateway traffic through a [`FaultProxy`].
    pub gateway_proxy: bool,
    /// Kafka nodes (each broker and controller): 1, or 3 for a replicated
    /// cluster (topics with 3 replicas, `min.insync.replicas` 2).
    pub brokers: u32,
    /// Partitions of each topic (`KAFKA_PARTITIONS` of every service).
    pub partitions: i32,
    /// The services' secrets; fresh random ones when None.
    pub secrets: Option<super::Secrets>,
    /// `Some(settings)`: the stack runs a PostgreSQL cluster of its own
    /// (initdb in the run directory, its own port; `settings` appended to
    /// its `postgresql.conf`), which it can crash; `None`: the databases
    /// live on the shared server at `pg_base`.
    pub own_postgres: Option<String>,
    /// On the shared server, reach PostgreSQL through its Unix socket when
    /// it answers there (no TCP, no TLS: the local stack and the bench);
    /// off for the test stacks, whose faults act on TCP.
    pub postgres_socket: bool,
    /// Runs each service and each Kafka node under a uid of its own
    /// ([`Stack::process_uid`]), so that a partition can cut one of them
    /// off by its uid ([`testkit::partition::Cut`]).
    pub isolated_uids: bool,
    /// Dropped without [`super::Stack::shutdown`] and not while a test
    /// panics, the stack removes its run directory (a passing test leaves
    /// nothing in /tmp; a failing one its logs). Off by default: a tool that
    /// stops on an error keeps its logs.
    pub remove_run_dir_on_drop: bool,
    /// Take over databases of the stack's names that it did not make (no
    /// comment saying the stack made them): their owner and grants change.
    /// Off: such a database stops the start, named.
    pub adopt_databases: bool,
}

impl StackOptions {
    /// Options for a throw-away stack: a new temp dir, a unique database
    /// prefix, free ports, binaries next to the running executable.
    pub fn ephemeral(label: &str) -> anyhow::Result<Self> {
        let id = uuid::Uuid::new_v4().simple().to_string();
        let short = &id[..10];
        let run_dir = std::env::temp_dir().join(format!("eo-{label}-{short}"));
        std::fs::create_dir_all(&run_dir)?;
        Ok(Self {
            run_dir,
            db_prefix: format!("eo_{label}_{short}"),
            pg_base: testkit::db::server_url(),
            bin_dir: default_bin_dir()?,
            fixed_ports: false,
            adopt_databases: false,
            echo: false,
            extra_env: Vec::new(),
            gateway_proxy: false,
            brokers: 1,
            partitions: kafka::PARTITIONS,
            secrets: None,
            own_postgres: None,
            postgres_socket: false,
            isolated_uids: false,
            remove_run_dir_on_drop: false,
        })
    }
}

/// The directory of the workspace's binaries: `$EO_BIN_DIR`, else the
/// directory of the running executable (`target/<profile>`, also for test
/// binaries in `target/<profile>/deps`).
pub fn default_bin_dir() -> anyhow::Result<PathBuf> {
    if let Ok(d) = std::env::var("EO_BIN_DIR") {
        return Ok(PathBuf::from(d));
    }
    let exe = std::env::current_exe()?;
    let mut dir = exe.parent().context("executable has no directory")?.to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    Ok(dir)
}
