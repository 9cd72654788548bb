//! The docs cannot go stale silently: every file a doc links or names
//! exists, every function it names is defined — a path (`a::b::f`) in the
//! module it names, a bare name somewhere in the workspace — and
//! operations.md lists every environment variable the code reads.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

mod front;
mod resolve;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// README.md and docs/*.md.
fn docs() -> Vec<PathBuf> {
    let mut out = vec![root().join("README.md")];
    for e in std::fs::read_dir(root().join("docs")).unwrap().flatten() {
        if e.path().extension().is_some_and(|x| x == "md") {
            out.push(e.path());
        }
    }
    out.sort();
    out
}

/// Every `.rs` file of the workspace (not target/).
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if p.is_dir() && !name.starts_with('.') && name != "target" && name != "node_modules" {
            sources(&p, out);
        } else if name.ends_with(".rs") {
            out.push(p);
        }
    }
}

/// The text outside fenced code blocks.
fn prose(text: &str) -> String {
    let mut inside = false;
    text.lines()
        .filter(|l| {
            if l.trim_start().starts_with("```") {
                inside = !inside;
                return false;
            }
            !inside
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The `backticked` spans of `text`.
fn code_spans(text: &str) -> Vec<String> {
    text.split('`').skip(1).step_by(2).map(str::to_owned).collect()
}

/// The targets of `[..](target)` links.
fn links(text: &str) -> Vec<String> {
    text.match_indices("](")
        .filter_map(|(i, _)| {
            let rest = &text[i + 2..];
            rest.find(')').map(|end| rest[..end].to_owned())
        })
        .collect()
}

thread_local! {
    /// Every `.rs` file of the workspace, concatenated.
    static CODE: String = {
        let mut rs = Vec::new();
        sources(&root(), &mut rs);
        rs.iter().map(|p| std::fs::read_to_string(p).unwrap()).collect::<Vec<_>>().join("\n")
    };
}

const ROOTS: [&str; 8] = [
    "crates/",
    "services/",
    "docs/",
    "e2e/",
    "xtask/",
    "migrations/",
    "docker/",
    ".ci/",
];
const METRIC_SUFFIXES: [&str; 8] = [
    "_total", "_seconds", "_count", "_bucket", "_depth", "_lag", "_secs", "_ms",
];

fn is_path(span: &str) -> bool {
    ROOTS.iter().any(|r| span.starts_with(r)) && !span.contains(['<', '{', '*', ' ', '|']) && !span.contains("…")
}

/// A function a doc names: `path::to::name`, or a snake_case name of four
/// words or more that is not a metric, table or column.
fn function(span: &str) -> Option<String> {
    // A crash point's name (`consumer::while_handling`) is a string in the code.
    if span.contains("::") && !span.contains(' ') && CODE.with(|c| c.contains(&format!("\"{span}\""))) {
        return None;
    }
    let plain = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
    };
    if span.contains("::") && !span.contains(' ') {
        let last = span.rsplit("::").next()?.trim_end_matches("()");
        return plain(last).then(|| span.trim_end_matches("()").to_owned());
    }
    (plain(span) && span.matches('_').count() >= 3 && !METRIC_SUFFIXES.iter().any(|s| span.ends_with(s)))
        .then(|| span.to_owned())
}

/// `` `file.rs` — `name` `` (or `, `): a function named right after the file
/// it lives in. Returns (file, name) pairs.
fn file_functions(text: &str) -> Vec<(String, String)> {
    let parts: Vec<&str> = text.split('`').collect();
    let mut out = Vec::new();
    // parts: text, span, text, span, …: spans at odd indices.
    let mut i = 1;
    while i + 2 < parts.len() {
        let (file, between, name) = (parts[i], parts[i + 1], parts[i + 2]);
        let name = name.trim_end_matches("()");
        let plain = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if file.ends_with(".rs") && is_path(file) && [" — ", ", ", " - "].contains(&between) && plain {
            out.push((file.to_owned(), name.to_owned()));
        }
        i += 2;
    }
    out
}

#[test]
fn every_path_and_function_the_docs_name_exists() {
    let code = CODE.with(Clone::clone);
    let tree = resolve::Tree::load(&root());
    let mut all = Vec::new();
    sources(&root(), &mut all);
    let mut missing = BTreeSet::new();
    let (mut paths, mut functions) = (0, 0);
    for doc in docs() {
        let text = prose(&std::fs::read_to_string(&doc).unwrap());
        let name = doc.strip_prefix(root()).unwrap().display().to_string();
        for target in links(&text) {
            let target = target.split('#').next().unwrap_or_default();
            if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            paths += 1;
            if !doc.parent().unwrap().join(target).exists() {
                missing.insert(format!("{name}: link {target}"));
            }
        }
        for (file, f) in file_functions(&text) {
            functions += 1;
            let source = std::fs::read_to_string(root().join(&file)).unwrap_or_default();
            if !source.contains(&format!("fn {f}(")) && !source.contains(&format!("fn {f}<")) {
                missing.insert(format!("{name}: function {f} in {file}"));
            }
        }
        for span in code_spans(&text) {
            if is_path(&span) {
                paths += 1;
                if !root().join(span.trim_end_matches('/')).exists() {
                    missing.insert(format!("{name}: path {span}"));
                }
            } else if let Some(f) = function(&span) {
                functions += 1;
                if f.contains("::") {
                    if let Err(why) = tree.defines(&f, &all) {
                        missing.insert(format!("{name}: {f}: {why}"));
                    }
                    continue;
                }
                let defined = ["fn {f}(", "fn {f}<", "mod {f};", "mod {f} {"]
                    .iter()
                    .any(|pattern| code.contains(&pattern.replace("{f}", &f)));
                if !defined {
                    missing.insert(format!("{name}: function {f}"));
                }
            }
        }
    }
    assert!(
        missing.is_empty(),
        "named in the docs but not in the tree:\n{missing:#?}"
    );
    assert!(
        paths > 50 && functions > 50,
        "only {paths} paths and {functions} functions checked"
    );
}

#[test]
fn operations_md_lists_every_variable_the_code_reads() {
    let mut rs = Vec::new();
    for dir in ["crates", "services"] {
        sources(&root().join(dir), &mut rs);
    }
    let ops = std::fs::read_to_string(root().join("docs/operations.md")).unwrap();
    let mut missing = BTreeSet::new();
    let mut seen = 0;
    for p in rs {
        let text = std::fs::read_to_string(&p).unwrap();
        for (i, _) in text.match_indices("env = \"") {
            let var: String = text[i + 7..].chars().take_while(|c| *c != '"').collect();
            seen += 1;
            if !ops.contains(&format!("`{var}`")) {
                missing.insert(var);
            }
        }
    }
    assert!(seen > 30, "only {seen} variables found");
    assert!(missing.is_empty(), "not in docs/operations.md: {missing:?}");
}
