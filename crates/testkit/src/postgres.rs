//! PostgreSQL for the README's commands on a fresh machine: when nothing
//! answers at [`crate::db::server_url`] and that URL points at this machine,
//! Debian's `postgresql` package is installed (as root), its cluster allowed
//! to take local connections of the `postgres` user over TCP and started —
//! each step said on stderr. A server that answers (a user's own) is used
//! as it is; a remote one that does not answer is an error, never installed.

pub mod cluster;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::str::FromStr as _;
use std::time::{Duration, Instant};

use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions as _, Connection as _};

/// The line this module adds to `pg_hba.conf`, first, so it wins: the
/// `postgres` role may connect from 127.0.0.1 without a password, as the
/// project's default URL (`postgres://postgres@127.0.0.1:5432`) expects.
/// Loopback only; a deployment sets its own URL with a password instead.
const HBA_LINE: &str = "host all postgres 127.0.0.1/32 trust # effectively-once: local test server";

/// The lines this module adds to `pg_hba.conf` for the server's Unix
/// socket, first, so they win over Debian's `peer` lines: the `postgres`
/// role without a password (as [`HBA_LINE`] over TCP), the services' own
/// roles (members of [`SERVICE_GROUP`]) with their passwords; every other
/// local role as Debian has it. The local stack and the bench reach the
/// server through the socket ([`socket_url`]): no TCP, no TLS.
const HBA_LOCAL_LINES: &str = "local all postgres trust # effectively-once: local test server\n\
local all +eo_services scram-sha-256 # effectively-once: local test server";

/// The role every service's database role is a member of (no privileges
/// of its own): `pg_hba.conf` lets its members in over the Unix socket
/// with their passwords.
pub const SERVICE_GROUP: &str = "eo_services";

/// Settings the local test server needs beyond Debian's defaults: the test
/// command boots several stacks at once (five pools each), so more
/// connections than the default 100.
const CONF: &str =
    "# effectively-once: the local test server (crates/testkit/src/postgres.rs)\nmax_connections = 400\n";

/// What a PostgreSQL server at a URL did when asked to connect.
#[derive(Debug)]
pub enum Probe {
    /// It let us in.
    Answers,
    /// Nothing answered: no server listens there (or none in 5 s).
    Silent(String),
    /// A server answered, with an error: a wrong password, an unknown role,
    /// a refused address — its words.
    Refuses(String),
}

/// Connects to `url` (a server URL, no database) once and says how it went.
pub async fn probe(url: &str) -> Probe {
    let opts = match PgConnectOptions::from_str(url) {
        Ok(o) => o.database("postgres").disable_statement_logging(),
        Err(e) => return Probe::Refuses(format!("not a PostgreSQL URL: {e}")),
    };
    match tokio::time::timeout(Duration::from_secs(5), sqlx::PgConnection::connect_with(&opts)).await {
        Ok(Ok(_)) => Probe::Answers,
        Ok(Err(sqlx::Error::Database(e))) => Probe::Refuses(e.to_string()),
        Ok(Err(sqlx::Error::Io(e))) => Probe::Silent(e.to_string()),
        Ok(Err(e)) => Probe::Refuses(e.to_string()),
        Err(_) => Probe::Silent("no answer in 5 s".into()),
    }
}

/// Whether a PostgreSQL server answers at `url` (a server URL, no database).
pub async fn answers(url: &str) -> bool {
    matches!(probe(url).await, Probe::Answers)
}

/// Makes sure a server answers at [`crate::db::server_url`], installing and
/// starting Debian's PostgreSQL when none does and the URL is local.
pub async fn ensure() -> anyhow::Result<()> {
    let url = crate::db::server_url();
    let shown = crate::db::redact(&url);
    match probe(&url).await {
        Probe::Answers => {
            // A server this module set up before its socket lines existed gets them now.
            if let Err(e) = allow_local_socket(true) {
                eprintln!("(the server's Unix socket stays as it was: {e:#})");
            }
            return Ok(());
        }
        // A server that answers is never replaced: its error is the news.
        Probe::Refuses(why) => anyhow::bail!(
            "PostgreSQL at {shown} answered with an error: {why}\n\
             (the URL is PG_BASE_URL's, default postgres://postgres@127.0.0.1:5432; nothing was installed)"
        ),
        Probe::Silent(_) => {}
    }
    let opts = PgConnectOptions::from_str(&url)?;
    anyhow::ensure!(
        ["127.0.0.1", "localhost"].contains(&opts.get_host()),
        "no PostgreSQL answers at {shown} (PG_BASE_URL); start it, or unset PG_BASE_URL to use a local one"
    );
    eprintln!("nothing listens at {shown}: setting up Debian's PostgreSQL on this machine");
    let tools = Path::new("/usr/bin/pg_lsclusters");
    if !tools.is_file() || cluster().is_none() {
        eprintln!("  installing the postgresql package with apt-get (once, about a minute)");
        apt_install(&["postgresql"])?;
    }
    let (version, name) = cluster().ok_or_else(|| anyhow::anyhow!("no PostgreSQL cluster after installing"))?;
    let etc = PathBuf::from(format!("/etc/postgresql/{version}/{name}"));
    let hba = etc.join("pg_hba.conf");
    let text = std::fs::read_to_string(&hba)?;
    if !text.contains(HBA_LINE) {
        eprintln!(
            "  allowing the postgres role from 127.0.0.1 without a password ({})",
            hba.display()
        );
        std::fs::write(&hba, format!("{HBA_LINE}\n{text}"))?;
    }
    allow_local_socket(false)?;
    let conf = etc.join("conf.d/effectively-once.conf");
    if !conf.is_file() {
        std::fs::create_dir_all(etc.join("conf.d"))?;
        std::fs::write(&conf, CONF)?;
    }
    let port = opts.get_port().to_string();
    let configured = std::fs::read_to_string(etc.join("postgresql.conf"))?;
    if !configured
        .lines()
        .any(|l| l.trim_start().starts_with(&format!("port = {port}")))
    {
        eprintln!("  serving on port {port}");
        std::fs::write(
            etc.join("conf.d/effectively-once-port.conf"),
            format!("port = {port}\n"),
        )?;
    }
    eprintln!("  starting cluster {version}/{name} (pg_ctlcluster)");
    // Restart: a running cluster picks up the access rule and settings.
    let status = Command::new("pg_ctlcluster")
        .args(["--skip-systemctl-redirect", &version, &name, "restart"])
        .status()?;
    anyhow::ensure!(
        status.success(),
        "pg_ctlcluster {version} {name} restart failed with {status}"
    );
    let end = Instant::now() + Duration::from_secs(30);
    while !answers(&url).await {
        anyhow::ensure!(
            Instant::now() < end,
            "PostgreSQL started but does not answer at {shown}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!("  PostgreSQL answers at {shown}");
    Ok(())
}

/// Adds [`HBA_LOCAL_LINES`] to the Debian cluster's `pg_hba.conf` when
/// they are missing — only to a cluster this module set up (its
/// [`HBA_LINE`] is there) — and, when `reload`, has the running server
/// read it again.
fn allow_local_socket(reload: bool) -> anyhow::Result<()> {
    let Some((version, name)) = cluster() else {
        return Ok(());
    };
    let hba = PathBuf::from(format!("/etc/postgresql/{version}/{name}/pg_hba.conf"));
    let Ok(text) = std::fs::read_to_string(&hba) else {
        return Ok(());
    };
    if !text.contains(HBA_LINE) || text.contains(HBA_LOCAL_LINES) {
        return Ok(());
    }
    eprintln!(
        "allowing the local roles over the server's Unix socket ({})",
        hba.display()
    );
    std::fs::write(&hba, format!("{HBA_LOCAL_LINES}\n{text}"))?;
    if reload {
        let status = Command::new("pg_ctlcluster")
            .args(["--skip-systemctl-redirect", &version, &name, "reload"])
            .status()?;
        anyhow::ensure!(
            status.success(),
            "pg_ctlcluster {version} {name} reload failed with {status}"
        );
    }
    Ok(())
}

/// The directories a local server's Unix socket may be in (Debian's first).
const SOCKET_DIRS: [&str; 2] = ["/var/run/postgresql", "/tmp"];

/// The URL of the server at `server` (a local TCP URL) through its Unix
/// socket — `postgres://postgres@%2Fvar%2Frun%2Fpostgresql:5432`, the
/// socket's directory as the host — when the socket is there and answers;
/// `None` otherwise (a remote server, no socket, or one that refuses).
pub async fn socket_url(server: &str) -> Option<String> {
    let opts = PgConnectOptions::from_str(server).ok()?;
    if !["127.0.0.1", "localhost"].contains(&opts.get_host()) {
        return None;
    }
    let port = opts.get_port();
    let (scheme, rest) = server.split_once("://")?;
    let user = rest.rsplit_once('@').map(|(user, _)| user)?;
    for dir in SOCKET_DIRS {
        if !Path::new(dir).join(format!(".s.PGSQL.{port}")).exists() {
            continue;
        }
        let url = format!("{scheme}://{user}@{}:{port}", dir.replace('/', "%2F"));
        if answers(&url).await {
            return Some(url);
        }
    }
    None
}

/// The server log of the first cluster `pg_lsclusters` lists (its last
/// column), when it is a file this process can see.
pub fn log_file() -> Option<PathBuf> {
    let out = Command::new("pg_lsclusters").arg("--no-header").output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let path = PathBuf::from(text.lines().next()?.split_whitespace().last()?);
    path.is_file().then_some(path)
}

/// The first cluster `pg_lsclusters` lists: (version, name).
fn cluster() -> Option<(String, String)> {
    let out = Command::new("pg_lsclusters").arg("--no-header").output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut fields = text.lines().next()?.split_whitespace();
    Some((fields.next()?.to_owned(), fields.next()?.to_owned()))
}

/// Installs Debian packages (`apt-get update` first); needs root.
pub fn apt_install(packages: &[&str]) -> anyhow::Result<()> {
    let status = Command::new("apt-get").arg("update").arg("-qq").status()?;
    anyhow::ensure!(status.success(), "apt-get update failed with {status} (are you root?)");
    let status = Command::new("apt-get")
        .args(["install", "-y", "-qq", "--no-install-recommends"])
        .args(packages)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .status()?;
    anyhow::ensure!(
        status.success(),
        "apt-get install {} failed with {status} (are you root?)",
        packages.join(" ")
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{probe, Probe};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A server that answers every connection as PostgreSQL does a wrong
    /// password: SSL declined, then a FATAL error for the start-up message.
    async fn refusing_server() -> u16 {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let mut first = [0u8; 8];
                if s.read_exact(&mut first).await.is_err() {
                    continue;
                }
                if first[4..] == [0x04, 0xd2, 0x16, 0x2f] {
                    // SSLRequest: no; then the start-up message.
                    s.write_all(b"N").await.unwrap();
                    let mut len = [0u8; 4];
                    s.read_exact(&mut len).await.unwrap();
                    let mut rest = vec![0u8; u32::from_be_bytes(len) as usize - 4];
                    s.read_exact(&mut rest).await.unwrap();
                }
                let mut fields = Vec::new();
                for (code, text) in [
                    (b'S', "FATAL"),
                    (b'V', "FATAL"),
                    (b'C', "28P01"),
                    (b'M', "password authentication failed for user \"postgres\""),
                ] {
                    fields.push(code);
                    fields.extend_from_slice(text.as_bytes());
                    fields.push(0);
                }
                fields.push(0);
                let mut msg = vec![b'E'];
                msg.extend_from_slice(&(fields.len() as u32 + 4).to_be_bytes());
                msg.extend_from_slice(&fields);
                s.write_all(&msg).await.ok();
            }
        });
        port
    }

    /// A server that answers with an error is told apart from none at all:
    /// the first is reported with its words, only the second leads to an
    /// install.
    #[tokio::test]
    async fn a_server_that_refuses_is_not_a_server_that_is_missing() {
        let free = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let silent = probe(&format!("postgres://postgres@127.0.0.1:{free}")).await;
        assert!(matches!(silent, Probe::Silent(_)), "{silent:?}");

        let port = refusing_server().await;
        match probe(&format!("postgres://postgres:wrong@127.0.0.1:{port}")).await {
            Probe::Refuses(why) => assert!(why.contains("password authentication failed"), "{why}"),
            other => panic!("a server's error is not a missing server: {other:?}"),
        }
    }
}
