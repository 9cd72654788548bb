//! The inventory's consumer: reserve / release, each idempotent per order,
//! a partition's queued commands in one transaction (the HTTP endpoints are
//! in [`crate::http`]).

use contract::topics::consumers::INVENTORY;
use contract::{Envelope, Message};
use kafka::consumer::{HandleError, Handled, Traced};
use std::collections::{BTreeSet, HashMap};

use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

/// Handles one inventory command.
pub async fn handle(pool: &PgPool, envelope: Envelope) -> Result<Handled, HandleError> {
    saga_kit::consumer::handle_one(envelope, |one| handle_batch(pool, one)).await
}

/// A command this service understands.
enum Command<'a> {
    Reserve { sku: &'a str, quantity: i32 },
    Release,
}

/// Handles a partition's queued commands, in order, in one transaction and
/// a fixed handful of statements however many there are: one multi-row
/// inbox insert; the batch's reservations read locked; the commands
/// applied in order to those rows and the stock in memory (`decide`);
/// then the result written back — one update per SKU, one insert of the
/// new reservations, one update of the changed ones, one insert of every
/// reply into the outbox. All commit together or none does.
///
/// A hot SKU is updated once per batch, not once per order (per-order
/// updates left one dead row version per order on the same row, and each
/// next update walked them), and a batch of one SKU holds its row only from
/// that update to the commit (`take_one_sku`).
pub async fn handle_batch(pool: &PgPool, batch: Vec<Traced<Envelope>>) -> Result<Vec<Handled>, HandleError> {
    let envelopes: Vec<&Envelope> = batch.iter().map(|t| &t.message).collect();
    let messages = envelopes
        .iter()
        .map(|e| e.message())
        .collect::<Result<Vec<_>, _>>()
        .map_err(HandleError::permanent)?;
    let commands = messages
        .iter()
        .map(|m| match m {
            Message::ReserveStock { sku, quantity } => Ok(Command::Reserve {
                sku,
                quantity: *quantity,
            }),
            Message::ReleaseStock => Ok(Command::Release),
            other => Err(HandleError::permanent(format!(
                "unexpected message {other:?} on inventory.commands"
            ))),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let (mut tx, fresh) = saga_kit::consumer::begin(pool, INVENTORY.name, &batch).await?;
    if !fresh.is_empty() {
        move_stock(&mut tx, &batch, &commands, &fresh.indices())
            .await
            .map_err(saga_kit::consumer::classify)?;
    }
    saga_kit::consumer::commit(tx, &fresh).await
}

/// Where a reservation stands (`reservations.status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Held {
    /// Its units are taken from the stock.
    Reserved,
    /// There were not enough: nothing was taken.
    Rejected,
    /// Its units went back to the stock.
    Released,
}

impl Held {
    fn as_str(self) -> &'static str {
        match self {
            Held::Reserved => "RESERVED",
            Held::Rejected => "REJECTED",
            Held::Released => "RELEASED",
        }
    }

    /// The stored value; one no version of this service writes is an error,
    /// not a guess.
    fn parse(stored: &str) -> anyhow::Result<Self> {
        [Held::Reserved, Held::Rejected, Held::Released]
            .into_iter()
            .find(|h| h.as_str() == stored)
            .ok_or_else(|| anyhow::anyhow!("a reservation's status is {stored:?}, which this service never writes"))
    }
}

/// A reservation as [`decide`] sees and leaves it.
#[derive(Debug, Clone, PartialEq)]
struct Reservation {
    sku: String,
    quantity: i32,
    status: Held,
    /// Already in the table (else inserted by this batch).
    stored: bool,
    /// Changed by this batch.
    changed: bool,
}

/// What a batch's commands do to the rows they read: the replies (by
/// command index), the repeats the reservation key caught, and the rows to
/// write back.
#[derive(Debug, Default, PartialEq)]
struct Decided {
    replies: Vec<(usize, Message)>,
    repeats: Vec<(usize, &'static str)>,
    reserved: u64,
    rejected: u64,
    released: u64,
}

/// Applies `commands[i]` for each `i` in `fresh`, in order, to `stock`
/// (SKU → available, the locked rows) and `reservations` (order → its
/// reservation), as the one-command-at-a-time statements did: a reserve is
/// a no-op for an order that has a reservation; it takes the units when
/// they are available and is rejected otherwise; a release returns the
/// units of a RESERVED reservation only.
fn decide(
    orders: &[Uuid],
    commands: &[Command<'_>],
    fresh: &[usize],
    stock: &mut HashMap<String, i64>,
    reservations: &mut HashMap<Uuid, Reservation>,
) -> Decided {
    let mut d = Decided::default();
    for &i in fresh {
        let order = orders[i];
        let reply = match commands[i] {
            Command::Reserve { quantity, .. } if quantity <= 0 => Message::StockRejected {
                reason: "invalid_quantity".into(),
            },
            Command::Reserve { .. } if reservations.contains_key(&order) => {
                d.repeats.push((i, "reservation per order"));
                continue;
            }
            Command::Reserve { sku, quantity } => {
                let taken = match stock.get_mut(sku) {
                    Some(available) if *available >= i64::from(quantity) => {
                        *available -= i64::from(quantity);
                        true
                    }
                    _ => false,
                };
                let status = if taken { Held::Reserved } else { Held::Rejected };
                reservations.insert(
                    order,
                    Reservation {
                        sku: sku.to_string(),
                        quantity,
                        status,
                        stored: false,
                        changed: true,
                    },
                );
                if taken {
                    d.reserved += 1;
                    Message::StockReserved
                } else {
                    d.rejected += 1;
                    Message::StockRejected {
                        reason: "out_of_stock".into(),
                    }
                }
            }
            Command::Release => match reservations.get_mut(&order) {
                Some(r) if r.status == Held::Reserved => {
                    r.status = Held::Released;
                    r.changed = true;
                    if let Some(available) = stock.get_mut(&r.sku) {
                        *available += i64::from(r.quantity);
                    }
                    d.released += 1;
                    Message::StockReleased
                }
                _ => {
                    d.repeats.push((i, "release once per reservation"));
                    continue;
                }
            },
        };
        d.replies.push((i, reply));
    }
    d
}

/// Stock large enough for any batch, for deciding before the count is read.
const UNLIMITED: i64 = i64::MAX / 4;

/// The common batch — one SKU — without holding its row any longer than
/// one statement before commit: decides as if the stock were unlimited,
/// then takes the units in one conditional update, which holds exactly when
/// the stock covers every unit the batch reserves (releases only add, so
/// each reserve in order would have found its units). `None` when it does
/// not (or the SKU is unknown): the batch is then decided against the
/// locked count ([`take_locked`]).
async fn take_one_sku(
    conn: &mut PgConnection,
    sku: &str,
    orders: &[Uuid],
    commands: &[Command<'_>],
    fresh: &[usize],
    reservations: &HashMap<Uuid, Reservation>,
) -> anyhow::Result<Option<(Decided, HashMap<Uuid, Reservation>)>> {
    let mut after = reservations.clone();
    let mut stock = HashMap::from([(sku.to_string(), UNLIMITED)]);
    let decided = decide(orders, commands, fresh, &mut stock, &mut after);
    let taken: i64 = after
        .values()
        .filter(|r| !r.stored && r.status != Held::Rejected)
        .map(|r| i64::from(r.quantity))
        .sum();
    let delta = stock[sku] - UNLIMITED;
    if taken == 0 && delta == 0 {
        return Ok(Some((decided, after)));
    }
    let updated = sqlx::query(
        "UPDATE stock SET available = (available + $2::int8)::int4, updated_at = now()
         WHERE sku = $1 AND available >= $3::int8",
    )
    .bind(sku)
    .bind(delta)
    .bind(taken)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    Ok((updated == 1).then_some((decided, after)))
}

/// Decides the batch against the stock of `skus`, read locked in SKU order
/// (so two batches never wait on each other in a cycle), and writes each
/// changed count once.
async fn take_locked(
    conn: &mut PgConnection,
    skus: &BTreeSet<String>,
    orders: &[Uuid],
    commands: &[Command<'_>],
    fresh: &[usize],
    reservations: &mut HashMap<Uuid, Reservation>,
) -> anyhow::Result<Decided> {
    let skus: Vec<&str> = skus.iter().map(String::as_str).collect();
    let rows: Vec<(String, i32)> =
        sqlx::query_as("SELECT sku, available FROM stock WHERE sku = ANY($1) ORDER BY sku FOR UPDATE")
            .bind(&skus)
            .fetch_all(&mut *conn)
            .await?;
    let before: HashMap<String, i64> = rows.into_iter().map(|(s, a)| (s, i64::from(a))).collect();
    let mut stock = before.clone();
    let decided = decide(orders, commands, fresh, &mut stock, reservations);
    let (mut changed, mut available) = (Vec::new(), Vec::new());
    for (sku, now) in &stock {
        if before.get(sku) != Some(now) {
            changed.push(sku.as_str());
            available.push(i32::try_from(*now).map_err(|_| anyhow::anyhow!("stock of {sku} would overflow: {now}"))?);
        }
    }
    if !changed.is_empty() {
        sqlx::query(
            "UPDATE stock s SET available = v.available, updated_at = now()
             FROM unnest($1::text[], $2::int4[]) AS v(sku, available) WHERE s.sku = v.sku",
        )
        .bind(&changed)
        .bind(&available)
        .execute(&mut *conn)
        .await?;
    }
    Ok(decided)
}

/// [`handle_batch`]'s transaction after the inbox insert: read the batch's
/// reservations locked, [`decide`] against the stock ([`take_one_sku`] or
/// [`take_locked`]), write back.
async fn move_stock(
    conn: &mut PgConnection,
    batch: &[Traced<Envelope>],
    commands: &[Command<'_>],
    fresh: &[usize],
) -> anyhow::Result<()> {
    let orders: Vec<Uuid> = batch.iter().map(|t| t.message.order_id).collect();
    let fresh_orders: Vec<Uuid> = fresh.iter().map(|&i| orders[i]).collect();
    let stored: Vec<(Uuid, String, i32, String)> = sqlx::query_as(
        "SELECT order_id, sku, quantity, status FROM reservations WHERE order_id = ANY($1)
         ORDER BY order_id FOR UPDATE",
    )
    .bind(&fresh_orders)
    .fetch_all(&mut *conn)
    .await?;
    let mut reservations = HashMap::new();
    for (order, sku, quantity, status) in stored {
        let status = Held::parse(&status)?;
        let r = Reservation {
            sku,
            quantity,
            status,
            stored: true,
            changed: false,
        };
        reservations.insert(order, r);
    }
    // Every SKU the batch may touch: those it reserves, those it may release.
    let mut skus: BTreeSet<String> = reservations.values().map(|r| r.sku.clone()).collect();
    for &i in fresh {
        if let Command::Reserve { sku, quantity } = commands[i] {
            if quantity > 0 {
                skus.insert(sku.to_string());
            }
        }
    }
    let one_sku = match skus.len() {
        1 => {
            take_one_sku(
                conn,
                skus.first().expect("one"),
                &orders,
                commands,
                fresh,
                &reservations,
            )
            .await?
        }
        _ => None,
    };
    let decided = match one_sku {
        Some((decided, after)) => {
            reservations = after;
            decided
        }
        None => take_locked(conn, &skus, &orders, commands, fresh, &mut reservations).await?,
    };

    let changed = || reservations.iter().filter(|(_, r)| r.changed);
    let (new, old): (Vec<_>, Vec<_>) = changed().partition(|(_, r)| !r.stored);
    if !new.is_empty() {
        let inserted = sqlx::query(
            "INSERT INTO reservations (order_id, sku, quantity, status)
             SELECT * FROM unnest($1::uuid[], $2::text[], $3::int4[], $4::text[])
             ON CONFLICT (order_id) DO NOTHING",
        )
        .bind(new.iter().map(|(o, _)| **o).collect::<Vec<_>>())
        .bind(new.iter().map(|(_, r)| r.sku.as_str()).collect::<Vec<_>>())
        .bind(new.iter().map(|(_, r)| r.quantity).collect::<Vec<_>>())
        .bind(new.iter().map(|(_, r)| r.status.as_str()).collect::<Vec<_>>())
        .execute(&mut *conn)
        .await?
        .rows_affected();
        // A concurrent transaction reserved one of these orders after the
        // read above: retry the batch, which then sees its reservation.
        anyhow::ensure!(
            inserted == new.len() as u64,
            "a reservation appeared concurrently; retrying the batch"
        );
    }
    if !old.is_empty() {
        sqlx::query(
            "UPDATE reservations r SET status = v.status, updated_at = now()
             FROM unnest($1::uuid[], $2::text[]) AS v(order_id, status) WHERE r.order_id = v.order_id",
        )
        .bind(old.iter().map(|(o, _)| **o).collect::<Vec<_>>())
        .bind(old.iter().map(|(_, r)| r.status.as_str()).collect::<Vec<_>>())
        .execute(&mut *conn)
        .await?;
    }
    for &(i, caught_by) in &decided.repeats {
        let env = &batch[i].message;
        let command = match commands[i] {
            Command::Reserve { .. } => "reserve",
            Command::Release => "release",
        };
        batch[i].span.in_scope(|| {
            tracing::info!(command, "the order's reservation already decided this command; a no-op");
        });
        telemetry::metrics::incr("inventory_repeat_commands_total", &[("command", command)]);
        saga_kit::consumer::note_miss(conn, INVENTORY.name, env.event_id, env.order_id, caught_by).await?;
    }
    let replies: Vec<(Message, Envelope)> = decided
        .replies
        .into_iter()
        .map(|(i, message)| {
            let envelope = saga_kit::emit::envelope(
                batch[i].message.order_id,
                &message,
                Some(&batch[i].message),
                &batch[i].span,
            );
            (message, envelope)
        })
        .collect();
    saga_kit::emit::reply_all(conn, INVENTORY.name, &replies).await?;
    telemetry::metrics::incr_by("inventory_reserved_total", &[], decided.reserved);
    telemetry::metrics::incr_by("inventory_rejected_total", &[], decided.rejected);
    telemetry::metrics::incr_by("inventory_released_total", &[], decided.released);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stored status no version writes is an error, not a guess (it once
    /// became RELEASED silently). Removal tried: the old fallback to
    /// RELEASED — this failed.
    #[test]
    fn a_reservation_status_reads_back_and_an_unknown_one_is_an_error() {
        for held in [Held::Reserved, Held::Rejected, Held::Released] {
            assert_eq!(Held::parse(held.as_str()).unwrap(), held);
        }
        let err = Held::parse("LOST").unwrap_err().to_string();
        assert!(err.contains("\"LOST\""), "{err}");
    }

    fn run(commands: &[(Uuid, Command<'_>)], available: i64) -> (Decided, i64, HashMap<Uuid, Reservation>) {
        let orders: Vec<Uuid> = commands.iter().map(|(o, _)| *o).collect();
        let commands: Vec<Command<'_>> = commands
            .iter()
            .map(|(_, c)| match c {
                Command::Reserve { sku, quantity } => Command::Reserve {
                    sku,
                    quantity: *quantity,
                },
                Command::Release => Command::Release,
            })
            .collect();
        let fresh: Vec<usize> = (0..commands.len()).collect();
        let mut stock = HashMap::from([("A".to_string(), available)]);
        let mut reservations = HashMap::new();
        let d = decide(&orders, &commands, &fresh, &mut stock, &mut reservations);
        (d, stock["A"], reservations)
    }

    const ONE: Command<'static> = Command::Reserve { sku: "A", quantity: 1 };

    #[test]
    fn a_batch_decides_each_command_as_if_applied_one_at_a_time() {
        let (a, b, c) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
        // a reserves, b takes the last unit, c finds none; a's release
        // returns its unit; a second reserve and release of a are no-ops.
        let (d, left, reservations) = run(
            &[
                (a, ONE),
                (b, ONE),
                (c, ONE),
                (a, Command::Release),
                (a, ONE),
                (a, Command::Release),
            ],
            2,
        );
        assert_eq!(left, 1, "2 - a - b + a");
        let replies: Vec<usize> = d.replies.iter().map(|(i, _)| *i).collect();
        assert_eq!(replies, [0, 1, 2, 3]);
        assert_eq!(
            d.replies[2].1,
            Message::StockRejected {
                reason: "out_of_stock".into()
            }
        );
        assert_eq!(d.replies[3].1, Message::StockReleased);
        assert_eq!(
            d.repeats,
            [(4, "reservation per order"), (5, "release once per reservation")]
        );
        assert_eq!((d.reserved, d.rejected, d.released), (2, 1, 1));
        assert_eq!(reservations[&a].status, Held::Released);
        assert_eq!(reservations[&c].status, Held::Rejected);
    }

    #[test]
    fn an_invalid_quantity_is_rejected_without_a_reservation_and_a_release_without_one_is_a_no_op() {
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        let (d, left, reservations) = run(
            &[(a, Command::Reserve { sku: "A", quantity: 0 }), (b, Command::Release)],
            5,
        );
        assert_eq!(left, 5);
        assert_eq!(
            d.replies,
            [(
                0,
                Message::StockRejected {
                    reason: "invalid_quantity".into()
                }
            )]
        );
        assert_eq!(d.repeats, [(1, "release once per reservation")]);
        assert!(reservations.is_empty());
    }
}
