//! JSON Schemas of the wire format, generated from the Rust types
//! (`schemars`): one per message type — the envelope with that type's
//! `event_type` and `payload` — in two kinds, both committed:
//!
//! - the **audit** schemas (docs/contract/schemas, referenced by
//!   docs/contract/asyncapi.json): closed, every field of this version and
//!   no other — what the test suite checks every message on the topics
//!   against, so a field produced by mistake is caught;
//! - the **reader** schemas (docs/contract/schemas/reader): open to unknown
//!   fields and to any minor version of this major — what a consumer that
//!   validates its input should use, so that the next minor (which only
//!   adds optional fields) still passes, and another major does not.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use crate::{Envelope, Message};

/// A generated document as committed under docs/contract: pretty JSON
/// and a final newline.
pub fn document_text(doc: &Value) -> String {
    serde_json::to_string_pretty(doc).expect("a JSON value serializes") + "\n"
}

/// `event_type` → the audit schema of an envelope carrying that message:
/// closed ([`reader_schemas`] are the open ones).
pub fn message_schemas() -> BTreeMap<String, Value> {
    let mut out = open_schemas();
    for schema in out.values_mut() {
        close(schema);
    }
    out
}

/// `event_type` → the reader schema of an envelope carrying that message:
/// unknown fields allowed anywhere, `version` any minor of [`crate::envelope::MAJOR`]
/// (or absent: 1.0).
pub fn reader_schemas() -> BTreeMap<String, Value> {
    let mut out = open_schemas();
    for schema in out.values_mut() {
        schema["description"] = json!(format!(
            "{} Reader schema: open to fields a later minor version adds.",
            schema["description"].as_str().unwrap_or_default()
        ));
        schema["properties"]["version"]["pattern"] = json!(format!("^{}\\.[0-9]+$", crate::envelope::MAJOR));
    }
    out
}

/// The schemas before either kind's finish.
fn open_schemas() -> BTreeMap<String, Value> {
    let envelope = serde_json::to_value(schemars::schema_for!(Envelope)).expect("schema is JSON");
    let messages = serde_json::to_value(schemars::schema_for!(Message)).expect("schema is JSON");
    let variants = messages["oneOf"].as_array().cloned().unwrap_or_default();
    let mut out = BTreeMap::new();
    for variant in variants {
        let props = &variant["properties"];
        let Some(event_type) = props["event_type"]["const"].as_str() else {
            continue;
        };
        let mut schema = envelope.clone();
        schema["title"] = json!(event_type);
        schema["description"] = variant["description"].clone();
        schema["properties"]["event_type"] = props["event_type"].clone();
        schema["properties"]["payload"] = match props.get("payload") {
            Some(payload) => payload.clone(),
            None => json!({"type": "null"}),
        };
        if let Some(defs) = messages.get("$defs") {
            schema["$defs"] = defs.clone();
        }
        let required = schema["required"].as_array_mut().expect("envelope has required fields");
        if !required.contains(&json!("payload")) {
            required.push(json!("payload"));
        }
        out.insert(event_type.to_owned(), schema);
    }
    out
}

/// Marks every object schema with properties `additionalProperties: false`
/// (unless it combines subschemas, where that would refuse the siblings'
/// properties): a document names every field a message of this version
/// carries, so a message with another field was not produced by it. Readers
/// still ignore unknown fields (the next minor may add some); the schema of
/// that minor then names them.
fn close(schema: &mut Value) {
    match schema {
        Value::Object(obj) => {
            let combines = ["allOf", "oneOf", "anyOf"].iter().any(|k| obj.contains_key(*k));
            if obj.contains_key("properties") && !combines && !obj.contains_key("additionalProperties") {
                obj.insert("additionalProperties".into(), Value::Bool(false));
            }
            obj.values_mut().for_each(close);
        }
        Value::Array(items) => items.iter_mut().for_each(close),
        _ => {}
    }
}

/// A schema as an AsyncAPI component: without the `$schema` keyword (the
/// document states its schema format).
fn component(mut schema: Value) -> Value {
    if let Some(obj) = schema.as_object_mut() {
        obj.remove("$schema");
    }
    schema
}

/// Which service sends each topic's messages (through its outbox and the relay).
const SENDERS: [(&str, &str); 3] = [
    (crate::topics::INVENTORY_COMMANDS, "order-api"),
    (crate::topics::PAYMENT_COMMANDS, "order-api"),
    (crate::topics::ORDER_EVENTS, "inventory-service and payment-service"),
];

/// The AsyncAPI 3.0 document of the saga: every topic and its dead-letter
/// topic, every message with its headers and payload schema, who sends and
/// who receives what.
pub fn asyncapi() -> Value {
    let schemas = message_schemas();
    let mut components_schemas = serde_json::Map::new();
    let mut components_messages = serde_json::Map::new();
    let mut channels = serde_json::Map::new();
    let mut operations = serde_json::Map::new();
    components_schemas.insert(
        "Headers".into(),
        json!({
            "type": "object",
            "description": "Kafka headers of every saga message.",
            "properties": {
                "event_id": {"type": "string", "format": "uuid", "description": "the envelope's event_id: unique across the whole system (every topic, order and producer), the same on every copy of one event"},
                "event_type": {"type": "string", "description": "the envelope's event_type"},
                "traceparent": {"type": "string", "description": "W3C trace context of the relay's publish span"},
                "correlation_id": {"type": "string", "format": "uuid", "description": "the envelope's correlation_id (the saga), repeated so a reader's span and logs carry it without decoding the body"},
                "causation_id": {"type": "string", "format": "uuid", "description": "the envelope's causation_id, when it has one"},
                "producer": {"type": "string", "description": "the service whose outbox the relay read the record from (never the row's word); a reader checks it against the type"}
            },
            "required": ["event_id", "event_type"]
        }),
    );
    components_schemas.insert(
        "DeadLetterHeaders".into(),
        json!({
            "type": "object",
            "description": "The original message's headers plus why and where it was dead-lettered.",
            "properties": {
                "dlq.error": {"type": "string", "description": "the reason (decode error, permanent handler error)"},
                "dlq.consumer": {"type": "string", "description": "the consumer group that refused it"},
                "dlq.topic": {"type": "string"},
                "dlq.partition": {"type": "string"},
                "dlq.offset": {"type": "string"}
            },
            "required": ["dlq.error", "dlq.consumer", "dlq.topic", "dlq.partition", "dlq.offset"]
        }),
    );
    components_messages.insert(
        "DeadLetter".into(),
        json!({
            "name": "DeadLetter",
            "title": "A message a consumer could never handle",
            "summary": "The original key and bytes, unchanged; `cargo xtask dlq replay <topic>` puts it back.",
            "headers": {"$ref": "#/components/schemas/DeadLetterHeaders"},
            "payload": {}
        }),
    );
    for (event_type, schema) in &schemas {
        let message: Message = match Message::from_parts(event_type, example_payload(schema)) {
            Ok(m) => m,
            Err(_) => continue,
        };
        components_schemas.insert(event_type.clone(), component(schema.clone()));
        components_messages.insert(
            event_type.clone(),
            json!({
                "name": event_type,
                "title": event_type,
                "summary": schema["description"],
                "contentType": "application/json",
                "headers": {"$ref": "#/components/schemas/Headers"},
                "payload": {"$ref": format!("#/components/schemas/{event_type}")},
                "correlationId": {"location": "$message.payload#/correlation_id"},
                "x-topic": message.topic(),
                "x-on-repeat": crate::repeats::of(event_type).map(|r| r.on_repeat.says())
            }),
        );
    }
    for topic in crate::topics::ALL {
        let refs: serde_json::Map<String, Value> = components_messages
            .iter()
            .filter(|(_, m)| m["x-topic"] == topic)
            .map(|(name, _)| (name.clone(), json!({"$ref": format!("#/components/messages/{name}")})))
            .collect();
        let list: Vec<Value> = refs
            .keys()
            .map(|name| json!({"$ref": format!("#/channels/{topic}/messages/{name}")}))
            .collect();
        let sender = SENDERS.iter().find(|(t, _)| *t == topic).map_or("", |(_, s)| s);
        let consumer = crate::topics::consumers::ALL
            .iter()
            .find(|c| c.topic == topic)
            .expect("every topic has a consumer");
        channels.insert(
            topic.into(),
            json!({
                "address": topic,
                "description": format!("Sent by {sender} (written to its outbox, published by outbox-relay); read by consumer group {}. Key: the order id.", consumer.name),
                "messages": refs
            }),
        );
        let dlq = format!("{topic}.dlq");
        channels.insert(
            dlq.clone(),
            json!({
                "address": dlq,
                "description": format!("Messages of {topic} that {} could never handle.", consumer.name),
                "messages": {"DeadLetter": {"$ref": "#/components/messages/DeadLetter"}}
            }),
        );
        let id = topic.replace('.', "_");
        operations.insert(
            format!("send_{id}"),
            json!({"action": "send", "channel": {"$ref": format!("#/channels/{topic}")}, "summary": format!("{sender} sends"), "messages": list}),
        );
        operations.insert(
            format!("receive_{id}"),
            json!({"action": "receive", "channel": {"$ref": format!("#/channels/{topic}")}, "summary": format!("{} receives (inbox-deduplicated)", consumer.name), "messages": list}),
        );
        operations.insert(
            format!("deadletter_{id}"),
            json!({"action": "send", "channel": {"$ref": format!("#/channels/{dlq}")}, "summary": format!("{} dead-letters", consumer.name), "messages": [{"$ref": format!("#/channels/{dlq}/messages/DeadLetter")}]}),
        );
    }
    for m in components_messages.values_mut() {
        if let Some(obj) = m.as_object_mut() {
            obj.remove("x-topic");
        }
    }
    json!({
        "asyncapi": "3.0.0",
        "info": {
            "title": "effectively-once saga",
            "version": crate::envelope::VERSION,
            "description": "The messages between order-api, inventory-service and payment-service. Every message travels in the envelope (docs/contract.md); its event_id is fixed when the sender writes its outbox row, is unique across the whole system (every topic, order and producer: a UUIDv7), and every consumer deduplicates on it."
        },
        "defaultContentType": "application/json",
        "servers": {
            "local": {"host": "127.0.0.1:9092", "protocol": "kafka", "description": "Apache Kafka (KRaft), as started by cargo xtask up"}
        },
        "channels": channels,
        "operations": operations,
        "components": {"schemas": components_schemas, "messages": components_messages}
    })
}

/// A payload that fits `schema` well enough to name the message's topic.
pub(crate) fn example_payload(schema: &Value) -> Value {
    let payload = &schema["properties"]["payload"];
    if payload["type"] == "null" {
        return Value::Null;
    }
    let mut out = serde_json::Map::new();
    for (name, prop) in payload["properties"].as_object().into_iter().flatten() {
        let v = match prop["type"].as_str() {
            Some("integer") => json!(1),
            _ => json!("x"),
        };
        out.insert(name.clone(), v);
    }
    Value::Object(out)
}
