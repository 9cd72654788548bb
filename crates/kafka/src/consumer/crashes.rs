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
//! - **A life's mark**: before a lane hands over its first batch, it
//!   commits the partition's committed offset again with `life` in the
//!   metadata — the offset does not move, so offsets stay lazy. librdkafka's
//!   next background commit (or the final one) moves the offset on and
//!   takes the mark with it. A mark still there when a lane starts says
//!   the previous life died before it committed anything.
//! - **Careful**: such a lane handles the next `max_batch` messages one at
//!   a time, each **armed**: committed with `crashes=<n>` (the lives that
//!   died inside the handler on this very message, this one included)
//!   before the handler call, the count taken back when the call returns
//!   with an error, the next offset committed clean when it succeeds. Only a
//!   life that dies **inside** the handler leaves a count, and the count
//!   narrows to the one message that kills.
//! - **Dead-letter**: a lane that starts on a count of
//!   `KAFKA_CONSUMER_MAX_CRASHES` does not hand the message over: it goes to
//!   the dead-letter topic, named as the message that killed its consumer
//!   that many times, and the partition moves on.
//!
//! Cost: one synchronous commit per lane life (its mark), and three per
//! message only while careful — after a life died before its first commit.
//! A count is written only around a handler call, so a life killed while
//! it waits between retries (a database down) counts nothing.

use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::{CommitMode, Consumer as _};
use rdkafka::message::OwnedMessage;
use rdkafka::{Message as _, Offset, TopicPartitionList};

use super::GroupConsumer;

/// The metadata's prefix of a count: `crashes=<n>`.
const PREFIX: &str = "crashes=";
/// The metadata of a life that has not committed yet.
const LIFE: &str = "life";
/// How long reading the committed offset may take.
const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// What a committed offset's metadata says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mark {
    /// Nothing: the last life committed past it.
    Clean,
    /// A life started here and died (or stopped) before committing.
    Life,
    /// This many lives died inside the handler on the message here.
    Crashes(u32),
}

/// Reads a committed offset's metadata.
pub(super) fn parse(metadata: &str) -> Mark {
    if metadata == LIFE {
        return Mark::Life;
    }
    match metadata.strip_prefix(PREFIX).and_then(|n| n.parse().ok()) {
        Some(n) if n > 0 => Mark::Crashes(n),
        _ => Mark::Clean,
    }
}

/// The metadata of a mark.
pub(super) fn metadata(mark: Mark) -> String {
    match mark {
        Mark::Clean | Mark::Crashes(0) => String::new(),
        Mark::Life => LIFE.to_owned(),
        Mark::Crashes(n) => format!("{PREFIX}{n}"),
    }
}

/// What a lane does with the message in front of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Plan {
    /// A batch as usual (what is queued); `mark`: commit a life's mark first.
    Batch {
        /// Whether to mark the life before handing the batch over.
        mark: bool,
    },
    /// This message alone, armed: the lane is careful.
    One(Arm),
    /// This message killed its consumer `lives` times: dead-letter it.
    Poison {
        /// The lives it killed.
        lives: u32,
    },
}

/// A count to set around a handler call: `offset` committed with `before +
/// 1` crashes while the handler runs, `before` again when it returns with
/// an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Arm {
    pub offset: i64,
    pub before: u32,
}

/// Decides a plan, given what the lane knows: whether it still has to mark
/// its life, where careful handling ends, and — for its first message —
/// the committed offset and its mark (`None`: unknown).
pub(super) fn plan(
    unmarked: bool,
    offset: i64,
    careful_below: i64,
    committed: Option<(i64, Mark)>,
    max_crashes: u32,
) -> Plan {
    match committed {
        Some((at, Mark::Crashes(n))) if at == offset && n >= max_crashes => Plan::Poison { lives: n },
        Some((at, Mark::Crashes(n))) if at == offset => Plan::One(Arm { offset, before: n }),
        Some((at, Mark::Life)) if at == offset => Plan::One(Arm { offset, before: 0 }),
        _ if offset < careful_below => Plan::One(Arm { offset, before: 0 }),
        _ => Plan::Batch { mark: unmarked },
    }
}

/// Where a lane stands: what [`plan`] needs beside the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Stand {
    /// No message handed over yet: the committed offset is read at the first.
    pub first: bool,
    /// The next batch marks a life (the lane's first, or the first after
    /// careful handling).
    pub unmarked: bool,
    /// Offsets below this are handled one at a time, armed.
    pub careful_below: i64,
}

impl Stand {
    /// A lane that has handed nothing over.
    pub(super) fn new() -> Self {
        Self {
            first: true,
            unmarked: true,
            careful_below: -1,
        }
    }

    /// Where the lane stands once `plan` is taken: a first message under
    /// a mark starts careful handling for `max_batch` offsets (later careful
    /// messages do not extend it); careful handling leaves the next batch to
    /// mark a life again; a marked batch has marked it.
    pub(super) fn after(&mut self, plan: Plan, max_batch: i64) {
        match plan {
            Plan::One(arm) if self.first => {
                self.careful_below = arm.offset + max_batch;
                self.unmarked = true;
            }
            Plan::One(_) => self.unmarked = true,
            Plan::Batch { mark: true } => self.unmarked = false,
            Plan::Batch { mark: false } | Plan::Poison { .. } => {}
        }
        self.first = false;
    }
}

/// One lane's watch over its partition's committed mark.
pub(super) struct Watch {
    consumer: Arc<GroupConsumer>,
    name: Arc<str>,
    max_crashes: u32,
    max_batch: i64,
    stand: Stand,
}

impl Watch {
    pub(super) fn new(consumer: Arc<GroupConsumer>, name: Arc<str>, max_crashes: u32, max_batch: usize) -> Self {
        Self {
            consumer,
            name,
            max_crashes: max_crashes.max(1),
            max_batch: max_batch as i64,
            stand: Stand::new(),
        }
    }

    /// The plan for `msg`, the next message of the lane's partition.
    pub(super) async fn plan(&mut self, msg: &OwnedMessage) -> Plan {
        let committed = if self.stand.first {
            self.committed(msg.topic(), msg.partition()).await
        } else {
            None
        };
        let plan = plan(
            self.stand.unmarked,
            msg.offset(),
            self.stand.careful_below,
            committed,
            self.max_crashes,
        );
        if let (Plan::One(arm), true) = (plan, self.stand.first) {
            tracing::warn!(
                consumer = &*self.name,
                partition = msg.partition(),
                offset = arm.offset,
                crashes = arm.before,
                "a consumer died here before it committed: the next messages one at a time"
            );
        }
        self.stand.after(plan, self.max_batch);
        plan
    }

    /// Commits `offset` of `msg`'s partition with `mark` (best effort: a
    /// failure costs the mark, never a message).
    pub(super) async fn commit(&self, msg: &OwnedMessage, offset: i64, mark: Mark) {
        let mut tpl = TopicPartitionList::new();
        let set = tpl
            .add_partition_offset(msg.topic(), msg.partition(), Offset::Offset(offset))
            .map(|()| {
                if let Some(mut e) = tpl.find_partition(msg.topic(), msg.partition()) {
                    e.set_metadata(metadata(mark));
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
            tracing::warn!(consumer = &*self.name, offset, ?mark, %error, "crash mark not committed");
        }
    }

    /// The partition's committed offset and its mark (offset -1: nothing
    /// committed yet; `None`: unreadable).
    async fn committed(&self, topic: &str, partition: i32) -> Option<(i64, Mark)> {
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
            _ => Some((-1, Mark::Clean)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mark_reads_back_what_was_written_and_nothing_else() {
        for mark in [Mark::Clean, Mark::Life, Mark::Crashes(3)] {
            assert_eq!(parse(&metadata(mark)), mark);
        }
        assert_eq!(metadata(Mark::Crashes(0)), "", "no crash is no mark");
        assert_eq!(parse("crashes=0"), Mark::Clean, "nor read as one");
        assert_eq!(parse("something else"), Mark::Clean);
    }

    #[test]
    fn a_lane_on_a_clean_offset_batches_and_marks_its_life_once() {
        assert_eq!(
            plan(true, 10, -1, Some((10, Mark::Clean)), 3),
            Plan::Batch { mark: true }
        );
        // A mark at another offset is not this message's.
        assert_eq!(
            plan(true, 10, -1, Some((7, Mark::Crashes(2))), 3),
            Plan::Batch { mark: true }
        );
        assert_eq!(plan(true, 10, -1, Some((7, Mark::Life)), 3), Plan::Batch { mark: true });
        assert_eq!(plan(true, 10, -1, None, 3), Plan::Batch { mark: true });
        assert_eq!(plan(false, 11, -1, None, 3), Plan::Batch { mark: false });
    }

    #[test]
    fn a_lane_on_a_dead_lifes_mark_is_careful_and_a_count_at_the_limit_is_poison() {
        assert_eq!(
            plan(true, 10, -1, Some((10, Mark::Life)), 3),
            Plan::One(Arm { offset: 10, before: 0 })
        );
        assert_eq!(
            plan(true, 10, -1, Some((10, Mark::Crashes(2))), 3),
            Plan::One(Arm { offset: 10, before: 2 })
        );
        assert_eq!(
            plan(true, 10, -1, Some((10, Mark::Crashes(3))), 3),
            Plan::Poison { lives: 3 }
        );
    }

    /// Careful handling lasts `max_batch` offsets from the first message,
    /// not from each careful one; the batch after it marks a life again.
    #[test]
    fn careful_handling_is_bounded_by_the_first_message_and_then_a_life_is_marked() {
        let mut stand = Stand::new();
        stand.after(Plan::One(Arm { offset: 10, before: 1 }), 32);
        assert_eq!((stand.first, stand.unmarked, stand.careful_below), (false, true, 42));
        stand.after(Plan::One(Arm { offset: 11, before: 0 }), 32);
        assert_eq!(stand.careful_below, 42, "a later careful message does not extend it");
        stand.after(Plan::Batch { mark: true }, 32);
        assert!(!stand.unmarked, "the life is marked");
        stand.after(Plan::Batch { mark: false }, 32);
        assert!(!stand.unmarked);
        let mut fresh = Stand::new();
        fresh.after(Plan::Batch { mark: true }, 32);
        assert_eq!((fresh.first, fresh.unmarked, fresh.careful_below), (false, false, -1));
    }

    #[test]
    fn a_careful_lane_arms_each_message_below_its_bound_then_batches_again() {
        assert_eq!(plan(true, 11, 42, None, 3), Plan::One(Arm { offset: 11, before: 0 }));
        assert_eq!(plan(true, 42, 42, None, 3), Plan::Batch { mark: true });
    }
}
