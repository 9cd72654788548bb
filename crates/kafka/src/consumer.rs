//! The consume loop every service uses.
//!
//! Order of operations per message, which is what makes delivery
//! at-least-once and processing effectively-once:
//!
//! 1. decode the message; a body that can never decode goes to the
//!    dead-letter topic (with the error and the original headers);
//! 2. run the handler, which records `(consumer, event_id)` in the inbox in the
//!    **same transaction** as its effect and commits;
//! 3. only then **store** the offset; librdkafka commits stored offsets in the
//!    background every `commit_interval` (and on shutdown and rebalance). A
//!    crash between 2 and the next commit redelivers up to an interval's worth
//!    of handled messages; the inbox turns each into a no-op. That is what
//!    lets the commit be lazy: an offset commit per message would cost a
//!    broker write and a round trip each, in series.
//!
//! **Concurrency.** Each partition has its own lane (a task fed by a bounded
//! queue): partitions are handled concurrently, each strictly in order, and
//! an offset is stored only after every earlier message of its partition.
//!
//! **Groups.** The consumer joins its consumer group (cooperative-sticky);
//! a revoked partition's lane finishes its in-flight batch and the handled
//! offsets are committed before the partition moves ([`crate::group`]).
//!
//! **Errors.** A handler says what kind of failure it had ([`HandleError`]):
//! a dependency down (*unavailable*) retries the same message with capped
//! exponential backoff for as long as it takes — the partition waits, and
//! moves on when the dependency is back; a *transient* failure retries the
//! same way up to `KAFKA_CONSUMER_MAX_ATTEMPTS` attempts in a row, and then
//! the message is dead-lettered with the last error, so a message that
//! fails deterministically cannot stall its partition for ever; a
//! *permanent* one (undecodable, a constraint it violates) is dead-lettered
//! at once. A message that kills the process returns no error at all: its
//! count lives in the committed offset's metadata (`consumer/crashes.rs`), and after
//! `KAFKA_CONSUMER_MAX_CRASHES` lives it is dead-lettered too.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::{CommitMode, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::OwnedMessage;
use rdkafka::producer::FutureProducer;
use rdkafka::Message as _;
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::{KafkaArgs, Result};

mod crashes;
mod dispatch;
mod outcome;
mod retry;
use dispatch::consume_span;
pub use outcome::{Cause, HandleError, Handled};
use retry::{handle_with_retry, Retry};

/// Crash point (failpoints builds): abort after the handler's transaction
/// committed, before the offset is stored — the redelivery that follows
/// must be absorbed by the inbox. Reached only by a batch that applied at
/// least one event: after a batch of duplicates there is nothing a
/// redelivery could repeat.
pub const CRASH_BEFORE_OFFSET_COMMIT: &str = "consumer::before_offset_commit";

/// Crash point (failpoints builds): the process dies while handling a
/// message — after it was received, 3 s into the handler, before the
/// handler's transaction. 3 s is longer than any commit interval a test
/// sets, so an offset stored *before* handling (ack first) would have been
/// committed by then and the message lost; stored after, it comes back.
pub const CRASH_WHILE_HANDLING: &str = "consumer::while_handling";

/// Failpoint (failpoints builds): the consume loop fails as if its broker
/// session broke for good — the supervisor must turn the service not-ready
/// and exit non-zero.
pub const FAIL_LOOP: &str = "consumer::loop_fails";

/// Settings of one consumer.
#[derive(Debug, Clone)]
pub struct ConsumerSettings {
    /// Brokers and assignment.
    pub kafka: KafkaArgs,
    /// Consumer group; also the consumer name recorded in the inbox.
    pub group_id: String,
    /// Topics to consume.
    pub topics: Vec<String>,
    /// Most messages of one partition a batch handler gets ([`run_batches`]; [`run`]: one).
    pub max_batch: usize,
}

use crate::group::LaneStop;
pub use crate::group::{GroupConsumer, GroupContext};

/// Builds a consumer with manual offset stores that joins its consumer
/// group (`subscribe`) with the cooperative-sticky assignor: instances of
/// a service share the partitions, and a rebalance moves only the
/// partitions that change owner.
pub fn build(settings: &ConsumerSettings) -> Result<GroupConsumer> {
    let context = GroupContext::new(&settings.group_id);
    let mut config = settings.kafka.client_config();
    if let Some(id) = &settings.kafka.group_instance_id {
        config.set("group.instance.id", id);
    }
    settings.kafka.set_fetch_wait(&mut config);
    let consumer: GroupConsumer = config
        .set("group.id", &settings.group_id)
        .set("partition.assignment.strategy", "cooperative-sticky")
        // Stored offsets (only those of handled messages) are committed in
        // the background; see the module docs.
        .set("enable.auto.commit", "true")
        .set("auto.commit.interval.ms", settings.kafka.commit_interval_ms.to_string())
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        // A SIGKILLed member's partitions wait this long for a new owner.
        .set("session.timeout.ms", "10000")
        .set("heartbeat.interval.ms", "1000")
        .create_with_context(context)?;
    let topics: Vec<&str> = settings.topics.iter().map(String::as_str).collect();
    consumer.subscribe(&topics)?;
    Ok(consumer)
}

/// Runs the loop until `shutdown` is cancelled, handing each message body,
/// decoded from JSON as `T`, to `handler` — one lane per partition, so
/// partitions proceed concurrently and each in order. A message being handled
/// when shutdown comes is finished or left unstored for redelivery, never
/// half-done; stored offsets are committed before returning.
pub async fn run<T, H, F>(settings: ConsumerSettings, shutdown: CancellationToken, handler: H) -> Result<()>
where
    T: DeserializeOwned + Clone + Send + 'static,
    H: Fn(T) -> F + Send + Sync + 'static,
    F: Future<Output = Result<Handled, HandleError>> + Send + 'static,
{
    let settings = ConsumerSettings {
        max_batch: 1,
        ..settings
    };
    run_batches(settings, shutdown, move |mut batch: Vec<Traced<T>>| {
        let Traced { message, span, .. } = batch.pop().expect("a lane hands over at least one message");
        // Called inside the span, so spans the handler opens are its children.
        let one = span.in_scope(|| handler(message)).instrument(span);
        async move { one.await.map(|handled| vec![handled]) }
    })
    .await
}

/// Like [`run`], but hands `handler` up to `settings.max_batch` messages of
/// one partition at a time, in order: whatever that partition's lane has
/// queued when it becomes free. Each comes with its consumer span (a child
/// of the trace context in its `traceparent` header): the handler runs each
/// message's work inside it. Idle, a batch is one message; behind, batches
/// grow, and a handler that applies them in one transaction pays one commit
/// for many messages.
///
/// The handler must be all-or-nothing: return one [`Handled`] per message,
/// in order, when all of them committed, or an error when none did. A
/// transient error retries the whole batch; a permanent one makes the lane
/// handle that batch again one message at a time, so only the message that
/// cannot succeed goes to the dead-letter topic.
pub async fn run_batches<T, H, F>(settings: ConsumerSettings, shutdown: CancellationToken, handler: H) -> Result<()>
where
    T: DeserializeOwned + Clone + Send + 'static,
    H: Fn(Vec<Traced<T>>) -> F + Send + Sync + 'static,
    F: Future<Output = Result<Vec<Handled>, HandleError>> + Send + 'static,
{
    let handler = Arc::new(handler);
    let name = settings.group_id.as_str();
    loop {
        let Some(fatal) = consume(&settings, &shutdown, handler.clone()).await? else {
            tracing::info!(consumer = name, "consumer stopped");
            return Ok(());
        };
        // librdkafka gave up on this consumer for good (e.g. a static member
        // fenced by its own successor after a coordinator failover). A broker's
        // restart must not end the service: a fresh consumer joins the group
        // again, and what the old one handled but had not committed comes back
        // to the inbox as redeliveries.
        let reason = match &fatal {
            KafkaError::MessageConsumptionFatal(code) => format!("{code:?}"),
            other => other.to_string(),
        };
        tracing::warn!(consumer = name, error = %fatal, "the consumer failed for good; building a new one");
        telemetry::metrics::incr(
            "consumer_rebuilds_total",
            &[("consumer", name), ("reason", reason.as_str())],
        );
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            _ = tokio::time::sleep(REBUILD_PAUSE) => {}
        }
    }
}

/// How long a consumer that failed for good waits before its successor joins.
const REBUILD_PAUSE: Duration = Duration::from_secs(1);

/// One consumer's life: joins the group, dispatches to lanes until
/// `shutdown` (`Ok(None)`) or until librdkafka gives up on it
/// (`Ok(Some(error))`: its lanes have stopped and its stored offsets were
/// committed where the group still allowed it).
async fn consume<T, H, F>(
    settings: &ConsumerSettings,
    shutdown: &CancellationToken,
    handler: Arc<H>,
) -> Result<Option<KafkaError>>
where
    T: DeserializeOwned + Clone + Send + 'static,
    H: Fn(Vec<Traced<T>>) -> F + Send + Sync + 'static,
    F: Future<Output = Result<Vec<Handled>, HandleError>> + Send + 'static,
{
    let consumer = Arc::new(build(settings)?);
    let membership = consumer.context().membership();
    // Ends this consumer's lanes and lag observer, on shutdown or when it fails.
    let life = shutdown.child_token();
    let _ends_life = life.clone().drop_guard();
    let lane = Lane {
        consumer: consumer.clone(),
        dlq: settings.kafka.producer()?,
        name: Arc::from(settings.group_id.as_str()),
        handler,
        max_batch: settings.max_batch.max(1),
        max_attempts: settings.kafka.consumer_max_attempts.max(1),
        max_crashes: settings.kafka.consumer_max_crashes.max(1),
        shutdown: life.clone(),
        revoked: CancellationToken::new(),
        _done: None,
        decoded: std::marker::PhantomData,
    };
    let name = settings.group_id.as_str();
    tracing::info!(consumer = name, topics = ?settings.topics, "consumer started");
    let mut lanes: HashMap<(String, i32), mpsc::Sender<OwnedMessage>> = HashMap::new();
    let mut fatal = None;
    let mut running = JoinSet::new();
    tokio::spawn(crate::lag::observe_lag(
        consumer.clone(),
        Arc::from(name),
        settings.topics.clone(),
        life.clone(),
    ));
    loop {
        fail::fail_point!(FAIL_LOOP, |_| Err(crate::Error::Kafka(
            rdkafka::error::KafkaError::Canceled
        )));
        let msg = tokio::select! {
            _ = shutdown.cancelled() => break,
            m = consumer.recv() => m,
        };
        let msg = match msg {
            Ok(m) => m.detach(),
            Err(e @ KafkaError::MessageConsumptionFatal(_)) => {
                fatal = Some(e);
                break;
            }
            Err(e) => {
                tracing::warn!(consumer = name, error = %e, "receive failed");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        let key = (msg.topic().to_owned(), msg.partition());
        let queue = {
            let mut m = membership.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let m = &mut *m;
            // Fetched before its partition was revoked: its new owner reads it.
            if !m.assigned.contains(&key) {
                continue;
            }
            // A lane stops when its partition is revoked; assigned again, it gets a new one.
            if dispatch::needs_new_lane(lanes.get(&key), m.lanes.contains_key(&key)) {
                let (tx, rx) = mpsc::channel(LANE_QUEUE);
                let (done_tx, done) = std::sync::mpsc::channel();
                let revoked = CancellationToken::new();
                m.lanes.insert(key.clone(), LaneStop::new(revoked.clone(), done));
                running.spawn(lane.for_partition(revoked, done_tx).run(rx));
                // Lanes of partitions revoked earlier have ended: reap them.
                while running.try_join_next().is_some() {}
                lanes.insert(key.clone(), tx);
            }
            lanes[&key].clone()
        };
        // A full queue holds the dispatcher: that partition's lane is behind.
        // A lane gone meanwhile (revoked) drops the message: not stored, read again.
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = queue.send(msg) => {}
        }
    }
    drop(lanes);
    if fatal.is_some() {
        // Lanes stop after the batch in hand (its offset is stored, or it
        // is read again by this consumer's successor).
        life.cancel();
    }
    while running.join_next().await.is_some() {}
    // Whatever was stored and not yet committed in the background.
    match consumer.commit_consumer_state(CommitMode::Sync) {
        Ok(()) | Err(KafkaError::ConsumerCommit(RDKafkaErrorCode::NoOffset)) => {}
        Err(e) => {
            tracing::warn!(consumer = name, error = %e, "final offset commit failed; the inbox absorbs the redelivery")
        }
    }
    Ok(fatal)
}

/// Messages queued per partition lane before the dispatcher waits.
const LANE_QUEUE: usize = 1024;

/// A decoded message and its consumer span.
#[derive(Debug, Clone)]
pub struct Traced<T> {
    /// The decoded body.
    pub message: T,
    /// `<topic> process`, a child of the message's `traceparent` header:
    /// run the message's work in it (`.instrument(span)`), so the trace
    /// continues from the relay's publish span.
    pub span: tracing::Span,
    /// Where in the log this copy was read (`None` for a message handed
    /// over by hand: a test, a replay). An inbox that records it says which
    /// copy of an event was the one applied.
    pub position: Option<Position>,
    /// Who published it, as the publisher stamped it (the
    /// [`outbox::kafka::PRODUCER`] header: the relay's source, never the
    /// row's word); `None` when the record has no stamp.
    pub producer: Option<String>,
    /// The `event_id` header the publisher wrote beside the body (`None`
    /// when the record has none): a reader checks it against the body's.
    pub header_event_id: Option<String>,
}

/// A message's place in its topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    /// Partition.
    pub partition: i32,
    /// Offset within the partition.
    pub offset: i64,
}

/// A crash mark to set around each handler call: the lane's watch, the
/// batch's first message and the mark ([`crashes`]).
type Armed<'a> = (&'a crashes::Watch, &'a OwnedMessage, crashes::Arm);

/// What one partition's lane needs.
struct Lane<T, H> {
    consumer: Arc<GroupConsumer>,
    dlq: FutureProducer,
    name: Arc<str>,
    handler: Arc<H>,
    max_batch: usize,
    /// Transient failures in a row before a message is dead-lettered.
    max_attempts: u32,
    /// Lives a message may kill before it is dead-lettered ([`crashes`]).
    max_crashes: u32,
    shutdown: CancellationToken,
    /// Cancelled when the partition is revoked from this member.
    revoked: CancellationToken,
    /// Dropped when the lane ends: tells the revocation it may hand over.
    _done: Option<std::sync::mpsc::Sender<()>>,
    decoded: std::marker::PhantomData<fn() -> T>,
}

impl<T, H> Lane<T, H> {
    /// This lane's settings for one partition, stopped by `revoked`.
    fn for_partition(&self, revoked: CancellationToken, done: std::sync::mpsc::Sender<()>) -> Self {
        Self {
            consumer: self.consumer.clone(),
            dlq: self.dlq.clone(),
            name: self.name.clone(),
            handler: self.handler.clone(),
            max_batch: self.max_batch,
            max_attempts: self.max_attempts,
            max_crashes: self.max_crashes,
            shutdown: self.shutdown.clone(),
            revoked,
            _done: Some(done),
            decoded: std::marker::PhantomData,
        }
    }
}

impl<T, H, F> Lane<T, H>
where
    T: DeserializeOwned + Clone + Send + 'static,
    H: Fn(Vec<Traced<T>>) -> F + Send + Sync + 'static,
    F: Future<Output = Result<Vec<Handled>, HandleError>> + Send + 'static,
{
    /// Handles one partition's messages in order until its queue closes,
    /// shutdown or revocation, a batch at a time (what is queued, up to
    /// `max_batch`); stores the batch's last offset after its handling
    /// committed. A revocation lets the batch in hand finish and store.
    async fn run(self, mut queue: mpsc::Receiver<OwnedMessage>) {
        let mut batch = Vec::with_capacity(self.max_batch);
        let mut watch = crashes::Watch::new(
            self.consumer.clone(),
            self.name.clone(),
            self.max_crashes,
            self.max_batch,
        );
        loop {
            let first = tokio::select! {
                biased;
                _ = self.shutdown.cancelled() => return,
                _ = self.revoked.cancelled() => return,
                m = queue.recv() => match m { Some(m) => m, None => return },
            };
            // Armed: careful, this message alone.
            let arm = match watch.plan(&first).await {
                crashes::Plan::Poison { lives } => {
                    let reason =
                        format!("killed its consumer: {lives} lives died handling it (KAFKA_CONSUMER_MAX_CRASHES)");
                    if !crate::dlq::dead_letter(&self.dlq, &first, &self.name, &reason, &self.shutdown).await {
                        return;
                    }
                    self.store(&first);
                    watch.commit(&first, first.offset() + 1, crashes::Mark::Clean).await;
                    continue;
                }
                crashes::Plan::One(arm) => Some(arm),
                crashes::Plan::Batch { mark } => {
                    if mark {
                        // The offset does not move: the next background commit takes the mark.
                        watch.commit(&first, first.offset(), crashes::Mark::Life).await;
                    }
                    None
                }
            };
            batch.clear();
            batch.push(first);
            while batch.len() < self.max_batch && arm.is_none() {
                match queue.try_recv() {
                    Ok(m) => batch.push(m),
                    Err(_) => break,
                }
            }
            #[cfg(feature = "negative-controls")]
            crate::negative_controls::before_handling(&self.consumer, &self.name, &batch);
            let armed = arm.map(|arm| (&watch, &batch[0], arm));
            // Shutdown mid-batch: leave its offsets for redelivery.
            let Some(new) = self.handle(&batch, armed).await else {
                return;
            };
            if new > 0 {
                fail::fail_point!(CRASH_BEFORE_OFFSET_COMMIT, |_| telemetry::crash_point(
                    CRASH_BEFORE_OFFSET_COMMIT
                ));
            }
            let last = batch.last().expect("a batch has a message");
            self.store(last);
            if arm.is_some() {
                // A careful message done: its next offset, without a mark.
                watch.commit(last, last.offset() + 1, crashes::Mark::Clean).await;
            }
        }
    }

    /// Stores `msg`'s offset, committed later in the background. Not fatal
    /// when it fails (a revoked partition): the message is redelivered and
    /// absorbed.
    fn store(&self, msg: &OwnedMessage) {
        if let Err(e) = self.consumer.store_offset(msg.topic(), msg.partition(), msg.offset()) {
            tracing::warn!(consumer = &*self.name, error = %e, "offset store failed");
        }
    }

    /// Handles `batch` (decoding, the handler, dead letters): how many of
    /// its events were new to the inbox (applied or ignored), or `None`
    /// when shutdown interrupted it.
    async fn handle(&self, batch: &[OwnedMessage], armed: Option<Armed<'_>>) -> Option<usize> {
        let name = &*self.name;
        telemetry::metrics::incr_by(
            "consumer_messages_received_total",
            &[("consumer", name)],
            batch.len() as u64,
        );
        telemetry::metrics::incr("consumer_batches_total", &[("consumer", name)]);
        let mut decoded = Vec::with_capacity(batch.len());
        let mut sources = Vec::with_capacity(batch.len());
        for msg in batch {
            match serde_json::from_slice::<T>(msg.payload().unwrap_or_default()) {
                Ok(message) => {
                    decoded.push(Traced {
                        span: consume_span(name, msg),
                        message,
                        position: Some(Position {
                            partition: msg.partition(),
                            offset: msg.offset(),
                        }),
                        producer: dispatch::header(msg, outbox::kafka::PRODUCER).map(str::to_owned),
                        header_event_id: dispatch::header(msg, outbox::kafka::EVENT_ID).map(str::to_owned),
                    });
                    sources.push(msg);
                }
                Err(e) => {
                    if !crate::dlq::dead_letter(&self.dlq, msg, name, &format!("decode: {e}"), &self.shutdown).await {
                        return None;
                    }
                }
            }
        }
        if decoded.is_empty() {
            return Some(0);
        }
        fail::fail_point!(CRASH_WHILE_HANDLING, |_| {
            std::thread::sleep(Duration::from_secs(3));
            telemetry::crash_point(CRASH_WHILE_HANDLING)
        });
        let single = decoded.len() == 1;
        match self.retrying(decoded.clone(), armed).await {
            Ok(Some(outcomes)) => return Some(self.count(&sources, &outcomes)),
            Ok(None) => return None,
            Err(e) if single => {
                return crate::dlq::dead_letter(&self.dlq, sources[0], name, &e.report(), &self.shutdown)
                    .await
                    .then_some(0)
            }
            Err(e) => {
                tracing::warn!(
                    consumer = name,
                    error = e.report(),
                    size = decoded.len(),
                    "batch refused; handling its messages one by one"
                );
            }
        }
        let mut new = 0;
        for (message, msg) in decoded.into_iter().zip(sources) {
            match self.retrying(vec![message], armed).await {
                Ok(Some(outcomes)) => new += self.count(&[msg], &outcomes),
                Ok(None) => return None,
                Err(e) => {
                    if !crate::dlq::dead_letter(&self.dlq, msg, name, &e.report(), &self.shutdown).await {
                        return None;
                    }
                }
            }
        }
        Some(new)
    }

    /// The handler on `batch` with its retries ([`handle_with_retry`]).
    async fn retrying(
        &self,
        batch: Vec<Traced<T>>,
        armed: Option<Armed<'_>>,
    ) -> Result<Option<Vec<Handled>>, HandleError> {
        let retry = Retry {
            name: &self.name,
            max_attempts: self.max_attempts,
            shutdown: &self.shutdown,
            armed,
        };
        handle_with_retry(&retry, &*self.handler, batch).await
    }

    /// Counts the outcomes in the metrics; returns how many were new to the
    /// inbox (applied or ignored).
    fn count(&self, sources: &[&OwnedMessage], outcomes: &[Handled]) -> usize {
        let name = &*self.name;
        let mut new = 0;
        debug_assert_eq!(
            sources.len(),
            outcomes.len(),
            "a batch handler returns one outcome per message"
        );
        for (msg, outcome) in sources.iter().zip(outcomes) {
            match outcome {
                Handled::Applied => {
                    new += 1;
                    telemetry::metrics::incr("consumer_events_applied_total", &[("consumer", name)]);
                }
                Handled::Ignored => {
                    new += 1;
                    telemetry::metrics::incr("consumer_events_ignored_total", &[("consumer", name)]);
                }
                Handled::Duplicate => {
                    telemetry::metrics::incr("consumer_duplicates_absorbed_total", &[("consumer", name)]);
                    tracing::info!(
                        consumer = name,
                        partition = msg.partition(),
                        offset = msg.offset(),
                        "duplicate event absorbed by inbox"
                    );
                }
            }
        }
        new
    }
}
