//! Load on a running stack: an open-loop driver (orders sent at a fixed
//! arrival rate, each timed from when it was *meant* to be sent, so a stall
//! anywhere shows as latency instead of silently lowering the rate) and a
//! closed-loop one for the HTTP API's own ceiling.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use serde::Serialize;
use sqlx::{Connection, PgConnection};
use uuid::Uuid;

use super::mix::{Load, CANCEL_AFTER};

/// Requests in flight at most; beyond that an arrival waits (and its wait
/// counts in its latency).
const MAX_IN_FLIGHT: usize = 512;

/// How late a trial's orders may be sent and the rate still count as
/// offered: past it, `POST /orders` answered slower than the arrivals came
/// (the driver's requests in flight all taken), and the backlog of orders
/// placed — which does not see the orders waiting to be sent — would call a
/// rate sustained that the intake never took.
pub const MAX_SEND_LAG: Duration = Duration::from_secs(1);

/// What an open-loop run sent.
#[derive(Debug, Default)]
pub struct Sent {
    /// Order id → when it was meant to be sent.
    pub intended: BTreeMap<Uuid, SystemTime>,
    /// Requests that did not get a 201.
    pub failed: usize,
    /// Backlog (orders not yet terminal) per second of the run.
    pub backlog: Vec<i64>,
    /// How late the most delayed arrival was sent (waiting for one of the
    /// `MAX_IN_FLIGHT` requests to be answered): an intake that cannot keep
    /// up shows here, not in the backlog of orders placed.
    pub send_lag: Duration,
    /// Orders sent per second: all of them over the time to send the last.
    pub offered_per_sec: f64,
    /// Orders whose cancel was accepted ([`CANCEL_AFTER`] their intended
    /// send); their end is the cancel's, so placed → terminal leaves them out.
    pub cancelled: std::collections::BTreeSet<Uuid>,
    /// Cancels not accepted: 409 (the order not yet CONFIRMED a second
    /// after it was sent, so it goes on to its own end) or an error.
    pub cancels_failed: usize,
    /// Orders of this run terminal when the last order had been answered
    /// (before any drain): what the saga completed while the orders came.
    pub terminal_at_end: usize,
    /// From the first intended send until the last order was answered.
    pub elapsed: Duration,
}

impl Sent {
    /// The orders placed and not cancelled by the driver.
    pub fn uncancelled(&self) -> Vec<Uuid> {
        self.intended
            .keys()
            .filter(|id| !self.cancelled.contains(id))
            .copied()
            .collect()
    }

    /// Whether every order went out within [`MAX_SEND_LAG`] of its time.
    pub fn on_time(&self) -> bool {
        self.send_lag <= MAX_SEND_LAG
    }
}

/// Sends `load`'s orders at `rate` per second for `duration`, open loop,
/// sampling the backlog every second; the orders drawn to be cancelled
/// get their cancel [`CANCEL_AFTER`] their intended send.
pub async fn open_loop(load: &Load, orders_db: &str, rate: f64, duration: Duration) -> anyhow::Result<Sent> {
    let n = (rate * duration.as_secs_f64()).round() as usize;
    let sent = Arc::new(Mutex::new(Sent::default()));
    let permits = Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT));
    let start = Instant::now();
    let wall = SystemTime::now();
    let sampler = {
        let (sent, url) = (sent.clone(), orders_db.to_owned());
        tokio::spawn(async move {
            let mut db = PgConnection::connect(&url).await?;
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.tick().await;
            loop {
                tick.tick().await;
                let b = backlog(&mut db).await?;
                sent.lock().expect("sent").backlog.push(b);
            }
            #[allow(unreachable_code)]
            anyhow::Ok(())
        })
    };
    let mut tasks = tokio::task::JoinSet::new();
    // Each cancel waits in its own task from when its order is answered,
    // so it goes out on time while orders are still being sent.
    let cancels = Arc::new(Mutex::new(Vec::new()));
    let mut send_lag = Duration::ZERO;
    for i in 0..n {
        let offset = Duration::from_secs_f64(i as f64 / rate);
        tokio::time::sleep_until((start + offset).into()).await;
        let permit = permits.clone().acquire_owned().await?;
        send_lag = send_lag.max(start.elapsed().saturating_sub(offset));
        let (client, order, cancel) = load.order(i);
        let (client, sent, cancels) = (client.clone(), sent.clone(), cancels.clone());
        tasks.spawn(async move {
            let result = client.post_order(&Uuid::new_v4().to_string(), &order).await;
            drop(permit);
            let id = match result {
                Ok(r) if r.status == 201 => serde_json::from_str::<crate::driver::OrderView>(&r.body)
                    .ok()
                    .map(|o| o.id),
                _ => None,
            };
            let Some(id) = id else {
                sent.lock().expect("sent").failed += 1;
                return;
            };
            sent.lock().expect("sent").intended.insert(id, wall + offset);
            if cancel {
                let at = start + offset + CANCEL_AFTER;
                let task = tokio::spawn(async move {
                    tokio::time::sleep_until(at.into()).await;
                    let ok = matches!(client.cancel(&format!("cancel-{id}"), id).await,
                        Ok(r) if r.status == 202 || r.status == 200);
                    let mut s = sent.lock().expect("sent");
                    if ok {
                        s.cancelled.insert(id);
                    } else {
                        s.cancels_failed += 1;
                    }
                });
                cancels.lock().expect("cancels").push(task);
            }
        });
    }
    let sending = start.elapsed();
    while tasks.join_next().await.is_some() {}
    let elapsed = start.elapsed();
    let ids: Vec<Uuid> = sent.lock().expect("sent").intended.keys().copied().collect();
    let terminal_at_end = terminal(orders_db, &ids).await?;
    let cancels = std::mem::take(&mut *cancels.lock().expect("cancels"));
    for c in cancels {
        c.await?;
    }
    sampler.abort();
    let mut sent = sent.lock().expect("sent");
    sent.send_lag = send_lag;
    sent.offered_per_sec = n as f64 / sending.as_secs_f64().max(f64::EPSILON);
    sent.terminal_at_end = terminal_at_end;
    sent.elapsed = elapsed;
    Ok(std::mem::take(&mut *sent))
}

/// How many of `ids` are CONFIRMED or CANCELLED now.
async fn terminal(orders_db: &str, ids: &[Uuid]) -> anyhow::Result<usize> {
    let mut db = PgConnection::connect(orders_db).await?;
    let n: i64 =
        sqlx::query_scalar("SELECT count(*) FROM orders WHERE id = ANY($1) AND status IN ('CONFIRMED', 'CANCELLED')")
            .bind(ids)
            .fetch_one(&mut db)
            .await?;
    db.close().await?;
    Ok(usize::try_from(n).unwrap_or(0))
}

/// Orders not yet CONFIRMED or CANCELLED: the open ones and those in
/// manual review, counted through the status index (the bench asks ten
/// times a second; a scan of every order placed would be the bench's own
/// cost on the database it measures, growing with each trial).
pub async fn backlog(db: &mut PgConnection) -> anyhow::Result<i64> {
    let waiting: Vec<&str> = order_api::orders::Status::OPEN
        .iter()
        .chain([&order_api::orders::Status::ManualReview])
        .map(|s| s.as_str())
        .collect();
    Ok(sqlx::query_scalar("SELECT count(*) FROM orders WHERE status = ANY($1)")
        .bind(&waiting)
        .fetch_one(db)
        .await?)
}

/// Waits until the backlog is empty; how long it took, or `None` after `timeout`.
pub async fn wait_drained(orders_db: &str, timeout: Duration) -> anyhow::Result<Option<Duration>> {
    let mut db = PgConnection::connect(orders_db).await?;
    let start = Instant::now();
    while start.elapsed() < timeout {
        if backlog(&mut db).await? == 0 {
            return Ok(Some(start.elapsed()));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(None)
}

/// How long the saga runs before the first trial ([`warm_up`]).
pub const WARM_UP: Duration = Duration::from_secs(90);

/// Runs the saga at `rate` for [`WARM_UP`] and waits for it to drain, before
/// anything is measured. Without it the first trials measured a JVM still
/// compiling: the broker's C2 compiler thread, not its request handlers,
/// took most of its CPU (measured: docs/results/code-decisions.md). A deployed broker
/// has long been warm; the ceilings' short runs do not warm the saga's paths
/// (consumer groups, offset commits, six topics).
pub async fn warm_up(load: &Load, orders_db: &str, rate: f64) -> anyhow::Result<()> {
    eprintln!("bench: warm-up at {rate:.0} orders/s for {WARM_UP:?}");
    open_loop(load, orders_db, rate, WARM_UP).await?;
    if wait_drained(orders_db, Duration::from_secs(120)).await?.is_none() {
        eprintln!("bench: the warm-up's backlog did not drain in 120 s: the first trial starts behind");
    }
    Ok(())
}

/// Placed → terminal latencies (milliseconds, sorted) of `sent`'s orders
/// that are terminal, measured from their intended send time to the
/// order's last transition; and the time the last one finished.
pub async fn latencies(orders_db: &str, sent: &Sent) -> anyhow::Result<(Vec<f64>, Option<SystemTime>)> {
    let mut db = PgConnection::connect(orders_db).await?;
    let ids = sent.uncancelled();
    let rows: Vec<(Uuid, chrono::DateTime<chrono::Utc>)> =
        sqlx::query_as("SELECT id, updated_at FROM orders WHERE id = ANY($1) AND status IN ('CONFIRMED', 'CANCELLED')")
            .bind(&ids)
            .fetch_all(&mut db)
            .await?;
    let mut out = Vec::with_capacity(rows.len());
    let mut last: Option<SystemTime> = None;
    for (id, at) in rows {
        let done: SystemTime = at.into();
        last = Some(last.map_or(done, |l| l.max(done)));
        let ms = done
            .duration_since(sent.intended[&id])
            .map_or(0.0, |d| d.as_secs_f64() * 1000.0);
        out.push(ms);
    }
    out.sort_by(f64::total_cmp);
    Ok((out, last))
}

/// Percentiles of a set of latencies, ms.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Percentiles {
    /// Orders measured.
    pub orders: usize,
    /// Median.
    pub p50_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// 99.9th percentile.
    pub p999_ms: f64,
    /// The slowest.
    pub max_ms: f64,
}

impl Percentiles {
    /// Of `sorted` (ascending).
    pub fn of(sorted: &[f64]) -> Self {
        Self {
            orders: sorted.len(),
            p50_ms: super::pct(sorted, 0.50),
            p99_ms: super::pct(sorted, 0.99),
            p999_ms: super::pct(sorted, 0.999),
            max_ms: sorted.last().copied().unwrap_or(0.0),
        }
    }
}

/// Latency at a fixed rate.
#[derive(Debug, Clone, Serialize)]
pub struct Latency {
    /// Arrival rate.
    pub rate: f64,
    /// Placed → terminal from the intended send time, of the orders not
    /// cancelled by the driver.
    pub placed_to_terminal: Percentiles,
    /// Requests that did not get a 201.
    pub failed: usize,
    /// The same orders' time, stage by stage.
    pub stages: Vec<Stage>,
}

/// Placed → terminal latency of orders sent at `rate` for `window`, and its stages.
pub async fn latency(load: &Load, orders_db: &str, rate: f64, window: Duration) -> anyhow::Result<Latency> {
    eprintln!("bench: latency at {rate:.0} orders/s for {window:?}");
    let sent = open_loop(load, orders_db, rate, window).await?;
    wait_drained(orders_db, Duration::from_secs(120)).await?;
    let (lat, _) = latencies(orders_db, &sent).await?;
    Ok(Latency {
        rate,
        placed_to_terminal: Percentiles::of(&lat),
        failed: sent.failed,
        stages: stages(orders_db, &sent).await?,
    })
}

/// Where an order's placed → terminal time went, in three stages cut at
/// its history entries (each stamped with its transaction's start):
/// intended send → placed (the driver and `POST /orders`), placed → stock
/// reserved (relay, inventory, relay, saga), reserved → terminal (relay,
/// payment and the gateway, relay, saga). Terminal orders that were
/// reserved only; each stage's p50 and p99, ms.
#[derive(Debug, Clone, Serialize)]
pub struct Stage {
    /// The stage, as "from → to".
    pub name: &'static str,
    /// Median, ms.
    pub p50_ms: f64,
    /// 99th percentile, ms.
    pub p99_ms: f64,
}

/// The [`Stage`]s of the orders of `sent` that ended.
pub async fn stages(orders_db: &str, sent: &Sent) -> anyhow::Result<Vec<Stage>> {
    type At = chrono::DateTime<chrono::Utc>;
    let mut db = PgConnection::connect(orders_db).await?;
    let ids = sent.uncancelled();
    let rows: Vec<(Uuid, At, At, At)> = sqlx::query_as(
        "SELECT o.id, p.at, r.at, o.updated_at
         FROM orders o
         JOIN order_history p ON p.order_id = o.id AND p.cause = 'OrderPlaced'
         JOIN order_history r ON r.order_id = o.id AND r.applied AND r.to_status = 'AWAITING_PAYMENT'
         WHERE o.id = ANY($1) AND o.status IN ('CONFIRMED', 'CANCELLED')",
    )
    .bind(&ids)
    .fetch_all(&mut db)
    .await?;
    let ms = |from: SystemTime, to: SystemTime| to.duration_since(from).map_or(0.0, |d| d.as_secs_f64() * 1000.0);
    let mut columns: [Vec<f64>; 3] = Default::default();
    for (id, placed, reserved, terminal) in rows {
        let (placed, reserved, terminal) = (placed.into(), reserved.into(), terminal.into());
        columns[0].push(ms(sent.intended[&id], placed));
        columns[1].push(ms(placed, reserved));
        columns[2].push(ms(reserved, terminal));
    }
    let names = ["send → placed", "placed → reserved", "reserved → terminal"];
    Ok(names
        .into_iter()
        .zip(columns)
        .map(|(name, mut column)| {
            column.sort_by(f64::total_cmp);
            Stage {
                name,
                p50_ms: super::pct(&column, 0.50),
                p99_ms: super::pct(&column, 0.99),
            }
        })
        .collect())
}

/// The HTTP API alone: `clients` closed-loop clients posting orders with
/// fresh keys for `duration`.
#[derive(Debug, Clone, Serialize)]
pub struct HttpFigures {
    /// Concurrent clients.
    pub clients: usize,
    /// 201s.
    pub requests: usize,
    /// 201s per second.
    pub requests_per_sec: f64,
    /// Latency percentiles, milliseconds.
    pub p50_ms: f64,
    /// 99th percentile, milliseconds.
    pub p99_ms: f64,
    /// Requests that did not get a 201.
    pub failed: usize,
}

/// Closed-loop `POST /orders` at full speed.
pub async fn post_max(load: &Load, clients: usize, duration: Duration) -> anyhow::Result<HttpFigures> {
    let end = Instant::now() + duration;
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..clients {
        let load = load.clone();
        tasks.spawn(async move {
            let (mut ok, mut failed) = (Vec::new(), 0usize);
            while Instant::now() < end {
                let (client, order, _) = load.order(c);
                let t = Instant::now();
                match client.post_order(&Uuid::new_v4().to_string(), &order).await {
                    Ok(r) if r.status == 201 => ok.push(t.elapsed().as_secs_f64() * 1000.0),
                    _ => failed += 1,
                }
            }
            (ok, failed)
        });
    }
    let (mut lat, mut failed) = (Vec::new(), 0);
    while let Some(r) = tasks.join_next().await {
        let (ok, f) = r?;
        lat.extend(ok);
        failed += f;
    }
    let secs = started.elapsed().as_secs_f64();
    lat.sort_by(f64::total_cmp);
    Ok(HttpFigures {
        clients,
        requests: lat.len(),
        requests_per_sec: lat.len() as f64 / secs,
        p50_ms: super::pct(&lat, 0.50),
        p99_ms: super::pct(&lat, 0.99),
        failed,
    })
}
