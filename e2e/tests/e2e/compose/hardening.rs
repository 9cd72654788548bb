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

fn networks(service: &serde_yaml_ng::Value) -> Vec<String> {
    service["networks"]
        .as_sequence()
        .map(|s| s.iter().map(|n| n.as_str().unwrap().to_owned()).collect())
        .unwrap_or_default()
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
            "jaeger" | "prometheus" | "grafana" => &["telemetry"],
            "postgres" | "kafka" | "kafka-init" | "seed" => &["data"],
            _ => &["data", "telemetry"],
        };
        assert_eq!(nets, expected, "{name}'s networks");
    }
    assert_eq!(checked, 6, "the five services and the seed run the project's image");
    // Prometheus scrapes only what shares its network.
    let scrape = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docker/prometheus.yml")).unwrap();
    for target in scrape.split("targets: [\"").skip(1) {
        let host = target.split(':').next().unwrap();
        let service = services().into_iter().find(|(n, _)| n == host).expect(host).1;
        assert!(networks(&service).iter().any(|n| n == "telemetry"), "{host} is scraped");
    }
}
