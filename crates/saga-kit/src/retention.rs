//! The retention chain, checked before a service starts. Deduplication works
//! only while its records outlive every way a duplicate can still arrive:
//!
//! `gateway key lifetime ≥ inbox retention ≥ topic retention + margin`
//!
//! — a message can be redelivered for as long as the broker keeps it (plus
//! a consumer's outage, the margin), so the inbox must remember it longer;
//! and a payment command redelivered within the inbox window may call the
//! gateway again, so the gateway must still know its key. A configuration
//! that breaks the chain refuses to start and names the variables.

/// One link: a duration in seconds and the variable that sets it.
#[derive(Debug, Clone, Copy)]
pub struct Link {
    /// Seconds.
    pub secs: u64,
    /// The variable that sets it.
    pub var: &'static str,
}

/// Checks `inbox ≥ topic + margin` and, when given, `gateway_key ≥ inbox`.
pub fn check(gateway_key: Option<Link>, inbox: Link, topic: Link, margin: Link) -> anyhow::Result<()> {
    let needed = topic.secs.saturating_add(margin.secs);
    anyhow::ensure!(
        inbox.secs >= needed,
        "{} ({} s) must be at least {} ({} s) + {} ({} s): a message the broker redelivers after its inbox record is purged would be applied again",
        inbox.var,
        inbox.secs,
        topic.var,
        topic.secs,
        margin.var,
        margin.secs
    );
    if let Some(key) = gateway_key {
        anyhow::ensure!(
            key.secs >= inbox.secs,
            "{} ({} s) must be at least {} ({} s): a payment command redelivered inside the inbox window would reach a gateway that forgot its key, and charge again",
            key.var,
            key.secs,
            inbox.var,
            inbox.secs
        );
    }
    Ok(())
}

/// The chain for a consumer service: its inbox against its topics, and, for
/// one that calls a gateway, the gateway's key lifetime against its inbox.
pub fn check_consumer(
    kafka: &kafka::KafkaArgs,
    inbox: &inbox::RetentionArgs,
    gateway_key_secs: Option<u64>,
) -> anyhow::Result<()> {
    check(
        gateway_key_secs.map(|secs| Link {
            secs,
            var: "GATEWAY_KEY_TTL_SECS",
        }),
        Link {
            secs: inbox.secs,
            var: "INBOX_RETENTION_SECS",
        },
        Link {
            secs: kafka.topic_retention_secs,
            var: "KAFKA_TOPIC_RETENTION_SECS",
        },
        Link {
            secs: inbox.margin_secs,
            var: "REDELIVERY_MARGIN_SECS",
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn l(secs: u64, var: &'static str) -> Link {
        Link { secs, var }
    }

    #[test]
    fn the_defaults_hold_and_each_broken_link_is_named() {
        let (key, inbox, topic, margin) = (
            l(8 * 86_400, "GATEWAY_KEY_TTL_SECS"),
            l(7 * 86_400, "INBOX_RETENTION_SECS"),
            l(3 * 86_400, "KAFKA_TOPIC_RETENTION_SECS"),
            l(86_400, "REDELIVERY_MARGIN_SECS"),
        );
        check(Some(key), inbox, topic, margin).unwrap();
        let e = check(None, l(3 * 86_400, "INBOX_RETENTION_SECS"), topic, margin)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("INBOX_RETENTION_SECS")
                && e.contains("KAFKA_TOPIC_RETENTION_SECS")
                && e.contains("REDELIVERY_MARGIN_SECS"),
            "{e}"
        );
        let e = check(Some(l(86_400, "GATEWAY_KEY_TTL_SECS")), inbox, topic, margin)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("GATEWAY_KEY_TTL_SECS") && e.contains("INBOX_RETENTION_SECS"),
            "{e}"
        );
        // Just inside the window holds.
        check(None, l(4 * 86_400, "INBOX_RETENTION_SECS"), topic, margin).unwrap();
    }
}
