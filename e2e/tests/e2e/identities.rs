//! Kafka with identities, read from the broker: the saga runs with a
//! principal per service over SASL/SCRAM-SHA-512 and TLS, and the brokers'
//! ACLs refuse a client without credentials, a wrong password, and a
//! service's credentials on another service's topic or group — so a forged
//! `ChargePayment` or `PaymentCaptured` never reaches the log, let alone a
//! handler.

use std::time::Duration;

use e2e::Service;
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Message as _, Offset, TopicPartitionList};

use contract::topics::{INVENTORY_COMMANDS, ORDER_EVENTS, PAYMENT_COMMANDS};

/// The high watermarks of every partition of the saga's topics, as `admin`.
fn log_ends(admin: &kafka::KafkaArgs) -> Vec<(String, i32, i64)> {
    let consumer: BaseConsumer = kafka::Connect::client_config(admin).create().unwrap();
    let mut ends = Vec::new();
    for topic in [INVENTORY_COMMANDS, PAYMENT_COMMANDS, ORDER_EVENTS] {
        for p in 0..kafka::PARTITIONS {
            let (_, high) = consumer.fetch_watermarks(topic, p, Duration::from_secs(10)).unwrap();
            ends.push((topic.to_owned(), p, high));
        }
    }
    ends
}

/// Produces one forged message to `topic` with `config` (not idempotent:
/// the refusal is the topic's, not the producer id's); the broker's answer.
async fn forge(config: &ClientConfig, topic: &str) -> Result<(), RDKafkaErrorCode> {
    let producer: FutureProducer = config
        .clone()
        .set("enable.idempotence", "false")
        .set("acks", "all")
        .set("message.timeout.ms", "10000")
        .create()
        .unwrap();
    let key = uuid::Uuid::now_v7().to_string();
    let body = br#"{"forged":true}"#;
    let record = FutureRecord::to(topic).key(&key).payload(&body[..]);
    match producer.send(record, Duration::from_secs(10)).await {
        Ok(_) => Ok(()),
        Err((KafkaError::MessageProduction(code), _)) => Err(code),
        Err((e, _)) => panic!("{topic}: {e}"),
    }
}

/// Reads `topic` with `config` in `group`, as a service does (`subscribe`,
/// or every partition assigned from the start); the first error the broker
/// answers, or Ok once a message came.
fn consume(config: &ClientConfig, topic: &str, group: &str, subscribe: bool) -> Result<(), RDKafkaErrorCode> {
    let consumer: BaseConsumer = config
        .clone()
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    if subscribe {
        consumer.subscribe(&[topic]).unwrap();
    } else {
        let mut tpl = TopicPartitionList::new();
        for p in 0..kafka::PARTITIONS {
            tpl.add_partition_offset(topic, p, Offset::Beginning).unwrap();
        }
        consumer.assign(&tpl).unwrap();
    }
    let end = std::time::Instant::now() + Duration::from_secs(20);
    while std::time::Instant::now() < end {
        match consumer.poll(Duration::from_millis(500)) {
            Some(Ok(m)) => {
                assert_eq!(m.topic(), topic);
                return Ok(());
            }
            Some(Err(e)) => return Err(e.rdkafka_error_code().unwrap_or(RDKafkaErrorCode::Unknown)),
            None => {}
        }
    }
    panic!("{topic} in {group}: neither a message nor an error in 20 s")
}

/// Group `group`'s committed offset on `topic` partition 0, read with
/// `config` (as the group's progress is read to join it).
fn group_offsets(config: &ClientConfig, topic: &str, group: &str) -> Result<(), RDKafkaErrorCode> {
    let consumer: BaseConsumer = config.clone().set("group.id", group).create().unwrap();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(topic, 0);
    consumer
        .committed_offsets(tpl, Duration::from_secs(10))
        .map(drop)
        .map_err(|e| e.rdkafka_error_code().unwrap_or(RDKafkaErrorCode::Unknown))
}

fn as_user(stack: &e2e::Stack, user: &str) -> ClientConfig {
    kafka::Connect::client_config(&stack.kafka_as(user))
}

/// Removals tried: order-api granted Write on the saga's topics beside the
/// relay (`kafka_identity::acls`) — its forged charge was accepted and the
/// test failed there; the StandardAuthorizer out of the nodes' settings
/// (testkit's `broker/security.rs`) — the stack does not start (the broker
/// refuses the ACLs: "No Authorizer is configured").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_brokers_refuse_a_stranger_and_a_service_outside_its_own_topics() {
    let stack = crate::stack("identities").await;
    // The saga runs under its principals and ACLs: an order ends CONFIRMED.
    crate::one_confirmed_order(&stack).await;
    let before = log_ends(&stack.kafka());

    // No credentials: a plaintext client on the TLS listener gets nothing.
    let stranger: BaseConsumer = kafka::client_config(&stack.brokers())
        .set("log_level", "0")
        .create()
        .unwrap();
    assert!(
        stranger.fetch_metadata(None, Duration::from_secs(5)).is_err(),
        "a client without TLS or credentials was answered"
    );
    // A principal's name with a wrong password: refused at authentication.
    let wrong = as_user(&stack, Service::OrderApi.name())
        .set("sasl.password", "0".repeat(64))
        .set("log_level", "0")
        .create::<BaseConsumer>()
        .unwrap()
        .fetch_metadata(None, Duration::from_secs(5));
    assert!(wrong.is_err(), "a wrong password was answered");

    // A service's credentials on another service's topic: each forged
    // message is refused by the broker.
    let forgeries = [
        // order-api's principal forging a charge (card token, amount).
        (Service::OrderApi, PAYMENT_COMMANDS),
        // inventory's forging a capture (an unpaid order CONFIRMED).
        (Service::Inventory, ORDER_EVENTS),
        // payment-service's writing its own commands (a refund, a charge).
        (Service::Payment, PAYMENT_COMMANDS),
        (Service::Payment, INVENTORY_COMMANDS),
    ];
    for (s, topic) in forgeries {
        let answer = forge(&as_user(&stack, s.name()), topic).await;
        assert_eq!(
            answer,
            Err(RDKafkaErrorCode::TopicAuthorizationFailed),
            "{} producing to {topic}",
            s.name()
        );
    }
    // Reading what is not one's own: card tokens on payment.commands, or
    // another consumer's group.
    let reads = [
        // order-api in its own group, after card tokens.
        (
            Service::OrderApi,
            PAYMENT_COMMANDS,
            "order-saga",
            RDKafkaErrorCode::TopicAuthorizationFailed,
        ),
        // inventory in its own group, after the saga's replies.
        (
            Service::Inventory,
            ORDER_EVENTS,
            "inventory-service",
            RDKafkaErrorCode::TopicAuthorizationFailed,
        ),
        // The relay writes and reads nothing: it has no group at all.
        (
            Service::Relay,
            PAYMENT_COMMANDS,
            "outbox-relay",
            RDKafkaErrorCode::GroupAuthorizationFailed,
        ),
    ];
    for (s, topic, group, refusal) in reads {
        let answer = consume(&as_user(&stack, s.name()), topic, group, true);
        assert_eq!(answer, Err(refusal), "{} reading {topic} in {group}", s.name());
    }
    // Its own topic in another consumer's group (taking the saga's replies' partitions from it).
    let answer = consume(
        &as_user(&stack, Service::Payment.name()),
        PAYMENT_COMMANDS,
        "order-saga",
        true,
    );
    assert_eq!(
        answer,
        Err(RDKafkaErrorCode::GroupAuthorizationFailed),
        "payment-service in order-saga's group"
    );

    // The same clients do what their principal may: the refusals above are
    // the ACLs', not a broken client's.
    let dlq = kafka::dead_letter_topic(PAYMENT_COMMANDS);
    assert_eq!(forge(&as_user(&stack, Service::Payment.name()), &dlq).await, Ok(()));
    let payment = as_user(&stack, Service::Payment.name());
    assert_eq!(consume(&payment, PAYMENT_COMMANDS, "payment-service", false), Ok(()));
    assert_eq!(group_offsets(&payment, PAYMENT_COMMANDS, "payment-service"), Ok(()));

    // Nothing forged reached the log, so nothing reached a handler.
    assert_eq!(log_ends(&stack.kafka()), before, "a refused message was written");
    stack.shutdown(true).await.unwrap();
}
