//! Scenario 17's negative control, in a process of its own: the switch it
//! turns on (`outbox::negative_controls::event_id_at_publish`) holds for the
//! whole process, and the relay tests beside it (`tests/relay/main.rs`)
//! check that the record carries the row's own event id.

// The relay tests' helpers; this process needs some of them.
#[allow(dead_code)]
mod common;

use rdkafka::message::Headers as _;
use rdkafka::Message as _;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_switch_on_each_publish_carries_a_new_event_id() {
    outbox::negative_controls::event_id_at_publish();
    let (_serial, brokers, db, topic) = common::setup().await;
    let env = db.enqueue(&topic, uuid::Uuid::new_v4(), 0).await;
    let relay = outbox::Relay::new(db.pool.clone(), outbox::KafkaPublisher::new(&brokers).unwrap(), "t");
    while relay.run_once().await.unwrap().claimed > 0 {}
    let records = testkit::topics::read_all(&brokers, &topic).await.unwrap();
    let record = records.first().expect("the row was published");
    let header = record
        .headers()
        .and_then(|h| h.iter().find(|h| h.key == "event_id"))
        .and_then(|h| h.value)
        .map(|v| String::from_utf8(v.to_vec()).unwrap())
        .expect("an event_id header");
    let body = contract::Envelope::from_bytes(record.payload().unwrap()).unwrap();
    assert_ne!(header, env.event_id.to_string(), "the switch mints a new id");
    assert_eq!(header, body.event_id.to_string(), "header and body agree on the new id");
    db.drop().await;
}
