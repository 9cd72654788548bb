//! The negative controls' switches, one mechanism for all of them.
//!
//! A negative control is a run with one layer of protection turned off; it
//! must fail, naming the invariant that layer guards, or the suite would not
//! notice the layer missing (docs/results/negative-controls.md). Each layer
//! is a [`Switch`]. A process parses its switches once ([`Switches`], every
//! `UNSAFE_*` variable as a `clap` argument), [`Switches::install`]s the set
//! at start — refusing any switch the service does not have — and the code
//! of the layer asks [`on`] where it acts.
//!
//! Built without the `failpoints` feature (every release build), [`on`] is a
//! constant `false`, so the unsafe paths are compiled out, and
//! [`Switches::install`] refuses to start a process with any switch set: a
//! production binary can never run with a layer off.

use std::sync::OnceLock;

/// One layer a negative control can turn off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Switch {
    /// `UNSAFE_NO_INBOX`: the consumer's inbox records nothing and reports
    /// every delivery as new.
    NoInbox,
    /// `UNSAFE_INBOX_SEPARATE_TX`: a batching consumer commits its inbox rows
    /// in their own transaction, before the effects they stand for.
    InboxSeparateTx,
    /// `UNSAFE_NO_IDEMPOTENCY_KEY`: the HTTP layer treats every request as new.
    NoIdempotencyKey,
    /// `UNSAFE_OFFSET_BEFORE_HANDLING`: each batch's offsets are committed
    /// before its handler runs (acknowledging before processing).
    OffsetBeforeHandling,
    /// `UNSAFE_NO_PRODUCER_IDEMPOTENCE`: the producer runs without
    /// `enable.idempotence`.
    NoProducerIdempotence,
    /// `UNSAFE_EVENT_ID_AT_PUBLISH`: the relay mints a new event id at every
    /// publish instead of sending the one the outbox row was given.
    EventIdAtPublish,
    /// `UNSAFE_PAYMENT_NO_DEDUP`: payment-service neither records a
    /// payment per operation nor sends a gateway key (the chaos suite's
    /// negative control).
    NoPaymentDedup,
    /// `UNSAFE_OUTBOX_AFTER_COMMIT`: order-api commits a new order, then
    /// writes the command it waits on in a second transaction — the dual
    /// write the outbox exists to prevent.
    OutboxAfterCommit,
    /// `UNSAFE_RELAY_MARKS_UNSENT`: the relay marks rows published that it
    /// never delivered (one in `outbox::negative_controls::UNSENT_EVERY`).
    RelayMarksUnsent,
}

impl Switch {
    /// Every switch.
    pub const ALL: [Switch; 9] = [
        Switch::NoInbox,
        Switch::InboxSeparateTx,
        Switch::NoIdempotencyKey,
        Switch::OffsetBeforeHandling,
        Switch::NoProducerIdempotence,
        Switch::EventIdAtPublish,
        Switch::NoPaymentDedup,
        Switch::OutboxAfterCommit,
        Switch::RelayMarksUnsent,
    ];

    /// The environment variable that sets it.
    pub const fn var(self) -> &'static str {
        match self {
            Switch::NoInbox => "UNSAFE_NO_INBOX",
            Switch::InboxSeparateTx => "UNSAFE_INBOX_SEPARATE_TX",
            Switch::NoIdempotencyKey => "UNSAFE_NO_IDEMPOTENCY_KEY",
            Switch::OffsetBeforeHandling => "UNSAFE_OFFSET_BEFORE_HANDLING",
            Switch::NoProducerIdempotence => "UNSAFE_NO_PRODUCER_IDEMPOTENCE",
            Switch::EventIdAtPublish => "UNSAFE_EVENT_ID_AT_PUBLISH",
            Switch::NoPaymentDedup => "UNSAFE_PAYMENT_NO_DEDUP",
            Switch::OutboxAfterCommit => "UNSAFE_OUTBOX_AFTER_COMMIT",
            Switch::RelayMarksUnsent => "UNSAFE_RELAY_MARKS_UNSENT",
        }
    }

    /// What is off while it is on, for the start-up log.
    pub const fn off(self) -> &'static str {
        match self {
            Switch::NoInbox => "the inbox is OFF: every delivery is applied as new",
            Switch::InboxSeparateTx => "inbox rows commit BEFORE and apart from their effects",
            Switch::NoIdempotencyKey => "the Idempotency-Key layer is OFF",
            Switch::OffsetBeforeHandling => "offsets are committed BEFORE their messages are handled",
            Switch::NoProducerIdempotence => "the producer is NOT idempotent",
            Switch::EventIdAtPublish => "the relay mints a NEW event id at every publish",
            Switch::NoPaymentDedup => "payment-service deduplicates nothing",
            Switch::OutboxAfterCommit => {
                "a new order's command is written AFTER its order commits, in a second transaction"
            }
            Switch::RelayMarksUnsent => "the relay marks rows published that it NEVER sent",
        }
    }

    /// The pattern crate whose negative controls this switch needs, when
    /// this build lacks them (its feature of this crate is off); `None`
    /// when it has them or the switch is a service's own.
    pub const fn lacking_crate(self) -> Option<&'static str> {
        let (krate, compiled) = match self {
            Switch::NoInbox | Switch::InboxSeparateTx => ("inbox", cfg!(feature = "inbox")),
            Switch::NoIdempotencyKey => ("idempotency", cfg!(feature = "idempotency")),
            Switch::OffsetBeforeHandling => ("kafka", cfg!(feature = "kafka")),
            Switch::NoProducerIdempotence | Switch::EventIdAtPublish | Switch::RelayMarksUnsent => {
                ("outbox", cfg!(feature = "outbox"))
            }
            Switch::NoPaymentDedup | Switch::OutboxAfterCommit => return None,
        };
        if compiled {
            None
        } else {
            Some(krate)
        }
    }

    const fn bit(self) -> u32 {
        1 << self as u32
    }
}

/// Why a process refused its switches.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    /// A switch is on in a build without failpoints.
    #[error("{var} is set, but this build has no failpoints feature: the unsafe switches exist only in test builds")]
    NotATestBuild {
        /// The variable that is on.
        var: &'static str,
    },
    /// A switch is on that this service has no layer for.
    #[error("{var} is set, but {service} has no such layer (its switches: {known})")]
    NotHere {
        /// The variable that is on.
        var: &'static str,
        /// The service refusing it.
        service: &'static str,
        /// The variables it knows.
        known: String,
    },
    /// A switch is on whose layer's crate this build has no negative
    /// controls of (its feature in `switches` is off).
    #[error("{var} is set, but this build has no negative controls of {krate} (switches feature `{krate}`)")]
    NotCompiled {
        /// The variable that is on.
        var: &'static str,
        /// The crate lacking.
        krate: &'static str,
    },
    /// The process installed another set of switches before.
    #[error("this process installed other switches before: one set per process")]
    Twice,
}

/// The switches of one process, as `clap` arguments: flatten it into a
/// service's configuration. Each is off by default and hidden from short
/// help.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct Switches {
    /// NEGATIVE CONTROL ONLY (test builds): turn this service's inbox off.
    #[arg(long = "unsafe-no-inbox", env = "UNSAFE_NO_INBOX", default_value_t = false,
          action = clap::ArgAction::Set, hide_short_help = true)]
    pub no_inbox: bool,
    /// NEGATIVE CONTROL ONLY (test builds): commit the inbox rows in their own transaction, before the effect.
    #[arg(long = "unsafe-inbox-separate-tx", env = "UNSAFE_INBOX_SEPARATE_TX", default_value_t = false,
          action = clap::ArgAction::Set, hide_short_help = true)]
    pub inbox_separate_tx: bool,
    /// NEGATIVE CONTROL ONLY (test builds): ignore the Idempotency-Key header.
    #[arg(long = "unsafe-no-idempotency-key", env = "UNSAFE_NO_IDEMPOTENCY_KEY", default_value_t = false,
          action = clap::ArgAction::Set, hide_short_help = true)]
    pub no_idempotency_key: bool,
    /// NEGATIVE CONTROL ONLY (test builds): acknowledge before processing —
    /// each batch's offsets are committed before its handler runs, so a
    /// crash mid-handling loses the batch (scenario 15).
    #[arg(long = "unsafe-offset-before-handling", env = "UNSAFE_OFFSET_BEFORE_HANDLING", default_value_t = false,
          action = clap::ArgAction::Set, hide_short_help = true)]
    pub offset_before_handling: bool,
    /// NEGATIVE CONTROL ONLY (test builds): produce without
    /// `enable.idempotence`, so a batch retried after a lost acknowledgement
    /// is appended again.
    #[arg(long = "unsafe-no-producer-idempotence", env = "UNSAFE_NO_PRODUCER_IDEMPOTENCE", default_value_t = false,
          action = clap::ArgAction::Set, hide_short_help = true)]
    pub no_producer_idempotence: bool,
    /// NEGATIVE CONTROL ONLY (test builds): mint a new event id at every
    /// publish (scenario 16's removal).
    #[arg(long = "unsafe-event-id-at-publish", env = "UNSAFE_EVENT_ID_AT_PUBLISH", default_value_t = false,
          action = clap::ArgAction::Set, hide_short_help = true)]
    pub event_id_at_publish: bool,
    /// NEGATIVE CONTROL ONLY (test builds): payment-service records no
    /// payment per operation and sends no gateway key.
    #[arg(long = "unsafe-payment-no-dedup", env = "UNSAFE_PAYMENT_NO_DEDUP", default_value_t = false,
          action = clap::ArgAction::Set, hide_short_help = true)]
    pub no_payment_dedup: bool,
    /// NEGATIVE CONTROL ONLY (test builds): order-api writes a new order's
    /// command in a second transaction, after the order commits.
    #[arg(long = "unsafe-outbox-after-commit", env = "UNSAFE_OUTBOX_AFTER_COMMIT", default_value_t = false,
          action = clap::ArgAction::Set, hide_short_help = true)]
    pub outbox_after_commit: bool,
    /// NEGATIVE CONTROL ONLY (test builds): the relay marks some rows
    /// published without sending them.
    #[arg(long = "unsafe-relay-marks-unsent", env = "UNSAFE_RELAY_MARKS_UNSENT", default_value_t = false,
          action = clap::ArgAction::Set, hide_short_help = true)]
    pub relay_marks_unsent: bool,
}

impl Switches {
    /// The switches that are on.
    pub fn set(&self) -> Vec<Switch> {
        let flags = [
            self.no_inbox,
            self.inbox_separate_tx,
            self.no_idempotency_key,
            self.offset_before_handling,
            self.no_producer_idempotence,
            self.event_id_at_publish,
            self.no_payment_dedup,
            self.outbox_after_commit,
            self.relay_marks_unsent,
        ];
        Switch::ALL
            .into_iter()
            .zip(flags)
            .filter(|(_, on)| *on)
            .map(|(s, _)| s)
            .collect()
    }

    /// Checks the switches that are on against the layers `service` has
    /// (`known`) and this build, then makes them the process's set, read by
    /// [`on`]. Call at start; the same set again is accepted, another is refused.
    pub fn install(&self, service: &'static str, known: &[Switch]) -> Result<(), Refused> {
        let set = self.set();
        for s in &set {
            if !known.contains(s) {
                return Err(Refused::NotHere {
                    var: s.var(),
                    service,
                    known: known.iter().map(|k| k.var()).collect::<Vec<_>>().join(", "),
                });
            }
            if !cfg!(feature = "failpoints") {
                return Err(Refused::NotATestBuild { var: s.var() });
            }
            if let Some(krate) = s.lacking_crate() {
                return Err(Refused::NotCompiled { var: s.var(), krate });
            }
        }
        let bits = set.iter().fold(0, |bits, s| bits | s.bit());
        if bits == 0 {
            return Ok(());
        }
        if INSTALLED.set(bits).is_err() {
            // A test process may build a service twice: the same set again is fine.
            return match INSTALLED.get() {
                Some(installed) if *installed == bits => Ok(()),
                _ => Err(Refused::Twice),
            };
        }
        for s in &set {
            tracing::error!("{} is set: {} (negative control only)", s.var(), s.off());
        }
        for s in &set {
            hand_over(*s);
        }
        Ok(())
    }
}

/// Turns `switch` on where its layer lives: the pattern crates own their
/// negative controls (each crate's `negative_controls` module, compiled only
/// with its `negative-controls` feature, which this crate's feature of the
/// same name turns on) and know nothing of this crate; a service's own
/// switch is read with [`on`]. `install` has refused a switch whose crate
/// this build lacks ([`Switch::lacking_crate`]), so none is ignored here.
fn hand_over(switch: Switch) {
    match switch {
        #[cfg(feature = "inbox")]
        Switch::NoInbox => inbox::negative_controls::turn_off(),
        #[cfg(feature = "inbox")]
        Switch::InboxSeparateTx => inbox::negative_controls::commit_apart(),
        #[cfg(feature = "idempotency")]
        Switch::NoIdempotencyKey => idempotency::negative_controls::turn_off(),
        #[cfg(feature = "kafka")]
        Switch::OffsetBeforeHandling => kafka::negative_controls::ack_first(),
        #[cfg(feature = "outbox")]
        Switch::NoProducerIdempotence => outbox::negative_controls::no_producer_idempotence(),
        #[cfg(feature = "outbox")]
        Switch::EventIdAtPublish => outbox::negative_controls::event_id_at_publish(),
        #[cfg(feature = "outbox")]
        Switch::RelayMarksUnsent => outbox::negative_controls::marks_unsent(),
        _ => {}
    }
}

static INSTALLED: OnceLock<u32> = OnceLock::new();

/// Whether `switch` is on in this process. Always `false` in a build
/// without failpoints.
#[cfg(feature = "failpoints")]
pub fn on(switch: Switch) -> bool {
    INSTALLED.get().is_some_and(|bits| bits & switch.bit() != 0)
}

/// Whether `switch` is on in this process. Always `false` in a build
/// without failpoints.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub const fn on(_switch: Switch) -> bool {
    false
}

/// Refuses a test-only setting that is not one layer (the gateway's admin
/// routes and fault injection) in a build without failpoints.
pub fn test_builds_only(var: &'static str, on: bool) -> Result<bool, Refused> {
    if on && !cfg!(feature = "failpoints") {
        return Err(Refused::NotATestBuild { var });
    }
    Ok(on)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One naming scheme: every switch is `UNSAFE_…`, and its flag the
    /// same words (`--unsafe-…`). Removal tried: the payment switch's old
    /// name (`PAYMENT_UNSAFE_DISABLE_DEDUP`) — this failed.
    #[test]
    fn every_switch_is_named_unsafe_and_its_flag_says_the_same() {
        use clap::Args as _;
        let flags: Vec<(String, String)> = Switches::augment_args(clap::Command::new("switches"))
            .get_arguments()
            .filter_map(|a| Some((a.get_long()?.to_owned(), a.get_env()?.to_string_lossy().into_owned())))
            .collect();
        for s in Switch::ALL {
            assert!(s.var().starts_with("UNSAFE_"), "{}", s.var());
            let flag = s.var().to_lowercase().replace('_', "-");
            assert!(
                flags.contains(&(flag.clone(), s.var().to_owned())),
                "--{flag} for {}: {flags:?}",
                s.var()
            );
        }
    }

    #[test]
    fn a_switch_the_service_lacks_is_refused_and_none_set_installs_nothing() {
        let s = Switches {
            no_inbox: true,
            ..Default::default()
        };
        let e = s
            .install("mock-gateway", &[Switch::NoIdempotencyKey])
            .unwrap_err()
            .to_string();
        assert!(e.contains("UNSAFE_NO_INBOX") && e.contains("mock-gateway"), "{e}");
        assert!(Switches::default().set().is_empty());
        assert!(!on(Switch::NoInbox));
    }

    #[test]
    fn variables_are_distinct_and_bits_too() {
        let vars: std::collections::BTreeSet<_> = Switch::ALL.iter().map(|s| s.var()).collect();
        let bits = Switch::ALL.iter().fold(0, |b, s| b | s.bit());
        assert_eq!(vars.len(), Switch::ALL.len());
        assert_eq!(bits.count_ones() as usize, Switch::ALL.len());
    }

    #[test]
    fn a_switch_on_is_refused_by_a_build_without_failpoints_and_read_back_by_one_with() {
        let s = Switches {
            offset_before_handling: true,
            ..Default::default()
        };
        let r = s.install("inventory-service", &[Switch::OffsetBeforeHandling]);
        if cfg!(feature = "failpoints") {
            r.unwrap();
            assert!(on(Switch::OffsetBeforeHandling));
            assert!(!on(Switch::NoInbox));
        } else {
            let e = r.unwrap_err().to_string();
            assert!(
                e.contains("UNSAFE_OFFSET_BEFORE_HANDLING") && e.contains("failpoints"),
                "{e}"
            );
            assert!(!on(Switch::OffsetBeforeHandling));
        }
    }
}
