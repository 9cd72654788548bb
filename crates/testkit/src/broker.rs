//! The Kafka-protocol broker used where no Apache Kafka exists: tansu,
//! pinned, installed with `cargo install` into `~/.cargo/bin` when missing.

use std::path::PathBuf;
use std::process::Command;

/// Pinned tansu version.
pub const TANSU_VERSION: &str = "0.6.0";

/// The tansu binary: `$TANSU_BIN`, else `tansu` on `PATH`, else `~/.cargo/bin/tansu`.
pub fn find() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("TANSU_BIN") {
        return Some(PathBuf::from(p));
    }
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("tansu"))
            .find(|p| p.is_file())
    });
    on_path.or_else(|| {
        let home = std::env::var_os("CARGO_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))?;
        Some(home.join("bin").join("tansu")).filter(|p| p.is_file())
    })
}

/// Returns the tansu binary, installing it first when missing (about ten
/// minutes of compiling on two cores; progress is shown).
pub fn ensure() -> anyhow::Result<PathBuf> {
    if let Some(p) = find() {
        return Ok(p);
    }
    eprintln!(
        "tansu {TANSU_VERSION} (Kafka-compatible broker) is not installed: installing it with cargo install; \
         this takes about 10 minutes on 2 cores and happens once"
    );
    let status = Command::new("cargo")
        .args(["install", "tansu", "--locked", "--version", TANSU_VERSION])
        .args(["--no-default-features", "--features", "libsql,dynostore"])
        .status()?;
    anyhow::ensure!(status.success(), "cargo install tansu failed with {status}");
    find().ok_or_else(|| anyhow::anyhow!("tansu installed but not found in ~/.cargo/bin"))
}

/// The tansu command line serving `addr` with SQLite storage in `data_dir`.
pub fn command(tansu: &std::path::Path, addr: &str, data_dir: &std::path::Path) -> tokio::process::Command {
    let listener = format!("tcp://{addr}");
    let mut c = tokio::process::Command::new(tansu);
    c.args(["broker", "--storage-engine", "sqlite://tansu.db"])
        .args(["--listener-url", &listener, "--advertised-listener-url", &listener])
        .current_dir(data_dir)
        .env("RUST_LOG", "warn")
        .kill_on_drop(true);
    c
}

/// Indexes tansu 0.6's SQLite schema lacks. Its fetch runs `header_fetch.sql`
/// once per fetched record, and the `header` table has no index: every
/// consumed message scanned every header ever written (three per message
/// here), so the broker slowed as its log grew and burned most of its CPU in
/// SQLite's btree scans (seen with `perf`). With the index a header lookup
/// is a seek. The schema is the broker's own storage, created when tansu
/// starts; adding an index changes no data and no behaviour.
const TUNING: &str = "CREATE INDEX IF NOT EXISTS eo_header_record ON header (topition, offset_id);";

/// Applies [`TUNING`] to the broker's database in `data_dir` once tansu has
/// created its schema (call it when the broker accepts connections).
pub fn tune(data_dir: &std::path::Path) -> anyhow::Result<()> {
    let db = rusqlite::Connection::open(data_dir.join("tansu.db"))?;
    db.busy_timeout(std::time::Duration::from_secs(10))?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    // The schema appears shortly after the listener.
    loop {
        match db.execute_batch(TUNING) {
            Ok(()) => return Ok(()),
            Err(e) if std::time::Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// A standalone broker for library tests: a free port, a temp data dir,
/// killed (and its data removed) on drop.
pub struct Broker {
    /// `127.0.0.1:port`.
    pub addr: String,
    dir: PathBuf,
    child: Option<tokio::process::Child>,
}

impl Broker {
    /// Starts tansu and waits until it accepts connections.
    pub async fn start() -> anyhow::Result<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let dir = std::env::temp_dir().join(format!("eo-broker-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir)?;
        let mut b = Self {
            addr: format!("127.0.0.1:{port}"),
            dir,
            child: None,
        };
        b.restart().await?;
        Ok(b)
    }

    /// SIGKILLs the broker (its data stays).
    pub async fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill().await;
        }
    }

    /// Starts the broker (again) on the same port and data.
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        self.kill().await;
        let log = std::fs::File::create(self.dir.join("tansu.log"))?;
        let child = command(&ensure()?, &self.addr, &self.dir)
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        self.child = Some(child);
        let end = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while tokio::net::TcpStream::connect(&self.addr).await.is_err() {
            anyhow::ensure!(std::time::Instant::now() < end, "tansu did not start");
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        let dir = self.dir.clone();
        tokio::task::spawn_blocking(move || tune(&dir)).await??;
        Ok(())
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
