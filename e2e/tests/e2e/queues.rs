//! The bench's queue sampler (`e2e::bench::queues`) on a real stack: it
//! reads every outbox, the notices and each consumer group's lag, and sees
//! them empty once the orders are done; and its split of PostgreSQL's CPU
//! (`e2e::bench::pg_cpu`), which finds each database at work.

use e2e::bench::queues::Sampler;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bench_reads_every_queue_and_sees_it_empty_after_the_orders() {
    let stack = crate::stack("queues").await;
    let sampler = Sampler::start(&stack);
    let pg_cpu = e2e::bench::pg_cpu::Sampler::start(&stack);
    for _ in 0..3 {
        crate::one_confirmed_order(&stack).await;
    }
    let owners = pg_cpu.owners().clone();
    let split = pg_cpu.finish(3).await;
    let queues = sampler.finish(&stack, 1).await;
    let names: Vec<&str> = queues.queues.iter().map(|q| q.name.as_str()).collect();
    assert_eq!(names.len(), 7, "three outboxes, the notices, three groups: {names:?}");
    for q in &queues.queues {
        assert!(!q.series.is_empty(), "{} never sampled", q.name);
        assert!(
            q.series.iter().all(|n| *n >= 0),
            "{} not read every second: {:?}",
            q.name,
            q.series
        );
        assert!(q.drained_secs.is_some(), "{} did not empty: {:?}", q.name, q.series);
    }
    // The orders went through: the notices queue held one at some point or
    // was sent within the second; the orders' outbox had rows to publish.
    assert!(queues.behind(1.0).is_empty(), "{:?}", queues.behind(1.0));
    // Each of the system's databases did work for the orders, charged to
    // it by its services' backends (which backend is whose: the unit tests
    // of `pg_cpu`; the gateway stand-in's few ms of three charges may fall
    // under the clock's 10-ms tick).
    println!("PostgreSQL CPU ms per order: {split:?}");
    for label in ["postgres: orders", "postgres: inventory", "postgres: payments"] {
        assert!(split.get(label).is_some_and(|ms| *ms > 0.0), "{label}: {split:?}");
    }
    let system = e2e::bench::pg_cpu::Sampler::system_ms(&owners, &split);
    assert!(system > 0.0 && system <= split.values().sum::<f64>(), "{split:?}");
    stack.shutdown(true).await.unwrap();
}
