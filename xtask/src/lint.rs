//! `cargo xtask lint`: the gates that keep the style — rustfmt, clippy with
//! warnings denied, rustdoc with broken intra-doc links denied — the
//! published crates packaged as crates.io would take them (`cargo package`;
//! the full build of each package is `cargo publish --dry-run`, see the
//! README), and the layout rules of the workspace, read from `cargo metadata`:
//!
//! - no production crate depends on test support (`testkit`, `e2e`, `xtask`);
//! - no dev-dependency cycle (a crate's dev-dependency that itself depends,
//!   at any depth, on the crate: its tests would build a second copy of it);
//! - no source file over 600 lines;
//! - the README's part table names every workspace member and nothing else;
//! - the crate graph in docs/design.md is the graph cargo sees
//!   (`cargo xtask docs` writes it).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context as _;
use serde_json::Value;

/// Crates that are test support or tooling, never a production dependency.
const TEST_SUPPORT: [&str; 3] = ["testkit", "e2e", "xtask"];
/// Lines a source file may have.
const MAX_LINES: usize = 600;
/// The crate graph's place in docs/design.md.
const GRAPH_START: &str = "<!-- crate-graph: written by `cargo xtask docs`, checked by `cargo xtask lint` -->";
const GRAPH_END: &str = "<!-- /crate-graph -->";

/// One workspace member as `cargo metadata` describes it.
#[derive(Debug, Clone)]
pub struct Member {
    /// The package name.
    pub name: String,
    /// Its directory relative to the workspace root (`crates/inbox`, `e2e`).
    pub dir: String,
    /// Workspace crates it depends on (normal and build dependencies).
    pub deps: BTreeSet<String>,
    /// Workspace crates it dev-depends on.
    pub dev_deps: BTreeSet<String>,
}

/// Runs every gate; fails naming each one that failed.
pub fn run(root: &Path, cargo: impl Fn() -> Command) -> anyhow::Result<()> {
    let mut failed = Vec::new();
    // (name, cargo arguments, one environment variable)
    type Step = (
        &'static str,
        &'static [&'static str],
        Option<(&'static str, &'static str)>,
    );
    let steps: [Step; 4] = [
        ("rustfmt", &["fmt", "--all", "--check"], None),
        (
            "clippy",
            &[
                "clippy",
                "--workspace",
                "--all-targets",
                "--all-features",
                "--quiet",
                "--",
                "-D",
                "warnings",
            ],
            None,
        ),
        (
            "rustdoc",
            &["doc", "--workspace", "--no-deps", "--quiet"],
            Some((
                "RUSTDOCFLAGS",
                "-D rustdoc::broken_intra_doc_links -D rustdoc::private_intra_doc_links",
            )),
        ),
        (
            "package",
            &[
                "package",
                "--no-verify",
                "--allow-dirty",
                "--quiet",
                "-p",
                "effectively-once-credentials",
                "-p",
                "effectively-once-inbox",
                "-p",
                "effectively-once-outbox",
                "-p",
                "effectively-once-idempotency",
            ],
            None,
        ),
    ];
    for (name, args, env) in steps {
        println!("lint: {name} (cargo {})", args.join(" "));
        let mut cmd = cargo();
        cmd.args(args).current_dir(root);
        if let Some((k, v)) = env {
            cmd.env(k, v);
        }
        let status = cmd.status().with_context(|| format!("running cargo for {name}"))?;
        if !status.success() {
            failed.push(name.to_owned());
        }
    }
    println!("lint: layout rules (cargo metadata)");
    let members = members(root, &cargo)?;
    let mut broken = layout_problems(&members);
    broken.extend(long_files(root, &members));
    broken.extend(readme_problems(
        &std::fs::read_to_string(root.join("README.md"))?,
        &members,
    ));
    broken.extend(history_problems(root));
    let design = std::fs::read_to_string(root.join("docs/design.md"))?;
    if graph_block(&design) != Some(graph(&members)) {
        broken.push("docs/design.md's crate graph is not the workspace's: run `cargo xtask docs`".into());
    }
    for b in &broken {
        println!("  layout: {b}");
    }
    if !broken.is_empty() {
        failed.push(format!("layout ({} problems)", broken.len()));
    }
    anyhow::ensure!(failed.is_empty(), "lint failed: {}", failed.join(", "));
    println!("lint: all gates passed");
    Ok(())
}

/// The workspace members, from `cargo metadata --no-deps`.
pub fn members(root: &Path, cargo: &impl Fn() -> Command) -> anyhow::Result<Vec<Member>> {
    let out = cargo()
        .args(["metadata", "--format-version", "1", "--no-deps"])
        .current_dir(root)
        .output()
        .context("running cargo metadata")?;
    anyhow::ensure!(out.status.success(), "cargo metadata failed");
    let metadata: Value = serde_json::from_slice(&out.stdout)?;
    parse_members(&metadata)
}

/// [`Member`]s of a `cargo metadata` document.
pub fn parse_members(metadata: &Value) -> anyhow::Result<Vec<Member>> {
    let root = PathBuf::from(metadata["workspace_root"].as_str().context("workspace_root")?);
    let packages = metadata["packages"].as_array().context("packages")?;
    // A member is named by its folder (`crates/inbox` → inbox), as the
    // workspace's code and docs name it: a published crate's package name
    // carries the project's prefix (effectively-once-inbox).
    let folder = |p: &Value| -> anyhow::Result<(String, String)> {
        let manifest = PathBuf::from(p["manifest_path"].as_str().context("manifest_path")?);
        let dir = manifest.parent().context("manifest in a folder")?;
        let name = dir.file_name().context("folder name")?.to_string_lossy().into_owned();
        let dir = dir
            .strip_prefix(&root)
            .map(|d| d.to_string_lossy().into_owned())
            .unwrap_or_default();
        Ok((name, dir))
    };
    let mut names = BTreeMap::new();
    for p in packages {
        names.insert(p["name"].as_str().context("package name")?.to_owned(), folder(p)?.0);
    }
    let mut out = Vec::new();
    for p in packages {
        let (name, dir) = folder(p)?;
        let (mut deps, mut dev_deps) = (BTreeSet::new(), BTreeSet::new());
        for d in p["dependencies"].as_array().into_iter().flatten() {
            let Some(dep) = names.get(d["name"].as_str().unwrap_or_default()).cloned() else {
                continue;
            };
            match d["kind"].as_str() {
                Some("dev") => dev_deps.insert(dep),
                _ => deps.insert(dep),
            };
        }
        out.push(Member {
            name,
            dir,
            deps,
            dev_deps,
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// Production crates on test support, and dev-dependency cycles.
pub fn layout_problems(members: &[Member]) -> Vec<String> {
    let by_name: BTreeMap<&str, &Member> = members.iter().map(|m| (m.name.as_str(), m)).collect();
    let mut out = Vec::new();
    for m in members {
        if !TEST_SUPPORT.contains(&m.name.as_str()) {
            for d in m.deps.iter().filter(|d| TEST_SUPPORT.contains(&d.as_str())) {
                out.push(format!("production crate {} depends on test support {d}", m.name));
            }
        }
        // A crate's dev-dependency on itself turns on its own features
        // (its negative controls) for its tests: no cycle.
        for d in m.dev_deps.iter().filter(|d| **d != m.name) {
            if let Some(path) = path_to(&by_name, d, &m.name) {
                out.push(format!(
                    "dev-dependency cycle: {} dev-depends on {}, which depends on it ({})",
                    m.name,
                    d,
                    path.join(" → ")
                ));
            }
        }
    }
    out
}

/// A chain of normal dependencies from `from` to `to`, if there is one.
fn path_to(by_name: &BTreeMap<&str, &Member>, from: &str, to: &str) -> Option<Vec<String>> {
    let mut seen = BTreeSet::new();
    let mut stack = vec![vec![from.to_owned()]];
    while let Some(path) = stack.pop() {
        let last = path.last().expect("a path has a crate").clone();
        if last == to {
            return Some(path);
        }
        if !seen.insert(last.clone()) {
            continue;
        }
        for d in by_name.get(last.as_str()).map(|m| &m.deps).into_iter().flatten() {
            let mut next = path.clone();
            next.push(d.clone());
            stack.push(next);
        }
    }
    None
}

/// Source files of the members over [`MAX_LINES`].
fn long_files(root: &Path, members: &[Member]) -> Vec<String> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() && path.file_name().is_some_and(|n| n != "target") {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let mut files = Vec::new();
    for m in members {
        walk(&root.join(&m.dir), &mut files);
    }
    files
        .into_iter()
        .filter_map(|f| {
            let n = std::fs::read_to_string(&f).ok()?.lines().count();
            (n > MAX_LINES).then(|| format!("{} has {n} lines (at most {MAX_LINES})", f.display()))
        })
        .collect()
}

/// The first commit of the subject rule (CONTRIBUTING.md): commits after
/// it are read by their subjects, so each fits in `git log --oneline`.
const SUBJECTS_SINCE: &str = "d06cfee";
/// Characters a commit subject may have.
const MAX_SUBJECT: usize = 72;

/// Commits after [`SUBJECTS_SINCE`] whose subject is too long (nothing
/// when the history is not here: a tarball, a shallow clone).
fn history_problems(root: &Path) -> Vec<String> {
    let out = Command::new("git")
        .args(["log", "--format=%h %s", &format!("{SUBJECTS_SINCE}..HEAD")])
        .current_dir(root)
        .output();
    match out {
        Ok(o) if o.status.success() => long_subjects(&String::from_utf8_lossy(&o.stdout)),
        _ => {
            println!("  (commit subjects not checked: no history back to {SUBJECTS_SINCE} here)");
            Vec::new()
        }
    }
}

/// The lines of `git log --format='%h %s'` whose subject is over [`MAX_SUBJECT`].
pub fn long_subjects(log: &str) -> Vec<String> {
    log.lines()
        .filter_map(|l| l.split_once(' '))
        .filter(|(_, subject)| subject.chars().count() > MAX_SUBJECT)
        .map(|(hash, subject)| {
            format!(
                "commit {hash}: subject of {} characters (at most {MAX_SUBJECT}; the detail goes in the body)",
                subject.chars().count()
            )
        })
        .collect()
}

/// Differences between the README's part table and the members.
pub fn readme_problems(readme: &str, members: &[Member]) -> Vec<String> {
    let listed: BTreeSet<String> = readme
        .lines()
        .filter(|l| l.starts_with("| `"))
        .filter_map(|l| l.split('`').nth(1))
        .map(|p| p.trim_end_matches('/').to_owned())
        .filter(|p| {
            ["crates/", "services/", "examples/"].iter().any(|d| p.starts_with(d)) || p == "e2e" || p == "xtask"
        })
        .collect();
    let dirs: BTreeSet<String> = members.iter().map(|m| m.dir.clone()).collect();
    let mut out = Vec::new();
    for d in dirs.difference(&listed) {
        out.push(format!("README's part table lacks {d}"));
    }
    for l in listed.difference(&dirs) {
        out.push(format!(
            "README's part table lists {l}, which is not a workspace member"
        ));
    }
    out
}

/// The crate graph as docs/design.md shows it: one line per crate, its
/// workspace dependencies, then its dev-dependencies.
pub fn graph(members: &[Member]) -> String {
    let width = members.iter().map(|m| m.name.len()).max().unwrap_or(0);
    let mut out = String::from("```text\n");
    for m in members {
        let deps = if m.deps.is_empty() {
            "—".to_owned()
        } else {
            m.deps.iter().cloned().collect::<Vec<_>>().join(", ")
        };
        out.push_str(&format!("{:width$} → {deps}", m.name));
        // A crate's dev-dependency on itself (its own features) is no arrow.
        let dev: Vec<_> = m.dev_deps.iter().filter(|d| **d != m.name).cloned().collect();
        if !dev.is_empty() {
            out.push_str(&format!("   (tests: {})", dev.join(", ")));
        }
        out.push('\n');
    }
    out.push_str("```");
    out
}

/// The graph block between the markers, if the document has them.
pub fn graph_block(doc: &str) -> Option<String> {
    let start = doc.find(GRAPH_START)? + GRAPH_START.len();
    let end = doc[start..].find(GRAPH_END)? + start;
    Some(doc[start..end].trim().to_owned())
}

/// `doc` with its graph block replaced by `graph`.
pub fn with_graph(doc: &str, graph: &str) -> Option<String> {
    let start = doc.find(GRAPH_START)? + GRAPH_START.len();
    let end = doc[start..].find(GRAPH_END)? + start;
    Some(format!("{}\n{graph}\n{}", &doc[..start], &doc[end..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_subject_over_72_characters_is_named_with_its_commit() {
        let ok = "a".repeat(72);
        let long = "b".repeat(73);
        let log = format!("abc1234 {ok}\ndef5678 {long}\n");
        assert_eq!(
            long_subjects(&log),
            vec!["commit def5678: subject of 73 characters (at most 72; the detail goes in the body)".to_owned()]
        );
        let accented = format!("abc1234 {}", "é".repeat(72));
        assert!(long_subjects(&accented).is_empty(), "characters, not bytes");
    }

    fn member(name: &str, deps: &[&str], dev: &[&str]) -> Member {
        Member {
            name: name.into(),
            dir: format!("crates/{name}"),
            deps: deps.iter().map(|d| d.to_string()).collect(),
            dev_deps: dev.iter().map(|d| d.to_string()).collect(),
        }
    }

    #[test]
    fn a_dev_dependency_cycle_and_a_production_crate_on_test_support_are_named() {
        let ok = [
            member("testkit", &[], &[]),
            // Its own features for its tests: allowed.
            member("inbox", &[], &["testkit", "inbox"]),
            member("kafka", &[], &["inbox", "testkit"]),
        ];
        assert!(layout_problems(&ok).is_empty(), "{:?}", layout_problems(&ok));
        // testkit reaching inbox through kafka: inbox's tests would build it twice.
        let cycle = [
            member("testkit", &["kafka"], &[]),
            member("inbox", &[], &["testkit"]),
            member("kafka", &["inbox"], &["testkit"]),
        ];
        let p = layout_problems(&cycle);
        assert!(
            p.iter()
                .any(|l| l.contains("inbox dev-depends on testkit") && l.contains("testkit → kafka → inbox")),
            "{p:?}"
        );
        assert!(p.iter().any(|l| l.contains("kafka dev-depends on testkit")), "{p:?}");
        let on_support = [member("testkit", &[], &[]), member("outbox", &["testkit"], &[])];
        let p = layout_problems(&on_support);
        assert_eq!(p, ["production crate outbox depends on test support testkit"]);
    }

    #[test]
    fn the_readme_table_must_name_each_member_once_and_nothing_else() {
        let members = [member("inbox", &[], &[]), member("kafka", &[], &[])];
        let readme = "| part | what |\n|---|---|\n| `crates/inbox` | x |\n| `crates/gone` | y |\n";
        assert_eq!(
            readme_problems(readme, &members),
            [
                "README's part table lacks crates/kafka",
                "README's part table lists crates/gone, which is not a workspace member"
            ]
        );
    }

    #[test]
    fn the_graph_block_is_read_back_as_written() {
        let members = [
            member("inbox", &["switches"], &["testkit"]),
            member("switches", &[], &[]),
        ];
        let doc = format!("before\n{GRAPH_START}\nold\n{GRAPH_END}\nafter\n");
        let new = with_graph(&doc, &graph(&members)).unwrap();
        assert_eq!(graph_block(&new), Some(graph(&members)));
        assert!(new.starts_with("before\n") && new.ends_with("after\n"), "{new}");
        assert!(
            graph(&members).contains("inbox    → switches   (tests: testkit)"),
            "{}",
            graph(&members)
        );
    }
}
