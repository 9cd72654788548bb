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
        std::env::split_paths(&paths).map(|d| d.join("tansu")).find(|p| p.is_file())
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
