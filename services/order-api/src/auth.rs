//! Who is calling, and how much: API keys and per-client limits.
//!
//! Every `/orders` request carries `Authorization: Bearer <key>`. The key's
//! SHA-256 is looked up in `api_keys` (cached for `API_KEY_CACHE_SECS`, so a
//! revoked key stops working within that time); the client it belongs to
//! becomes the request's [`idempotency::Scope`] — the Idempotency-Key's
//! scope and the owner of the orders it creates. `X-Client-Id` is ignored.
//! Then the client's limits: a body larger than `API_MAX_BODY_BYTES` is a
//! 413, more than `API_RATE_LIMIT_PER_SEC` requests per second (bursts up
//! to `API_RATE_BURST`) a 429 with `Retry-After`. The limits are per
//! instance of order-api.
//!
//! Before a key is looked up, two guards keep a flood of bad keys off the
//! database: a key found unknown is remembered as unknown (a negative cache,
//! for `API_KEY_CACHE_SECS`) and answered 401 without a query, and each
//! remote address may cause at most `API_KEY_LOOKUPS_PER_SEC` lookups of
//! keys not in either cache (bursts up to 4× that); past it, a 429 without
//! a query. A known key never waits on either. Concurrent requests with the
//! same uncached key share one lookup: after a restart, hundreds of a
//! client's requests in flight cost one query and one unit of the
//! address's allowance, not hundreds. A lookup that fails (the database
//! unreachable, its connections dropped) is a 503 with `Retry-After`, not a
//! 401 — the key may be good — and is remembered for [`FAILED_LOOKUP_TTL`]:
//! the requests queued behind it, and those that follow, are answered 503
//! without a query of their own, so an outage neither hammers the database
//! nor spends the address's allowance (which would turn a good client's
//! retries into 429s).

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest as _, Sha256};
use sqlx::PgPool;

/// How long a failed lookup of a key answers for it: the requests with that
/// key get a 503 without a query until then.
pub const FAILED_LOOKUP_TTL: Duration = Duration::from_secs(1);

/// Authentication and limits, from the environment.
#[derive(Debug, Clone, clap::Args)]
pub struct AuthArgs {
    /// Requests per second one client may make (per order-api instance).
    #[arg(long, env = "API_RATE_LIMIT_PER_SEC", default_value_t = 2_000.0)]
    pub rate_per_sec: f64,
    /// Requests one client may make at once above that rate.
    #[arg(long, env = "API_RATE_BURST", default_value_t = 4_000.0)]
    pub burst: f64,
    /// Largest request body accepted, in bytes.
    #[arg(long, env = "API_MAX_BODY_BYTES", default_value_t = 16 * 1024)]
    pub max_body_bytes: usize,
    /// Seconds a looked-up key is trusted before it is looked up again (a
    /// revoked key works at most this long).
    #[arg(long, env = "API_KEY_CACHE_SECS", default_value_t = 30)]
    pub key_cache_secs: u64,
    /// Database lookups of uncached keys one remote address may cause per
    /// second (bursts up to 4×); past it, 429 without a lookup.
    #[arg(long, env = "API_KEY_LOOKUPS_PER_SEC", default_value_t = 20.0)]
    pub lookups_per_sec: f64,
    /// New cards (not yet tokenised by this process) one client may send
    /// to the vault per minute (bursts up to `API_NEW_CARDS_BURST`); past
    /// it, 429. The gateway limits order-api as one caller: this keeps one
    /// client, card testing, from spending every client's share.
    #[arg(long, env = "API_NEW_CARDS_PER_MIN", default_value_t = 600.0)]
    pub new_cards_per_min: f64,
    /// New cards one client may send at once above that rate.
    #[arg(long, env = "API_NEW_CARDS_BURST", default_value_t = 100.0)]
    pub new_cards_burst: f64,
    /// A client whose payments were declined this many times in the last
    /// hour may send no new card (429) until the hour rolls on: card
    /// testing shows as declines. 0: no limit.
    #[arg(long, env = "API_DECLINES_PER_HOUR", default_value_t = 100)]
    pub declines_per_hour: u32,
}

impl Default for AuthArgs {
    fn default() -> Self {
        Self {
            rate_per_sec: 2_000.0,
            burst: 4_000.0,
            max_body_bytes: 16 * 1024,
            key_cache_secs: 30,
            lookups_per_sec: 20.0,
            new_cards_per_min: 600.0,
            new_cards_burst: 100.0,
            declines_per_hour: 100,
        }
    }
}

/// A token bucket per key (governor's GCRA): a rate and a burst above it.
type Limiter<K> =
    governor::RateLimiter<K, governor::state::keyed::DefaultKeyedStateStore<K>, governor::clock::DefaultClock>;

/// Keys of one kind remembered before the least recently used go.
const REMEMBERED: u64 = 100_000;

/// How long a key a lookup found live keeps its refreshes outside the
/// per-address allowance (after that, one lookup like any key's).
const KNOWN_GOOD_FOR: Duration = Duration::from_secs(24 * 3600);

/// The authentication state shared by every request.
pub struct Auth {
    pool: PgPool,
    args: AuthArgs,
    /// key hash → its client, or `None` when found unknown; for
    /// `API_KEY_CACHE_SECS`. Concurrent lookups of one key are one lookup
    /// (moka's `try_get_with`): whoever waited gets its answer.
    keys: moka::future::Cache<String, Option<String>>,
    /// key hash → its lookup failed (the database, not the key), for
    /// [`FAILED_LOOKUP_TTL`].
    failed: moka::sync::Cache<String, ()>,
    /// Hashes of keys a lookup found live within [`KNOWN_GOOD_FOR`]: their
    /// refresh (once `keys` forgets them) is not a guess, so it does not
    /// spend the address's lookups — a flood of bad keys from a shared
    /// address (a proxy) cannot 429 a good client whose key needs its
    /// refresh. A revoked key found so is forgotten here too.
    known_good: moka::sync::Cache<String, ()>,
    /// Requests per client.
    requests: Limiter<String>,
    /// Key lookups per remote address.
    lookups: Limiter<std::net::IpAddr>,
    /// New cards sent to the vault per client.
    new_cards: Limiter<String>,
    /// Database lookups made (tests and benches read it).
    lookups_made: std::sync::atomic::AtomicU64,
    /// Refusals written to the audit trail, once per (actor, reason) a minute.
    pub refusals: crate::audit::Refusals,
}

/// A limiter of `rate` per second per key, bursting to `burst`.
fn limiter<K: std::hash::Hash + Eq + Clone>(rate: f64, burst: f64) -> Limiter<K> {
    let period = Duration::from_secs_f64(1.0 / rate.max(1e-3));
    let burst = std::num::NonZeroU32::new(burst.clamp(1.0, f64::from(u32::MAX)) as u32).expect("at least 1");
    let quota = governor::Quota::with_period(period)
        .expect("a positive period")
        .allow_burst(burst);
    governor::RateLimiter::keyed(quota)
}

mod keys;
mod refusal;
pub use keys::{create_key, create_key_expiring, list_keys, revoke_key, Key};
pub use refusal::Refusal;

impl Auth {
    /// Spends one of `client`'s new cards, or refuses (counted in
    /// `api_refusals_total{reason="new_cards"}`).
    pub fn allow_new_card(&self, client: &str) -> Result<(), Refusal> {
        if self.new_cards.check_key(&client.to_owned()).is_ok() {
            return Ok(());
        }
        telemetry::metrics::incr("api_refusals_total", &[("reason", "new_cards")]);
        self.refusals.refused(client, "new_cards", None);
        Err(Refusal::TooManyNewCards(self.args.new_cards_per_min))
    }

    /// Whether `client` may send a new card, by its declined payments of
    /// the last hour (`API_DECLINES_PER_HOUR`); refused, counted in
    /// `api_refusals_total{reason="declines"}`.
    pub async fn allow_declines(
        &self,
        conn: &mut sqlx::PgConnection,
        client: &str,
    ) -> sqlx::Result<Result<(), Refusal>> {
        let limit = self.args.declines_per_hour;
        if limit == 0 {
            return Ok(Ok(()));
        }
        let declined: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM (
                 SELECT 1 FROM orders
                 WHERE client_id = $1 AND cancel_reason = 'payment_declined'
                   AND updated_at > now() - interval '1 hour'
                 LIMIT $2) d",
        )
        .bind(client)
        .bind(i64::from(limit))
        .fetch_one(conn)
        .await?;
        if declined < i64::from(limit) {
            return Ok(Ok(()));
        }
        telemetry::metrics::incr("api_refusals_total", &[("reason", "declines")]);
        self.refusals.refused(client, "declines", None);
        Ok(Err(Refusal::TooManyDeclines(limit)))
    }
}

/// SHA-256 of `key`, hex: what `api_keys` stores.
pub fn hash(key: &str) -> String {
    hex::encode(Sha256::digest(key.as_bytes()))
}

impl Auth {
    /// Authentication over `pool`'s `api_keys`.
    pub fn new(pool: PgPool, args: AuthArgs) -> Arc<Self> {
        let lookups = args.lookups_per_sec;
        Arc::new(Self {
            refusals: crate::audit::Refusals::new(pool.clone()),
            pool,
            keys: moka::future::Cache::builder()
                .max_capacity(REMEMBERED)
                .time_to_live(Duration::from_secs(args.key_cache_secs))
                .build(),
            failed: moka::sync::Cache::builder()
                .max_capacity(REMEMBERED)
                .time_to_live(FAILED_LOOKUP_TTL)
                .build(),
            known_good: moka::sync::Cache::builder()
                .max_capacity(REMEMBERED)
                .time_to_live(KNOWN_GOOD_FOR)
                .build(),
            requests: limiter(args.rate_per_sec, args.burst),
            lookups: limiter(lookups, (lookups * 4.0).max(1.0)),
            new_cards: limiter(args.new_cards_per_min / 60.0, args.new_cards_burst),
            args,
            lookups_made: Default::default(),
        })
    }

    /// How many keys this instance has looked up in the database.
    pub fn lookups_made(&self) -> u64 {
        self.lookups_made.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The client of the request's bearer key; `peer` is the remote
    /// address (None when the server does not know it, e.g. in-process).
    async fn client(&self, headers: &axum::http::HeaderMap, peer: Option<std::net::IpAddr>) -> Result<String, Refusal> {
        let key = service_kit::bearer::presented(headers).ok_or(Refusal::Unauthenticated(
            "an API key is required: Authorization: Bearer <key>",
        ))?;
        let digest = hash(key);
        if self.failed.contains_key(&digest) {
            telemetry::metrics::incr("api_key_lookups_avoided_total", &[("reason", "failed_recently")]);
            return Err(Refusal::Unavailable);
        }
        if let Some(known) = self.keys.get(&digest).await {
            return known_client(known, "known_unknown");
        }
        // One lookup per key at a time: who came meanwhile gets its answer.
        let answer = self
            .keys
            .try_get_with(digest.clone(), self.look_up(digest, peer))
            .await
            .map_err(|refusal| (*refusal).clone())?;
        answer.ok_or(Refusal::Unauthenticated("unknown or revoked API key"))
    }

    /// Looks the key with `digest` up in the database, if `peer` has
    /// lookups left: its client, or `None` when no live key has it.
    async fn look_up(&self, digest: String, peer: Option<std::net::IpAddr>) -> Result<Option<String>, Refusal> {
        let refresh = self.known_good.contains_key(&digest);
        if let (Some(peer), false) = (peer, refresh) {
            if self.lookups.check_key(&peer).is_err() {
                telemetry::metrics::incr("api_key_lookups_avoided_total", &[("reason", "address_limit")]);
                return Err(Refusal::TooManyLookups(self.args.lookups_per_sec));
            }
        }
        telemetry::metrics::incr("api_key_lookups_total", &[]);
        self.lookups_made.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // A key that opens nothing is written to the audit trail in the
        // lookup's own statement (a key answered from memory was written
        // when it was looked up).
        let client: Option<String> = sqlx::query_scalar(
            "WITH k AS (
                 SELECT client_id FROM api_keys
                 WHERE key_hash = $1 AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > now())),
             failed AS (
                 INSERT INTO audit_log (actor, action, subject, source, detail)
                 SELECT 'unknown', 'auth.failed', 'key sha256 ' || left($1, 12), $2,
                        'an API key unknown, revoked or expired'
                 WHERE NOT EXISTS (SELECT 1 FROM k))
             SELECT client_id FROM k",
        )
        .bind(&digest)
        .bind(peer.map(|p| p.to_string()))
        .fetch_optional(&self.pool)
        .await
        .map_err(|e| {
            tracing::error!(error = %e, "API key lookup failed");
            self.failed.insert(digest.clone(), ());
            Refusal::Unavailable
        })?;
        match client {
            Some(_) => self.known_good.insert(digest, ()),
            None if refresh => self.known_good.invalidate(&digest),
            None => {}
        }
        Ok(client)
    }

    /// Takes one request from `client`'s token bucket.
    fn admit(&self, client: &str) -> Result<(), Refusal> {
        if self.requests.len() > REMEMBERED as usize {
            self.requests.retain_recent();
            self.lookups.retain_recent();
        }
        self.requests
            .check_key(&client.to_owned())
            .map_err(|_| Refusal::TooMany(self.args.rate_per_sec))
    }
}

/// A key's remembered answer: its client, or 401 for a key with none (the
/// lookup avoided is counted under `avoided`).
fn known_client(answer: Option<String>, avoided: &'static str) -> Result<String, Refusal> {
    answer.ok_or_else(|| {
        telemetry::metrics::incr("api_key_lookups_avoided_total", &[("reason", avoided)]);
        Refusal::Unauthenticated("unknown or revoked API key")
    })
}

/// The middleware: authenticate, apply the client's limits, and hand the
/// handler the client as the request's [`idempotency::Scope`].
pub async fn middleware(State(auth): State<Arc<Auth>>, mut req: Request, next: Next) -> Response {
    let peer = req
        .extensions()
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|c| c.0.ip());
    let client = match auth.client(req.headers(), peer).await {
        Ok(c) => c,
        Err(refusal) => {
            let reason = match refusal {
                Refusal::TooManyLookups(_) => "lookup_limited",
                Refusal::Unavailable => "key_check_unavailable",
                _ => "unauthenticated",
            };
            telemetry::metrics::incr("api_refusals_total", &[("reason", reason)]);
            if reason == "lookup_limited" {
                auth.refusals.refused("unknown", reason, peer);
            }
            return refusal.into_response();
        }
    };
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > auth.args.max_body_bytes) {
        telemetry::metrics::incr("api_refusals_total", &[("reason", "too_large")]);
        return Refusal::TooLarge(auth.args.max_body_bytes).into_response();
    }
    if let Err(refusal) = auth.admit(&client) {
        telemetry::metrics::incr("api_refusals_total", &[("reason", "rate_limited")]);
        auth.refusals.refused(&client, "rate_limited", peer);
        return refusal.into_response();
    }
    // A body without a length (chunked) is cut at the limit as it is read.
    let max = auth.args.max_body_bytes;
    let (parts, body) = req.into_parts();
    let body = match axum::body::to_bytes(body, max).await {
        Ok(bytes) => bytes,
        Err(e) => {
            let refusal = body_refusal(e, max);
            let reason = if matches!(refusal, Refusal::TooLarge(_)) {
                "too_large"
            } else {
                "incomplete_body"
            };
            telemetry::metrics::incr("api_refusals_total", &[("reason", reason)]);
            return refusal.into_response();
        }
    };
    req = Request::from_parts(parts, axum::body::Body::from(body));
    req.extensions_mut().insert(idempotency::Scope(client));
    next.run(req).await
}

/// Why a body could not be read: over the limit (413, final), or broken off
/// or timed out on the way (408: a transient error — a careful client
/// retries it with its key, where a 413 would tell it to give up).
fn body_refusal(e: axum::Error, max: usize) -> Refusal {
    let inner = e.into_inner();
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(inner.as_ref());
    while let Some(e) = source {
        if e.is::<http_body_util::LengthLimitError>() {
            return Refusal::TooLarge(max);
        }
        source = e.source();
    }
    Refusal::Incomplete
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::{HeaderValue, StatusCode};

    /// Over the limit is a 413; a body that breaks off on the way is a 408,
    /// never "too large" (a careful client stops retrying on a 413).
    #[tokio::test]
    async fn a_body_over_the_limit_is_413_and_one_that_breaks_off_is_408() {
        let big = axum::body::Body::from(vec![b'x'; 100]);
        let e = axum::body::to_bytes(big, 10).await.unwrap_err();
        assert!(matches!(body_refusal(e, 10), Refusal::TooLarge(10)));
        let chunks: Vec<Result<&'static [u8], std::io::Error>> = vec![
            Ok(b"{\"sku\":"),
            Err(std::io::Error::new(std::io::ErrorKind::ConnectionReset, "client gone")),
        ];
        let broken = axum::body::Body::from_stream(futures::stream::iter(chunks));
        let e = axum::body::to_bytes(broken, 16_384).await.unwrap_err();
        let refusal = body_refusal(e, 16_384);
        assert!(matches!(refusal, Refusal::Incomplete), "{refusal:?}");
        assert_eq!(refusal.into_response().status(), StatusCode::REQUEST_TIMEOUT);
    }

    #[test]
    fn the_stored_hash_is_not_the_key() {
        let h = hash("eo_secret");
        assert_eq!(h.len(), 64);
        assert!(!h.contains("secret"));
        assert_eq!(h, hash("eo_secret"));
    }

    #[tokio::test]
    async fn a_bucket_admits_its_burst_then_refuses_until_it_refills() {
        let pool = sqlx::PgPool::connect_lazy("postgres://unused").unwrap();
        let auth = Auth::new(
            pool,
            AuthArgs {
                rate_per_sec: 10.0,
                burst: 3.0,
                ..AuthArgs::default()
            },
        );
        for _ in 0..3 {
            auth.admit("a").unwrap();
        }
        assert_eq!(auth.admit("a"), Err(Refusal::TooMany(10.0)));
        auth.admit("b").expect("another client has its own bucket");
        std::thread::sleep(Duration::from_millis(150));
        auth.admit("a").expect("refilled at 10/s");
    }

    /// Behind one proxy address, a flood of bad keys spends the address's
    /// lookups; a good client's key, forgotten by the cache meanwhile, is
    /// refreshed anyway (its refresh is not a guess) — and once revoked, it
    /// is a guess like any other. Removal tried: refreshes counted against
    /// the address (the first `known_good` check taken out): the good key
    /// gets the 429 and this fails.
    #[tokio::test]
    async fn a_flood_of_bad_keys_from_a_shared_address_never_429s_a_good_key() {
        let db = testkit::TempDb::new("eo_auth");
        let pool = crate::connect(db.url(), 2).await.unwrap();
        let auth = Auth::new(
            pool.clone(),
            AuthArgs {
                lookups_per_sec: 1.0,
                key_cache_secs: 1,
                ..AuthArgs::default()
            },
        );
        let (id, good) = create_key(&pool, "good").await.unwrap();
        let bearer = |key: &str| {
            let mut h = axum::http::HeaderMap::new();
            h.insert(
                header::AUTHORIZATION,
                HeaderValue::from_str(&format!("Bearer {key}")).unwrap(),
            );
            h
        };
        let proxy = Some(std::net::IpAddr::from([10, 0, 0, 1]));
        let mut guesses = 0;
        // Bad keys, each new, until the address has no lookup left.
        let mut exhaust = async |auth: &Auth| loop {
            guesses += 1;
            match auth.client(&bearer(&format!("eo_bad_{guesses}")), proxy).await {
                Err(Refusal::Unauthenticated(_)) => continue,
                Err(Refusal::TooManyLookups(_)) => break,
                other => panic!("a bad key: {other:?}"),
            }
        };
        assert_eq!(auth.client(&bearer(&good), proxy).await, Ok("good".to_owned()));
        for round in 0..3 {
            exhaust(&auth).await;
            // The good key's cached answer expires (1 s); the lookups the
            // address regained meanwhile are spent too; then the refresh.
            tokio::time::sleep(Duration::from_millis(1_100)).await;
            exhaust(&auth).await;
            assert_eq!(
                auth.client(&bearer(&good), proxy).await,
                Ok("good".to_owned()),
                "round {round}: the good key's refresh was refused"
            );
        }
        assert!(revoke_key(&pool, id).await.unwrap());
        tokio::time::sleep(Duration::from_millis(1_100)).await;
        assert_eq!(
            auth.client(&bearer(&good), proxy).await,
            Err(Refusal::Unauthenticated("unknown or revoked API key")),
            "revoked: its refresh finds nothing"
        );
        tokio::time::sleep(Duration::from_millis(1_100)).await;
        exhaust(&auth).await;
        assert_eq!(
            auth.client(&bearer(&good), proxy).await,
            Err(Refusal::TooManyLookups(1.0)),
            "a revoked key's lookup is a guess again"
        );
        pool.close().await;
    }

    /// As under the chaos run's dropped database connections: the lookup
    /// of a good client's key fails while hundreds of its requests wait on
    /// it. Each must get a 503 to retry — not a 401 (its key is fine), and
    /// not, after the address's allowance is spent on lookups of their own,
    /// a 429.
    #[tokio::test]
    async fn a_failed_lookup_answers_its_waiters_503_without_a_query_each() {
        // Nothing listens on port 9 of the loopback: every lookup fails.
        let pool = sqlx::postgres::PgPoolOptions::new()
            .acquire_timeout(Duration::from_millis(200))
            .connect_lazy("postgres://eo@127.0.0.1:9/none")
            .unwrap();
        let auth = Auth::new(
            pool,
            AuthArgs {
                lookups_per_sec: 1.0,
                ..AuthArgs::default()
            },
        );
        let mut headers = axum::http::HeaderMap::new();
        headers.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer eo_good_key"));
        let peer = Some(std::net::IpAddr::from([127, 0, 0, 1]));
        let answers = futures::future::join_all((0..200).map(|_| auth.client(&headers, peer))).await;
        assert!(
            answers.iter().all(|a| *a == Err(Refusal::Unavailable)),
            "{:?}",
            answers.iter().find(|a| **a != Err(Refusal::Unavailable))
        );
        assert_eq!(auth.lookups_made(), 1, "one lookup for 200 requests");
        assert_eq!(
            Refusal::Unavailable.into_response().status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        // The failure is not kept: a request after it looks the key up again.
        tokio::time::sleep(FAILED_LOOKUP_TTL).await;
        assert_eq!(auth.client(&headers, peer).await, Err(Refusal::Unavailable));
        assert_eq!(auth.lookups_made(), 2);
    }
}
