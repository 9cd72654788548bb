//! `promtool`, Prometheus's checker, and the `prometheus` server, found or installed: on `PATH`, else
//! under `target/tools/`, else unpacked there from Debian's `prometheus`
//! package (downloaded with `apt-get download`, not installed: no daemon is
//! started and nothing outside the workspace changes).

use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};

fn tools_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/tools")
}

/// The path of a working `promtool`, installing it into `target/tools` when missing.
pub fn ensure() -> anyhow::Result<PathBuf> {
    ensure_binary("promtool")
}

/// The path of a working `prometheus` server binary (for a test that
/// scrapes a running stack and queries it), installed the same way.
pub fn ensure_server() -> anyhow::Result<PathBuf> {
    ensure_binary("prometheus")
}

/// `name` (a binary of Debian's `prometheus` package): on `PATH`, else under
/// `target/tools/`, else unpacked there from the package.
fn ensure_binary(name: &str) -> anyhow::Result<PathBuf> {
    // Tests of one binary run in parallel: one installation at a time.
    static INSTALLING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = INSTALLING.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if Command::new(name)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        return Ok(PathBuf::from(name));
    }
    let dir = tools_dir();
    let local = dir.join(name);
    if local.exists() {
        return Ok(local);
    }
    eprintln!(
        "{name} is missing: unpacking it from Debian's prometheus package into {}",
        dir.display()
    );
    let work = tempfile_dir()?;
    let status = Command::new("apt-get")
        .args(["download", "prometheus"])
        .current_dir(&work)
        .status()?;
    anyhow::ensure!(status.success(), "apt-get download prometheus failed with {status}");
    let deb = std::fs::read_dir(&work)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "deb"))
        .ok_or_else(|| anyhow::anyhow!("no .deb downloaded"))?;
    let unpacked = work.join("x");
    let status = Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&unpacked).status()?;
    anyhow::ensure!(status.success(), "dpkg-deb -x failed with {status}");
    std::fs::create_dir_all(&dir)?;
    std::fs::copy(unpacked.join("usr/bin").join(name), &local)?;
    let _ = std::fs::remove_dir_all(&work);
    Ok(local)
}

fn tempfile_dir() -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("eo-promtool-{}-{}", std::process::id(), uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// A Prometheus server of a test's own: its own port and temp storage,
/// scraping the given targets every second; killed (by its pid) and its
/// storage removed when dropped.
pub struct Server {
    child: std::process::Child,
    dir: PathBuf,
    url: String,
}

impl Server {
    /// Starts Prometheus scraping `targets` (`(job, "host:port")`) every
    /// second, and waits until it answers.
    pub fn start(targets: &[(&str, String)]) -> anyhow::Result<Server> {
        let binary = ensure_server()?;
        let dir = tempfile_dir()?;
        let mut config = String::from("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n");
        for (job, target) in targets {
            config.push_str(&format!(
                "  - job_name: {job}\n    static_configs:\n      - targets: ['{target}']\n"
            ));
        }
        std::fs::write(dir.join("prometheus.yml"), config)?;
        let port = crate::ports::free()?;
        let log = std::fs::File::create(dir.join("prometheus.log"))?;
        let child = Command::new(binary)
            .arg(format!("--config.file={}", dir.join("prometheus.yml").display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        let server = Server {
            child,
            dir,
            url: format!("http://127.0.0.1:{port}"),
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            anyhow::ensure!(
                std::time::Instant::now() < deadline,
                "prometheus did not listen on {port} within 30 s: {}",
                server.log()
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        Ok(server)
    }

    /// Its HTTP API's base URL (`/api/v1/query`, `/api/v1/targets`).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// What the server logged.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Runs `promtool check metrics` on an exposition page; the problems it
/// reports, empty when the page is clean.
pub fn check_metrics(promtool: &std::path::Path, page: &str) -> anyhow::Result<String> {
    let mut child = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    child.stdin.take().expect("piped stdin").write_all(page.as_bytes())?;
    let out = child.wait_with_output()?;
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(String::new())
    } else {
        Ok(report)
    }
}

/// Runs `promtool check rules` on a rule file; its report, and whether the
/// file is valid.
pub fn check_rules(promtool: &std::path::Path, file: &std::path::Path) -> anyhow::Result<(bool, String)> {
    on_file(promtool, &["check", "rules"], file)
}

/// Runs `promtool test rules` on a rule test file; its report, and
/// whether every case passed.
pub fn test_rules(promtool: &std::path::Path, file: &std::path::Path) -> anyhow::Result<(bool, String)> {
    on_file(promtool, &["test", "rules"], file)
}

/// `promtool <args> <file>`: whether it succeeded, and everything it said.
fn on_file(promtool: &std::path::Path, args: &[&str], file: &std::path::Path) -> anyhow::Result<(bool, String)> {
    let out = Command::new(promtool).args(args).arg(file).output()?;
    Ok((
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    ))
}
