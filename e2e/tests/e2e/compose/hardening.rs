//! Compose's containers hold no more than they need: no privilege gained
//! through exec anywhere; the project's own containers without any Linux
//! capability, on a read-only root; the watchers (Jaeger, Prometheus,
//! Grafana) on a network without the databases, the broker or the gateway.

use super::compose;

/// The services' names and definitions (merge keys applied).
fn services() -> Vec<(String, serde_yaml_ng::Value)> {
    compose()["services"]
        .as_mapping()
        .expect("services")
        .iter()
        .map(|(k, v)| (k.as_str().unwrap().to_owned(), v.clone()))
        .collect()
}

/// A service's networks, as a list or as a mapping (with addresses).
fn networks(service: &serde_yaml_ng::Value) -> Vec<String> {
    let nets = &service["networks"];
    match (nets.as_sequence(), nets.as_mapping()) {
        (Some(list), _) => list.iter().map(|n| n.as_str().unwrap().to_owned()).collect(),
        (_, Some(map)) => map.keys().map(|n| n.as_str().unwrap().to_owned()).collect(),
        _ => Vec::new(),
    }
}

#[test]
fn every_container_is_hardened_and_the_watchers_reach_no_data() {
    let own = compose()["x-service"]["image"].clone();
    let mut checked = 0;
    for (name, s) in services() {
        assert!(
            s["security_opt"]
                .as_sequence()
                .is_some_and(|o| o.iter().any(|v| v.as_str() == Some("no-new-privileges:true"))),
            "{name}: no-new-privileges"
        );
        if s["image"] == own {
            checked += 1;
            assert_eq!(
                s["cap_drop"][0].as_str(),
                Some("ALL"),
                "{name}: every capability dropped"
            );
            assert_eq!(s["read_only"].as_bool(), Some(true), "{name}: a read-only root");
        }
        let nets = networks(&s);
        let expected: &[&str] = match name.as_str() {
            "jaeger" | "prometheus" | "grafana" => &["management"],
            "postgres" | "kafka" | "kafka-init" | "seed" => &["data"],
            _ => &["data", "management"],
        };
        assert_eq!(nets, expected, "{name}'s networks");
    }
    assert_eq!(checked, 6, "the five services and the seed run the project's image");
    // Prometheus scrapes only what shares its network, by the alias the
    // service has there alone.
    let scrape = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docker/prometheus.yml")).unwrap();
    for target in scrape.split("targets: [\"").skip(1) {
        let host = target.split(':').next().unwrap();
        let name = host.strip_suffix("-admin").expect("an -admin alias");
        let service = services().into_iter().find(|(n, _)| n == name).expect(host).1;
        assert_eq!(
            service["networks"]["management"]["aliases"][0].as_str(),
            Some(host),
            "{host} is scraped on the management network"
        );
    }
}

/// Each service binds its admin port (probes, metrics, the journey's
/// records) to its address on the management network alone: from the data
/// network (PostgreSQL, Kafka, the seed) nothing reaches it. The journey
/// reads the participants there. Removal tried: order-api's admin on
/// 0.0.0.0 — this failed.
#[test]
fn admin_ports_listen_on_the_management_network_alone() {
    let subnet = compose()["networks"]["management"]["ipam"]["config"][0]["subnet"]
        .as_str()
        .expect("a fixed management subnet")
        .to_owned();
    let prefix = subnet.strip_suffix("0/24").expect("a /24");
    let mut seen = std::collections::BTreeSet::new();
    for (name, s) in services() {
        let Some(addr) = s["environment"]["ADMIN_ADDR"].as_str() else {
            continue;
        };
        let (ip, _) = addr.rsplit_once(':').unwrap();
        let own = s["networks"]["management"]["ipv4_address"].as_str();
        assert_eq!(Some(ip), own, "{name}: ADMIN_ADDR {addr} is its management address");
        assert!(ip.starts_with(prefix), "{name}: {ip} in {subnet}");
        assert!(seen.insert(ip.to_owned()), "{name}: {ip} taken twice");
        let health = s["healthcheck"]["test"][1].as_str().unwrap_or_default();
        assert!(
            health.contains("$${ADMIN_ADDR}"),
            "{name}'s healthcheck reaches it: {health}"
        );
    }
    assert_eq!(seen.len(), 5, "the five services");
    let order_api = &compose()["services"]["order-api"]["environment"];
    for (var, alias) in [
        ("INVENTORY_ADMIN_URL", "inventory-service-admin"),
        ("PAYMENT_ADMIN_URL", "payment-service-admin"),
    ] {
        assert!(
            order_api[var]
                .as_str()
                .unwrap()
                .starts_with(&format!("http://{alias}:")),
            "{var} over the management network"
        );
    }
}
