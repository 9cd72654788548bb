//! The contract documents hold: the AsyncAPI document validates with the
//! AsyncAPI CLI, and every message a saga run put on the topics matches the
//! JSON Schema of its type (docs/contract/schemas).

use std::path::Path;
use std::time::Duration;

const DOCS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/contract");

#[tokio::test]
async fn the_asyncapi_document_is_valid() {
    // The AsyncAPI CLI (node, and npm's install the first time) is not
    // beside a chaos run, whose rate it would slow.
    let _share = crate::share().await;
    let report = testkit::asyncapi::validate(&Path::new(DOCS).join("asyncapi.json")).expect("valid AsyncAPI");
    assert!(report.contains("is valid"), "{report}");
    assert!(report.contains("0 errors"), "{report}");
}

/// Every envelope on every saga topic of `stack` matches its type's schema;
/// returns how many were checked. Called by the saga test after its demo.
pub async fn check_topics(stack: &e2e::Stack) -> usize {
    let brokers = stack.kafka();
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

/// A reader that validates its input uses the reader schemas: a message of
/// the next minor version (a new optional field in the envelope and in the
/// payload) passes them, while the audit schemas refuse it; another major
/// is refused by both.
#[test]
fn a_next_minor_message_passes_the_reader_schemas_and_another_major_does_not() {
    let message = contract::Message::ReserveStock {
        sku: "WIDGET".into(),
        quantity: 2,
    };
    let mut next_minor = serde_json::to_value(contract::Envelope::new(uuid::Uuid::now_v7(), &message, None)).unwrap();
    let (major, minor) = contract::envelope::VERSION.split_once('.').unwrap();
    next_minor["version"] = format!("{major}.{}", minor.parse::<u32>().unwrap() + 1).into();
    next_minor["tenant"] = "acme".into();
    next_minor["payload"]["warehouse"] = "north".into();
    let (audit, reader) = (Path::new(DOCS).join("schemas"), Path::new(DOCS).join("schemas/reader"));
    assert_eq!(
        testkit::jsonschema::validate_envelopes(&reader, std::slice::from_ref(&next_minor)).unwrap(),
        1
    );
    assert!(
        testkit::jsonschema::validate_envelopes(&audit, std::slice::from_ref(&next_minor)).is_err(),
        "the audit schema names every field of this version"
    );
    let mut next_major = next_minor.clone();
    next_major["version"] = format!("{}.0", major.parse::<u32>().unwrap() + 1).into();
    assert!(
        testkit::jsonschema::validate_envelopes(&reader, &[next_major]).is_err(),
        "another major is refused"
    );
}

#[test]
fn a_message_with_an_undocumented_field_or_a_malformed_value_is_refused() {
    let message = contract::Message::ReserveStock {
        sku: "WIDGET".into(),
        quantity: 2,
    };
    let good = serde_json::to_value(contract::Envelope::new(uuid::Uuid::now_v7(), &message, None)).unwrap();
    let schemas = Path::new(DOCS).join("schemas");
    assert_eq!(
        testkit::jsonschema::validate_envelopes(&schemas, std::slice::from_ref(&good)).unwrap(),
        1
    );
    type Spoil = (&'static str, fn(&mut serde_json::Value));
    let spoiled: [Spoil; 5] = [
        ("an extra envelope field", |m| m["shard"] = 3.into()),
        ("an extra payload field", |m| m["payload"]["colour"] = "red".into()),
        ("an event id that is no uuid", |m| m["event_id"] = "42".into()),
        ("a time without its zone", |m| {
            m["occurred_at"] = "2026-12-01T10:00:00".into()
        }),
        ("a quantity wider than int32", |m| {
            m["payload"]["quantity"] = (1u64 << 40).into()
        }),
    ];
    for (what, spoil) in spoiled {
        let mut bad = good.clone();
        spoil(&mut bad);
        let refused = testkit::jsonschema::validate_envelopes(&schemas, &[bad]);
        assert!(refused.is_err(), "{what} was accepted");
        println!("contract: {what} refused: {}", refused.unwrap_err());
    }
}
