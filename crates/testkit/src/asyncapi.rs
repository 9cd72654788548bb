//! The AsyncAPI CLI (npm `@asyncapi/cli`, pinned), found under
//! `target/tools/asyncapi` or installed there with npm; run with its
//! usage analytics off (a test talks to nothing outside this machine).

use std::path::PathBuf;
use std::process::Command;

/// The version installed when missing.
pub const VERSION: &str = "6.2.0";

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/tools/asyncapi")
}

/// The path of the `asyncapi` command, installing it when missing.
pub fn ensure() -> anyhow::Result<PathBuf> {
    // Tests of one binary run in parallel: one installation at a time.
    static INSTALLING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = INSTALLING.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let bin = dir().join("node_modules/.bin/asyncapi");
    if bin.exists() {
        return Ok(bin);
    }
    eprintln!(
        "the AsyncAPI CLI is missing: installing @asyncapi/cli {VERSION} into {} (about a minute)",
        dir().display()
    );
    std::fs::create_dir_all(dir())?;
    let status = Command::new("npm")
        .args(["install", "--no-audit", "--no-fund", "--loglevel=error", "--prefix"])
        .arg(dir())
        .arg(format!("@asyncapi/cli@{VERSION}"))
        .status()?;
    anyhow::ensure!(status.success(), "npm install @asyncapi/cli failed with {status}");
    Ok(bin)
}

/// `asyncapi validate <document>`: Ok with its report, or Err with it.
pub fn validate(document: &std::path::Path) -> anyhow::Result<String> {
    let bin = ensure()?;
    let settings = dir().join("analytics.json");
    std::fs::write(
        &settings,
        r#"{"analyticsEnabled":"false","infoMessageShown":"true","userID":"effectively-once-tests"}"#,
    )?;
    let out = Command::new(bin)
        .arg("validate")
        .arg(document)
        .env("ASYNCAPI_METRICS_CONFIG_PATH", &settings)
        .env("SUPPRESS_NO_CONFIG_WARNING", "1")
        .output()?;
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    anyhow::ensure!(out.status.success(), "asyncapi validate failed:\n{report}");
    Ok(report)
}
