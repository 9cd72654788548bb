//! Losses before the log: what the outbox pattern exists to prevent, judged
//! from the outboxes, the orders' history and the broker's own clock.
//!
//! A message that never reaches its topic is not "late": the deadline
//! reconciler's re-send (or a participant re-emitting its stored reply for
//! that re-send) puts a copy in the log later, and that copy is then the
//! first one the log holds — so reading the log alone, the order looks
//! merely slow. Two checks see through it:
//!
//! - **the outbox against the log**: every row the relay settled as
//!   published (deleted, its publication recorded in `outbox_published`)
//!   has a copy of its event id in its topic appended (the broker's
//!   `LogAppendTime`) no later than its first settle
//!   (`outbox_published.first_published_at`, which a re-send does not
//!   reset). A settle with no copy before it is a relay that settled what
//!   it never delivered.
//! - **a re-send against the log**: a command the reconciler re-sent at `R`
//!   is late only if its first copy in the log predates `R`, or its outbox
//!   row was written before `R` and still waited for the relay then (the
//!   relay was behind: the first check ties that row's mark to the log).
//!   Otherwise the command never existed before its rescue — written apart
//!   from its business transaction, and lost with it.
//! - **an order against its command**: the command an order waits on
//!   (`orders.last_command_id`) is written in the transaction that moved the
//!   order, so it is always in the outbox (pending, or recorded published)
//!   or the log; one in neither was
//!   lost before the re-send even came (evident at once, not at the deadline).

use std::collections::BTreeMap;

use sqlx::Connection as _;
use uuid::Uuid;

use super::provenance::Log;
use crate::stack::Stack;

/// One message lost before the log, in words, with its order and the time
/// its loss was first evident (the mark or the re-send).
#[derive(Debug, Clone)]
pub(super) struct Lost {
    /// The order it belonged to.
    pub order_id: Uuid,
    /// What the evidence says.
    pub what: String,
    /// The mark without a copy, or the re-send that found none.
    pub at: chrono::DateTime<chrono::Utc>,
}

/// An outbox row as the first check reads it: event id, topic, order (the
/// key), first mark.
type Marked = (Uuid, String, String, chrono::DateTime<chrono::Utc>);

/// Rows marked published whose first copy in the log came after the mark,
/// or never came.
pub(super) fn marked_before_appended(source: &str, rows: &[Marked], log: &Log) -> Vec<Lost> {
    let mut lost = Vec::new();
    for (event_id, topic, key, marked) in rows {
        let first = log.first_appended(topic, *event_id);
        let in_time = first.is_some_and(|ms| ms <= marked.timestamp_millis());
        if !in_time {
            lost.push(Lost {
                order_id: key.parse().unwrap_or_default(),
                what: format!(
                    "{source}'s outbox row {event_id} on {topic} marked published at {} but {}",
                    marked.format("%H:%M:%S%.3f"),
                    match first.and_then(chrono::DateTime::from_timestamp_millis) {
                        Some(at) => format!("first appended to the log at {}", at.format("%H:%M:%S%.3f")),
                        None => "never in the log".to_owned(),
                    }
                ),
                at: *marked,
            });
        }
    }
    lost
}

/// A re-send as the second check reads it: order, cause, event id, when;
/// and the command's outbox row (written, first marked), if it has one.
pub(super) struct Resend {
    order_id: Uuid,
    cause: String,
    event_id: Uuid,
    at: chrono::DateTime<chrono::Utc>,
    written: Option<chrono::DateTime<chrono::Utc>>,
    first_marked: Option<chrono::DateTime<chrono::Utc>>,
}

/// Re-sent commands that were nowhere before their re-send: not in the log,
/// and not waiting in the outbox either.
pub(super) fn resent_before_existing(resends: &[Resend], log: &Log) -> Vec<Lost> {
    let mut lost = Vec::new();
    for r in resends {
        let first = log.first_appended_anywhere(r.event_id);
        let in_log = first.is_some_and(|ms| ms < r.at.timestamp_millis());
        let waiting = r.written.is_some_and(|w| w < r.at) && r.first_marked.is_none_or(|m| m >= r.at);
        if !in_log && !waiting {
            lost.push(Lost {
                order_id: r.order_id,
                what: format!(
                    "order {}: {} at {} found command {} in neither the log (first copy {}) nor the outbox (row written {})",
                    r.order_id,
                    r.cause,
                    r.at.format("%H:%M:%S%.3f"),
                    r.event_id,
                    first
                        .and_then(chrono::DateTime::from_timestamp_millis)
                        .map_or_else(|| "never".to_owned(), |t| t.format("%H:%M:%S%.3f").to_string()),
                    r.written
                        .map_or_else(|| "never".to_owned(), |t| t.format("%H:%M:%S%.3f").to_string()),
                ),
                at: r.at,
            });
        }
    }
    lost
}

/// Orders whose command (`last_command_id`) is in neither their outbox
/// (`waiting` holds only those) nor the log.
pub(super) fn commands_nowhere(waiting: &[(Uuid, Uuid, chrono::DateTime<chrono::Utc>)], log: &Log) -> Vec<Lost> {
    waiting
        .iter()
        .filter(|(_, command, _)| log.first_appended_anywhere(*command).is_none())
        .map(|(order, command, at)| Lost {
            order_id: *order,
            what: format!("order {order} waits on command {command}, which is in neither its outbox nor the log"),
            at: *at,
        })
        .collect()
}

/// The three checks over the stack's databases and `log`.
pub(super) async fn lost_before_the_log(stack: &Stack, log: &Log) -> anyhow::Result<Vec<Lost>> {
    let mut lost = Vec::new();
    for db in ["orders", "inventory", "payments"] {
        let mut c = sqlx::PgConnection::connect(&stack.db_url(db)).await?;
        let rows: Vec<Marked> =
            sqlx::query_as("SELECT event_id, topic, message_key, first_published_at FROM outbox_published")
                .fetch_all(&mut c)
                .await?;
        lost.extend(marked_before_appended(db, &rows, log));
    }
    let mut c = sqlx::PgConnection::connect(&stack.db_url("orders")).await?;
    type Row = (
        Uuid,
        String,
        Uuid,
        chrono::DateTime<chrono::Utc>,
        Option<chrono::DateTime<chrono::Utc>>,
        Option<chrono::DateTime<chrono::Utc>>,
    );
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT h.order_id, h.cause, h.event_id, h.at, COALESCE(p.created_at, o.created_at), p.first_published_at
         FROM order_history h
              LEFT JOIN outbox_published p ON p.event_id = h.event_id
              LEFT JOIN outbox o ON o.event_id = h.event_id
         WHERE h.cause LIKE 'Resent:%' AND h.event_id IS NOT NULL",
    )
    .fetch_all(&mut c)
    .await?;
    let resends: Vec<Resend> = rows
        .into_iter()
        .map(|(order_id, cause, event_id, at, written, first_marked)| Resend {
            order_id,
            cause,
            event_id,
            at,
            written,
            first_marked,
        })
        .collect();
    lost.extend(resent_before_existing(&resends, log));
    let waiting: Vec<(Uuid, Uuid, chrono::DateTime<chrono::Utc>)> = sqlx::query_as(
        "SELECT o.id, o.last_command_id, o.updated_at FROM orders o
         WHERE o.last_command_id IS NOT NULL
           AND NOT EXISTS (SELECT 1 FROM outbox x WHERE x.event_id = o.last_command_id)
           AND NOT EXISTS (SELECT 1 FROM outbox_published p WHERE p.event_id = o.last_command_id)",
    )
    .fetch_all(&mut c)
    .await?;
    lost.extend(commands_nowhere(&waiting, log));
    Ok(lost)
}

/// The losses per order, for the report: the first evidence of each.
pub(super) fn per_order(lost: &[Lost]) -> BTreeMap<Uuid, &Lost> {
    let mut out: BTreeMap<Uuid, &Lost> = BTreeMap::new();
    for l in lost {
        let e = out.entry(l.order_id).or_insert(l);
        if l.at < e.at {
            *e = l;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use chrono::{DateTime, Utc};
    use contract::{Envelope, Message};
    use rdkafka::message::OwnedMessage;
    use rdkafka::Timestamp;
    use uuid::Uuid;

    use super::*;

    fn at_ms(ms: i64) -> DateTime<Utc> {
        DateTime::from_timestamp_millis(ms).unwrap()
    }

    /// `envelope` appended by the broker at `ms`.
    fn appended(envelope: &Envelope, offset: i64, ms: i64) -> OwnedMessage {
        let headers = kafka::headers(&envelope.event_id.to_string(), &envelope.event_type, None);
        OwnedMessage::new(
            Some(envelope.to_bytes()),
            Some(envelope.order_id.to_string().into_bytes()),
            "inventory.commands".into(),
            Timestamp::LogAppendTime(ms),
            0,
            offset,
            Some(headers),
        )
    }

    #[test]
    fn a_mark_before_the_first_copy_is_a_loss_and_a_copy_before_it_is_not() {
        let order = Uuid::new_v4();
        let [sent, unsent, never] = [(); 3].map(|()| Envelope::new(order, &Message::ReleaseStock, None));
        let mut log = Log::default();
        // `sent` appended at 1,000 and marked at 1,000 (same millisecond) —
        // in time; `unsent` marked at 1,000, its first copy (a re-send's)
        // at 40,000; `never` marked and nowhere in the log.
        log.add(
            "inventory.commands",
            &[appended(&sent, 1, 1_000), appended(&unsent, 2, 40_000)],
        );
        let row = |e: &Envelope, ms| {
            (
                e.event_id,
                "inventory.commands".to_owned(),
                order.to_string(),
                at_ms(ms),
            )
        };
        let rows = [row(&sent, 1_000), row(&unsent, 1_000), row(&never, 2_000)];
        let lost = marked_before_appended("inventory", &rows, &log);
        let ids: Vec<bool> = lost
            .iter()
            .map(|l| l.what.contains(&sent.event_id.to_string()))
            .collect();
        assert_eq!(lost.len(), 2, "{lost:?}");
        assert!(!ids.contains(&true), "the row sent in time is not a loss: {lost:?}");
        assert!(lost[0].what.contains("first appended to the log at"), "{lost:?}");
        assert!(lost[1].what.contains("never in the log"), "{lost:?}");
        assert_eq!(lost[0].order_id, order);
    }

    #[test]
    fn a_resend_is_late_only_when_its_command_existed_before_it() {
        let order = Uuid::new_v4();
        let [in_log, waiting, never_written, marked_unsent] =
            [(); 4].map(|()| Envelope::new(order, &Message::ReleaseStock, None));
        let mut log = Log::default();
        log.add(
            "inventory.commands",
            &[
                appended(&in_log, 1, 10_000),
                appended(&waiting, 2, 45_000),
                appended(&never_written, 3, 45_000),
                appended(&marked_unsent, 4, 45_000),
            ],
        );
        let resend = |e: &Envelope, written: Option<i64>, marked: Option<i64>| Resend {
            order_id: order,
            cause: "Resent:ReleaseStock".into(),
            event_id: e.event_id,
            at: at_ms(40_000),
            written: written.map(at_ms),
            first_marked: marked.map(at_ms),
        };
        let resends = [
            // In the log at 10 s, re-sent at 40 s: late.
            resend(&in_log, Some(9_000), Some(10_000)),
            // Written at 9 s, still pending at 40 s (first marked at 45 s): late in the outbox.
            resend(&waiting, Some(9_000), Some(45_000)),
            // Written only by the re-send: lost before the log.
            resend(&never_written, Some(40_000), Some(45_000)),
            // Marked at 10 s, first in the log at 45 s: lost (the first check says so too).
            resend(&marked_unsent, Some(9_000), Some(10_000)),
        ];
        let lost = resent_before_existing(&resends, &log);
        let named = |e: &Envelope| lost.iter().any(|l| l.what.contains(&e.event_id.to_string()));
        assert!(!named(&in_log) && !named(&waiting), "{lost:?}");
        assert!(named(&never_written) && named(&marked_unsent), "{lost:?}");
        assert_eq!(lost.len(), 2);
        // An order waiting on a command its outbox lacks: lost unless the log has it.
        let waiting = [
            (order, in_log.event_id, at_ms(9_000)),
            (order, Uuid::new_v4(), at_ms(9_000)),
        ];
        let nowhere = commands_nowhere(&waiting, &log);
        assert_eq!(nowhere.len(), 1, "{nowhere:?}");
        assert!(nowhere[0].what.contains(&waiting[1].1.to_string()));
    }
}
