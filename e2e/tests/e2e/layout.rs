//! The layout rules of the workspace, checked so they cannot rot: the
//! README's part table names every member, test support stays out of the
//! production crates' dependencies, no source file grows past reading size.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// `crates/<x>` and `services/<x>` directories, plus `e2e` and `xtask`.
fn members() -> Vec<String> {
    let mut out = vec!["e2e".to_owned(), "xtask".to_owned()];
    for group in ["crates", "services"] {
        for entry in std::fs::read_dir(root().join(group)).unwrap().flatten() {
            if entry.path().join("Cargo.toml").is_file() {
                out.push(format!("{group}/{}", entry.file_name().to_string_lossy()));
            }
        }
    }
    out.sort();
    out
}

/// The names listed in a manifest section (`[dependencies]` etc.).
fn section(manifest: &str, name: &str) -> Vec<String> {
    let mut inside = false;
    let mut out = Vec::new();
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            inside = line == format!("[{name}]");
            continue;
        }
        if inside && !line.is_empty() && !line.starts_with('#') {
            if let Some((dep, _)) = line.split_once(['.', '=']) {
                out.push(dep.trim().to_owned());
            }
        }
    }
    out
}

#[test]
fn the_readme_part_table_names_every_workspace_member_and_nothing_else() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let listed: Vec<String> = readme
        .lines()
        .filter(|l| l.starts_with("| `"))
        .filter_map(|l| l.split('`').nth(1))
        .map(|p| p.trim_end_matches('/').to_owned())
        .filter(|p| p.starts_with("crates/") || p.starts_with("services/") || p == "e2e" || p == "xtask")
        .collect();
    for m in members() {
        assert!(listed.contains(&m), "README's part table lacks {m}");
    }
    for l in &listed {
        assert!(
            members().contains(l),
            "README's part table lists {l}, which is not in the tree"
        );
    }
}

#[test]
fn test_support_is_never_a_dependency_of_a_production_crate() {
    for m in members()
        .iter()
        .filter(|m| m.starts_with("crates/") || m.starts_with("services/"))
    {
        let manifest = std::fs::read_to_string(root().join(m).join("Cargo.toml")).unwrap();
        let deps = section(&manifest, "dependencies");
        for forbidden in ["e2e", "testkit"] {
            assert!(!deps.iter().any(|d| d == forbidden), "{m} depends on {forbidden}");
        }
        let dev = section(&manifest, "dev-dependencies");
        assert!(!dev.iter().any(|d| d == "e2e"), "{m} dev-depends on e2e (a cycle)");
    }
}

#[test]
fn no_source_file_is_longer_than_600_lines() {
    fn walk(dir: &Path, out: &mut Vec<(PathBuf, usize)>) {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() && path.file_name().is_some_and(|n| n != "target" && n != ".git") {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let lines = std::fs::read_to_string(&path).unwrap().lines().count();
                out.push((path, lines));
            }
        }
    }
    let mut files = Vec::new();
    for dir in ["crates", "services", "e2e", "xtask"] {
        walk(&root().join(dir), &mut files);
    }
    let long: Vec<_> = files.iter().filter(|(_, n)| *n > 600).collect();
    assert!(long.is_empty(), "over 600 lines: {long:?}");
}
