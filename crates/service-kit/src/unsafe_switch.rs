//! Switches that turn one layer of protection off, for the chaos suite's
//! negative controls: a run with a layer off must fail and name the
//! invariant that broke, or the suite would not notice the layer missing.
//!
//! They exist in every build's `--help` but refuse to start a process that
//! was built without the `failpoints` feature, so a production binary can
//! never run with a layer off.

/// Checks an unsafe switch at start: `Ok(on)`, or an error naming `var`
/// when it is on in a build without failpoints.
pub fn check(var: &str, on: bool) -> anyhow::Result<bool> {
    if !on {
        return Ok(false);
    }
    anyhow::ensure!(
        fail::has_failpoints(),
        "{var} is set, but this build has no failpoints feature: the unsafe switches exist only in test builds"
    );
    tracing::error!("{var} is set: a layer of deduplication is OFF (negative control only)");
    Ok(true)
}

/// `UNSAFE_NO_INBOX`: the service's consumer applies every delivery as new.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct NoInbox {
    /// NEGATIVE CONTROL ONLY (test builds): turn this service's inbox off.
    #[arg(long = "unsafe-no-inbox", env = "UNSAFE_NO_INBOX", default_value_t = false,
          action = clap::ArgAction::Set, hide_short_help = true)]
    pub no_inbox: bool,
}

impl NoInbox {
    /// Applies the switch (refused outside test builds).
    pub fn apply(&self) -> anyhow::Result<()> {
        if check("UNSAFE_NO_INBOX", self.no_inbox)? {
            inbox::unsafe_disable();
        }
        Ok(())
    }
}

/// `UNSAFE_INBOX_SEPARATE_TX`: a batching consumer commits its inbox rows
/// before, and apart from, the effects they stand for.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct InboxSeparateTx {
    /// NEGATIVE CONTROL ONLY (test builds): commit the inbox rows in their own transaction, before the effect.
    #[arg(long = "unsafe-inbox-separate-tx", env = "UNSAFE_INBOX_SEPARATE_TX", default_value_t = false,
          action = clap::ArgAction::Set, hide_short_help = true)]
    pub inbox_separate_tx: bool,
}

impl InboxSeparateTx {
    /// Applies the switch (refused outside test builds).
    pub fn apply(&self) -> anyhow::Result<()> {
        if check("UNSAFE_INBOX_SEPARATE_TX", self.inbox_separate_tx)? {
            crate::consumer::unsafe_inbox_separate_tx();
        }
        Ok(())
    }
}

/// `UNSAFE_NO_IDEMPOTENCY_KEY`: every HTTP request is treated as new.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct NoIdempotencyKey {
    /// NEGATIVE CONTROL ONLY (test builds): ignore the Idempotency-Key header.
    #[arg(long = "unsafe-no-idempotency-key", env = "UNSAFE_NO_IDEMPOTENCY_KEY", default_value_t = false,
          action = clap::ArgAction::Set, hide_short_help = true)]
    pub no_idempotency_key: bool,
}

impl NoIdempotencyKey {
    /// Applies the switch (refused outside test builds).
    pub fn apply(&self) -> anyhow::Result<()> {
        if check("UNSAFE_NO_IDEMPOTENCY_KEY", self.no_idempotency_key)? {
            idempotency::unsafe_disable();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_switch_that_is_off_always_passes_and_one_that_is_on_needs_failpoints() {
        assert!(!super::check("UNSAFE_X", false).unwrap());
        let on = super::check("UNSAFE_X", true);
        if fail::has_failpoints() {
            assert!(on.unwrap());
        } else {
            let e = on.unwrap_err().to_string();
            assert!(e.contains("UNSAFE_X") && e.contains("failpoints"), "{e}");
        }
    }
}
