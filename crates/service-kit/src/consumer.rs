//! A service's saga consumer as supervised tasks: the consume loop on its
//! topic and the retention of its inbox, which live and die together.

use std::future::Future;
use std::time::Duration;

use contract::topics::consumers::Consumer;
use contract::Envelope;
use kafka::consumer::{ConsumerSettings, HandleError, Handled, Traced};
use kafka::KafkaArgs;
use sqlx::PgPool;

use crate::Supervisor;

/// One consumer of the saga.
#[derive(Debug, Clone)]
pub struct SagaConsumer {
    /// Who it is and what it reads (`contract::topics::consumers`).
    pub consumer: Consumer,
    /// The broker.
    pub kafka: KafkaArgs,
    /// The service's database, which holds its inbox.
    pub pool: PgPool,
    /// How long inbox rows are kept (must exceed the broker's redelivery window).
    pub inbox_retention: Duration,
}

impl SagaConsumer {
    /// `consumer`, with the service's broker, database and inbox retention settings.
    pub fn new(consumer: Consumer, kafka: &KafkaArgs, pool: &PgPool, inbox: &inbox::RetentionArgs) -> Self {
        Self {
            consumer,
            kafka: kafka.clone(),
            pool: pool.clone(),
            inbox_retention: inbox.window(),
        }
    }
}

impl Supervisor {
    /// Runs `consumer` under supervision: each envelope goes to
    /// `handler(state.clone(), envelope)`; the inbox retention runs beside it.
    pub fn spawn_consumer<S, H, F>(&mut self, saga: SagaConsumer, state: S, handler: H)
    where
        S: Clone + Send + Sync + 'static,
        H: Fn(S, Envelope) -> F + Send + Sync + 'static,
        F: Future<Output = Result<Handled, HandleError>> + Send + 'static,
    {
        let (settings, pool, retention) = saga.into_parts();
        let name = settings.group_id.clone();
        let token = self.token();
        self.spawn(
            format!("{name} consumer"),
            kafka::consumer::run(settings, token, move |envelope| handler(state.clone(), envelope)),
        );
        self.spawn_retention(&name, pool, retention);
    }

    /// Like [`Supervisor::spawn_consumer`] for a handler that applies a
    /// partition's queued envelopes (up to `KAFKA_CONSUMER_MAX_BATCH`) in one
    /// transaction: `handler(state.clone(), envelopes)` returns one outcome
    /// per envelope, all committed, or an error with none committed. Each
    /// envelope comes with its consumer span, for the work done on it.
    pub fn spawn_batch_consumer<S, H, F>(&mut self, saga: SagaConsumer, state: S, handler: H)
    where
        S: Clone + Send + Sync + 'static,
        H: Fn(S, Vec<Traced<Envelope>>) -> F + Send + Sync + 'static,
        F: Future<Output = Result<Vec<Handled>, HandleError>> + Send + 'static,
    {
        let (settings, pool, retention) = saga.into_parts();
        let name = settings.group_id.clone();
        let token = self.token();
        self.spawn(
            format!("{name} consumer"),
            kafka::consumer::run_batches(settings, token, move |envelopes| handler(state.clone(), envelopes)),
        );
        self.spawn_retention(&name, pool, retention);
    }

    fn spawn_retention(&mut self, name: &str, pool: PgPool, retention: Duration) {
        let token = self.token();
        self.spawn(
            format!("{name} inbox retention"),
            inbox::run_retention(pool, retention, token),
        );
    }
}

impl SagaConsumer {
    fn into_parts(self) -> (ConsumerSettings, PgPool, Duration) {
        let Consumer { name, topic } = self.consumer;
        let settings = ConsumerSettings {
            max_batch: self.kafka.consumer_max_batch.into(),
            kafka: self.kafka,
            group_id: name.into(),
            topics: vec![topic.into()],
        };
        (settings, self.pool, self.inbox_retention)
    }
}
