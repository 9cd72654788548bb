//! Ports: each service's API port (order-api, inventory-service's stock
//! endpoints, the gateway) and admin port (health, metrics, the API's
//! description), free ones or `cargo xtask up`'s fixed ones.

use std::collections::BTreeMap;

use super::{Service, Stack};

impl Service {
    /// Whether the service serves an API beside its admin endpoints
    /// (payment-service and outbox-relay serve only the admin endpoints).
    pub fn has_api(self) -> bool {
        matches!(self, Service::OrderApi | Service::Inventory | Service::Gateway)
    }
}

impl Stack {
    /// `host:port` of a service's admin endpoints.
    pub fn admin_addr(&self, s: Service) -> String {
        format!("127.0.0.1:{}", self.admin_ports[&s])
    }

    /// Base URL of a service's admin endpoints: `/health/*`, `/metrics`,
    /// `/openapi.json`.
    pub fn admin_url(&self, s: Service) -> String {
        format!("http://{}", self.admin_addr(s))
    }

    /// The addresses `s` listens on, and (order-api) where its journey
    /// page reads the participants' parts and where a browser finds it,
    /// and its decline limit (off).
    pub(super) fn address_env(&self, s: Service) -> Vec<(String, String)> {
        let mut env = vec![("ADMIN_ADDR".to_owned(), self.admin_addr(s))];
        if s.has_api() {
            env.push(("HTTP_ADDR".into(), self.addr(s)));
        }
        if s == Service::OrderApi {
            env.push(("INVENTORY_ADMIN_URL".into(), self.admin_url(Service::Inventory)));
            env.push(("PAYMENT_ADMIN_URL".into(), self.admin_url(Service::Payment)));
            env.push(("JOURNEY_PUBLIC_URL".into(), self.admin_url(Service::OrderApi)));
            // The drivers decline thousands of payments an hour under one
            // client on purpose: no decline limit, unless a test sets one.
            env.push(("API_DECLINES_PER_HOUR".into(), "0".into()));
        }
        env
    }

    /// Whether one of `s`'s ports is taken by another process now.
    pub(super) fn a_port_was_taken(&self, s: Service) -> bool {
        (s.has_api() && port_taken(self.ports[&s])) || port_taken(self.admin_ports[&s])
    }
}

/// Whether something else listens on `port` now.
fn port_taken(port: u16) -> bool {
    std::net::TcpListener::bind(("127.0.0.1", port)).is_err()
}

pub(super) fn free_port() -> anyhow::Result<u16> {
    Ok(testkit::ports::free()?)
}

/// `cargo xtask up`'s fixed ports, all free: the services' API and admin
/// ports, the broker's and its controller's.
pub(super) fn fixed_are_free(
    ports: &BTreeMap<Service, u16>,
    admin_ports: &BTreeMap<Service, u16>,
) -> anyhow::Result<()> {
    let mut wanted: Vec<(String, u16)> = Vec::new();
    for s in Service::ALL {
        if s.has_api() || s == Service::Broker {
            wanted.push((s.name().to_owned(), ports[&s]));
        }
        if s != Service::Broker {
            wanted.push((format!("{} admin", s.name()), admin_ports[&s]));
        }
    }
    wanted.push(("Kafka's controller".into(), 9093));
    check_fixed(&wanted)
}

/// Fixed ports (`cargo xtask up`'s) must be free before anything starts:
/// each one taken, named with what it was for.
pub(super) fn check_fixed(wanted: &[(String, u16)]) -> anyhow::Result<()> {
    let taken: Vec<String> = wanted
        .iter()
        .filter(|(_, port)| port_taken(*port))
        .map(|(what, port)| format!("{port} ({what})"))
        .collect();
    anyhow::ensure!(
        taken.is_empty(),
        "port {} in use by another process (another `cargo xtask up`? `ss -ltnp` names it)",
        taken.join(", ")
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_fixed_port_in_use_is_named_before_anything_starts() {
        let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = held.local_addr().unwrap().port();
        let free = super::free_port().unwrap();
        let err = super::check_fixed(&[("order-api".into(), port), ("inventory-service admin".into(), free)])
            .unwrap_err()
            .to_string();
        assert!(err.contains(&format!("{port} (order-api)")), "{err}");
        assert!(!err.contains("inventory"), "a free port is not named: {err}");
        drop(held);
        super::check_fixed(&[("order-api".into(), port)]).unwrap();
    }
}
