//! A broker that goes away does not take the services with it: a service
//! started while Kafka is down waits, not ready, and serves once it
//! answers; Kafka SIGKILLed and restarted under load ends no service, and
//! every order still finishes.

use std::time::{Duration, Instant};

use e2e::driver::{new_key, Client, OrderRequest, GOOD_CARD};
use e2e::Service;

fn order(sku: &str) -> OrderRequest {
    OrderRequest {
        sku: sku.into(),
        quantity: 1,
        amount_cents: 900,
        card: GOOD_CARD.into(),
    }
}

/// `GET /health/ready` of `s`: its status and body (None while nothing answers).
async fn readiness(stack: &e2e::Stack, s: Service) -> Option<(u16, String)> {
    let r = reqwest::get(format!("{}/health/ready", stack.admin_url(s)))
        .await
        .ok()?;
    Some((r.status().as_u16(), r.text().await.unwrap_or_default()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_started_while_kafka_is_down_waits_not_ready_and_then_serves() {
    let mut stack = crate::stack("kafka-down").await;
    let client = Client::new(&stack, Duration::from_secs(5)).unwrap();
    client.seed_stock("DOWN", 5).await.unwrap();
    let killed = stack.kill(Service::Broker).await.unwrap();
    assert_eq!(killed.and_then(|k| k.signal), Some(9), "the broker died of SIGKILL");
    // The relay creates its topics at start, the others join their groups.
    let waiting = [Service::Relay, Service::Inventory, Service::Payment];
    for s in waiting {
        stack.restart_unready(s).await.unwrap();
    }
    for s in waiting {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match readiness(&stack, s).await {
                Some((503, body)) if body.contains("waiting for kafka") => break,
                other => assert!(
                    Instant::now() < deadline,
                    "{} did not say it waits for Kafka: {other:?}",
                    s.name()
                ),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    // Longer than any start-up timeout the services had (10 s topic
    // creation): still there, still waiting.
    tokio::time::sleep(Duration::from_secs(12)).await;
    for s in waiting {
        assert!(
            stack.is_running(s),
            "{} exited while Kafka was down: {:?}",
            s.name(),
            stack.last_exit(s)
        );
        assert_eq!(
            readiness(&stack, s).await.map(|r| r.0),
            Some(503),
            "{} is not ready",
            s.name()
        );
    }
    // An order placed meanwhile waits in the outbox.
    let placed = client
        .place_order(&new_key(), &order("DOWN"), Duration::from_secs(10))
        .await
        .unwrap();

    stack.start_service(Service::Broker).await.unwrap();
    for s in waiting {
        stack.wait_ready(s, Duration::from_secs(60)).await.unwrap();
    }
    let done = client
        .wait_terminal(&[placed.id], Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(done[&placed.id].status, "CONFIRMED", "{:?}", done[&placed.id]);
    stack.shutdown(true).await.unwrap();
}

/// As `cargo xtask up` runs it (nothing restarts a service that exits):
/// the broker SIGKILLed and restarted twice while clients place orders.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_broker_restarts_under_load_end_no_service_and_every_order_finishes() {
    let mut stack = crate::stack("kafka-restarts").await;
    let client = Client::new(&stack, Duration::from_secs(5)).unwrap();
    client.seed_stock("RESTART", 100).await.unwrap();
    let load = {
        let client = client.clone();
        tokio::spawn(async move {
            let mut ids = Vec::new();
            for _ in 0..40 {
                let placed = client
                    .place_order(&new_key(), &order("RESTART"), Duration::from_secs(60))
                    .await
                    .unwrap();
                ids.push(placed.id);
                tokio::time::sleep(Duration::from_millis(400)).await;
            }
            ids
        })
    };
    for _ in 0..2 {
        tokio::time::sleep(Duration::from_secs(4)).await;
        let restarted = stack.restart(Service::Broker).await.unwrap();
        assert!(
            restarted.evident(),
            "the broker was SIGKILLed and replaced: {restarted}"
        );
    }
    let ids = load.await.unwrap();
    let done = client.wait_terminal(&ids, Duration::from_secs(120)).await.unwrap();
    assert!(
        done.values().all(|o| o.status == "CONFIRMED"),
        "every order confirmed: {:?}",
        done.values().filter(|o| o.status != "CONFIRMED").collect::<Vec<_>>()
    );
    for s in Service::ALL.into_iter().filter(|s| *s != Service::Broker) {
        assert!(
            stack.is_running(s),
            "{} exited on its own: {:?}",
            s.name(),
            stack.last_exit(s)
        );
    }
    stack.shutdown(true).await.unwrap();
}
