//! `cargo xtask docs`: the committed API documents, written from the code,
//! and the crate graph of docs/design.md, written from `cargo metadata`.
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
    let design = docs.join("design.md");
    let members = crate::lint::members(&crate::workspace_root(), &crate::cargo)?;
    let text = crate::lint::with_graph(&std::fs::read_to_string(&design)?, &crate::lint::graph(&members))
        .ok_or_else(|| anyhow::anyhow!("docs/design.md has no crate-graph markers"))?;
    written.push(write(&design, &text)?);
    Ok(written)
}

fn write(path: &Path, text: &str) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(path.parent().expect("under docs/"))?;
    std::fs::write(path, text)?;
    Ok(path.to_path_buf())
}
