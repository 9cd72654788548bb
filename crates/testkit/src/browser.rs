//! Headless Chromium (Debian's `chromium`, installed when missing): a page's
//! DOM after its scripts ran, and a screenshot of it.

use std::path::Path;
use std::process::Command;

/// The browser, installed (as root, with apt-get) if it is missing.
pub fn ensure() -> anyhow::Result<&'static str> {
    const PROGRAM: &str = "chromium";
    let works = || {
        Command::new(PROGRAM)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !works() {
        eprintln!("{PROGRAM} is missing: installing Debian's chromium package with apt-get");
        crate::postgres::apt_install(&["chromium"])?;
        anyhow::ensure!(works(), "{PROGRAM} still does not run after installing it");
    }
    Ok(PROGRAM)
}

fn headless(extra: &[&str], url: &str) -> anyhow::Result<std::process::Output> {
    let program = ensure()?;
    let profile = tempfile_dir()?;
    let out = Command::new(program)
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"])
        .arg(format!("--user-data-dir={}", profile.display()))
        // Scripts and their fetches get this much time before the page is read.
        .arg("--virtual-time-budget=10000")
        .args(extra)
        .arg(url)
        .output()?;
    let _ = std::fs::remove_dir_all(&profile);
    anyhow::ensure!(
        out.status.success(),
        "chromium {url}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(out)
}

fn tempfile_dir() -> anyhow::Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("eo-chromium-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// The page at `url` as its DOM stands once its scripts ran.
pub fn dom(url: &str) -> anyhow::Result<String> {
    Ok(String::from_utf8(headless(&["--dump-dom"], url)?.stdout)?)
}

/// A PNG of the page at `url`, `width` × `height` pixels, written to `to`.
pub fn screenshot(url: &str, to: &Path, width: u32, height: u32) -> anyhow::Result<()> {
    let shot = format!("--screenshot={}", to.display());
    let size = format!("--window-size={width},{height}");
    headless(&[&shot, &size], url)?;
    anyhow::ensure!(to.exists(), "chromium wrote no screenshot to {}", to.display());
    Ok(())
}
