//! Where a Rust path a doc names can be defined: `idempotency::fingerprint`
//! in the idempotency crate's root, `saga::reconcile::retry_refund` in a
//! crate's `saga/reconcile.rs`, `Stack::restart` in a file with both the
//! type and the function. A name defined somewhere else does not count.

use std::path::{Path, PathBuf};

/// The workspace's crates: (library name, directory).
pub struct Tree {
    crates: Vec<(String, PathBuf)>,
}

impl Tree {
    pub fn load(root: &Path) -> Self {
        let mut dirs = vec![root.join("e2e"), root.join("xtask")];
        for group in ["crates", "services"] {
            for e in std::fs::read_dir(root.join(group)).unwrap().flatten() {
                dirs.push(e.path());
            }
        }
        let crates = dirs
            .into_iter()
            .filter(|d| d.join("Cargo.toml").exists())
            .map(|d| {
                let name = d.file_name().unwrap().to_string_lossy().replace('-', "_");
                (name, d)
            })
            .collect();
        Self { crates }
    }

    /// The files a module path (`a::b`, maybe starting with a crate's
    /// name) can be: `src/a/b.rs`, `src/a/b/mod.rs`, a test target's
    /// `tests/<t>/a/b.rs`, or the crate root when the path is the crate.
    fn module_files(&self, modules: &[&str]) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for (name, dir) in &self.crates {
            if modules.first() == Some(&name.as_str()) {
                out.extend(candidates(&dir.join("src"), &modules[1..]));
            }
            let mut bases = vec![dir.join("src"), dir.join("tests"), dir.join("benches")];
            if let Ok(targets) = std::fs::read_dir(dir.join("tests")) {
                bases.extend(targets.flatten().map(|e| e.path()).filter(|p| p.is_dir()));
            }
            for base in bases {
                out.extend(candidates(&base, modules));
            }
        }
        out.retain(|p| p.is_file());
        out.sort();
        out.dedup();
        out
    }

    /// Whether `path` (`a::b::f`, `a::Type::f`, `Type::f`) names a function
    /// or module `f` defined where the path says; `all` is every source file.
    pub fn defines(&self, path: &str, all: &[PathBuf]) -> Result<(), String> {
        let segments: Vec<&str> = path.trim_end_matches("()").split("::").collect();
        let (f, parents) = segments.split_last().expect("a path has segments");
        let ty = parents
            .iter()
            .position(|s| s.starts_with(|c: char| c.is_ascii_uppercase()));
        let modules = &parents[..ty.unwrap_or(parents.len())];
        let mut files = if modules.is_empty() {
            all.to_vec()
        } else {
            let files = self.inline_or_file(modules);
            if files.is_empty() {
                return Err(format!("module {} is no file", modules.join("::")));
            }
            files
        };
        if let Some(t) = ty {
            // A type a module re-exports is defined in its crate's files.
            let ty = parents[t];
            let crate_dirs: Vec<&Path> = self
                .crates
                .iter()
                .filter(|(_, dir)| files.iter().any(|f| f.starts_with(dir)))
                .map(|(_, dir)| dir.as_path())
                .collect();
            files.extend(
                all.iter()
                    .filter(|f| crate_dirs.iter().any(|d| f.starts_with(d)))
                    .filter(|f| {
                        let text = std::fs::read_to_string(f).unwrap_or_default();
                        [
                            format!("impl {ty}"),
                            format!("for {ty}"),
                            format!("struct {ty}"),
                            format!("enum {ty}"),
                        ]
                        .iter()
                        .any(|p| text.contains(p.as_str()))
                    })
                    .cloned(),
            );
        }
        let found = files.iter().any(|file| {
            let text = std::fs::read_to_string(file).unwrap_or_default();
            let in_type = ty.is_none_or(|t| text.contains(parents[t]));
            in_type && (defines_fn(&text, f) || re_exports(&text, f))
        });
        if found {
            Ok(())
        } else {
            Err(format!("{f} is not defined in {}", files_named(&files)))
        }
    }
}

impl Tree {
    /// The module's own files, or else its parent's files when they hold
    /// it inline (`mod tests { … }`).
    fn inline_or_file(&self, modules: &[&str]) -> Vec<PathBuf> {
        let files = self.module_files(modules);
        match modules.split_last() {
            Some((last, parent)) if files.is_empty() && !parent.is_empty() => self
                .module_files(parent)
                .into_iter()
                .filter(|f| {
                    std::fs::read_to_string(f)
                        .unwrap_or_default()
                        .contains(&format!("mod {last} {{"))
                })
                .collect(),
            _ => files,
        }
    }
}

fn candidates(base: &Path, rest: &[&str]) -> Vec<PathBuf> {
    if rest.is_empty() {
        return vec![base.join("lib.rs"), base.join("main.rs")];
    }
    let joined = rest.join("/");
    vec![base.join(format!("{joined}.rs")), base.join(&joined).join("mod.rs")]
}

fn defines_fn(text: &str, f: &str) -> bool {
    ["fn {f}(", "fn {f}<", "mod {f};", "mod {f} {"]
        .iter()
        .any(|pattern| text.contains(&pattern.replace("{f}", f)))
}

/// A `pub use` line naming `f` as a whole word.
fn re_exports(text: &str, f: &str) -> bool {
    text.lines().filter(|l| l.trim_start().starts_with("pub use")).any(|l| {
        l.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .any(|w| w == f)
    })
}

fn files_named(files: &[PathBuf]) -> String {
    if files.len() > 3 {
        return format!("any of {} files", files.len());
    }
    files
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}
