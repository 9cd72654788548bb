//! Test support for the workspace's tests, benches and the e2e harness.
//! Listed only under `[dev-dependencies]` of the library and service crates
//! (and as a dependency of `e2e`, which is itself a test harness). It depends
//! on no crate of the workspace, so no dev-dependency cycle runs through it
//! (checked by `cargo xtask lint`).
//!
//! - [`asyncapi`], [`jsonschema`]: the contract's validators (npm, PyPI), found or installed;
//! - [`db`]: throw-away databases that are dropped with their guard;
//! - [`broker`]: Apache Kafka — fetched from Maven Central, a node started
//!   on free ports with a temp data directory, killed and restarted;
//! - [`partition`]: network partitions on loopback (nftables rules by uid);
//! - [`postgres`]: a local PostgreSQL installed and started when none answers, or a cluster of a run's own;
//! - [`openapi`]: a service's OpenAPI document is current and well-formed;
//! - [`process`]: which process listens on a port (a harness's check that
//!   the service answering is the one it started);
//! - [`proxy`]: a TCP fault proxy (latency, reset, blackhole, swallowed responses);
//! - [`promtool`]: Prometheus's checker and a server of a test's own, found or unpacked from Debian's package;
//! - [`schemathesis`]: the OpenAPI fuzzer, found or installed in a virtualenv;
//! - [`tls`]: a private certificate authority and the loopback server certificates it signs;
//! - [`topics`]: topics created and read back whole without the crate under test;

pub mod asyncapi;
pub mod broker;
pub mod browser;
pub mod db;
pub mod jsonschema;
pub mod openapi;
pub mod partition;
pub mod ports;
pub mod postgres;
pub mod process;
pub mod promtool;
pub mod proxy;
pub mod schemathesis;
pub mod tls;
pub mod topics;

pub use broker::Broker;
pub use db::TempDb;
