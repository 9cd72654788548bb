//! Apache Kafka, the broker of every test, chaos run and benchmark: a
//! pinned version fetched from Maven Central with an ordinary Maven client
//! (`tools/kafka/pom.xml`, `mvn dependency:copy-dependencies` into
//! `target/tools/kafka-<version>/libs`), its storage formatted with
//! `kafka.tools.StorageTool`, and `kafka.Kafka` started in KRaft mode
//! (each node broker and controller at once) on a small heap. Processes are
//! stopped by their own pids.
//!
//! [`Broker`] is one node for library tests; the e2e harness builds its
//! nodes (one, or three with replication) from [`NodeSpec`] and [`prepare`].

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use base64::Engine as _;
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::ClientConfig;

pub mod acl;
mod security;
pub use security::{Security, ADMIN_USER, BROKER_USER, NODE_CN};

/// The Apache Kafka version the project runs (also the default of
/// `tools/kafka/pom.xml`).
pub const KAFKA_VERSION: &str = "4.4.0";

/// JVM options of every node unless `EO_KAFKA_JVM_OPTS` says otherwise: a
/// small fixed heap and the serial collector — two cores are shared with
/// PostgreSQL, five services and the load driver, and a broker holding a
/// few hundred MB of log needs no concurrent collector threads.
pub const DEFAULT_JVM_OPTS: &str =
    "-Xms384m -Xmx384m -XX:+UseSerialGC -XX:+ExitOnOutOfMemoryError -Djava.awt.headless=true";

fn workspace_root() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    root.canonicalize().unwrap_or(root)
}

/// Where the broker's jars live: `target/tools/kafka-<version>/libs`.
pub fn libs_dir() -> PathBuf {
    workspace_root()
        .join("target/tools")
        .join(format!("kafka-{KAFKA_VERSION}"))
        .join("libs")
}

const COMPLETE: &str = ".complete";
/// What [`COMPLETE`] says of a fetch: the version and what
/// `tools/kafka/pom.xml` fetches with it (a directory fetched for an
/// earlier list is fetched again).
fn fetched() -> String {
    format!("{KAFKA_VERSION} broker tools")
}

/// Returns the directory of the broker's jars, fetching them first when
/// missing (about a minute, once; Java and Maven are installed from
/// Debian's packages when absent and this runs as root).
pub fn ensure() -> anyhow::Result<PathBuf> {
    // Tests of one binary run in parallel: one fetch at a time.
    static FETCHING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = FETCHING.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let libs = libs_dir();
    if std::fs::read_to_string(libs.join(COMPLETE)).is_ok_and(|s| s == fetched()) {
        return Ok(libs);
    }
    ensure_program("java", &["-version"], "openjdk-17-jre-headless")?;
    ensure_program("mvn", &["--version"], "maven")?;
    eprintln!(
        "Apache Kafka {KAFKA_VERSION} is not under {}: fetching it and its dependencies from Maven Central \
         with mvn (tools/kafka/pom.xml; once, about a minute)",
        libs.display()
    );
    let partial = libs.with_extension("partial");
    let _ = std::fs::remove_dir_all(&partial);
    let status = Command::new("mvn")
        .args(["-q", "-B", "-f"])
        .arg(workspace_root().join("tools/kafka/pom.xml"))
        .arg(format!("-Dkafka.version={KAFKA_VERSION}"))
        .arg("dependency:copy-dependencies")
        .arg(format!("-DoutputDirectory={}", partial.display()))
        .status()?;
    anyhow::ensure!(
        status.success(),
        "mvn dependency:copy-dependencies failed with {status}"
    );
    let _ = std::fs::remove_dir_all(&libs);
    std::fs::rename(&partial, &libs)?;
    std::fs::write(libs.join(COMPLETE), fetched())?;
    eprintln!("Apache Kafka {KAFKA_VERSION}: {} ready", libs.display());
    Ok(libs)
}

/// Runs `program args`; when it is missing, installs Debian's `package`
/// (as root) and says so.
fn ensure_program(program: &str, args: &[&str], package: &str) -> anyhow::Result<()> {
    let works = |p: &str| Command::new(p).args(args).output().is_ok_and(|o| o.status.success());
    if works(program) {
        return Ok(());
    }
    eprintln!("{program} is missing: installing Debian's {package} package with apt-get");
    crate::postgres::apt_install(&[package])?;
    anyhow::ensure!(
        works(program),
        "{program} still does not run after installing {package}"
    );
    Ok(())
}

/// A fresh KRaft cluster id (a base64url UUID, as `StorageTool random-uuid`
/// prints). Like Kafka's own, never one that starts with `-`, which a
/// command line would read as an option.
pub fn new_cluster_id() -> String {
    loop {
        let id = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(uuid::Uuid::new_v4().as_bytes());
        if !id.starts_with('-') {
            return id;
        }
    }
}

/// One node of a cluster: its id, client port and controller port.
#[derive(Debug, Clone)]
pub struct NodeSpec {
    /// `node.id`, from 1.
    pub id: u32,
    /// Client listener on 127.0.0.1 (PLAINTEXT, or SASL_SSL with a [`Security`]).
    pub port: u16,
    /// Controller listener on 127.0.0.1.
    pub controller_port: u16,
    /// The port clients are told to use (`advertised.listeners`): the
    /// client port, or a proxy's in front of it.
    pub advertised_port: u16,
}

impl NodeSpec {
    /// A node on two free ports.
    pub fn free(id: u32) -> anyhow::Result<Self> {
        let port = free_port()?;
        Ok(Self {
            id,
            port,
            controller_port: free_port()?,
            advertised_port: port,
        })
    }

    /// `127.0.0.1:<port>`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

/// The `server.properties` of `node` in a cluster of `nodes`, its log in
/// `data_dir/log`; with `security`, its listeners authenticate and the
/// authorizer is on ([`Security`]), otherwise every listener is plaintext.
///
/// Settings that differ from Kafka's defaults, and why:
/// - replication of the internal topics (`__consumer_offsets`,
///   `__transaction_state`) follows the cluster size, with
///   `min.insync.replicas` one less than the replicas (2 of 3), and
///   `unclean.leader.election.enable=false`, as docs/operations.md asks of
///   a deployment;
/// - `group.initial.rebalance.delay.ms=0`: a group forms as soon as its
///   first member joins (tests start consumers one by one);
/// - fewer partitions for the internal topics (5, not 50): each costs
///   memory and a leader on a two-core machine; nothing here needs 50;
/// - `broker.session.timeout.ms=4000` (9 s by default): a SIGKILLed node's
///   partitions — a consumer group's coordinator among them — get a new
///   leader well within the consumers' 10-s session timeout, so a member
///   does not lose its session to a coordinator that is gone.
pub fn properties(node: &NodeSpec, nodes: &[NodeSpec], data_dir: &Path, security: Option<&Security>) -> String {
    let voters: Vec<String> = nodes
        .iter()
        .map(|n| format!("{}@127.0.0.1:{}", n.id, n.controller_port))
        .collect();
    let replicas = nodes.len().min(3);
    let min_isr = replicas.saturating_sub(1).max(1);
    let listeners = match security {
        Some(s) => s.properties(node.port, node.controller_port, node.advertised_port),
        None => format!(
            "listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{cport}\n\
             advertised.listeners=PLAINTEXT://127.0.0.1:{aport}\n\
             controller.listener.names=CONTROLLER\n\
             inter.broker.listener.name=PLAINTEXT\n\
             listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT\n",
            port = node.port,
            cport = node.controller_port,
            aport = node.advertised_port,
        ),
    };
    format!(
        "process.roles=broker,controller\n\
         node.id={id}\n\
         controller.quorum.voters={voters}\n\
         {listeners}\
         log.dirs={log}\n\
         num.network.threads=2\n\
         num.io.threads=4\n\
         offsets.topic.replication.factor={replicas}\n\
         offsets.topic.num.partitions=5\n\
         transaction.state.log.replication.factor={replicas}\n\
         transaction.state.log.min.isr={min_isr}\n\
         transaction.state.log.num.partitions=5\n\
         share.coordinator.state.topic.replication.factor={replicas}\n\
         share.coordinator.state.topic.min.isr={min_isr}\n\
         default.replication.factor={replicas}\n\
         min.insync.replicas={min_isr}\n\
         unclean.leader.election.enable=false\n\
         group.initial.rebalance.delay.ms=0\n\
         broker.session.timeout.ms=4000\n\
         broker.heartbeat.interval.ms=1000\n",
        id = node.id,
        voters = voters.join(","),
        log = data_dir.join("log").display(),
    )
}

/// The broker's own log: warnings and errors, plus Kafka's start and stop lines.
const LOG4J2: &str = "status = warn\n\
appender.console.type = Console\n\
appender.console.name = STDOUT\n\
appender.console.layout.type = PatternLayout\n\
appender.console.layout.pattern = [%d] %p %m (%c)%n\n\
rootLogger.level = warn\n\
rootLogger.appenderRef.stdout.ref = STDOUT\n\
logger.server.name = kafka.server.KafkaRaftServer\n\
logger.server.level = info\n";

/// Writes `node`'s configuration into `data_dir` and formats its storage
/// with `cluster_id` (and `security`'s SCRAM users) unless it was formatted
/// before (a restart keeps its data).
pub fn prepare(
    node: &NodeSpec,
    nodes: &[NodeSpec],
    cluster_id: &str,
    data_dir: &Path,
    security: Option<&Security>,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(data_dir)?;
    std::fs::write(
        data_dir.join("server.properties"),
        properties(node, nodes, data_dir, security),
    )?;
    std::fs::write(data_dir.join("log4j2.properties"), LOG4J2)?;
    if data_dir.join("log/meta.properties").is_file() {
        return Ok(());
    }
    let out = java(data_dir)?
        .args(["kafka.tools.StorageTool", "format", "--ignore-formatted"])
        // `=`: an id may not be read as an option, whatever it starts with.
        .arg(format!("--cluster-id={cluster_id}"))
        .arg(format!("--config={}", data_dir.join("server.properties").display()))
        .args(security.map(Security::scram_args).unwrap_or_default())
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "formatting the Kafka storage in {} failed: {}{}",
        data_dir.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

fn java(data_dir: &Path) -> anyhow::Result<Command> {
    let libs = ensure()?;
    let mut c = Command::new("java");
    let opts = std::env::var("EO_KAFKA_JVM_OPTS").unwrap_or_else(|_| DEFAULT_JVM_OPTS.into());
    c.args(opts.split_whitespace())
        .arg(format!(
            "-Dlog4j2.configurationFile={}",
            data_dir.join("log4j2.properties").display()
        ))
        .arg("-cp")
        .arg(format!("{}/*", libs.display()))
        .current_dir(data_dir);
    Ok(c)
}

/// The command that runs the node prepared in `data_dir` ([`prepare`]).
pub fn command(data_dir: &Path) -> anyhow::Result<tokio::process::Command> {
    let mut c: tokio::process::Command = java(data_dir)?.into();
    c.arg("kafka.Kafka")
        .arg(data_dir.join("server.properties"))
        .kill_on_drop(true);
    Ok(c)
}

/// A plaintext client's settings for `bootstrap` (a cluster without
/// [`Security`]).
pub fn plaintext(bootstrap: &str) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap).set("log_level", "0");
    c
}

/// Whether the cluster `client` reaches answers metadata with `brokers`
/// brokers registered (unfenced): a listening socket alone is not a
/// working broker.
pub fn answers(client: &ClientConfig, brokers: usize) -> bool {
    let Ok(client) = client.create::<BaseConsumer>() else {
        return false;
    };
    client
        .fetch_metadata(None, Duration::from_secs(2))
        .is_ok_and(|m| m.brokers().len() >= brokers)
}

/// Waits until [`answers`] holds, or `timeout`.
pub async fn wait_ready(client: &ClientConfig, brokers: usize, timeout: Duration) -> anyhow::Result<()> {
    let end = Instant::now() + timeout;
    loop {
        let c = client.clone();
        if tokio::task::spawn_blocking(move || answers(&c, brokers)).await? {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < end,
            "Kafka at {} did not answer with {brokers} broker(s) within {timeout:?}",
            client.get("bootstrap.servers").unwrap_or("?")
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until the cluster at `bootstrap` hands out producer ids (a
/// producer's first request, `InitProducerId`), or `timeout`. A freshly
/// formatted cluster answers metadata before it can: a service whose
/// idempotent producer starts then logs librdkafka's "Failed to acquire
/// idempotence PID … Coordinator load in progress: retrying" — a warning in
/// what is a normal start. A transactional producer's `init_transactions`
/// returns once ids are handed out (and the transaction log is loaded).
pub async fn wait_producer_ids(client: &ClientConfig, timeout: Duration) -> anyhow::Result<()> {
    let mut client = client.clone();
    tokio::task::spawn_blocking(move || {
        let producer: rdkafka::producer::BaseProducer = client
            .set(
                "transactional.id",
                format!("eo-harness-{}", uuid::Uuid::new_v4().simple()),
            )
            .set("log_level", "0")
            .create()?;
        rdkafka::producer::Producer::init_transactions(&producer, timeout)?;
        anyhow::Ok(())
    })
    .await?
}

/// A standalone single-node broker for library tests: free ports, a temp
/// data dir, killed by its pid (and its data removed) on drop.
pub struct Broker {
    /// `127.0.0.1:port`.
    pub addr: String,
    node: NodeSpec,
    dir: PathBuf,
    child: Option<tokio::process::Child>,
}

impl Broker {
    /// Starts a broker and waits until it answers.
    pub async fn start() -> anyhow::Result<Self> {
        Self::start_with(|_| {}).await
    }

    /// Starts a broker whose node `adjust` may change first (e.g. to
    /// advertise a proxy's port), and waits until it answers.
    pub async fn start_with(adjust: impl FnOnce(&mut NodeSpec)) -> anyhow::Result<Self> {
        let mut node = NodeSpec::free(1)?;
        adjust(&mut node);
        let dir = std::env::temp_dir().join(format!("eo-kafka-{}", uuid::Uuid::new_v4().simple()));
        let cluster = new_cluster_id();
        let prep = (node.clone(), dir.clone());
        tokio::task::spawn_blocking(move || prepare(&prep.0, std::slice::from_ref(&prep.0), &cluster, &prep.1, None))
            .await??;
        let mut b = Self {
            addr: node.addr(),
            node,
            dir,
            child: None,
        };
        b.restart().await?;
        Ok(b)
    }

    /// The node's ports.
    pub fn node(&self) -> &NodeSpec {
        &self.node
    }

    /// SIGKILLs the broker (its data stays).
    pub async fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill().await;
        }
    }

    /// Starts the broker (again) on the same ports and data.
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        self.kill().await;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("kafka.log"))?;
        let child = command(&self.dir)?.stdout(log.try_clone()?).stderr(log).spawn()?;
        self.child = Some(child);
        wait_ready(&plaintext(&self.addr), 1, Duration::from_secs(90)).await
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_mut() {
            let _ = c.start_kill();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The address of this test process's own broker, started on first use and
/// shared by the tests of the binary: for tests that need a broker only to
/// get through a service's start (its topics), where one JVM per test would
/// cost more than the tests.
///
/// A static is never dropped, so the broker is not stopped by a `Drop`: it
/// runs under `sh`, which reads its stdin from this process; when the test
/// process ends, however it ends, the pipe closes, `sh` kills the broker by
/// its pid and removes its data directory.
pub async fn shared() -> anyhow::Result<String> {
    static SHARED: std::sync::OnceLock<Result<String, String>> = std::sync::OnceLock::new();
    tokio::task::spawn_blocking(|| {
        SHARED
            .get_or_init(|| start_shared().map_err(|e| format!("{e:#}")))
            .clone()
            .map_err(anyhow::Error::msg)
    })
    .await?
}

/// Starts the shared broker (see [`shared`]); its `sh`'s stdin is kept
/// open, by leaking it, for as long as this process lives.
fn start_shared() -> anyhow::Result<String> {
    let dir = std::env::temp_dir().join(format!("eo-kafka-shared-{}", uuid::Uuid::new_v4().simple()));
    let started = spawn_shared(&dir);
    if started.is_err() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    started
}

fn spawn_shared(dir: &Path) -> anyhow::Result<String> {
    let node = NodeSpec::free(1)?;
    prepare(&node, std::slice::from_ref(&node), &new_cluster_id(), dir, None)?;
    let mut java = java(dir)?;
    java.arg("kafka.Kafka").arg(dir.join("server.properties"));
    let log = std::fs::File::create(dir.join("kafka.log"))?;
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(r#"dir="$1"; shift; "$@" & pid=$!; read -r _; kill -9 "$pid"; wait "$pid"; rm -rf "$dir""#)
        .arg("eo-shared-kafka")
        .arg(dir)
        .arg(java.get_program())
        .args(java.get_args())
        .current_dir(dir)
        .stdin(std::process::Stdio::piped())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()?;
    // Dropped on an error below: then `sh` stops the broker at once.
    let lifeline = child.stdin.take();
    let addr = node.addr();
    let end = Instant::now() + Duration::from_secs(90);
    while !answers(&plaintext(&addr), 1) {
        anyhow::ensure!(
            Instant::now() < end,
            "the shared Kafka at {addr} did not answer within 90 s (log: {})",
            dir.join("kafka.log").display()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    std::mem::forget(lifeline);
    Ok(addr)
}

fn free_port() -> anyhow::Result<u16> {
    Ok(crate::ports::free()?)
}

#[cfg(test)]
mod tests {
    #[test]
    fn cluster_ids_are_22_base64url_characters_and_never_look_like_an_option() {
        for _ in 0..2_000 {
            let id = super::new_cluster_id();
            assert_eq!(id.len(), 22, "{id}");
            assert!(!id.starts_with('-'), "{id}");
        }
    }
}
