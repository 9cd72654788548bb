//! Kafka plumbing, generic over what the messages carry.
//!
//! - [`config`]: the typed settings ([`KafkaArgs`], flattened into each
//!   service's `--help`);
//! - [`client`]: client configuration, the idempotent producer, topic
//!   creation, identity headers, publishing;
//! - [`consumer`]: the consume loop — decode, hand to an inbox-backed
//!   handler, store the offset only after the handler's transaction,
//!   dead-letter what can never succeed;
//! - [`group`]: consumer-group membership, the rebalance callbacks (and the
//!   consumer's lag and dead-letter gauges, `lag`);
//! - [`dlq`]: dead-letter a message, list and replay dead letters;
//! - [`read`]: read a topic back to its end (audits, tools, tests).
//!
//! What the messages mean is the `contract` crate's business, not this one's.

pub mod client;
pub mod config;
pub mod consumer;
pub mod dlq;
pub mod group;
mod lag;
/// The broken consumer the chaos suite swaps in (feature
/// `negative-controls`): each lane hands its batch to it before handling,
/// compiled only with the feature.
#[cfg(feature = "negative-controls")]
pub mod negative_controls;
pub mod read;

pub use client::{
    client_config, dead_letter_topic, ensure_exactly, ensure_topics, ensure_topics_with, producer,
    producer_with_timeout, publish, topic_config, Connect, TopicSettings,
};
pub use config::KafkaArgs;
pub use outbox::kafka::{headers, idempotent_producer, stamp};
pub use read::{group_lag, read_topic, read_topic_at_most, read_whole_topic};

/// Number of partitions of every topic created here.
pub use client::PARTITIONS;

/// Errors of the Kafka layer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The broker or librdkafka reported an error.
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    /// A topic exists with settings the saga cannot run on, or its settings
    /// could not be read or aligned.
    #[error("topic: {0}")]
    Topic(String),
    /// A read that had to reach the end of a topic stopped short of it.
    #[error("partial read of {topic}: partitions {partitions:?} not read to their end")]
    PartialRead {
        /// The topic.
        topic: String,
        /// The partitions left short.
        partitions: Vec<i32>,
    },
}

impl Error {
    /// Whether the cluster may answer otherwise in a moment: an admin or
    /// metadata request that timed out or found no broker, controller or
    /// leader (a node restarting, an election) — not a topic the saga
    /// cannot run on, nor a refusal.
    pub fn is_transient(&self) -> bool {
        use rdkafka::error::{KafkaError, RDKafkaErrorCode as C};
        match self {
            Self::Kafka(KafkaError::AdminOp(code) | KafkaError::MetadataFetch(code)) => matches!(
                code,
                C::OperationTimedOut
                    | C::RequestTimedOut
                    | C::BrokerTransportFailure
                    | C::AllBrokersDown
                    | C::NotController
                    | C::NetworkException
                    | C::LeaderNotAvailable
                    | C::BrokerNotAvailable
            ),
            _ => false,
        }
    }
}

/// Result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The metrics the consume loop and dead-lettering records, for their `# HELP` (`telemetry::metrics::describe`).
pub const METRICS: &[telemetry::metrics::Description] = telemetry::descriptions![
    counter "consumer_messages_received_total": "Messages a consumer took from the broker.",
    counter "consumer_batches_total": "Handler calls (a batch of one partition's queued messages each).",
    counter "consumer_events_applied_total": "Events whose effect was applied (inbox row written with it).",
    counter "consumer_events_ignored_total": "Events new to the inbox that the handler had nothing to apply for (a stale or illegal saga reply).",
    counter "consumer_duplicates_absorbed_total": "Redelivered events the inbox turned into no-ops.",
    counter "consumer_transient_errors_total": "Handler failures retried in place.",
    counter "consumer_dead_lettered_total": "Messages moved to the dead-letter topic.",
    histogram "consumer_handler_duration_seconds": "Handler latency per call (one batch, one transaction).",
    gauge "consumer_lag": "Messages behind: partition high watermark minus committed offset.",
    counter "consumer_rebuilds_total": "Consumers built anew in-process after librdkafka gave up on one (e.g. a fenced static member), by reason.",
    counter "consumer_rebalances_total": "Group rebalances this member took part in, by kind (assign, revoke).",
    gauge "consumer_partitions_assigned": "1 for each partition the group assigned to this member, 0 once revoked.",
    gauge "dead_letter_depth": "Messages in a consumed topic's dead-letter topic.",
];

#[cfg(test)]
mod error_tests {
    use rdkafka::error::{KafkaError, RDKafkaErrorCode as C};

    use super::Error;

    #[test]
    fn a_timed_out_admin_request_is_transient_and_a_refusal_or_a_bad_topic_is_not() {
        assert!(Error::Kafka(KafkaError::AdminOp(C::OperationTimedOut)).is_transient());
        assert!(Error::Kafka(KafkaError::MetadataFetch(C::AllBrokersDown)).is_transient());
        assert!(!Error::Kafka(KafkaError::AdminOp(C::TopicAuthorizationFailed)).is_transient());
        assert!(!Error::Topic("3 partitions where the saga needs 6".into()).is_transient());
    }
}
