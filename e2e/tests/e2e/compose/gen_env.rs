//! docker/gen-env.sh as a first-time user meets it: it writes the file it
//! is given whole, refuses to overwrite one (compose's volumes keep the
//! passwords of the first), and when openssl fails it says openssl's words.

use std::path::{Path, PathBuf};
use std::process::Output;

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../docker/gen-env.sh");

/// A scratch directory of its own.
fn scratch() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("eo-gen-env-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// gen-env.sh run in `dir` with `args`, its TLS files in `dir/tls`, and
/// `path_first` ahead of PATH.
fn run(dir: &Path, args: &[&str], path_first: Option<&Path>) -> Output {
    let mut path = std::env::var("PATH").unwrap_or_default();
    if let Some(p) = path_first {
        path = format!("{}:{path}", p.display());
    }
    std::process::Command::new("sh")
        .arg(SCRIPT)
        .args(args)
        .current_dir(dir)
        .env("TLS_DIR", dir.join("tls"))
        .env("PATH", path)
        .output()
        .unwrap()
}

#[test]
fn gen_env_writes_its_file_once_and_refuses_to_overwrite_it() {
    let dir = scratch();
    let first = run(&dir, &[".env"], None);
    assert!(first.status.success(), "{}", String::from_utf8_lossy(&first.stderr));
    assert!(first.stdout.is_empty(), "the secrets go to the file, not the terminal");
    let env = std::fs::read_to_string(dir.join(".env")).unwrap();
    assert!(env.lines().any(|l| l.starts_with("POSTGRES_PASSWORD=")), "{env}");
    assert!(dir.join("tls/ca.pem").exists());

    let second = run(&dir, &[".env"], None);
    let said = String::from_utf8_lossy(&second.stderr);
    assert!(!second.status.success());
    assert!(
        said.contains("docker compose down -v"),
        "says how to start over: {said}"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join(".env")).unwrap(),
        env,
        "the first file is kept"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn gen_env_reports_openssls_own_error_and_writes_nothing() {
    let dir = scratch();
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    // An openssl that refuses to make keys, as one too old for EC keys does.
    let fake = bin.join("openssl");
    std::fs::write(
        &fake,
        "#!/bin/sh\n[ \"$1\" = req ] && { echo 'unknown option -pkeyopt (from the fake)' >&2; exit 1; }\nexec /usr/bin/openssl \"$@\"\n",
    )
    .unwrap();
    std::process::Command::new("chmod")
        .arg("+x")
        .arg(&fake)
        .status()
        .unwrap();
    let out = run(&dir, &[".env"], Some(&bin));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains("openssl req failed") && said.contains("unknown option -pkeyopt (from the fake)"),
        "{said}"
    );
    assert!(!dir.join(".env").exists(), "no half-written .env");
    std::fs::remove_dir_all(&dir).unwrap();
}
