//! Schemathesis (PyPI), the OpenAPI fuzzer, and `jsonschema`, the JSON Schema
//! validator: in a virtualenv under `target/tools/venv`, created and filled
//! with pip when missing (pinned versions, so a run today and a run next
//! month agree).

use std::path::PathBuf;
use std::process::Command;

/// The version installed when missing.
pub const VERSION: &str = "4.32.5";
/// The `jsonschema` version installed beside it.
pub const JSONSCHEMA_VERSION: &str = "4.26.0";

/// The path of a working `st`, installing schemathesis when missing.
pub fn ensure() -> anyhow::Result<PathBuf> {
    // Tests of one binary run in parallel: one installation at a time.
    static INSTALLING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = INSTALLING.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/tools/venv");
    let st = venv.join("bin/st");
    if Command::new(&st)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        return Ok(st);
    }
    eprintln!("schemathesis is missing: installing {VERSION} into {}", venv.display());
    let status = Command::new("python3").args(["-m", "venv"]).arg(&venv).status()?;
    anyhow::ensure!(status.success(), "python3 -m venv failed with {status}");
    let status = Command::new(venv.join("bin/pip"))
        .args([
            "install",
            "--quiet",
            &format!("schemathesis=={VERSION}"),
            &format!("jsonschema=={JSONSCHEMA_VERSION}"),
        ])
        .status()?;
    anyhow::ensure!(status.success(), "pip install schemathesis failed with {status}");
    Ok(st)
}
