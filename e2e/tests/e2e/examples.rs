//! The README's and docs' curl examples, run as written against a stack
//! laid out as `cargo xtask up` lays it out: the fixed ports (8080–8084),
//! the services' secrets in `.data/secrets.env` and client shop-1's API key
//! in `.data/api-key`, the files the examples read. Each must answer 2xx.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The markdown files whose examples a user copies.
fn documents() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = vec![root.join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

/// One example: where it is, the shell lines before it in its block (the
/// `. .data/secrets.env` and `KEY=…` it relies on), and the command.
#[derive(Debug)]
struct Example {
    at: String,
    prelude: Vec<String>,
    command: String,
}

/// Every `curl` of `text` for a stack laid out by `cargo xtask up`: in ```sh blocks (continuation lines joined,
/// comments dropped; the block's variable-setting lines as its prelude)
/// and in inline code spans.
fn examples(name: &str, text: &str) -> Vec<Example> {
    let mut out = Vec::new();
    let mut block: Option<Vec<String>> = None;
    let mut pending = String::new();
    for (n, line) in text.lines().enumerate() {
        let at = format!("{name}:{}", n + 1);
        if line.trim_start().starts_with("```") {
            block = match block {
                // ```sh blocks are for `cargo xtask up`; ```sh compose blocks
                // are compose's, run by the compose check (docker/check.sh).
                None if line.trim_start().trim_start_matches('`').trim() == "sh" => Some(Vec::new()),
                _ => None,
            };
            continue;
        }
        match &mut block {
            Some(prelude) => {
                let line = line.split(" # ").next().unwrap_or_default().trim();
                if line.starts_with('#') || line.is_empty() {
                    continue;
                }
                if let Some(joined) = line.strip_suffix('\\') {
                    pending.push_str(joined);
                    continue;
                }
                let full = std::mem::take(&mut pending) + line;
                if full.starts_with("curl ") {
                    out.push(Example {
                        at,
                        prelude: prelude.clone(),
                        command: full,
                    });
                } else if full.starts_with(". ") || full.contains("=$(") {
                    prelude.push(full);
                }
            }
            None => {
                for span in line.split('`').skip(1).step_by(2) {
                    if span.starts_with("curl ") {
                        out.push(Example {
                            at: at.clone(),
                            prelude: Vec::new(),
                            command: span.to_owned(),
                        });
                    }
                }
            }
        }
    }
    out
}

/// Runs `example` in `dir` with `{id}` as `order`: its HTTP status and body.
fn run(dir: &Path, example: &Example, order: Option<&str>) -> (u16, String) {
    let command = example.command.replace("{id}", order.unwrap_or("{id}"));
    let script = format!(
        "set -e\n{}\n{command} -sS -o response -w '%{{http_code}}'",
        example.prelude.join("\n")
    );
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg(&script)
        .current_dir(dir)
        .output()
        .unwrap();
    let status = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap_or(0);
    let body = std::fs::read_to_string(dir.join("response")).unwrap_or_default();
    assert!(
        out.status.success(),
        "{}: {command}: {}",
        example.at,
        String::from_utf8_lossy(&out.stderr)
    );
    (status, body)
}

/// The examples find everything they need where the README says: each
/// answers 2xx, the order they place is CONFIRMED before the cancel runs,
/// and the cancel then refunds it. The examples are found, not listed:
/// a new curl in the docs is run too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_curl_in_the_readme_and_docs_answers_as_documented() {
    let all: Vec<Example> = documents()
        .iter()
        .flat_map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            examples(&name, &std::fs::read_to_string(p).unwrap())
        })
        .collect();
    assert!(all.len() >= 8, "{all:#?}");
    let _share = crate::share().await;
    let mut opts = e2e::StackOptions::ephemeral("examples").unwrap();
    opts.fixed_ports = true;
    opts.remove_run_dir_on_drop = true;
    let stack = e2e::Stack::start(opts).await.expect("stack starts on the fixed ports");
    let workdir = stack.options().run_dir.join("workspace");
    std::fs::create_dir_all(workdir.join(".data")).unwrap();
    std::fs::write(workdir.join(".data/secrets.env"), stack.secrets().to_env_file()).unwrap();
    std::fs::create_dir_all(workdir.join(".data/tls")).unwrap();
    std::fs::write(workdir.join(".data/tls/ca.pem"), stack.ca_pem()).unwrap();
    let key = stack.create_api_key("shop-1").await.unwrap();
    std::fs::write(workdir.join(".data/api-key"), &key).unwrap();

    let mut order: Option<String> = None;
    let mut failures = Vec::new();
    for example in &all {
        if example.command.contains("{id}/cancel") {
            let id = order.as_deref().expect("an order placed before its cancel");
            wait_for(&key, id, "CONFIRMED").await;
        }
        let (status, body) = run(&workdir, example, order.as_deref());
        if !(200..300).contains(&status) {
            failures.push(format!("{}: {} → {status} {body}", example.at, example.command));
            continue;
        }
        let places_an_order = example.command.contains("localhost:8080/orders ") && example.command.contains(" -d ");
        if places_an_order {
            // `-i` puts the headers first; the order is the JSON after them.
            let json = body.split("\r\n\r\n").last().unwrap_or_default();
            let placed: serde_json::Value = serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {body}"));
            order.get_or_insert_with(|| placed["id"].as_str().expect("id").to_owned());
        }
    }
    assert!(failures.is_empty(), "examples that failed:\n{}", failures.join("\n"));
    if let Some(id) = &order {
        wait_for(&key, id, "CANCELLED").await;
    }
    stack.shutdown(true).await.unwrap();
}

/// Waits up to 60 s for order `id` (of the client holding `key`) to reach `status`.
async fn wait_for(key: &str, id: &str, status: &str) {
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let now: serde_json::Value = http
            .get(format!("http://127.0.0.1:8080/orders/{id}"))
            .bearer_auth(key)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if now["status"].as_str() == Some(status) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "order {id} is {} not {status}",
            now["status"]
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
