//! docs/contract (the AsyncAPI document and one JSON Schema per message
//! type) is generated from the Rust types and committed; this test fails
//! when the committed files are stale, and never writes them: regenerate
//! with `cargo xtask docs`.

use std::path::PathBuf;

fn docs() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/contract")
}

fn check(path: PathBuf, generated: &serde_json::Value) {
    let text = contract::schema::document_text(generated);
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == text,
        "{} is stale: run `cargo xtask docs` and commit it",
        path.display()
    );
}

#[test]
fn the_committed_contract_documents_are_current() {
    let schemas = contract::schema::message_schemas();
    assert_eq!(schemas.len(), 11, "one schema per message type: {:?}", schemas.keys());
    for (event_type, schema) in &schemas {
        check(docs().join("schemas").join(format!("{event_type}.json")), schema);
    }
    let readers = contract::schema::reader_schemas();
    assert_eq!(readers.keys().collect::<Vec<_>>(), schemas.keys().collect::<Vec<_>>());
    for (event_type, schema) in &readers {
        assert!(
            !contract::schema::document_text(schema).contains("additionalProperties\": false"),
            "{event_type}'s reader schema refuses unknown fields"
        );
        check(docs().join("schemas/reader").join(format!("{event_type}.json")), schema);
    }
    let asyncapi = contract::schema::asyncapi();
    assert_eq!(asyncapi["asyncapi"], "3.0.0");
    for topic in contract::topics::ALL {
        assert!(asyncapi["channels"][topic].is_object(), "{topic}");
        assert!(asyncapi["channels"][format!("{topic}.dlq")].is_object(), "{topic}.dlq");
    }
    check(docs().join("asyncapi.json"), &asyncapi);
}

#[test]
fn every_message_type_round_trips_through_its_schema_shape() {
    // Each schema names its type and requires a payload of the type's shape.
    for (event_type, schema) in contract::schema::message_schemas() {
        assert_eq!(schema["properties"]["event_type"]["const"], event_type.as_str());
        assert!(schema["required"].as_array().unwrap().contains(&"payload".into()));
    }
}
