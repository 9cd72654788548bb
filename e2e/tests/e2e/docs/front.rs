//! The README is a front page: short, with one quick start per way of
//! running the stack, each in its own setting, and links that land.

use super::{docs, links, root};

/// The fenced blocks of `text` whose info string is `info`, each as its lines.
fn blocks<'a>(text: &'a str, info: &str) -> Vec<Vec<&'a str>> {
    let mut out = Vec::new();
    // Inside a block: whether it is one of ours, and its lines so far.
    let mut inside: Option<(bool, Vec<&str>)> = None;
    for line in text.lines() {
        if let Some(rest) = line.trim_start().strip_prefix("```") {
            inside = match inside.take() {
                Some((ours, lines)) => {
                    if ours {
                        out.push(lines);
                    }
                    None
                }
                None => Some((rest.trim() == info, Vec::new())),
            };
        } else if let Some((_, lines)) = inside.as_mut() {
            lines.push(line);
        }
    }
    out
}

/// GitHub's anchor of a heading: lower case, punctuation dropped, spaces
/// as hyphens.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a markdown file's headings (outside code blocks).
fn anchors(text: &str) -> Vec<String> {
    let mut fenced = false;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced && line.starts_with('#') {
            out.push(slug(line.trim_start_matches('#')));
        }
    }
    out
}

#[test]
fn the_readme_is_a_front_page_with_a_quick_start_for_each_path() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(lines <= 120, "README.md has {lines} lines; the rest belongs in docs/");

    // Compose's path: its own block, everything from compose, nothing of `xtask up`'s.
    let compose = blocks(&readme, "sh compose");
    assert_eq!(compose.len(), 1, "one compose quick start");
    let compose = compose[0].join("\n");
    for step in [
        "sh docker/gen-env.sh .env",
        "docker compose up --build",
        "KEY=$(docker compose run --rm -T seed)",
        "curl -i -X POST 127.0.0.1:8080/orders",
        "127.0.0.1:8080/orders/{id}",
    ] {
        assert!(
            compose.contains(step),
            "the compose quick start lacks {step:?}:\n{compose}"
        );
    }
    assert!(
        !compose.contains(".data/"),
        "compose's path reads nothing of `xtask up`'s .data/"
    );

    // `xtask up`'s path: the files it keeps, and no container.
    let local = blocks(&readme, "sh").concat().join("\n");
    for step in [
        "cargo xtask up",
        ". .data/secrets.env",
        "KEY=$(cat .data/api-key)",
        "localhost:8080/orders",
    ] {
        assert!(local.contains(step), "the local quick start lacks {step:?}:\n{local}");
    }
    assert!(!local.contains("docker"), "the local path runs no container");
    assert!(readme.contains("cargo xtask test"), "the test command");
}

/// A link to a heading of another document (`running.md#docker-compose`)
/// lands on a heading that exists.
#[test]
fn every_link_to_a_heading_lands_on_one() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for doc in docs() {
        let text = std::fs::read_to_string(&doc).unwrap();
        for link in links(&text) {
            let Some((file, anchor)) = link.split_once('#') else {
                continue;
            };
            if file.contains("://") || !(file.is_empty() || file.ends_with(".md")) {
                continue;
            }
            let target = if file.is_empty() {
                doc.clone()
            } else {
                doc.parent().unwrap().join(file)
            };
            let Ok(target_text) = std::fs::read_to_string(&target) else {
                continue;
            };
            checked += 1;
            if !anchors(&target_text).iter().any(|a| a == anchor) {
                broken.push(format!("{}: {link}", doc.strip_prefix(root()).unwrap().display()));
            }
        }
    }
    assert!(broken.is_empty(), "links to headings that do not exist:\n{broken:#?}");
    assert!(checked >= 3, "only {checked} links to headings checked");
}

#[test]
fn blocks_and_slugs_read_as_github_does() {
    let text = "```sh compose\na\n```\n```sh\nb\n```\n```text\nc\n```\n";
    assert_eq!(blocks(text, "sh compose"), vec![vec!["a"]]);
    assert_eq!(blocks(text, "sh"), vec![vec!["b"]]);
    assert_eq!(slug(" The API under `cargo xtask up`"), "the-api-under-cargo-xtask-up");
    assert_eq!(slug(" Docker Compose"), "docker-compose");
}
