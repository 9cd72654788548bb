//! The clients of a run: careful ones, that retry with the same key until
//! they get an answer, re-send some acknowledged requests and cancel some
//! confirmed orders — and count what they saw.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use uuid::Uuid;

use super::plan::{Kind, Planned};
use crate::driver::Client;

/// The longest a client waits before trying again: its waits double from
/// the first, up to this, each drawn between half and all of it ("equal
/// jitter"). Without the doubling and the spread, 2,048 clients behind a
/// stalled order-api came back together every second and, on a slower
/// machine, kept it overloaded long after the stall: tens of thousands of
/// retries, and arrivals held to half the rate asked.
const MAX_BACKOFF: Duration = Duration::from_secs(4);

/// `delay` with equal jitter: between half of it and all of it.
fn jittered(delay: Duration) -> Duration {
    use rand::Rng as _;
    delay.mul_f64(rand::thread_rng().gen_range(0.5..=1.0))
}

/// What the clients saw.
#[derive(Debug, Default, Clone, Serialize, serde::Deserialize)]
#[serde(default)]
pub struct ClientStats {
    /// Orders acknowledged with 201.
    pub acknowledged: usize,
    /// Orders the client gave up on (outcome unknown).
    pub indeterminate: usize,
    /// Orders refused with a final 4xx.
    pub rejected: usize,
    /// HTTP attempts beyond the first, with the same key.
    pub retries: usize,
    /// Retries answered by a replayed response (the first attempt had committed).
    pub replays: usize,
    /// 409 "in flight" answers.
    pub in_flight_409: usize,
    /// Cancels requested and acknowledged.
    pub cancels: usize,
    /// The orders whose cancel was acknowledged (they must end CANCELLED).
    pub cancelled: Vec<Uuid>,
    /// The orders whose cancel was sent and never answered (either outcome).
    pub cancel_unanswered: Vec<Uuid>,
    /// Deliberate re-sends of an acknowledged request.
    pub resends: usize,
    /// 201 answers whose body is not an order (each is also a violation).
    pub unparsable_201: usize,
    /// Idempotency violations seen by clients (a key answered with two orders).
    pub violations: Vec<String>,
    /// Orders placed: the plan's first orders, and as many more as the
    /// fault schedule needed traffic for.
    pub placed: usize,
    /// When the last order's first attempt was sent, ms after the start: the
    /// arrival rate the clients offered is `placed` / this.
    pub last_first_send_ms: u64,
}

/// Orders acknowledged so far: key → (order id, intended kind).
pub(super) type Acked = Arc<Mutex<BTreeMap<String, (Uuid, Kind)>>>;

/// The running clients.
pub(super) struct Clients {
    workers: Vec<tokio::task::JoinHandle<()>>,
    /// Set when the orders past the first `min` are no longer needed.
    enough: Arc<AtomicBool>,
    cancels: Arc<tokio::sync::Mutex<tokio::task::JoinSet<()>>>,
    /// What they saw.
    pub stats: Arc<Mutex<ClientStats>>,
    /// What was acknowledged.
    pub acked: Acked,
}

impl Clients {
    /// Starts `clients` workers taking the plan in order, order `i` no
    /// earlier than `i / rate` seconds after `started`: the first `min`
    /// orders always, the rest until [`Clients::enough`].
    pub fn start(client: &Client, plan: Vec<Planned>, min: usize, clients: usize, rate: f64, started: Instant) -> Self {
        let stats = Arc::new(Mutex::new(ClientStats::default()));
        let enough = Arc::new(AtomicBool::new(false));
        let acked: Acked = Arc::default();
        let next = Arc::new(AtomicUsize::new(0));
        let plan = Arc::new(plan);
        let cancels = Arc::new(tokio::sync::Mutex::new(tokio::task::JoinSet::new()));
        let workers = (0..clients)
            .map(|_| {
                let (client, stats, acked, next, plan, cancels, enough) = (
                    client.clone(),
                    stats.clone(),
                    acked.clone(),
                    next.clone(),
                    plan.clone(),
                    cancels.clone(),
                    enough.clone(),
                );
                tokio::spawn(async move {
                    loop {
                        let i = next.fetch_add(1, Ordering::SeqCst);
                        let Some(p) = plan.get(i) else { return };
                        let due = started + Duration::from_secs_f64(i as f64 / rate);
                        tokio::time::sleep_until(due.into()).await;
                        if i >= min && enough.load(Ordering::SeqCst) {
                            return;
                        }
                        {
                            let sent = started.elapsed().as_millis() as u64;
                            let mut s = stats.lock().expect("stats");
                            s.last_first_send_ms = s.last_first_send_ms.max(sent);
                            s.placed += 1;
                        }
                        if let Some(id) = place(&client, p, &stats, &acked).await {
                            if p.cancel {
                                let (client, stats) = (client.clone(), stats.clone());
                                cancels
                                    .lock()
                                    .await
                                    .spawn(async move { cancel_when_confirmed(&client, id, &stats).await });
                            }
                        }
                    }
                })
            })
            .collect();
        Self {
            workers,
            enough,
            cancels,
            stats,
            acked,
        }
    }

    /// No more orders past the first `min` (they are placed only while the
    /// schedule still needs traffic).
    pub fn enough(&self) {
        self.enough.store(true, Ordering::SeqCst);
    }

    /// Whether every order of the plan has been placed (or given up on).
    pub fn placed_all(&self) -> bool {
        self.workers.iter().all(|w| w.is_finished())
    }

    /// Waits for the workers and the pending cancels.
    pub async fn finish(self) -> anyhow::Result<(BTreeMap<String, (Uuid, Kind)>, ClientStats)> {
        for w in self.workers {
            w.await?;
        }
        let mut cancels = std::mem::take(&mut *self.cancels.lock().await);
        while cancels.join_next().await.is_some() {}
        let acked = self.acked.lock().expect("acked").clone();
        let stats = self.stats.lock().expect("stats").clone();
        Ok((acked, stats))
    }
}

/// Places one order as a careful client: retries with the same key.
/// Returns the order id once acknowledged.
pub(super) async fn place(
    client: &Client,
    p: &Planned,
    stats: &Mutex<ClientStats>,
    acked: &Mutex<BTreeMap<String, (Uuid, Kind)>>,
) -> Option<Uuid> {
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut attempts = 0usize;
    let mut delay = Duration::from_millis(100);
    let id = loop {
        attempts += 1;
        match client.post_order(&p.key, &p.request).await {
            Ok(r) if r.status == 201 => {
                let mut s = stats.lock().expect("stats");
                if attempts > 1 && r.replayed {
                    s.replays += 1;
                }
                match serde_json::from_str::<crate::driver::OrderView>(&r.body) {
                    Ok(o) => break Some(o.id),
                    Err(e) => {
                        // Acknowledged, but with no order the client can
                        // hold on to: counted, and a failure of the run.
                        s.unparsable_201 += 1;
                        s.violations.push(format!(
                            "order {} acknowledged with a 201 that is not an order ({e}): {}",
                            p.key, r.body
                        ));
                        return None;
                    }
                }
            }
            Ok(r) if r.status == 409 => stats.lock().expect("stats").in_flight_409 += 1,
            Ok(r) if r.status < 500 => {
                let mut s = stats.lock().expect("stats");
                s.rejected += 1;
                s.violations
                    .push(format!("order {} refused: {} {}", p.key, r.status, r.body));
                return None;
            }
            _ => {}
        }
        if Instant::now() > deadline {
            let mut s = stats.lock().expect("stats");
            s.indeterminate += 1;
            s.retries += attempts - 1;
            return None;
        }
        tokio::time::sleep(jittered(delay)).await;
        delay = (delay * 2).min(MAX_BACKOFF);
    };
    let id = id?;
    {
        let mut s = stats.lock().expect("stats");
        s.acknowledged += 1;
        s.retries += attempts - 1;
    }
    acked.lock().expect("acked").insert(p.key.clone(), (id, p.kind));
    if p.resend {
        // The client never saw the answer and sends again: same order.
        if let Ok(r) = client.post_order(&p.key, &p.request).await {
            let mut s = stats.lock().expect("stats");
            s.resends += 1;
            if r.status == 201 {
                let again = serde_json::from_str::<crate::driver::OrderView>(&r.body)
                    .ok()
                    .map(|o| o.id);
                if again != Some(id) || !r.replayed {
                    s.violations
                        .push(format!("key {} answered with order {again:?}, first {id}", p.key));
                }
            }
        }
    }
    Some(id)
}

pub(super) async fn cancel_when_confirmed(client: &Client, id: Uuid, stats: &Mutex<ClientStats>) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut poll = Duration::from_millis(300);
    while Instant::now() < deadline {
        match client.order(id).await {
            Ok(o) if o.status == "CONFIRMED" => break,
            Ok(o) if o.status == "CANCELLED" => return,
            _ => {
                tokio::time::sleep(jittered(poll)).await;
                poll = (poll * 2).min(Duration::from_secs(2));
            }
        }
    }
    let key = format!("cancel-{id}");
    let mut attempts = 0;
    while Instant::now() < deadline {
        attempts += 1;
        match client.cancel(&key, id).await {
            Ok(r) if r.status == 202 || r.status == 200 => {
                let mut s = stats.lock().expect("stats");
                s.cancels += 1;
                s.cancelled.push(id);
                s.retries += attempts - 1;
                if attempts > 1 && r.replayed {
                    s.replays += 1;
                }
                return;
            }
            Ok(r) if r.status == 409 && r.body.contains("only CONFIRMED") => return,
            Ok(r) if r.status == 409 => stats.lock().expect("stats").in_flight_409 += 1,
            _ => {}
        }
        tokio::time::sleep(jittered(Duration::from_millis(300).mul_f64(attempts.min(6) as f64))).await;
    }
    if attempts > 0 {
        stats.lock().expect("stats").cancel_unanswered.push(id);
    }
}
