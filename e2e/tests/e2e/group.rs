//! Consumer groups on the real broker: three instances each of
//! inventory-service and payment-service in one group share the partitions
//! (as the group assigned them, read from each member), every instance
//! handles messages (from its own metrics), and SIGKILLs of instances
//! mid-flow — each followed by a rebalance and a replacement joining —
//! break no invariant.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use e2e::driver::{new_key, Client, OrderRequest, GOOD_CARD};
use e2e::invariants::{audit, Expected};
use e2e::{Service, Stack};
use uuid::Uuid;

/// Events an instance applied, from its own metrics (0 when it does not answer).
async fn applied(url: &str) -> f64 {
    Stack::metric(url, "consumer_events_applied_total", &[])
        .await
        .unwrap_or(0.0)
}

/// Waits until the instances at `urls` hold disjoint, non-empty shares of
/// all of `topic`'s partitions; returns the shares.
async fn wait_shared(stack: &Stack, urls: &[String], topic: &str) -> Vec<BTreeSet<(String, i32)>> {
    stack.wait_shared(urls, topic, Duration::from_secs(90)).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_share_partitions_and_survive_sigkill_churn() {
    let mut stack = crate::stack("group").await;
    let client = Client::new(&stack, Duration::from_secs(5)).unwrap();
    client.seed_stock("WIDGET", 100_000).await.unwrap();
    let consumers = [
        (Service::Inventory, contract::topics::INVENTORY_COMMANDS),
        (Service::Payment, contract::topics::PAYMENT_COMMANDS),
    ];
    // Instances by service: (pid, admin url); the first is the stack's own.
    let mut instances: BTreeMap<Service, Vec<(u32, String)>> = BTreeMap::new();
    for (s, topic) in consumers {
        // The stack's own instance holds every partition before the extras
        // join, so their joining makes it give partitions up: a revocation
        // for certain (a joiner arriving while the group still forms would
        // take its share with none).
        wait_shared(&stack, &[stack.admin_url(s)], topic).await;
        instances.entry(s).or_default().push((0, stack.admin_url(s)));
        for _ in 0..2 {
            let extra = stack.start_extra(s).await.unwrap();
            instances.entry(s).or_default().push(extra);
        }
    }
    for (s, topic) in consumers {
        let urls: Vec<String> = instances[&s].iter().map(|(_, u)| u.clone()).collect();
        let shares = wait_shared(&stack, &urls, topic).await;
        println!("{}: the group gave {shares:?}", s.name());
    }

    // Orders arrive for 45 s while an extra instance is SIGKILLed every 12 s
    // (after it handled something) and a replacement joins the group.
    let load = {
        let client = Client::new(&stack, Duration::from_secs(5)).unwrap();
        tokio::spawn(async move {
            let mut acknowledged = BTreeMap::new();
            let started = Instant::now();
            let mut n = 0u32;
            while started.elapsed() < Duration::from_secs(45) {
                let key = new_key();
                let req = OrderRequest {
                    sku: "WIDGET".into(),
                    quantity: 1,
                    amount_cents: 500 + n as i64,
                    card: GOOD_CARD.into(),
                };
                let order = client.place_order(&key, &req, Duration::from_secs(30)).await.unwrap();
                acknowledged.insert(key, order.id);
                n += 1;
                tokio::time::sleep(Duration::from_millis(150)).await;
            }
            acknowledged
        })
    };
    let mut handled: BTreeMap<(Service, u32), f64> = BTreeMap::new();
    let mut kills = 0;
    for round in 0..3 {
        tokio::time::sleep(Duration::from_secs(12)).await;
        let s = consumers[round % 2].0;
        // The oldest extra that has handled something goes.
        let mut victim = None;
        for (pid, url) in instances[&s].iter().skip(1) {
            let n = applied(url).await;
            if n > 0.0 {
                victim = Some((*pid, url.clone(), n));
                break;
            }
        }
        let Some((pid, url, n)) = victim else { continue };
        handled.insert((s, pid), n);
        assert!(stack.kill_extra(pid).await, "pid {pid} was an extra instance");
        kills += 1;
        let list = instances.get_mut(&s).unwrap();
        list.retain(|(p, _)| *p != pid);
        list.push(stack.start_extra(s).await.unwrap());
        println!(
            "killed {} pid {pid} ({url}) after {n} events; a replacement joins",
            s.name()
        );
    }
    let acknowledged = load.await.unwrap();
    assert!(kills >= 2, "the churn killed {kills} instances");

    let ids: Vec<Uuid> = acknowledged.values().copied().collect();
    client.wait_terminal(&ids, Duration::from_secs(120)).await.unwrap();
    // Every instance alive now holds a share and handled messages itself.
    for (s, topic) in consumers {
        let urls: Vec<String> = instances[&s].iter().map(|(_, u)| u.clone()).collect();
        wait_shared(&stack, &urls, topic).await;
        for (pid, url) in &instances[&s] {
            handled.insert((s, *pid), applied(url).await);
        }
    }
    println!("events applied per instance (pid 0 = the stack's own): {handled:?}");
    for ((s, pid), n) in &handled {
        assert!(*n > 0.0, "{} pid {pid} handled no message", s.name());
    }
    // A member that joins takes partitions from those holding them; which
    // member gives one up is the assignor's choice, so the revocations of
    // every inventory instance still running are counted.
    let mut revokes = 0.0;
    let alive = instances[&Service::Inventory].iter().map(|(_, u)| u.clone());
    for url in std::iter::once(stack.admin_url(Service::Inventory)).chain(alive) {
        revokes += Stack::metric(&url, "consumer_rebalances_total", &[("kind", "revoke")])
            .await
            .unwrap_or(0.0);
    }
    assert!(revokes > 0.0, "no inventory-service instance saw a revocation");

    let expected = Expected {
        initial_stock: [("WIDGET".to_owned(), 100_000)].into(),
        acknowledged,
        indeterminate: 0,
        rescue_expected: Default::default(),
        resends_judged_by_the_log: false,
        amount_is_nonce: false,
    };
    let a = audit(&stack, &expected).await.unwrap();
    assert!(a.passed(), "{:?}", a.violations);
    println!("{} orders, by status {:?}", ids.len(), a.orders_by_status);
    stack.shutdown(true).await.unwrap();
}
