//! The whole system as real processes: an Apache Kafka broker (KRaft) and
//! the five services, each on a free loopback port, each service on its own freshly
//! named database. Processes are stopped by their own pids — SIGKILL for
//! crashes, SIGTERM for a clean stop — and databases are dropped at the end.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::bail;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};

use crate::proxy::FaultProxy;

mod cleanup;
mod extra;
mod observe;
mod ports;
use ports::free_port;
mod options;
mod postgres;
mod restart;
mod uids;
use uids::chown_tree;
mod kafka_identity;
mod roles;
mod secrets;
mod tls;
pub use kafka_identity::acls as kafka_acls;
pub use observe::groups_lag;
pub use options::{default_bin_dir, StackOptions};
pub use restart::{Killed, Restarted};
pub use secrets::Secrets;

/// One process of the stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Service {
    /// The Apache Kafka broker (one KRaft node, broker and controller).
    Broker,
    /// mock-gateway.
    Gateway,
    /// inventory-service.
    Inventory,
    /// payment-service.
    Payment,
    /// order-api.
    OrderApi,
    /// outbox-relay.
    Relay,
}

impl Service {
    /// Start order: broker first, relay last.
    pub const ALL: [Service; 6] = [
        Service::Broker,
        Service::Gateway,
        Service::Inventory,
        Service::Payment,
        Service::OrderApi,
        Service::Relay,
    ];

    /// Process name (also the binary name, except the broker).
    pub fn name(self) -> &'static str {
        match self {
            Service::Broker => "kafka",
            Service::Gateway => "mock-gateway",
            Service::Inventory => "inventory-service",
            Service::Payment => "payment-service",
            Service::OrderApi => "order-api",
            Service::Relay => "outbox-relay",
        }
    }

    /// The API's port under `cargo xtask up` (documented in the README);
    /// the admin port is this + 1100 (payment-service and outbox-relay
    /// serve only that one).
    fn fixed_port(self) -> u16 {
        match self {
            Service::Broker => 9092,
            Service::OrderApi => 8080,
            Service::Inventory => 8081,
            Service::Payment => 8082,
            Service::Gateway => 8083,
            Service::Relay => 8084,
        }
    }
}

/// A running stack.
pub struct Stack {
    opts: StackOptions,
    ports: BTreeMap<Service, u16>,
    /// The admin endpoints' ports (health, metrics), per service.
    admin_ports: BTreeMap<Service, u16>,
    procs: BTreeMap<Service, Child>,
    http: reqwest::Client,
    /// Kills per service, for reports.
    pub kills: BTreeMap<Service, u32>,
    /// Set by [`Stack::shutdown`]; otherwise `Drop` cleans up.
    finished: bool,
    /// Second instances of services (e.g. two inventory consumers at once).
    extras: Vec<(Service, Child)>,
    /// How the processes that ended on their own ended, last one per service.
    exits: BTreeMap<Service, std::process::ExitStatus>,
    proxy: Option<FaultProxy>,
    /// The Kafka nodes (ports); node 1 is [`Service::Broker`], formatted in
    /// `run_dir/broker`, node n > 1 in `run_dir/broker-n`.
    broker_nodes: Vec<testkit::broker::NodeSpec>,
    /// The processes of nodes 2.. (node 1's is in `procs`).
    node_procs: BTreeMap<u32, Child>,
    /// The stack's own PostgreSQL ([`StackOptions::own_postgres`]).
    postgres: Option<testkit::postgres::cluster::Cluster>,
    /// The API key the drivers use (client [`DRIVER_CLIENT`]).
    api_key: String,
    /// The services' secrets, random for this stack.
    secrets: Secrets,
    /// The CA the gateway's certificate is signed by (`run_dir/tls`).
    tls: tls::StackTls,
    /// The services' database roles.
    roles: roles::Roles,
}

/// The client the stack provisions an API key for at start.
pub const DRIVER_CLIENT: &str = "e2e-driver";

/// Replicas of the saga's topics on a cluster of `nodes`: one per node,
/// three at most.
pub fn replication_factor(nodes: usize) -> i32 {
    i32::try_from(nodes.min(3)).expect("at most 3")
}

impl Stack {
    /// Starts the broker and all services and waits until each is ready.
    pub async fn start(mut opts: StackOptions) -> anyhow::Result<Self> {
        let (mut ports, mut admin_ports) = (BTreeMap::new(), BTreeMap::new());
        for s in Service::ALL {
            let port = if opts.fixed_ports { s.fixed_port() } else { free_port()? };
            ports.insert(s, port);
            let admin = if opts.fixed_ports {
                s.fixed_port() + 1100
            } else {
                free_port()?
            };
            admin_ports.insert(s, admin);
        }
        if opts.fixed_ports {
            ports::fixed_are_free(&ports, &admin_ports)?;
        }
        std::fs::create_dir_all(opts.run_dir.join("logs"))?;
        let postgres = match &opts.own_postgres {
            Some(settings) => {
                let (dir, settings) = (opts.run_dir.join("postgres"), settings.clone());
                let mut pg =
                    tokio::task::spawn_blocking(move || testkit::postgres::cluster::Cluster::create(&dir, &settings))
                        .await??;
                pg.start().await?;
                opts.pg_base = pg.url();
                Some(pg)
            }
            None => {
                if opts.postgres_socket {
                    if let Some(socket) = testkit::postgres::socket_url(&opts.pg_base).await {
                        opts.pg_base = socket;
                    }
                }
                None
            }
        };
        let mut broker_nodes = vec![testkit::broker::NodeSpec {
            id: 1,
            port: ports[&Service::Broker],
            controller_port: if opts.fixed_ports { 9093 } else { free_port()? },
            advertised_port: ports[&Service::Broker],
        }];
        for id in 2..=opts.brokers.max(1) {
            broker_nodes.push(if opts.fixed_ports {
                let port = 9092 + 2 * (id as u16 - 1);
                testkit::broker::NodeSpec {
                    id,
                    port,
                    controller_port: port + 1,
                    advertised_port: port,
                }
            } else {
                testkit::broker::NodeSpec::free(id)?
            });
        }
        let tls = tls::StackTls::generate(opts.run_dir.join("tls"))?;
        {
            let (nodes, run_dir, security) = (broker_nodes.clone(), opts.run_dir.clone(), tls.kafka.clone());
            let cluster = testkit::broker::new_cluster_id();
            tokio::task::spawn_blocking(move || {
                nodes.iter().try_for_each(|n| {
                    testkit::broker::prepare(n, &nodes, &cluster, &node_dir(&run_dir, n.id), Some(&security))
                })
            })
            .await??;
        }
        if opts.isolated_uids {
            testkit::partition::ensure()?;
            for n in &broker_nodes {
                chown_tree(&node_dir(&opts.run_dir, n.id), Self::uid_of_node(n.id))?;
            }
        }
        let (db_prefix, adopt) = (opts.db_prefix.clone(), opts.adopt_databases);
        let mut stack = Stack {
            opts,
            ports,
            admin_ports,
            procs: BTreeMap::new(),
            http: reqwest::Client::builder().timeout(Duration::from_secs(5)).build()?,
            kills: BTreeMap::new(),
            finished: false,
            extras: Vec::new(),
            exits: BTreeMap::new(),
            proxy: None,
            broker_nodes,
            node_procs: BTreeMap::new(),
            postgres,
            api_key: String::new(),
            secrets: Secrets::generate(),
            tls,
            roles: roles::Roles::new(&db_prefix, adopt),
        };
        stack.roles.bootstrap(&stack.opts.pg_base, |d| stack.db_name(d)).await?;
        if let Some(kept) = stack.opts.secrets.clone() {
            stack.secrets = kept;
        }
        for s in Service::ALL {
            if s == Service::Broker {
                // A cluster answers only once a majority of its controllers runs.
                for id in 2..=stack.broker_nodes.len() as u32 {
                    stack.spawn_node(id)?;
                }
            }
            if s == Service::Payment && stack.opts.gateway_proxy {
                stack.proxy = Some(FaultProxy::start(stack.addr(Service::Gateway)).await?);
            }
            stack.start_service(s).await?;
            if s == Service::Broker {
                testkit::broker::wait_producer_ids(&stack.kafka_admin_config(), Duration::from_secs(120)).await?;
                stack.create_acls().await?;
            }
        }
        stack.api_key = stack.create_api_key(DRIVER_CLIENT).await?;
        Ok(stack)
    }

    /// The options this stack was started with.
    pub fn options(&self) -> &StackOptions {
        &self.opts
    }

    /// `host:port` of a process.
    pub fn addr(&self, s: Service) -> String {
        format!("127.0.0.1:{}", self.ports[&s])
    }

    /// Base URL of a service's API (order-api, inventory-service, the
    /// gateway — https, signed by [`Stack::ca_pem`]).
    pub fn url(&self, s: Service) -> String {
        let scheme = if s == Service::Gateway { "https" } else { "http" };
        format!("{scheme}://{}", self.addr(s))
    }

    /// The Kafka nodes: ids, client, controller and advertised ports.
    pub fn broker_nodes(&self) -> &[testkit::broker::NodeSpec] {
        &self.broker_nodes
    }

    /// Broker bootstrap addresses, every node's, comma-separated.
    pub fn brokers(&self) -> String {
        self.broker_nodes
            .iter()
            .map(testkit::broker::NodeSpec::addr)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Starts Kafka node `id` > 1 (node 1 is [`Service::Broker`]) without
    /// waiting: the cluster answers once a majority runs.
    fn spawn_node(&mut self, id: u32) -> anyhow::Result<()> {
        let mut cmd = testkit::broker::command(&node_dir(&self.opts.run_dir, id))?;
        if self.opts.isolated_uids {
            cmd.uid(Self::uid_of_node(id)).env("HOME", &self.opts.run_dir);
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.opts.run_dir.join("logs").join(format!("kafka-{id}.log")))?;
        let child = cmd.stdin(Stdio::null()).stdout(log.try_clone()?).stderr(log).spawn()?;
        self.node_procs.insert(id, child);
        Ok(())
    }

    fn env(&self, s: Service) -> Vec<(String, String)> {
        let mut env = self.address_env(s);
        env.extend(self.secrets.env(s));
        env.extend(self.tls.env(s));
        if let Some((_, db)) = roles::OWNED.iter().find(|(owner, _)| *owner == s) {
            env.push(("DATABASE_URL".into(), self.service_db_url(s, db)));
        }
        env.extend(self.kafka_env(s));
        match s {
            Service::Broker => env.clear(),
            Service::Gateway => {
                // The fault switch exists in test builds only (debug builds carry
                // the failpoints, `cargo xtask`'s rule); a release gateway refuses it.
                if cfg!(debug_assertions) {
                    env.push(("GATEWAY_ADMIN".into(), "true".into()));
                }
            }
            Service::Inventory => {}
            Service::Payment => env.extend([(
                "GATEWAY_URL".into(),
                self.proxy
                    .as_ref()
                    .map_or_else(|| self.url(Service::Gateway), |p| format!("https://{}", p.addr)),
            )]),
            Service::OrderApi => env.push(("GATEWAY_URL".into(), self.url(Service::Gateway))),
            Service::Relay => env.push((
                "OUTBOX_DATABASE_URLS".into(),
                roles::RELAYED.map(|d| self.service_db_url(s, d)).join(","),
            )),
        }
        if matches!(s, Service::Inventory | Service::Payment | Service::OrderApi) {
            // The stack's own instance of a consumer service is a static
            // group member: restarted after a SIGKILL it takes its
            // partitions back at once. Extra instances are dynamic members.
            env.push(("KAFKA_GROUP_INSTANCE_ID".into(), format!("{}-1", s.name())));
            let relay = self.roles.name(Service::Relay).unwrap_or_default();
            env.push(("OUTBOX_RELAY_ROLE".into(), relay.to_owned()));
        }
        if s != Service::Broker && s != Service::Gateway && self.opts.partitions != kafka::PARTITIONS {
            env.push(("KAFKA_PARTITIONS".into(), self.opts.partitions.to_string()));
        }
        if s != Service::Broker && s != Service::Gateway && self.broker_nodes.len() > 1 {
            let replicas = replication_factor(self.broker_nodes.len());
            env.push(("KAFKA_REPLICATION_FACTOR".into(), replicas.to_string()));
        }
        for (svc, k, v) in &self.opts.extra_env {
            if *svc == s {
                env.push((k.clone(), v.clone()));
            }
        }
        env
    }

    /// Sets (or, with an empty value, clears) an environment variable of a
    /// service for its next start, e.g. `FAILPOINTS`.
    pub fn set_env(&mut self, s: Service, key: &str, value: &str) {
        self.opts.extra_env.retain(|(svc, k, _)| !(*svc == s && k == key));
        if !value.is_empty() {
            self.opts.extra_env.push((s, key.to_owned(), value.to_owned()));
        }
    }

    /// Arms the crash point `point` of `s` (it aborts the process the first
    /// time it is reached) for the service's next start.
    pub fn arm(&mut self, s: Service, point: &str) {
        self.set_env(s, "FAILPOINTS", &format!("{point}=1*return"));
    }

    /// Disarms every crash point of `s` for its next start.
    pub fn disarm(&mut self, s: Service) {
        self.set_env(s, "FAILPOINTS", "");
    }

    /// How the last process of `s` that ended on its own ended, if one did.
    pub fn last_exit(&self, s: Service) -> Option<std::process::ExitStatus> {
        self.exits.get(&s).copied()
    }

    /// Waits until a process exits on its own (a failpoint's abort).
    pub async fn wait_exit(&mut self, s: Service, timeout: Duration) -> anyhow::Result<()> {
        let end = Instant::now() + timeout;
        while self.is_running(s) {
            anyhow::ensure!(Instant::now() < end, "{} still running after {timeout:?}", s.name());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }

    /// Starts one process (again) and waits until it is ready.
    pub async fn start_service(&mut self, s: Service) -> anyhow::Result<()> {
        for attempt in 1.. {
            self.spawn(s)?;
            // Three JVMs on two cores busy with other tests took over a minute on CI.
            let budget = Duration::from_secs(if s == Service::Broker { 180 } else { 60 });
            match self.wait_ready(s, budget).await {
                // Ports are picked free but bound only once the process gets
                // that far: a concurrent test may have taken this one. Move.
                Err(e) if attempt < 3 && !self.opts.fixed_ports && !self.is_running(s) && self.a_port_was_taken(s) => {
                    eprintln!("{}: a port of its was taken meanwhile, moving ({e})", s.name());
                    self.ports.insert(s, free_port()?);
                    self.admin_ports.insert(s, free_port()?);
                }
                result => return result,
            }
        }
        unreachable!("the loop returns")
    }

    fn spawn(&mut self, s: Service) -> anyhow::Result<()> {
        let child = self.launch(s, self.env(s), s.name())?;
        self.procs.insert(s, child);
        Ok(())
    }

    /// Starts a process of `s` with `env`, logging to `logs/<log_name>.log`
    /// (and the console when echoing).
    fn launch(&self, s: Service, env: Vec<(String, String)>, log_name: &str) -> anyhow::Result<Child> {
        let mut cmd = match s {
            Service::Broker => testkit::broker::command(&node_dir(&self.opts.run_dir, 1))?,
            _ => {
                let bin = self.opts.bin_dir.join(s.name());
                anyhow::ensure!(
                    bin.is_file(),
                    "{} not found: build the workspace first (cargo build --bins)",
                    bin.display()
                );
                Command::new(bin)
            }
        };
        if s != Service::Broker && std::env::var_os("RUST_LOG").is_none() {
            cmd.env("RUST_LOG", "info");
        }
        cmd.envs(env).stdin(Stdio::null()).kill_on_drop(true);
        if let Some(uid) = self.process_uid(s) {
            // A home it can read (root's makes sqlx warn about ~/.pgpass).
            cmd.uid(uid).env("HOME", &self.opts.run_dir);
        }
        let log_path = self.opts.run_dir.join("logs").join(format!("{log_name}.log"));
        Ok(if self.opts.echo {
            let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
            let out = child.stdout.take().expect("piped");
            let err = child.stderr.take().expect("piped");
            tokio::spawn(tee(out, log_path.clone(), s.name()));
            tokio::spawn(tee(err, log_path, s.name()));
            child
        } else {
            let log = std::fs::OpenOptions::new().create(true).append(true).open(&log_path)?;
            cmd.stdout(log.try_clone()?).stderr(log).spawn()?
        })
    }

    /// Waits until `s` is ready (Kafka: every node answers; a service: its own
    /// process answers `/health/ready`); fails if it exits or `timeout` passes.
    pub async fn wait_ready(&mut self, s: Service, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.procs.get_mut(&s).and_then(|c| c.try_wait().ok().flatten()) {
                bail!(
                    "{} exited during start-up ({status}); see {}",
                    s.name(),
                    self.log_path(s).display()
                );
            }
            let ready = match s {
                Service::Broker => {
                    let (client, n) = (self.kafka_admin_config(), self.broker_nodes.len());
                    tokio::task::spawn_blocking(move || testkit::broker::answers(&client, n)).await?
                }
                // Ready, and answered by this process rather than by another
                // test's service that took the port first.
                _ => {
                    let ours = self
                        .procs
                        .get(&s)
                        .and_then(Child::id)
                        .is_some_and(|pid| testkit::process::listens_on(pid, self.admin_ports[&s]));
                    ours && self
                        .http
                        .get(format!("{}/health/ready", self.admin_url(s)))
                        .send()
                        .await
                        .is_ok_and(|r| r.status().is_success())
                }
            };
            if ready {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "{} not ready after {timeout:?}; see {}",
                    s.name(),
                    self.log_path(s).display()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The fault proxy between payment-service and the gateway, if enabled.
    pub fn gateway_proxy(&self) -> Option<&FaultProxy> {
        self.proxy.as_ref()
    }

    /// The pid of `s`'s process, when it runs.
    pub fn pid(&self, s: Service) -> Option<u32> {
        self.procs.get(&s).and_then(Child::id)
    }

    /// Whether the process is alive; reaps it (and forgets it) when it exited
    /// on its own, e.g. by a failpoint's abort.
    pub fn is_running(&mut self, s: Service) -> bool {
        match self.procs.get_mut(&s).map(|c| c.try_wait()) {
            Some(Ok(None)) => true,
            Some(exited) => {
                if let Ok(Some(status)) = exited {
                    self.exits.insert(s, status);
                }
                self.procs.remove(&s);
                false
            }
            None => false,
        }
    }

    /// Stops every process with SIGTERM (SIGKILL after 10 s) in reverse start
    /// order, drops the databases, and removes the run directory when asked.
    pub async fn shutdown(mut self, remove_run_dir: bool) -> anyhow::Result<()> {
        self.kill_extras().await;
        self.stop_processes().await;
        if self.postgres.take().is_none() {
            for (_, db) in roles::OWNED {
                testkit::db::drop_database(&self.db_url(db)).await?;
            }
            testkit::db::drop_roles(&self.opts.pg_base, &self.roles.all()).await?;
        }
        self.finished = true;
        if remove_run_dir {
            let _ = std::fs::remove_dir_all(&self.opts.run_dir);
        }
        Ok(())
    }

    /// Stops the services (SIGTERM, SIGKILL after 10 s) in reverse start
    /// order, then the Kafka nodes.
    async fn stop_processes(&mut self) {
        for s in Service::ALL.into_iter().rev() {
            if let Some(mut child) = self.procs.remove(&s) {
                terminate(&mut child).await;
            }
        }
        for (_, mut child) in std::mem::take(&mut self.node_procs) {
            terminate(&mut child).await;
        }
    }

    /// Waits until every process exits or ctrl-c, then stops the rest
    /// (`cargo xtask up`). Databases are kept.
    pub async fn run_until_ctrl_c(mut self) -> anyhow::Result<()> {
        self.finished = true; // keep the databases of `xtask up`
        tokio::signal::ctrl_c().await?;
        eprintln!("stopping…");
        self.stop_processes().await;
        Ok(())
    }
}

async fn terminate(child: &mut Child) {
    if let Some(pid) = child.id() {
        let _ = crate::signal(pid, nix::sys::signal::Signal::SIGTERM);
        let waited = tokio::time::timeout(Duration::from_secs(10), child.wait()).await;
        if waited.is_ok() {
            return;
        }
    }
    let _ = child.kill().await;
}

async fn tee(stream: impl tokio::io::AsyncRead + Unpin, path: PathBuf, name: &'static str) {
    let Ok(mut file) = tokio::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .await
    else {
        return;
    };
    let mut lines = BufReader::new(stream).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        println!("{name:>17} | {line}");
        let _ = file.write_all(format!("{line}\n").as_bytes()).await;
    }
}

/// The data directory of Kafka node `id`: `broker` for node 1, `broker-<id>` for the others.
fn node_dir(run_dir: &std::path::Path, id: u32) -> PathBuf {
    if id == 1 {
        run_dir.join("broker")
    } else {
        run_dir.join(format!("broker-{id}"))
    }
}
