//! `promtool`, Prometheus's checker, found or installed: on `PATH`, else
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
    // Tests of one binary run in parallel: one installation at a time.
    static INSTALLING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = INSTALLING.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if Command::new("promtool")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        return Ok(PathBuf::from("promtool"));
    }
    let dir = tools_dir();
    let local = dir.join("promtool");
    if local.exists() {
        return Ok(local);
    }
    eprintln!(
        "promtool is missing: unpacking it from Debian's prometheus package into {}",
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
    std::fs::copy(unpacked.join("usr/bin/promtool"), &local)?;
    let _ = std::fs::remove_dir_all(&work);
    Ok(local)
}

fn tempfile_dir() -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("eo-promtool-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
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
    let out = Command::new(promtool).args(["check", "rules"]).arg(file).output()?;
    Ok((
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    ))
}
