//! End-to-end tests over real processes: Apache Kafka, PostgreSQL, the five services.

mod access;
mod api;
mod broker;
mod cards;
mod chaos;
mod compose;
mod contract;
mod crash;
mod dashboard;
mod docs;
mod examples;
mod fuzz;
mod group;
mod identities;
mod journey;
mod layers;
mod metrics;
mod notices;
mod offsets;
mod payments;
mod privileges;
mod producers;
mod queues;
mod reconcile;
mod rotation;
mod saga;
mod scenarios;
mod supervisor;
mod traces;
mod transactions;
mod transport;

use tokio::sync::{OwnedRwLockReadGuard, OwnedRwLockWriteGuard, RwLock};

/// Two cores: ordinary e2e tests share the machine, a chaos run has it alone.
static MACHINE: std::sync::LazyLock<std::sync::Arc<RwLock<()>>> = std::sync::LazyLock::new(Default::default);

/// Says how long this test waited for its share of the machine, on the
/// test binary's own stdout (past libtest's capture), as
/// `machine-wait <test> <seconds>`: `cargo xtask test` takes it off the
/// test's duration, so its list of the slowest tests is of work, not waits.
fn waited(since: std::time::Instant) {
    use std::io::Write as _;
    let thread = std::thread::current();
    let line = format!(
        "machine-wait {} {:.3}\n",
        thread.name().unwrap_or("?"),
        since.elapsed().as_secs_f64()
    );
    let _ = std::io::stdout().write_all(line.as_bytes());
}

/// Held by a chaos test for its whole run.
pub async fn exclusive() -> OwnedRwLockWriteGuard<()> {
    let since = std::time::Instant::now();
    let slot = MACHINE.clone().write_owned().await;
    waited(since);
    slot
}

/// A fresh stack for one test, and its share of the machine.
pub struct TestStack {
    stack: e2e::Stack,
    _share: OwnedRwLockReadGuard<()>,
}

impl std::ops::Deref for TestStack {
    type Target = e2e::Stack;
    fn deref(&self) -> &e2e::Stack {
        &self.stack
    }
}

impl std::ops::DerefMut for TestStack {
    fn deref_mut(&mut self) -> &mut e2e::Stack {
        &mut self.stack
    }
}

impl TestStack {
    /// Stops the processes, drops the databases, removes the run directory.
    pub async fn shutdown(self, remove: bool) -> anyhow::Result<()> {
        self.stack.shutdown(remove).await
    }
}

/// A share of the machine, for a test that boots its own stack.
pub async fn share() -> OwnedRwLockReadGuard<()> {
    let since = std::time::Instant::now();
    let slot = MACHINE.clone().read_owned().await;
    waited(since);
    slot
}

/// Seeds stock and places one payable order through `stack`, until it
/// ends CONFIRMED: the saga ran end to end (under the stack's database
/// roles and Kafka principals).
pub async fn one_confirmed_order(stack: &e2e::Stack) {
    let client = e2e::driver::Client::new(stack, std::time::Duration::from_secs(5)).unwrap();
    client.seed_stock("WIDGET", 5).await.unwrap();
    let order = e2e::driver::OrderRequest {
        sku: "WIDGET".into(),
        quantity: 1,
        amount_cents: 700,
        card: e2e::driver::GOOD_CARD.into(),
    };
    let (_, status) = client
        .place_and_finish(&order, std::time::Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(status, "CONFIRMED");
}

/// Boots a fresh stack for one test.
pub async fn stack(label: &str) -> TestStack {
    stack_with(label, |_| {}).await
}

/// Boots a fresh stack for one test, its options changed by `configure`.
pub async fn stack_with(label: &str, configure: impl FnOnce(&mut e2e::StackOptions)) -> TestStack {
    let share = share().await;
    let mut opts = e2e::StackOptions::ephemeral(label).expect("stack options");
    opts.remove_run_dir_on_drop = true;
    configure(&mut opts);
    TestStack {
        stack: e2e::Stack::start(opts).await.expect("stack starts"),
        _share: share,
    }
}

/// The SQLSTATE of `result`'s database error, "ok" when it succeeded, or
/// the error itself when it is no database's (a TLS failure, say).
pub fn sqlstate<T>(result: Result<T, sqlx::Error>) -> String {
    match result {
        Ok(_) => "ok".into(),
        Err(sqlx::Error::Database(e)) => e.code().map(|c| c.into_owned()).unwrap_or_default(),
        Err(e) => format!("{e}"),
    }
}
