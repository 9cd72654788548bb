//! The contract documents hold: the AsyncAPI document validates with the
//! AsyncAPI CLI, and every message a saga run put on the topics matches the
//! JSON Schema of its type (docs/contract/schemas).

use std::path::Path;
use std::time::Duration;

const DOCS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/contract");

#[test]
fn the_asyncapi_document_is_valid() {
    let report = testkit::asyncapi::validate(&Path::new(DOCS).join("asyncapi.json")).expect("valid AsyncAPI");
    assert!(report.contains("is valid"), "{report}");
    assert!(report.contains("0 errors"), "{report}");
}

/// Every envelope on every saga topic of `stack` matches its type's schema;
/// returns how many were checked. Called by the saga test after its demo.
pub async fn check_topics(stack: &e2e::Stack) -> usize {
    let brokers = stack.brokers();
    let mut documents = Vec::new();
    for topic in contract::topics::ALL {
        let (b, t) = (brokers.clone(), topic.to_owned());
        let group = format!("contract-{}", uuid::Uuid::new_v4());
        let (messages, _) = tokio::task::spawn_blocking(move || {
            kafka::read_topic(&b, &t, &group, rdkafka::Offset::Beginning, Duration::from_secs(2))
        })
        .await
        .unwrap()
        .unwrap();
        for m in &messages {
            use rdkafka::Message as _;
            documents.push(serde_json::from_slice(m.payload().unwrap_or_default()).expect("every message is JSON"));
        }
    }
    let checked = tokio::task::spawn_blocking(move || {
        testkit::jsonschema::validate_envelopes(&Path::new(DOCS).join("schemas"), &documents)
    })
    .await
    .unwrap()
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(checked > 0, "no message was checked");
    checked
}
