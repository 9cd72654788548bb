//! payment-service's side of the gateway: the one client
//! (`gateway_client::Client`, shared with order-api), and what an answer
//! means for a payment. Every charge and refund carries the operation's
//! Idempotency-Key.

use gateway_client::api::{EntryStatus, Movement, Operation};
pub use gateway_client::{Client, Error};

/// The gateway's answer to a charge or refund, as the payment records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// Captured or refunded; the gateway's entry id.
    Done(String),
    /// Declined by the issuer.
    Declined(String),
    /// Refused for good (a 4xx the key stores: the same key always gets it).
    Refused(String),
}

impl Reply {
    /// The answer a movement is.
    pub fn of(movement: &Movement) -> Self {
        Self::from_status(movement.status, movement.id)
    }

    /// The answer a looked-up operation is.
    pub fn of_operation(operation: &Operation) -> Self {
        Self::from_status(operation.status, operation.id)
    }

    fn from_status(status: EntryStatus, id: uuid::Uuid) -> Self {
        match status {
            EntryStatus::Declined => Self::Declined(id.to_string()),
            EntryStatus::Captured | EntryStatus::Refunded => Self::Done(id.to_string()),
        }
    }

    /// A call's result as a definite answer — a refusal is one, as definite
    /// as a decline — or the error that says to ask again.
    pub fn from_call(result: Result<Movement, Error>) -> Result<Self, String> {
        match result {
            Ok(m) => Ok(Self::of(&m)),
            Err(Error::Refused(e)) => {
                tracing::warn!(error = %e, "gateway refused the operation");
                Ok(Self::Refused(e))
            }
            Err(Error::Unavailable(e)) => Err(e),
        }
    }
}
