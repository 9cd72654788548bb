//! The check every service's OpenAPI test makes: the document generated from
//! the code equals the one committed under docs/openapi (regenerated with
//! `cargo xtask docs`; the check never writes), is OpenAPI 3.1, documents the given paths, and
//! answers every 4xx/5xx with `application/problem+json`.

use std::path::PathBuf;

/// Checks `generated` against `docs/openapi/<name>.json`; panics with what to
/// do. `not_problems` lists the error statuses documented with another body
/// on purpose, as `"METHOD /path STATUS"`.
pub fn check_committed(name: &str, generated: &str, paths: &[&str], not_problems: &[&str]) {
    let committed_path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../docs/openapi")
        .join(format!("{name}.json"));
    let committed = std::fs::read_to_string(&committed_path).unwrap_or_default();
    assert!(
        committed == generated,
        "docs/openapi/{name}.json is stale: run `cargo xtask docs` and commit it"
    );
    let doc: serde_json::Value = serde_json::from_str(generated).expect("the document is JSON");
    assert!(
        doc["openapi"].as_str().unwrap_or_default().starts_with("3.1"),
        "OpenAPI 3.1"
    );
    for path in paths {
        assert!(doc["paths"][path].is_object(), "{path} is not documented");
    }
    for (path, ops) in doc["paths"].as_object().expect("paths") {
        for (method, op) in ops.as_object().expect("operations") {
            for (status, resp) in op["responses"].as_object().expect("responses") {
                let exempt = not_problems.contains(&format!("{} {path} {status}", method.to_uppercase()).as_str());
                if (status.starts_with('4') || status.starts_with('5')) && !exempt {
                    assert!(
                        resp["content"]["application/problem+json"].is_object(),
                        "{method} {path} {status} is not problem+json"
                    );
                }
            }
        }
    }
}
