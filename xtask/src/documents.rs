//! `cargo xtask docs`: the committed API documents and `.env.example`,
//! written from the code, and the crate graph of docs/design.md, written
//! from `cargo metadata`.
//! The staleness tests (each service's OpenAPI test, contract's documents
//! test) compare with what is committed and never write.

use std::path::{Path, PathBuf};

/// Writes every generated document under docs/; returns the paths written.
pub fn regenerate() -> anyhow::Result<Vec<PathBuf>> {
    let docs = crate::workspace_root().join("docs");
    let mut written = Vec::new();
    let openapi = [
        ("order-api", order_api::http::openapi_json()),
        ("inventory-service", inventory_service::openapi_json()),
        ("mock-gateway", mock_gateway::openapi_json()),
    ];
    for (name, text) in openapi {
        written.push(write(&docs.join("openapi").join(format!("{name}.json")), &text)?);
    }
    let contract = docs.join("contract");
    for (event_type, schema) in contract::schema::message_schemas() {
        let path = contract.join("schemas").join(format!("{event_type}.json"));
        written.push(write(&path, &contract::schema::document_text(&schema))?);
    }
    for (event_type, schema) in contract::schema::reader_schemas() {
        let path = contract.join("schemas/reader").join(format!("{event_type}.json"));
        written.push(write(&path, &contract::schema::document_text(&schema))?);
    }
    let asyncapi = contract::schema::document_text(&contract::schema::asyncapi());
    written.push(write(&contract.join("asyncapi.json"), &asyncapi)?);
    written.push(write(&crate::workspace_root().join(".env.example"), &env_example())?);
    let design = docs.join("design.md");
    let members = crate::lint::members(&crate::workspace_root(), &crate::cargo)?;
    let text = crate::lint::with_graph(&std::fs::read_to_string(&design)?, &crate::lint::graph(&members))
        .ok_or_else(|| anyhow::anyhow!("docs/design.md has no crate-graph markers"))?;
    written.push(write(&design, &text)?);
    Ok(written)
}

/// `.env.example`: every variable each service reads, with its default
/// and the first line of its `--help`, read from the service's own
/// configuration (clap) — so it cannot say what the code does not.
pub fn env_example() -> String {
    use clap::CommandFactory as _;
    let mut out = String::from(
        "# Every environment variable each service reads, its default and what it is for,\n\
         # written by `cargo xtask docs` from the services' own configuration (their --help);\n\
         # a test fails when it is stale. Commented out: a reference, not a file to load.\n\
         # A variable without a default and marked required is a secret or an address the\n\
         # service refuses to start without (`sh docker/gen-env.sh .env` makes compose's;\n\
         # docker-compose.yml and docs/operations.md say who needs which).\n",
    );
    let services = [
        ("order-api", order_api::Config::command()),
        ("inventory-service", inventory_service::Config::command()),
        ("payment-service", payment_service::Config::command()),
        ("outbox-relay", outbox_relay::Config::command()),
        ("mock-gateway", mock_gateway::Config::command()),
    ];
    for (name, command) in services {
        out.push_str(&format!("\n# ── {name} ──\n"));
        for arg in command.get_arguments() {
            let Some(env) = arg.get_env() else { continue };
            let help = arg
                .get_help()
                .map(|h| first_sentence(&h.to_string()))
                .unwrap_or_default();
            let default: Vec<String> = arg
                .get_default_values()
                .iter()
                .map(|v| v.to_string_lossy().into_owned())
                .collect();
            let value = match (default.is_empty(), arg.is_required_set()) {
                (false, _) => default.join(","),
                (true, true) => "(required)".to_owned(),
                (true, false) => String::new(),
            };
            out.push_str(&format!("# {}={value}\n#     {help}\n", env.to_string_lossy()));
        }
    }
    out
}

/// The first sentence of `help`, at most about a line.
fn first_sentence(help: &str) -> String {
    let line = help.lines().next().unwrap_or_default().trim();
    let sentence = line
        .split_once(". ")
        .map_or(line, |(first, _)| first)
        .trim_end_matches('.');
    match sentence.char_indices().nth(110) {
        Some((cut, _)) => format!("{}…", &sentence[..cut]),
        None => sentence.to_owned(),
    }
}

fn write(path: &Path, text: &str) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(path.parent().expect("under the workspace"))?;
    std::fs::write(path, text)?;
    Ok(path.to_path_buf())
}

#[cfg(test)]
mod tests {
    /// `.env.example` is what `cargo xtask docs` writes from the code now.
    #[test]
    fn the_env_example_is_the_services_configuration() {
        let committed = std::fs::read_to_string(crate::workspace_root().join(".env.example")).unwrap();
        assert!(
            committed == super::env_example(),
            ".env.example is stale: run `cargo xtask docs`"
        );
        for var in [
            "ADMIN_ADDR",
            "HTTP_TLS_CERT_FILE",
            "GATEWAY_CA_FILE",
            "API_NEW_CARDS_PER_MIN",
        ] {
            assert!(committed.contains(&format!("# {var}=")), "{var}");
        }
    }
}
