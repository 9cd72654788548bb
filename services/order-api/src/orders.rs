//! The order aggregate and its queries. Writers take `&mut PgConnection` so
//! the caller's transaction also covers the outbox row and idempotency key.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::{FromRow, PgConnection};
use uuid::Uuid;

/// Saga state of an order.
///
/// Stored as text (`PENDING`, `AWAITING_PAYMENT`, …); the transitions
/// between these states live in `saga::transitions`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, sqlx::Type, utoipa::ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
#[sqlx(type_name = "text", rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Status {
    /// Placed; stock being reserved.
    Pending,
    /// Stock reserved; payment being charged.
    AwaitingPayment,
    /// Paid. Terminal unless cancelled.
    Confirmed,
    /// Cancel of a confirmed order: refund in progress.
    Refunding,
    /// Stock being released after a decline or refund.
    Cancelling,
    /// Terminal: nothing charged (net), nothing reserved.
    Cancelled,
    /// Terminal until a person acts: a refund the gateway refused, or a
    /// state that stayed overdue after every re-send. `order-api review`
    /// lists them; `order-api review retry-refund ID` tries the refund again.
    ManualReview,
}

impl Status {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pending => "PENDING",
            Status::AwaitingPayment => "AWAITING_PAYMENT",
            Status::Confirmed => "CONFIRMED",
            Status::Refunding => "REFUNDING",
            Status::Cancelling => "CANCELLING",
            Status::Cancelled => "CANCELLED",
            Status::ManualReview => "MANUAL_REVIEW",
        }
    }

    /// The states a participant's reply moves on, each with a deadline.
    pub const OPEN: [Status; 4] = [
        Status::Pending,
        Status::AwaitingPayment,
        Status::Refunding,
        Status::Cancelling,
    ];
}

/// An order as stored.
#[derive(Debug, Clone, Serialize, FromRow, utoipa::ToSchema)]
pub struct Order {
    /// Order id (also the saga's correlation id and Kafka key).
    pub id: Uuid,
    /// The client that placed it (its API key's client).
    pub client_id: String,
    /// Stock keeping unit.
    pub sku: String,
    /// Units.
    pub quantity: i32,
    /// Total in cents.
    pub amount_cents: i64,
    /// The gateway's token of the card (the number is never stored).
    #[serde(skip)]
    #[schema(ignore)]
    pub card_token: Option<String>,
    /// The card number's last four digits.
    pub card_last4: Option<String>,
    /// Saga state.
    pub status: Status,
    /// Why it was cancelled, when it was.
    pub cancel_reason: Option<String>,
    /// Creation time.
    pub created_at: DateTime<Utc>,
    /// Last transition time.
    pub updated_at: DateTime<Utc>,
    /// The command the current state waits on (re-sent under this event id
    /// when the state is overdue).
    #[serde(skip)]
    #[schema(ignore)]
    pub last_command_id: Option<Uuid>,
    /// Re-sends of that command since the last transition.
    #[serde(skip)]
    #[schema(ignore)]
    pub reconcile_attempts: i32,
    /// The current refund attempt (1, or more after an operator's retry).
    #[serde(skip)]
    #[schema(ignore)]
    pub refund_attempt: i32,
    /// When the gateway's answer was taken without the participant's reply.
    pub reconciled_at: Option<DateTime<Utc>>,
}

/// One saga step as shown by `GET /orders/{id}`.
#[derive(Debug, Clone, Serialize, FromRow, utoipa::ToSchema)]
pub struct HistoryEntry {
    /// Status before.
    pub from_status: Option<Status>,
    /// Status after (equal to before when ignored).
    pub to_status: Status,
    /// Event type or HTTP action that caused it.
    pub cause: String,
    /// Causing event, if any.
    pub event_id: Option<Uuid>,
    /// False for an illegal or stale transition that was ignored.
    pub applied: bool,
    /// When.
    pub at: DateTime<Utc>,
}

/// Fields of a new order.
#[derive(Debug, Clone)]
pub struct NewOrder {
    /// Stock keeping unit.
    pub sku: String,
    /// Units.
    pub quantity: i32,
    /// Total in cents.
    pub amount_cents: i64,
    /// The gateway's token of the card.
    pub card_token: String,
    /// The card number's last four digits.
    pub card_last4: String,
}

const COLUMNS: &str = "id, client_id, sku, quantity, amount_cents, card_token, card_last4, status, cancel_reason, \
                       created_at, updated_at, last_command_id, reconcile_attempts, refund_attempt, reconciled_at";

/// Inserts a PENDING order and its first history entry.
pub async fn insert(conn: &mut PgConnection, client_id: &str, new: &NewOrder) -> sqlx::Result<Order> {
    insert_with(conn, Uuid::now_v7(), client_id, new, None).await
}

/// Inserts PENDING order `id`, waiting on `command`, and its first history
/// entry — in one statement: `POST /orders` makes one round trip fewer per
/// order than with an insert each (the history row's foreign key is checked
/// at the statement's end, when the order row is there).
pub async fn insert_with(
    conn: &mut PgConnection,
    id: Uuid,
    client_id: &str,
    new: &NewOrder,
    command: Option<Uuid>,
) -> sqlx::Result<Order> {
    sqlx::query_as(&format!(
        "WITH o AS (
             INSERT INTO orders (id, client_id, sku, quantity, amount_cents, card_token, card_last4, status, last_command_id)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) RETURNING {COLUMNS}),
         h AS (
             INSERT INTO order_history (order_id, from_status, to_status, cause, event_id, applied)
             SELECT id, NULL, status, 'OrderPlaced', NULL, true FROM o)
         SELECT {COLUMNS} FROM o"
    ))
    .bind(id)
    .bind(client_id)
    .bind(&new.sku)
    .bind(new.quantity)
    .bind(new.amount_cents)
    .bind(&new.card_token)
    .bind(&new.card_last4)
    .bind(Status::Pending)
    .bind(command)
    .fetch_one(conn)
    .await
}

/// A new order as [`insert_with`] would store it, not yet stored: its ids
/// and timestamps minted here (to the microsecond PostgreSQL keeps), so
/// that its answer can be written in the statement that stores it
/// ([`PLACE_CTES`]).
pub fn unsaved(id: Uuid, client_id: &str, new: &NewOrder, command: Uuid) -> Order {
    use chrono::SubsecRound as _;
    let now = Utc::now().trunc_subsecs(6);
    Order {
        id,
        client_id: client_id.to_owned(),
        sku: new.sku.clone(),
        quantity: new.quantity,
        amount_cents: new.amount_cents,
        card_token: Some(new.card_token.clone()),
        card_last4: Some(new.card_last4.clone()),
        status: Status::Pending,
        cancel_reason: None,
        created_at: now,
        updated_at: now,
        last_command_id: Some(command),
        reconcile_attempts: 0,
        refund_attempt: 0,
        reconciled_at: None,
    }
}

/// The order placed, as common table expressions after the key's `k`
/// (`idempotency::at_once::KEY_CTE`): the order `o` — only when `k` has a
/// row — its first history row, and the command it waits on in the outbox
/// `c`. Parameters from `$8` ([`bind_place`]).
pub static PLACE_CTES: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "o AS (
             INSERT INTO orders (id, client_id, sku, quantity, amount_cents, card_token, card_last4, status,
                                 last_command_id, created_at, updated_at)
             SELECT $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $17 FROM k RETURNING id),
         h AS (
             INSERT INTO order_history (order_id, from_status, to_status, cause, event_id, applied, at)
             SELECT id, NULL, $15, 'OrderPlaced', NULL, true, $17 FROM o),
         {}",
        outbox::enqueue_cte("c", "o", 18)
    )
});
const _: () = assert!(
    idempotency::at_once::FIRST_WORK_PARAMETER == 8,
    "PLACE_CTES begins at $8"
);

/// Binds [`PLACE_CTES`]'s parameters: `order` (from [`unsaved`]) and its
/// first command.
pub fn bind_place<'q>(
    statement: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    order: &'q Order,
    command: &'q outbox::OutboxEvent<'_>,
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    let statement = statement
        .bind(order.id)
        .bind(&order.client_id)
        .bind(&order.sku)
        .bind(order.quantity)
        .bind(order.amount_cents)
        .bind(&order.card_token)
        .bind(&order.card_last4)
        .bind(order.status)
        .bind(order.last_command_id)
        .bind(order.created_at);
    outbox::bind(statement, command)
}

/// Loads an order.
pub async fn get(conn: &mut PgConnection, id: Uuid) -> sqlx::Result<Option<Order>> {
    sqlx::query_as(&format!("SELECT {COLUMNS} FROM orders WHERE id = $1"))
        .bind(id)
        .fetch_optional(conn)
        .await
}

/// Loads an order and locks it for a transition.
pub async fn lock(conn: &mut PgConnection, id: Uuid) -> sqlx::Result<Option<Order>> {
    sqlx::query_as(&format!("SELECT {COLUMNS} FROM orders WHERE id = $1 FOR UPDATE"))
        .bind(id)
        .fetch_optional(conn)
        .await
}

/// Loads orders `ids` (those that exist) and locks them for their
/// transitions, in id order — two batches sharing orders lock them in the
/// same order.
pub async fn lock_all(conn: &mut PgConnection, ids: &[Uuid]) -> sqlx::Result<Vec<Order>> {
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM orders WHERE id = ANY($1) ORDER BY id FOR UPDATE"
    ))
    .bind(ids)
    .fetch_all(conn)
    .await
}

/// An order's move to a new status: the status, the cancel reason when
/// given, and the command the new state waits on.
#[derive(Debug, Clone, PartialEq)]
pub struct Transition {
    /// The order.
    pub id: Uuid,
    /// Its new status.
    pub status: Status,
    /// Why it is cancelled (kept when `None`).
    pub cancel_reason: Option<&'static str>,
    /// The command the new state waits on.
    pub command: Option<Uuid>,
}

/// A saga batch's writes in one statement: its moves — each order's
/// status (and cancel reason, when given), the command its new state waits
/// on, its deadline restarted — its history entries (applied and ignored
/// ones), the confirmation notices of the orders it confirmed
/// (`crate::notices`), and its commands' outbox rows (`outbox::enqueue_all_cte`).
/// At most one move per order.
pub async fn write_batch(
    conn: &mut PgConnection,
    moves: &[Transition],
    history: &[NewHistory],
    commands: &[outbox::OutboxEvent<'_>],
) -> sqlx::Result<()> {
    if moves.is_empty() && history.is_empty() && commands.is_empty() {
        return Ok(());
    }
    static SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        format!(
            "WITH moved AS (
                 UPDATE orders o SET status = v.status, cancel_reason = COALESCE(v.cancel_reason, o.cancel_reason),
                                     last_command_id = v.command, reconcile_attempts = 0, updated_at = now()
                 FROM unnest($1::uuid[], $2::text[], $3::text[], $4::uuid[]) AS v(id, status, cancel_reason, command)
                 WHERE o.id = v.id),
             history AS (
                 INSERT INTO order_history (order_id, from_status, to_status, cause, event_id, applied)
                 SELECT o, f, t, c, e, a
                 FROM unnest($5::uuid[], $6::text[], $7::text[], $8::text[], $9::uuid[], $10::bool[])
                      WITH ORDINALITY AS r(o, f, t, c, e, a, n)
                 ORDER BY n),
             notices AS (
                 INSERT INTO notices (order_id, status)
                 SELECT v.id, 'PENDING' FROM unnest($1::uuid[], $2::text[]) AS v(id, status)
                 WHERE v.status = 'CONFIRMED'
                 ON CONFLICT (order_id) DO NOTHING),
             {}
             SELECT 1",
            outbox::enqueue_all_cte("commands", 11)
        )
    });
    let statement = sqlx::query(&SQL)
        .bind(moves.iter().map(|m| m.id).collect::<Vec<_>>())
        .bind(moves.iter().map(|m| m.status.as_str()).collect::<Vec<_>>())
        .bind(moves.iter().map(|m| m.cancel_reason).collect::<Vec<_>>())
        .bind(moves.iter().map(|m| m.command).collect::<Vec<_>>())
        .bind(history.iter().map(|e| e.order_id).collect::<Vec<_>>())
        .bind(history.iter().map(|e| e.from.map(Status::as_str)).collect::<Vec<_>>())
        .bind(history.iter().map(|e| e.to.as_str()).collect::<Vec<_>>())
        .bind(history.iter().map(|e| e.cause.as_str()).collect::<Vec<_>>())
        .bind(history.iter().map(|e| e.event_id).collect::<Vec<_>>())
        .bind(history.iter().map(|e| e.applied).collect::<Vec<_>>());
    outbox::bind_all(statement, commands).execute(conn).await?;
    Ok(())
}

/// Notes that the gateway's answer was taken for participants' replies.
pub async fn mark_reconciled(conn: &mut PgConnection, ids: &[Uuid]) -> sqlx::Result<()> {
    if ids.is_empty() {
        return Ok(());
    }
    sqlx::query("UPDATE orders SET reconciled_at = now() WHERE id = ANY($1)")
        .bind(ids)
        .execute(conn)
        .await?;
    Ok(())
}

/// One entry of an order's history: a transition applied, or one ignored
/// (`applied` false, `from` = `to`).
#[derive(Debug, Clone, PartialEq)]
pub struct NewHistory {
    /// The order.
    pub order_id: Uuid,
    /// Status before (none for the order's creation).
    pub from: Option<Status>,
    /// Status after.
    pub to: Status,
    /// The event type or HTTP action.
    pub cause: String,
    /// The event that caused it, when one did.
    pub event_id: Option<Uuid>,
    /// Whether the transition was applied.
    pub applied: bool,
}

/// Appends a history entry.
pub async fn record_history(
    conn: &mut PgConnection,
    id: Uuid,
    from: Option<Status>,
    to: Status,
    cause: &str,
    event_id: Option<Uuid>,
    applied: bool,
) -> sqlx::Result<()> {
    let entry = NewHistory {
        order_id: id,
        from,
        to,
        cause: cause.into(),
        event_id,
        applied,
    };
    record_histories(conn, std::slice::from_ref(&entry)).await
}

/// Appends history entries in one statement, in the order given.
pub async fn record_histories(conn: &mut PgConnection, entries: &[NewHistory]) -> sqlx::Result<()> {
    write_batch(conn, &[], entries, &[]).await
}

/// The order's history, oldest first.
pub async fn history(conn: &mut PgConnection, id: Uuid) -> sqlx::Result<Vec<HistoryEntry>> {
    sqlx::query_as(
        "SELECT from_status, to_status, cause, event_id, applied, at
         FROM order_history WHERE order_id = $1 ORDER BY id",
    )
    .bind(id)
    .fetch_all(conn)
    .await
}

/// Deletes up to `batch` history rows of finished orders (CONFIRMED or
/// CANCELLED) older than `retention`; returns how many.
pub async fn purge_history(conn: &mut PgConnection, retention: std::time::Duration, batch: i64) -> sqlx::Result<u64> {
    Ok(sqlx::query(
        "DELETE FROM order_history WHERE id IN (
             SELECT h.id FROM order_history h JOIN orders o ON o.id = h.order_id
             WHERE h.at < now() - make_interval(secs => $1)
               AND o.status IN ('CONFIRMED', 'CANCELLED')
             LIMIT $2)",
    )
    .bind(retention.as_secs_f64())
    .bind(batch)
    .execute(conn)
    .await?
    .rows_affected())
}

/// Tokenises the card numbers of orders written before orders kept tokens
/// (the `card` column), a batch at a time, and clears the numbers. A value
/// the vault refuses (not a card number) is parked — `card_parked` says
/// why, the value itself is cleared too (whatever it is, it is not kept in
/// clear), and `order-api review` lists the order ([`parked_cards`]) — and
/// the rows after it go on; an unavailable vault ends the pass
/// (retried later). Returns (converted, parked).
pub async fn tokenise_legacy_cards(
    pool: &sqlx::PgPool,
    gateway: &crate::gateway::Client,
) -> anyhow::Result<(u64, u64)> {
    let (mut done, mut parked) = (0, 0);
    loop {
        let rows: Vec<(Uuid, String)> = sqlx::query_as(
            "SELECT id, card FROM orders WHERE card IS NOT NULL AND card_parked IS NULL ORDER BY id LIMIT 100",
        )
        .fetch_all(pool)
        .await?;
        if rows.is_empty() {
            return Ok((done, parked));
        }
        for (id, card) in rows {
            match gateway.tokenise(&card).await {
                Ok(token) => {
                    sqlx::query("UPDATE orders SET card_token = $2, card_last4 = $3, card = NULL WHERE id = $1")
                        .bind(id)
                        .bind(&token.token)
                        .bind(&token.last4)
                        .execute(pool)
                        .await?;
                    done += 1;
                }
                Err(crate::gateway::Error::Refused(why)) => {
                    // The value is not a card number (the vault says so);
                    // never logged, only the order and the vault's reason.
                    tracing::warn!(order_id = %id, reason = %why, "legacy card refused by the vault; row parked");
                    sqlx::query("UPDATE orders SET card_parked = $2, card = NULL WHERE id = $1")
                        .bind(id)
                        .bind(format!("refused by the vault: {why}"))
                        .execute(pool)
                        .await?;
                    parked += 1;
                }
                Err(unavailable) => return Err(unavailable.into()),
            }
        }
    }
}

/// The orders whose legacy card the vault refused (parked, the value
/// cleared): (order, why, when), for `order-api review`. A person asks the
/// client for a card; nothing else can be done with the order's payment.
pub async fn parked_cards(pool: &sqlx::PgPool) -> sqlx::Result<Vec<(Uuid, String, chrono::DateTime<chrono::Utc>)>> {
    sqlx::query_as("SELECT id, card_parked, updated_at FROM orders WHERE card_parked IS NOT NULL ORDER BY id")
        .fetch_all(pool)
        .await
}

/// Runs [`tokenise_legacy_cards`] until it succeeds (every 5 s while the
/// gateway is unavailable), then ends: a one-shot job
/// (`service_kit::supervisor::Supervisor::spawn_once`).
pub async fn run_legacy_card_backfill(
    pool: sqlx::PgPool,
    gateway: crate::gateway::Client,
    shutdown: tokio_util::sync::CancellationToken,
) {
    loop {
        match tokenise_legacy_cards(&pool, &gateway).await {
            Ok((n, parked)) => {
                if n > 0 || parked > 0 {
                    tracing::info!(rows = n, parked, "card numbers of earlier orders replaced by tokens");
                }
                return;
            }
            Err(e) => tracing::warn!(error = %e, "card backfill failed; retrying"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(std::time::Duration::from_secs(5)) => {}
        }
    }
}
