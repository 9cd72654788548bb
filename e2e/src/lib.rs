//! The end-to-end harness, shared by `cargo xtask` and the e2e tests.
//!
//! - [`stack`]: starts the broker and the five services as real processes on
//!   free ports with fresh, uniquely named databases; kills and restarts them.
//! - [`driver`]: places orders over HTTP like real clients do.
//! - [`interrupt`]: Ctrl-C or SIGTERM stops a long command and its stack, leaving nothing behind.
//! - [`chaos`]: the chaos suite — faults on a seed-fixed schedule, then the audit.
//! - [`proxy`]: a TCP fault proxy (latency, reset, blackhole).
//! - [`invariants`]: checks the invariants of docs/design.md against the databases and
//!   the gateway ledger.

pub mod bench;
pub mod chaos;
pub mod demo;
pub mod driver;
pub mod interrupt;
pub mod invariants;
pub mod otlp;
pub use testkit::proxy;
pub mod stack;

pub use stack::{Service, Stack, StackOptions};

/// Sends `signal` to the process `pid` (one this harness started, or
/// itself): SIGTERM or SIGINT for a graceful stop, SIGKILL for a crash.
pub fn signal(pid: u32, signal: nix::sys::signal::Signal) -> nix::Result<()> {
    let pid = i32::try_from(pid).map_err(|_| nix::errno::Errno::ESRCH)?;
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal)
}
