//! The chaos suite at CI size, and its negative control.

use e2e::chaos::{self, ChaosConfig};

/// This test run's seed: `CHAOS_SEED` (a replay) or one that changes from
/// run to run, shared by the ordinary run and every negative control.
pub fn seed() -> u64 {
    static SEED: std::sync::LazyLock<u64> = std::sync::LazyLock::new(chaos::matrix::seed_from_env_or_clock);
    *SEED
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_run_finds_no_double_charge_and_loses_nothing() {
    let _slot = crate::exclusive().await;
    let cfg = ChaosConfig::ci(seed());
    println!(
        "chaos: seed {} — replay with `cargo xtask chaos --seed {}` (or CHAOS_SEED={} for this test)",
        cfg.seed, cfg.seed, cfg.seed
    );
    let report = chaos::run(&cfg).await.expect("chaos run completes");
    println!("{}", chaos::markdown(&report));
    assert!(report.passed(), "{:?}", report.problems);
    assert!(report.orders >= 300);
    assert_eq!(
        report.faults_fired.len(),
        chaos::Fault::FIRST_ROUND.len(),
        "every fault kind fired: {:?}",
        report.faults_fired
    );
    assert!(report.duplicates.delivered() > 0, "duplicates were delivered");
    assert!(report.duplicates.total_absorbed() > 0, "and absorbed");
    assert!(report.audit.double_charged.is_empty() && report.audit.lost.is_empty() && report.audit.stuck.is_empty());
    assert_eq!(report.audit.lost_before_the_log, 0);
    assert_eq!(report.clients.indeterminate, 0);
    // The seed fixed the schedule: the run met, place by place, the kinds
    // and targets its plan draws from the seed alone.
    let plan = chaos::faults::Plan::new(cfg.seed, chaos::Fault::kinds(cfg.brokers));
    for (i, event) in report.timeline.iter().enumerate() {
        assert_eq!(event.fault, plan.kind_at(i), "place {i}: {event:?}");
        let choice = chaos::faults::choose(event.fault, &mut plan.rng_for(i), cfg.brokers);
        if let Some(words) = choice.words() {
            assert!(event.detail.contains(&words), "place {i}: {words} not in {event:?}");
        }
    }
    // The picture: both series, one lane per fault kind, one mark per fault.
    let svg = chaos::svg(&report);
    assert_eq!(svg.matches("<polyline").count(), 2, "orders/s and open orders");
    assert_eq!(
        svg.matches(r#"class="lane""#).count(),
        chaos::Fault::FIRST_ROUND.len(),
        "a lane per fault kind"
    );
    assert_eq!(
        svg.matches(r#"class="fault""#).count(),
        report.timeline.len(),
        "a mark per fault"
    );
    assert!(
        report.samples.len() > 10,
        "sampled every second: {}",
        report.samples.len()
    );
}

/// payment-service's inbox and gateway key off at once. Not in the test
/// command: the catch matrix's `payment-inbox` and `gateway-key` switch
/// each of the two off alone, and are caught on their effects; run it with
/// `cargo xtask chaos --negative-control` or `-- --ignored chaos::negative`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "covered by the catch matrix's payment-inbox and gateway-key switches; cargo xtask chaos --negative-control"]
async fn negative_control_without_dedup_finds_double_charges() {
    let _slot = crate::exclusive().await;
    let mut cfg = ChaosConfig::ci(seed());
    cfg.negative_control = true;
    let report = chaos::run(&cfg).await.expect("chaos run completes");
    println!("{}", chaos::markdown(&report));
    assert!(
        !report.audit.double_charged.is_empty(),
        "with deduplication off the same fault schedule must find double charges"
    );
}

/// The same faults with orders arriving at 60 a second: the lazy offset
/// commits and concurrent partitions keep every invariant under load.
///
/// The rate is what this project's two-core machine holds with the debug
/// services (failpoints compiled in) under the fault schedule: 100/s held on
/// the AMD EPYC machines of earlier runs; on the Intel Xeon ones 80/s failed
/// two runs of three (the stack acknowledged 32–53/s, so the backlog filled
/// the 2,048 clients before the schedule ended and the arrivals fell under
/// the floor), with every invariant kept in all three
/// (docs/results/chaos-loaded-rate.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_at_60_orders_per_second_keeps_every_invariant() {
    let _slot = crate::exclusive().await;
    let mut cfg = ChaosConfig::ci(20261201);
    cfg.orders = 1_500;
    // A crash point fires only on fresh work, and at 60/s the first 1,500
    // orders are placed in 25 s, before the schedule's first round (each
    // crash waits for its restart) is through: the clients go on at the
    // same rate until every kind fired (2 minutes at most).
    cfg.max_orders = 12_000;
    cfg.rate_per_sec = 60.0;
    // Under 90 % of it offered is a failed run (its logs kept), checked below too.
    cfg.offered_floor = 0.9;
    // Enough clients that slow responses under faults do not cap the arrival
    // rate: a kill of order-api stalls every order in flight for the seconds
    // of its restart (at 100/s, ~300 orders), and 64 clients held the arrivals
    // back to 87/s on CI. 512 absorb a 5-second stall on a quiet machine, but
    // held them to 84/s on CI with the suite's other tests sharing the cores
    // (two order-api outages, each answer slower): 2,048 absorb a 20-second
    // stall. A waiting client costs a timer and, while retrying, a request
    // every 2–4 s (its backoff, jittered).
    cfg.clients = 2_048;
    // The load is this run's subject: one Kafka node, so that three JVMs do
    // not take the two cores the arrival rate needs. The replicated cluster
    // (three nodes, one SIGKILLed at a time) is the CI-sized run's and the
    // negative control's.
    cfg.brokers = 1;
    cfg.fault_interval = std::time::Duration::from_millis(500);
    let report = chaos::run(&cfg).await.expect("chaos run completes");
    println!("{}", chaos::markdown(&report));
    assert!(report.passed(), "{:?}", report.problems);
    assert_eq!(
        report.faults_fired.len(),
        chaos::Fault::kinds(cfg.brokers).len(),
        "{:?}",
        report.faults_fired
    );
    assert!(report.duplicates.total_absorbed() > 0, "duplicates absorbed");
    // The arrival rate: open-loop, so the clients must have offered ~the
    // rate asked. The acknowledged rate is reported, not bounded: retries
    // after the last faults (an order-api restart) stretch it on a slow machine.
    assert!(
        report.offered_per_sec >= 0.9 * cfg.rate_per_sec,
        "orders were offered at {:.0}/s, not the {:.0}/s asked (acknowledged {:.0}/s)",
        report.offered_per_sec,
        cfg.rate_per_sec,
        report.placed_per_sec
    );
}
