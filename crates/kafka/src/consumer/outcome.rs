//! What a handler returns: what it did with each event, or why it failed.

/// What the handler did with an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handled {
    /// The effect was applied (and the inbox row written with it).
    Applied,
    /// The inbox already had this event id for this consumer: nothing done.
    Duplicate,
    /// New to the inbox (its row written), but the handler had nothing to
    /// apply: a reply the order saga's state machine stops (stale, or not
    /// legal in the order's state). Counted apart from the applied ones.
    Ignored,
}

impl Handled {
    /// Whether the event was new to the inbox: applied or ignored, its inbox
    /// row committed by this batch (a redelivery would be a duplicate).
    pub fn was_new(self) -> bool {
        matches!(self, Handled::Applied | Handled::Ignored)
    }
}

/// The cause a [`HandleError`] keeps: any error (its own chain of sources
/// kept), or a message.
pub type Cause = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why a handler failed: the kind of failure, which decides what the
/// consumer does, and its cause, kept whole as the error's source
/// ([`HandleError::report`] writes the kind and every cause in one line:
/// the dead-letter header and the logs).
#[derive(Debug, thiserror::Error)]
pub enum HandleError {
    /// A dependency is down (no connection to the database, the gateway
    /// unreachable): retry the same message, without limit.
    #[error("unavailable")]
    Unavailable(#[source] Cause),
    /// May succeed on another attempt (a serialisation failure, a deadlock,
    /// a timeout): retry the same message, up to the consumer's attempts.
    #[error("transient")]
    Transient(#[source] Cause),
    /// Can never succeed (unknown type, invalid payload, a constraint it
    /// violates): dead-letter it.
    #[error("permanent")]
    Permanent(#[source] Cause),
}

impl HandleError {
    /// A transient error, from an error (its chain kept) or a message.
    pub fn transient(e: impl Into<Cause>) -> Self {
        Self::Transient(e.into())
    }

    /// A dependency down, from an error or a message.
    pub fn unavailable(e: impl Into<Cause>) -> Self {
        Self::Unavailable(e.into())
    }

    /// A permanent error (decoding, validation), from an error or a message.
    pub fn permanent(e: impl Into<Cause>) -> Self {
        Self::Permanent(e.into())
    }

    /// The cause, whatever the kind.
    pub fn cause(&self) -> &Cause {
        match self {
            Self::Unavailable(c) | Self::Transient(c) | Self::Permanent(c) => c,
        }
    }

    /// The kind and every cause, outermost first: `permanent: a: b`.
    pub fn report(&self) -> String {
        let mut out = self.to_string();
        let mut next: Option<&(dyn std::error::Error + 'static)> = Some(self.cause().as_ref());
        while let Some(e) = next {
            out.push_str(": ");
            out.push_str(&e.to_string());
            next = e.source();
        }
        out
    }
}
