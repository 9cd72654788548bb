//! Consumer-group membership: the rebalance callbacks of the consume loop
//! ([`GroupContext`]) and what a member owns. Instances of a service join
//! one group with the cooperative-sticky assignor and share its partitions;
//! a partition that moves is handed over with its handled offsets committed.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer as _, ConsumerContext, Rebalance, StreamConsumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::TopicPartitionList;
use tokio_util::sync::CancellationToken;

/// The consumer type of the loop: a [`StreamConsumer`] with the group
/// callbacks of [`GroupContext`].
pub type GroupConsumer = StreamConsumer<GroupContext>;

/// How long a revocation waits for the lanes of the revoked partitions to
/// finish their in-flight batch. Past it the batch is dropped: its offset
/// is not stored, the partition's new owner gets the messages again and its
/// inbox absorbs whatever had committed.
const REVOKE_GRACE: Duration = Duration::from_secs(10);

/// What this member owns in its group, shared by the rebalance callbacks
/// and the dispatcher.
#[derive(Default)]
pub(crate) struct Membership {
    /// Partitions assigned to this member now.
    pub(crate) assigned: HashSet<(String, i32)>,
    /// The running lane of each partition that has one.
    pub(crate) lanes: HashMap<(String, i32), LaneStop>,
}

/// How a revocation stops a lane and learns that it stopped.
pub(crate) struct LaneStop {
    revoked: CancellationToken,
    /// Disconnected when the lane's task has ended.
    done: std::sync::mpsc::Receiver<()>,
}

impl LaneStop {
    /// Stops a lane by cancelling `revoked`; `done` disconnects when it ended.
    pub(crate) fn new(revoked: CancellationToken, done: std::sync::mpsc::Receiver<()>) -> Self {
        Self { revoked, done }
    }
}

/// The rebalance callbacks of the consume loop.
///
/// - **Revoke**: each revoked partition's lane is told to stop; a lane
///   finishes the batch it is handling (handler and offset store) and
///   takes no other; the callback waits for them (up to 10 s)
///   and then commits the stored offsets synchronously, before librdkafka
///   hands the partitions over. What was handled is committed; what was
///   queued and not handled is read again by the new owner.
/// - **Assign**: the partitions are recorded; their lanes start with their
///   first message.
///
/// Both are counted (`consumer_rebalances_total{consumer,kind}`), and
/// `consumer_partitions_assigned{consumer,topic,partition}` says which
/// partitions this member owns: the group's assignment, as the member sees it.
pub struct GroupContext {
    name: Arc<str>,
    membership: Arc<Mutex<Membership>>,
}

impl GroupContext {
    /// The context of a member of group `name`, owning nothing yet.
    pub(crate) fn new(name: &str) -> Self {
        Self {
            name: Arc::from(name),
            membership: Arc::default(),
        }
    }

    /// What this member owns, shared with the consume loop's dispatcher.
    pub(crate) fn membership(&self) -> Arc<Mutex<Membership>> {
        self.membership.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Membership> {
        self.membership
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl rdkafka::ClientContext for GroupContext {}

impl ConsumerContext for GroupContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let Rebalance::Revoke(tpl) = rebalance else {
            return;
        };
        let name = &*self.name;
        let stopping: Vec<LaneStop> = {
            let mut m = self.lock();
            tpl.elements()
                .iter()
                .filter_map(|p| {
                    let key = (p.topic().to_owned(), p.partition());
                    m.assigned.remove(&key);
                    let partition = p.partition().to_string();
                    telemetry::metrics::set(
                        "consumer_partitions_assigned",
                        &[("consumer", name), ("topic", p.topic()), ("partition", &partition)],
                        0.0,
                    );
                    m.lanes.remove(&key)
                })
                .inspect(|stop| stop.revoked.cancel())
                .collect()
        };
        let wait = || {
            let end = std::time::Instant::now() + REVOKE_GRACE;
            stopping.iter().all(|stop| {
                let left = end.saturating_duration_since(std::time::Instant::now());
                matches!(
                    stop.done.recv_timeout(left),
                    Err(std::sync::mpsc::RecvTimeoutError::Disconnected)
                )
            })
        };
        // The callback runs inside `recv`, on a runtime thread: waiting
        // there must hand the thread's other tasks (the lanes) to another
        // thread. A single-threaded runtime cannot run the lanes while this
        // waits: there the in-flight batches are dropped (not stored).
        let finished = stopping.is_empty()
            || match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
                Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(wait),
                _ => false,
            };
        match consumer.commit_consumer_state(CommitMode::Sync) {
            Ok(()) | Err(KafkaError::ConsumerCommit(RDKafkaErrorCode::NoOffset)) => {}
            Err(e) => {
                tracing::warn!(consumer = name, error = %e, "offset commit on revocation failed; the inbox absorbs the redelivery")
            }
        }
        telemetry::metrics::incr("consumer_rebalances_total", &[("consumer", name), ("kind", "revoke")]);
        tracing::info!(consumer = name, partitions = ?partitions(tpl), lanes_finished = finished, "partitions revoked");
    }

    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let name = &*self.name;
        match rebalance {
            Rebalance::Assign(tpl) => {
                let mut m = self.lock();
                for p in tpl.elements() {
                    m.assigned.insert((p.topic().to_owned(), p.partition()));
                    let partition = p.partition().to_string();
                    telemetry::metrics::set(
                        "consumer_partitions_assigned",
                        &[("consumer", name), ("topic", p.topic()), ("partition", &partition)],
                        1.0,
                    );
                }
                telemetry::metrics::incr("consumer_rebalances_total", &[("consumer", name), ("kind", "assign")]);
                tracing::info!(consumer = name, partitions = ?partitions(tpl), "partitions assigned");
            }
            Rebalance::Revoke(_) => {}
            Rebalance::Error(e) => tracing::warn!(consumer = name, error = %e, "rebalance error"),
        }
    }
}

fn partitions(tpl: &TopicPartitionList) -> Vec<String> {
    tpl.elements()
        .iter()
        .map(|p| format!("{}/{}", p.topic(), p.partition()))
        .collect()
}
