//! The gateway's wire types. mock-gateway serves them (with feature
//! `server`, their OpenAPI schemas and text columns); the callers read them.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// What a ledger entry moved (stored and shown as `charge` / `refund`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(sqlx::Type, utoipa::ToSchema))]
#[cfg_attr(feature = "server", sqlx(type_name = "text", rename_all = "lowercase"))]
#[serde(rename_all = "lowercase")]
pub enum EntryKind {
    /// A charge attempt.
    Charge,
    /// A refund.
    Refund,
}

/// How a movement ended (stored and shown as `captured`, …).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(sqlx::Type, utoipa::ToSchema))]
#[cfg_attr(feature = "server", sqlx(type_name = "text", rename_all = "lowercase"))]
#[serde(rename_all = "lowercase")]
pub enum EntryStatus {
    /// Money taken.
    Captured,
    /// Charge refused by the issuer; nothing taken.
    Declined,
    /// Money given back.
    Refunded,
}

impl EntryStatus {
    /// The stored name (a metric label).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Captured => "captured",
            Self::Declined => "declined",
            Self::Refunded => "refunded",
        }
    }
}

/// The largest amount one charge or refund may move, in cents (1,000,000.00):
/// a sum of an order's movements stays far inside `i64`, and a refund
/// beyond it is refused before any arithmetic.
pub const MAX_AMOUNT_CENTS: i64 = 100_000_000;

/// `POST /v1/charges` body.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
pub struct ChargeRequest {
    /// The merchant's order.
    pub order_id: Uuid,
    /// Amount in cents, 1 to [`MAX_AMOUNT_CENTS`].
    #[cfg_attr(feature = "server", schema(minimum = 1, maximum = 100_000_000))]
    pub amount_cents: i64,
    /// The card's token from `POST /v1/tokens` (never a card number).
    #[cfg_attr(feature = "server", schema(pattern = "^[^\\x00]*$"))]
    pub card_token: String,
}

/// `POST /v1/refunds` body.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
pub struct RefundRequest {
    /// The merchant's order whose charge is refunded.
    pub order_id: Uuid,
    /// Amount in cents, 1 to [`MAX_AMOUNT_CENTS`].
    #[cfg_attr(feature = "server", schema(minimum = 1, maximum = 100_000_000))]
    pub amount_cents: i64,
}

/// The result of a charge or refund.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
pub struct Movement {
    /// Ledger entry id.
    pub id: Uuid,
    /// How it ended.
    pub status: EntryStatus,
}

/// What a lookup by key tells a caller of the movement under it (the
/// gateway's ledger entry has more; these are the fields callers read).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Operation {
    /// Ledger entry id.
    pub id: Uuid,
    /// Charge or refund.
    pub kind: EntryKind,
    /// How it ended.
    pub status: EntryStatus,
}

/// `POST /v1/notices` body: a message for the customer of an order. The
/// notifier takes no idempotency key: each request is one more notice.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
pub struct NoticeRequest {
    /// The order the notice is about.
    pub order_id: Uuid,
    /// What the customer reads: up to 1,000 characters, no NUL.
    #[cfg_attr(feature = "server", schema(max_length = 1000, pattern = "^[^\\x00]*$"))]
    pub text: String,
}

/// `POST /v1/tokens` body.
#[derive(Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
pub struct TokenRequest {
    /// The card number, 12..=19 digits.
    #[cfg_attr(feature = "server", schema(pattern = "^[0-9]{12,19}$"))]
    pub card: String,
}

impl std::fmt::Debug for TokenRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenRequest").field("card", &"<redacted>").finish()
    }
}

/// A card's token.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
pub struct CardToken {
    /// Names the card in charges (`tok_…`).
    pub token: String,
    /// The card number's last four digits.
    pub last4: String,
}
