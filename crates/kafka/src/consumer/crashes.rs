//! Poison by behaviour: a message that kills its consumer's process.
//!
//! A message whose handling aborts the process (a panic that aborts, an
//! out-of-memory kill, a segfault in a library) never returns an error:
//! the attempt count of [`super::retry`] dies with the process, the
//! restarted consumer reads the same message first, and dies again — for
//! ever, its partition stalled. So the count has to outlive the process.
//! It lives where the consumer's position already does: in the metadata
//! of the group's committed offset (Kafka keeps a short string with each
//! commit), at no cost to the hot path.
//!
//! - **Arm**: before a lane's first batch, and before each message it
//!   handles carefully, the lane commits the batch's first offset with
//!   `crashes=<n>` — the lives that were handling it and did not finish,
//!   this one included. When the handler returns (whatever it returns),
//!   the count goes back to what it was; when the batch is done, its next
//!   offset is committed clean. Only a life that dies **inside** the
//!   handler leaves its mark.
//! - **Careful**: a lane that starts on a mark of one or more handles the
//!   next `max_batch` messages one at a time, each armed (the dead life's
//!   batch was at most that long), so the mark moves onto the one message
//!   that kills.
//! - **Dead-letter**: a lane that starts on a mark of
//!   `KAFKA_CONSUMER_MAX_CRASHES` does not hand the message over: it goes to
//!   the dead-letter topic, named as the message that killed its consumer
//!   that many times, and the partition moves on.
//!
//! Cost: two synchronous commits per lane life (one arm, one settle), and
//! three per message only while careful — after a death inside a handler.
//! A mark is written only around a handler call, so a life killed while it
//! waits between retries (a database down) counts nothing.

use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::{CommitMode, Consumer as _};
use rdkafka::message::OwnedMessage;
use rdkafka::{Message as _, Offset, TopicPartitionList};

use super::GroupConsumer;

/// The metadata's prefix: `crashes=<n>`.
const PREFIX: &str = "crashes=";
/// How long reading the committed offset may take.
const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// The lives a committed offset's metadata says died handling it.
pub(super) fn parse(metadata: &str) -> u32 {
    metadata.strip_prefix(PREFIX).and_then(|n| n.parse().ok()).unwrap_or(0)
}

/// The metadata for `lives` (none for 0).
pub(super) fn metadata(lives: u32) -> String {
    if lives == 0 {
        String::new()
    } else {
        format!("{PREFIX}{lives}")
    }
}

/// What a lane does with the message in front of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Plan {
    /// A batch as usual (what is queued), armed when `Some`.
    Batch(Option<Arm>),
    /// This message alone, armed: the lane is careful.
    One(Arm),
    /// This message killed its consumer `lives` times: dead-letter it.
    Poison {
        /// The lives it killed.
        lives: u32,
    },
}

/// A mark to set around a handler call: `offset` committed with `before + 1`
/// lives while the handler runs, `before` again when it returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Arm {
    pub offset: i64,
    pub before: u32,
}

/// Decides a plan, given what the lane knows: whether this is its first
/// message, where it stands carefully, and the committed offset and its
/// lives when it started (`None`: unknown).
pub(super) fn plan(
    first: bool,
    offset: i64,
    careful_below: i64,
    committed: Option<(i64, u32)>,
    max_crashes: u32,
) -> Plan {
    if first {
        let before = match committed {
            Some((at, lives)) if at == offset => lives,
            Some(_) => 0,
            None => return Plan::Batch(None),
        };
        if before >= max_crashes {
            return Plan::Poison { lives: before };
        }
        let arm = Arm { offset, before };
        return if before > 0 {
            Plan::One(arm)
        } else {
            Plan::Batch(Some(arm))
        };
    }
    if offset < careful_below {
        Plan::One(Arm { offset, before: 0 })
    } else {
        Plan::Batch(None)
    }
}

/// One lane's watch over its partition's committed mark.
pub(super) struct Watch {
    consumer: Arc<GroupConsumer>,
    name: Arc<str>,
    max_crashes: u32,
    max_batch: i64,
    /// No message handed over yet.
    first: bool,
    /// Offsets below this are handled one at a time, armed.
    careful_below: i64,
}

impl Watch {
    pub(super) fn new(consumer: Arc<GroupConsumer>, name: Arc<str>, max_crashes: u32, max_batch: usize) -> Self {
        Self {
            consumer,
            name,
            max_crashes: max_crashes.max(1),
            max_batch: max_batch as i64,
            first: true,
            careful_below: -1,
        }
    }

    /// The plan for `msg`, the next message of the lane's partition.
    pub(super) async fn plan(&mut self, msg: &OwnedMessage) -> Plan {
        let committed = if self.first {
            self.committed(msg.topic(), msg.partition()).await
        } else {
            None
        };
        let plan = plan(
            self.first,
            msg.offset(),
            self.careful_below,
            committed,
            self.max_crashes,
        );
        if self.first {
            if let Plan::One(arm) = plan {
                self.careful_below = arm.offset + self.max_batch;
                tracing::warn!(
                    consumer = &*self.name,
                    partition = msg.partition(),
                    offset = arm.offset,
                    lives = arm.before,
                    "a consumer died handling this partition: the next messages one at a time"
                );
            }
        }
        self.first = false;
        plan
    }

    /// Commits `offset` of `msg`'s partition with `lives` (best effort: a
    /// failure costs the count, never a message).
    pub(super) async fn commit(&self, msg: &OwnedMessage, offset: i64, lives: u32) {
        let mut tpl = TopicPartitionList::new();
        let set = tpl
            .add_partition_offset(msg.topic(), msg.partition(), Offset::Offset(offset))
            .map(|()| {
                if let Some(mut e) = tpl.find_partition(msg.topic(), msg.partition()) {
                    e.set_metadata(metadata(lives));
                }
            });
        let consumer = self.consumer.clone();
        let done = match set {
            Ok(()) => tokio::task::spawn_blocking(move || consumer.commit(&tpl, CommitMode::Sync))
                .await
                .map_err(|e| e.to_string())
                .and_then(|r| r.map_err(|e| e.to_string())),
            Err(e) => Err(e.to_string()),
        };
        if let Err(error) = done {
            tracing::warn!(consumer = &*self.name, offset, lives, %error, "crash mark not committed");
        }
    }

    /// The partition's committed offset and the lives its mark counts.
    async fn committed(&self, topic: &str, partition: i32) -> Option<(i64, u32)> {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(topic, partition);
        let consumer = self.consumer.clone();
        let read = tokio::task::spawn_blocking(move || consumer.committed_offsets(tpl, READ_TIMEOUT)).await;
        let tpl = match read {
            Ok(Ok(tpl)) => tpl,
            Ok(Err(e)) => {
                tracing::warn!(consumer = &*self.name, error = %e, "committed offset unreadable: no crash mark");
                return None;
            }
            Err(_) => return None,
        };
        let e = tpl.find_partition(topic, partition)?;
        match e.offset() {
            Offset::Offset(at) => Some((at, parse(e.metadata()))),
            // Nothing committed yet: no life died here.
            _ => Some((-1, 0)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mark_reads_back_what_was_written_and_nothing_else() {
        assert_eq!(parse(&metadata(3)), 3);
        assert_eq!(metadata(0), "");
        assert_eq!(parse(""), 0);
        assert_eq!(parse("something else"), 0);
    }

    #[test]
    fn a_first_message_on_a_clean_offset_is_a_batch_armed_from_zero() {
        let p = plan(true, 10, -1, Some((10, 0)), 3);
        assert_eq!(p, Plan::Batch(Some(Arm { offset: 10, before: 0 })));
        // A mark at another offset is not this message's.
        assert_eq!(plan(true, 10, -1, Some((7, 2)), 3), p);
        // Unknown: handled as usual, unarmed.
        assert_eq!(plan(true, 10, -1, None, 3), Plan::Batch(None));
    }

    #[test]
    fn a_first_message_under_a_mark_is_handled_alone_until_the_mark_reaches_the_limit() {
        assert_eq!(
            plan(true, 10, -1, Some((10, 1)), 3),
            Plan::One(Arm { offset: 10, before: 1 })
        );
        assert_eq!(
            plan(true, 10, -1, Some((10, 2)), 3),
            Plan::One(Arm { offset: 10, before: 2 })
        );
        assert_eq!(plan(true, 10, -1, Some((10, 3)), 3), Plan::Poison { lives: 3 });
    }

    #[test]
    fn a_careful_lane_arms_each_message_below_its_bound_then_batches_unarmed() {
        assert_eq!(plan(false, 11, 42, None, 3), Plan::One(Arm { offset: 11, before: 0 }));
        assert_eq!(plan(false, 42, 42, None, 3), Plan::Batch(None));
    }
}
