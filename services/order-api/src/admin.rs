//! Operator commands (`order-api <command>`), run against the service's
//! database; they need its URL and nothing else.

use uuid::Uuid;

use crate::auth;
use crate::saga::reconcile;

/// An operator's action.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Orders a person must look at.
    Review {
        #[command(subcommand)]
        action: Option<Review>,
    },
    /// Clients' API keys.
    Keys {
        #[command(subcommand)]
        action: Keys,
    },
    /// The audit trail, newest first: failed authentications, refusals,
    /// keys created and revoked.
    Audit {
        /// How many events.
        #[arg(long, default_value_t = 50)]
        limit: i64,
    },
}

/// `order-api keys …`
#[derive(Debug, clap::Subcommand)]
pub enum Keys {
    /// Provision a key for a client: printed once, stored as its hash.
    Create {
        /// The client (the scope of its Idempotency-Keys and owner of its orders).
        #[arg(long)]
        client: String,
        /// Days until the key stops working; without it, it does not expire.
        #[arg(long)]
        expires_in_days: Option<u32>,
    },
    /// Every key: id, client, created, revoked or expiring.
    List,
    /// Revoke a key (it stops working within API_KEY_CACHE_SECS).
    Revoke {
        /// The key's id (from `list`).
        id: Uuid,
    },
}

/// `order-api review …`
#[derive(Debug, clap::Subcommand)]
pub enum Review {
    /// List the orders in MANUAL_REVIEW (the default), and the orders whose
    /// legacy card the vault refused (parked, the value cleared).
    List,
    /// Retry the refund of an order in MANUAL_REVIEW after a refused refund:
    /// a new refund attempt under its own gateway key.
    RetryRefund {
        /// The order.
        id: Uuid,
    },
}

/// Runs `command`.
pub async fn run(command: Command, db: &service_kit::DbArgs) -> anyhow::Result<()> {
    let pool = crate::connect(&db.url, 2).await?;
    match command {
        Command::Review {
            action: None | Some(Review::List),
        } => {
            let orders = reconcile::manual_review(&pool).await?;
            if orders.is_empty() {
                println!("no order in MANUAL_REVIEW");
            }
            for (id, reason, since) in orders {
                println!("{id}  {:<18}  since {since}", reason.as_deref().unwrap_or("-"));
            }
            let parked = crate::orders::parked_cards(&pool).await?;
            if !parked.is_empty() {
                println!(
                    "orders whose legacy card the vault refused (the value is cleared; ask the client for a card):"
                );
            }
            for (id, why, since) in parked {
                println!("{id}  card parked: {why}  since {since}");
            }
        }
        Command::Review {
            action: Some(Review::RetryRefund { id }),
        } => {
            let order = reconcile::retry_refund(&pool, id).await?;
            println!(
                "order {id} is {} again: refund attempt {} sent",
                order.status.as_str(),
                order.refund_attempt
            );
        }
        Command::Keys {
            action: Keys::Create {
                client,
                expires_in_days,
            },
        } => {
            let expires = expires_in_days.map(|d| chrono::Utc::now() + chrono::Duration::days(d.into()));
            let (id, key) = auth::create_key_expiring(&pool, &client, expires).await?;
            eprintln!("key {id} for client {client:?} (shown once; keep it secret):");
            println!("{key}");
        }
        Command::Keys { action: Keys::List } => {
            for k in auth::list_keys(&pool).await? {
                let state = match (k.revoked_at, k.expires_at) {
                    (Some(r), _) => format!("revoked {r}"),
                    (None, Some(e)) if e <= chrono::Utc::now() => format!("expired {e}"),
                    (None, Some(e)) => format!("active, expires {e}"),
                    (None, None) => "active".to_owned(),
                };
                println!("{}  {:<24}  created {}  {state}", k.id, k.client_id, k.created_at);
            }
        }
        Command::Keys {
            action: Keys::Revoke { id },
        } => {
            anyhow::ensure!(auth::revoke_key(&pool, id).await?, "no active key {id}");
            println!("key {id} revoked");
        }
        Command::Audit { limit } => {
            for e in crate::audit::recent(&pool, limit).await? {
                let opt = |v: Option<String>| v.unwrap_or_else(|| "-".into());
                println!(
                    "{}  {:<10}  {:<16}  {}  from {}  {}",
                    e.at,
                    e.actor,
                    e.action,
                    opt(e.subject),
                    opt(e.source),
                    opt(e.detail)
                );
            }
        }
    }
    Ok(())
}
