//! A PostgreSQL cluster of a run's own: `initdb` into its directory, its
//! own port, the postmaster a child of the harness in a process group of its
//! own — so the run can crash the whole server (SIGKILL to every process of
//! it at once, as an OOM kill or a lost container does) and start it again
//! through crash recovery, under traffic.
//!
//! The binaries are Debian's (`/usr/lib/postgresql/<version>/bin`, installed
//! by [`super::ensure`] when missing); the server runs as the `postgres`
//! user, as PostgreSQL refuses to run as root.

use std::fs::OpenOptions;
use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;

/// What the run's server needs beyond `initdb`'s defaults: loopback only,
/// its socket in its own directory, room for several services' pools.
/// `synchronous_commit` stays on: a commit a service was told about is in
/// the WAL on disk before the answer, so a crash loses none.
const CONF: &str = "\n# effectively-once: a run's own server (crates/testkit/src/postgres/cluster.rs)\n\
listen_addresses = '127.0.0.1'\nmax_connections = 300\nshared_buffers = 128MB\n";

/// A server the run owns. Dropped, its processes are killed.
#[derive(Debug)]
pub struct Cluster {
    dir: PathBuf,
    port: u16,
    bin: PathBuf,
    log: PathBuf,
    postmaster: Option<Child>,
    /// Extra `postgresql.conf` lines (a test's removal, e.g. `synchronous_commit = off`).
    extra_conf: String,
}

/// A crash: the postmaster killed and how it ended (as `wait` saw it).
#[derive(Debug, Clone, Copy)]
pub struct Crashed {
    /// The postmaster's pid.
    pub pid: u32,
    /// The signal that ended it (9: SIGKILL).
    pub signal: Option<i32>,
}

impl Cluster {
    /// Creates a cluster in `dir` (which must not exist yet) on a free
    /// port, not started. `extra_conf` is appended to its settings.
    pub fn create(dir: &Path, extra_conf: &str) -> anyhow::Result<Self> {
        let bin = bin_dir()?;
        let (uid, gid) = postgres_user()?;
        std::fs::create_dir_all(dir)?;
        std::os::unix::fs::chown(dir, Some(uid), Some(gid))?;
        let data = dir.join("data");
        let out = Command::new(bin.join("initdb"))
            .args(["-D"])
            .arg(&data)
            .args([
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ])
            .uid(uid)
            .gid(gid)
            .output()
            .context("initdb")?;
        anyhow::ensure!(
            out.status.success(),
            "initdb failed with {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let port = crate::ports::free()?;
        let conf = format!(
            "{CONF}port = {port}\nunix_socket_directories = '{}'\n{extra_conf}\n",
            dir.display()
        );
        let mut file = OpenOptions::new().append(true).open(data.join("postgresql.conf"))?;
        std::io::Write::write_all(&mut file, conf.as_bytes())?;
        Ok(Self {
            dir: dir.to_path_buf(),
            port,
            bin,
            log: dir.join("server.log"),
            postmaster: None,
            extra_conf: extra_conf.to_owned(),
        })
    }

    /// The server URL (no database), as services take it.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}", self.port)
    }

    /// The server's log (every start appends to it).
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// Extra settings this cluster was created with.
    pub fn extra_conf(&self) -> &str {
        &self.extra_conf
    }

    /// The running postmaster's pid.
    pub fn pid(&self) -> Option<u32> {
        self.postmaster.as_ref().map(Child::id)
    }

    /// Starts the postmaster and waits until it accepts connections (crash
    /// recovery first, after a crash). Returns its pid.
    pub async fn start(&mut self) -> anyhow::Result<u32> {
        anyhow::ensure!(self.postmaster.is_none(), "the server runs already");
        let (uid, gid) = postgres_user()?;
        let log = OpenOptions::new().create(true).append(true).open(&self.log)?;
        let child = Command::new(self.bin.join("postgres"))
            .arg("-D")
            .arg(self.dir.join("data"))
            .uid(uid)
            .gid(gid)
            // Its own group: a crash kills the postmaster and every backend.
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting postgres")?;
        let pid = child.id();
        self.postmaster = Some(child);
        let end = Instant::now() + Duration::from_secs(60);
        while !super::answers(&self.url()).await {
            if let Some(status) = self.postmaster.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                self.postmaster = None;
                anyhow::bail!("postgres exited at start ({status}); see {}", self.log.display());
            }
            anyhow::ensure!(
                Instant::now() < end,
                "postgres did not accept connections in 60 s; see {}",
                self.log.display()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(pid)
    }

    /// The data directory (`PGDATA`).
    pub fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// The directory of the server's Unix socket (`PGHOST` for psql).
    pub fn socket_dir(&self) -> &Path {
        &self.dir
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Stops the server cleanly (a fast shutdown: SIGINT) and waits for it.
    pub fn stop(&mut self) -> anyhow::Result<()> {
        let mut child = self.postmaster.take().context("the server is not running")?;
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGINT,
        )?;
        child.wait()?;
        Ok(())
    }

    /// The `postgres` user's uid and gid, for a command run as the server's
    /// owner (a script that writes into [`Cluster::data_dir`]).
    pub fn owner() -> anyhow::Result<(u32, u32)> {
        postgres_user()
    }

    /// Crashes the server: SIGKILL to the postmaster and every backend at
    /// once (no shutdown checkpoint, nothing flushed that was not already),
    /// and reaps the postmaster.
    pub fn crash(&mut self) -> anyhow::Result<Crashed> {
        let mut child = self.postmaster.take().context("the server is not running")?;
        let pid = child.id();
        let group = nix::unistd::Pid::from_raw(pid as i32);
        nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL)?;
        let status = child.wait()?;
        Ok(Crashed {
            pid,
            signal: status.signal(),
        })
    }

    /// The log's length now: pass it to [`Cluster::recovered_since`].
    pub fn log_len(&self) -> u64 {
        std::fs::metadata(&self.log).map_or(0, |m| m.len())
    }

    /// Whether the log written after `offset` shows a crash recovery that
    /// completed: the server found it had not been shut down, replayed the
    /// WAL and then accepted connections.
    pub fn recovered_since(&self, offset: u64) -> bool {
        let text = std::fs::read(&self.log).unwrap_or_default();
        let after = String::from_utf8_lossy(text.get(offset as usize..).unwrap_or_default());
        recovery_in(&after)
    }
}

/// Whether a server log excerpt shows a completed crash recovery.
fn recovery_in(log: &str) -> bool {
    let interrupted = log.find("was not properly shut down; automatic recovery in progress");
    let ready = log.rfind("database system is ready to accept connections");
    matches!((interrupted, ready), (Some(i), Some(r)) if r > i)
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Some(mut child) = self.postmaster.take() {
            let group = nix::unistd::Pid::from_raw(child.id() as i32);
            let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
            let _ = child.wait();
        }
    }
}

/// Debian's newest PostgreSQL binaries.
fn bin_dir() -> anyhow::Result<PathBuf> {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .context("no /usr/lib/postgresql: is the postgresql package installed?")?
        .filter_map(|e| {
            let e = e.ok()?;
            let v = e.file_name().to_str()?.parse().ok()?;
            Some((v, e.path().join("bin")))
        })
        .filter(|(_, bin)| bin.join("initdb").is_file())
        .collect();
    versions.sort();
    versions
        .pop()
        .map(|(_, bin)| bin)
        .context("no PostgreSQL binaries under /usr/lib/postgresql")
}

/// The `postgres` user's uid and gid.
fn postgres_user() -> anyhow::Result<(u32, u32)> {
    let user =
        nix::unistd::User::from_name("postgres")?.context("no postgres user (install the postgresql package)")?;
    Ok((user.uid.as_raw(), user.gid.as_raw()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_recovery_is_a_crash_found_then_connections_accepted() {
        let crash = "LOG:  database system was not properly shut down; automatic recovery in progress\n\
                     LOG:  redo starts at 0/1A2B3C8\nLOG:  database system is ready to accept connections\n";
        assert!(super::recovery_in(crash));
        assert!(
            !super::recovery_in("LOG:  database system is ready to accept connections\n"),
            "a clean start is no recovery"
        );
        assert!(
            !super::recovery_in("LOG:  database system was not properly shut down; automatic recovery in progress\n"),
            "a recovery not finished"
        );
    }
}
