//! docker-compose.yml is kept in step with the services' configuration:
//! no Docker engine runs here, so the file is parsed and compared with the
//! environment variables each service's `Config` actually reads.

use std::collections::BTreeSet;

use clap::CommandFactory;

mod gen_env;
mod hardening;
mod kafka;
mod postgres;
mod secrets;
mod tls;

fn declared<C: CommandFactory>() -> BTreeSet<String> {
    C::command()
        .get_arguments()
        .filter_map(|a| a.get_env().map(|e| e.to_string_lossy().into_owned()))
        .collect()
}

/// The variables of the arguments a service cannot start without (the
/// secrets: no default).
fn required<C: CommandFactory>() -> BTreeSet<String> {
    C::command()
        .get_arguments()
        .filter(|a| a.is_required_set())
        .filter_map(|a| a.get_env().map(|e| e.to_string_lossy().into_owned()))
        .collect()
}

pub fn compose() -> serde_yaml_ng::Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docker-compose.yml");
    let text = std::fs::read_to_string(path).expect("docker-compose.yml exists");
    let mut doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).expect("docker-compose.yml is valid YAML");
    doc.apply_merge().expect("YAML merge keys resolve");
    doc
}

/// Runs docker/gen-env.sh as compose's user would, its TLS files written
/// into `dir` (what compose mounts at /etc/eo/tls) instead of docker/tls;
/// returns what it printed (the .env).
pub fn gen_env_into(dir: &std::path::Path) -> String {
    let out = std::process::Command::new("sh")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/../docker/gen-env.sh"))
        .env("TLS_DIR", dir)
        .output()
        .expect("sh runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("UTF-8")
}

/// docker/kafka-start.sh, which compose's Kafka runs.
fn kafka_start() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docker/kafka-start.sh")).unwrap()
}

/// The volumes compose mounts into `service`, as written.
pub fn mounts(service: &serde_yaml_ng::Value) -> Vec<&str> {
    service["volumes"]
        .as_sequence()
        .expect("volumes")
        .iter()
        .filter_map(|v| v.as_str())
        .collect()
}

#[test]
fn compose_services_use_exactly_the_variables_their_config_reads() {
    let doc = compose();
    let services = doc["services"].as_mapping().expect("services");
    let configs = [
        (
            "order-api",
            declared::<order_api::Config>(),
            required::<order_api::Config>(),
        ),
        (
            "inventory-service",
            declared::<inventory_service::Config>(),
            required::<inventory_service::Config>(),
        ),
        (
            "payment-service",
            declared::<payment_service::Config>(),
            required::<payment_service::Config>(),
        ),
        (
            "mock-gateway",
            declared::<mock_gateway::Config>(),
            required::<mock_gateway::Config>(),
        ),
        (
            "outbox-relay",
            declared::<outbox_relay::Config>(),
            required::<outbox_relay::Config>(),
        ),
    ];
    let secrets = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docker/gen-env.sh")).unwrap();
    for (name, vars, needed) in &configs {
        let svc = &services[&serde_yaml_ng::Value::from(*name)];
        assert!(svc.is_mapping(), "{name} missing from docker-compose.yml");
        let env: BTreeSet<String> = svc["environment"]
            .as_mapping()
            .unwrap_or_else(|| panic!("{name} has no environment"))
            .keys()
            .map(|k| k.as_str().expect("string key").to_owned())
            .collect();
        for key in &env {
            assert!(
                vars.contains(key),
                "{name}: compose sets {key}, which the service does not read"
            );
        }
        // The defaults point at 127.0.0.1, which is wrong inside a container.
        for must in [
            "DATABASE_URL",
            "OUTBOX_DATABASE_URLS",
            "KAFKA_BROKERS",
            "HTTP_ADDR",
            "ADMIN_ADDR",
            "GATEWAY_URL",
        ] {
            if vars.contains(must) {
                assert!(env.contains(must), "{name}: compose must set {must}");
            }
        }
        // Every secret is set, from .env (interpolated, required by
        // compose itself), never as a literal in the file.
        for must in needed {
            let value = svc["environment"][must.as_str()].as_str().unwrap_or_default();
            assert!(
                value.contains("${"),
                "{name}: compose must set {must} from .env, not {value:?}"
            );
            let from = value
                .split("${")
                .nth(1)
                .and_then(|v| v.split([':', '}']).next())
                .unwrap_or_default();
            assert!(
                secrets.contains(&format!("echo \"{from}=")),
                "{name}: {must} comes from {from}, which docker/gen-env.sh does not generate"
            );
        }
        assert!(svc["healthcheck"].is_mapping(), "{name} has no healthcheck");
        assert_eq!(svc["command"][0].as_str(), Some(*name), "{name} runs the wrong binary");
        // A healthy PostgreSQL, and Kafka with its ACLs in place.
        for (dep, condition) in [
            ("postgres", "service_healthy"),
            ("kafka-init", "service_completed_successfully"),
        ] {
            assert_eq!(
                svc["depends_on"][dep]["condition"].as_str(),
                Some(condition),
                "{name} must wait for {dep}"
            );
        }
    }
    let dockerfile = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../Dockerfile")).unwrap();
    for (name, _, _) in &configs {
        assert!(
            dockerfile.contains(&format!("-p {name}")),
            "Dockerfile does not build {name}"
        );
        assert!(
            dockerfile.contains(&format!("release/{name}")),
            "Dockerfile does not ship {name}"
        );
    }
}

#[test]
fn compose_creates_every_service_database_and_runs_kafka_in_kraft_mode() {
    let doc = compose();
    let init = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docker/postgres-init.sh")).unwrap();
    for db in ["orders", "inventory", "payments", "gateway"] {
        assert!(
            init.contains(&format!("CREATE DATABASE {db} OWNER ")),
            "init script misses {db}"
        );
    }
    let kafka = &doc["services"]["kafka"];
    assert_eq!(kafka["entrypoint"][1].as_str(), Some("/eo/kafka-start.sh"));
    assert!(mounts(kafka).contains(&"./docker/kafka-start.sh:/eo/kafka-start.sh:ro"));
    assert!(kafka_start().contains("process.roles=broker,controller\n"));
    assert_eq!(doc["services"]["postgres"]["image"].as_str(), Some("postgres:16"));
}

/// The `-c name=value` pairs compose passes to its PostgreSQL are exactly
/// the rows of docs/operations.md's "PostgreSQL settings for production"
/// marked `compose`, with the same values.
#[test]
fn compose_passes_postgres_the_settings_operations_md_lists() {
    let doc = compose();
    let args: Vec<&str> = doc["services"]["postgres"]["command"]
        .as_sequence()
        .expect("postgres has a command")
        .iter()
        .filter_map(|a| a.as_str())
        .collect();
    assert_eq!(args.first(), Some(&"postgres"));
    let mut passed = std::collections::BTreeMap::new();
    for pair in args[1..].chunks(2) {
        assert_eq!(pair[0], "-c", "{args:?}");
        let (name, value) = pair[1].split_once('=').expect("name=value");
        passed.insert(name.to_owned(), value.to_owned());
    }
    let ops = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/operations.md")).unwrap();
    let section = ops
        .split("## PostgreSQL settings for production")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("the section exists");
    let listed: std::collections::BTreeMap<String, String> = section
        .lines()
        .filter_map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            (cells.len() > 4 && cells[3] == "compose").then(|| {
                (
                    cells[1].trim_matches('`').to_owned(),
                    cells[2].trim_matches('`').to_owned(),
                )
            })
        })
        .collect();
    assert!(!listed.is_empty(), "no row marked compose");
    assert_eq!(passed, listed);
}

#[test]
fn compose_sends_traces_to_jaeger_and_prometheus_scrapes_every_service() {
    let doc = compose();
    let services = &doc["services"];
    // Jaeger receives OTLP/HTTP and shows its UI; every service exports to it.
    let jaeger = &services["jaeger"];
    assert!(jaeger["image"]
        .as_str()
        .unwrap_or_default()
        .starts_with("jaegertracing/all-in-one"));
    let ports: Vec<&str> = jaeger["ports"]
        .as_sequence()
        .expect("jaeger ports")
        .iter()
        .filter_map(|p| p.as_str())
        .collect();
    assert_eq!(ports, ["127.0.0.1:16686:16686"], "the UI only, on loopback");
    let prometheus_yml: serde_yaml_ng::Value = serde_yaml_ng::from_str(
        &std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docker/prometheus.yml")).unwrap(),
    )
    .expect("docker/prometheus.yml is YAML");
    let targets: BTreeSet<String> = prometheus_yml["scrape_configs"]
        .as_sequence()
        .expect("scrape_configs")
        .iter()
        .flat_map(|job| job["static_configs"].as_sequence().cloned().unwrap_or_default())
        .flat_map(|c| c["targets"].as_sequence().cloned().unwrap_or_default())
        .filter_map(|t| t.as_str().map(str::to_owned))
        .collect();
    for name in [
        "order-api",
        "inventory-service",
        "payment-service",
        "mock-gateway",
        "outbox-relay",
    ] {
        let env = &services[name]["environment"];
        assert_eq!(
            env["OTEL_EXPORTER_OTLP_ENDPOINT"].as_str(),
            Some("http://jaeger:4318"),
            "{name} must export spans to jaeger"
        );
        // The admin port, which nothing publishes.
        let port = env["ADMIN_ADDR"]
            .as_str()
            .and_then(|a| a.rsplit(':').next())
            .expect("ADMIN_ADDR");
        assert!(
            targets.contains(&format!("{name}-admin:{port}")),
            "prometheus does not scrape {name}-admin:{port} ({targets:?})"
        );
    }
    let mounts = mounts(&services["prometheus"]);
    assert!(
        mounts.contains(&"./docker/prometheus.yml:/etc/prometheus/prometheus.yml:ro"),
        "{mounts:?}"
    );
}

/// What a user needs is published, on 127.0.0.1 only: order-api, Jaeger's
/// UI, Prometheus, Grafana. PostgreSQL, Kafka and the internal services are on the
/// compose network alone; PostgreSQL's password comes from .env.
#[test]
fn compose_publishes_only_the_api_the_uis_and_kafkas_host_listener_on_loopback() {
    let doc = compose();
    let services = doc["services"].as_mapping().expect("services");
    let mut published = BTreeSet::new();
    for (name, svc) in services {
        let name = name.as_str().expect("service name");
        for port in svc["ports"].as_sequence().cloned().unwrap_or_default() {
            let port = port.as_str().expect("ports as strings");
            assert!(
                port.starts_with("127.0.0.1:"),
                "{name} publishes {port} beyond loopback"
            );
            published.insert(name.to_owned());
        }
    }
    assert_eq!(
        published,
        BTreeSet::from(["order-api", "jaeger", "prometheus", "grafana", "kafka"].map(str::to_owned))
    );
    // order-api publishes its API's port, not its admin port (health,
    // metrics, the API's description): Prometheus reaches that one on the
    // compose network.
    let api = &doc["services"]["order-api"];
    let port = |var: &str| {
        api["environment"][var]
            .as_str()
            .and_then(|a| a.rsplit(':').next())
            .map(str::to_owned)
            .expect(var)
    };
    let (http, admin) = (port("HTTP_ADDR"), port("ADMIN_ADDR"));
    assert_ne!(http, admin);
    assert_eq!(
        api["ports"][0].as_str(),
        Some(format!("127.0.0.1:{http}:{http}").as_str())
    );
    assert!(api["ports"][1].is_null(), "order-api publishes one port");
    // Kafka's host listener is advertised at the address it is published on,
    // so a tool on the host (cargo xtask dlq) reaches the broker itself.
    // It takes SASL/SCRAM over TLS only, as the compose network's does.
    let kafka = &doc["services"]["kafka"];
    let start = kafka_start();
    assert!(start.contains(": \"${KAFKA_HOST_PORT:=19092}\""));
    assert!(start.contains("HOST://127.0.0.1:$KAFKA_HOST_PORT\n"));
    assert_eq!(kafka["ports"][0].as_str(), Some("127.0.0.1:19092:19092"));
    assert!(start.contains("listener.security.protocol.map=CLIENT:SASL_SSL,HOST:SASL_SSL,CONTROLLER:SSL\n"));
    let password = doc["services"]["postgres"]["environment"]["POSTGRES_PASSWORD"]
        .as_str()
        .unwrap_or_default();
    assert!(password.starts_with("${POSTGRES_PASSWORD:?"), "{password}");
    assert!(
        doc["services"]["mock-gateway"]["environment"]["GATEWAY_ADMIN"].is_null(),
        "no fault switch in compose (release builds refuse it)"
    );
    for ignore in [".gitignore", ".dockerignore"] {
        let text = std::fs::read_to_string(format!("{}/../{ignore}", env!("CARGO_MANIFEST_DIR"))).unwrap();
        assert!(text.lines().any(|l| l.trim() == ".env"), "{ignore} must ignore .env");
    }
}

/// The state of a compose stack lives in named volumes (`down` then `up`
/// keeps orders, keys and the log); the image build caches its
/// dependencies (BuildKit cache mounts).
#[test]
fn compose_keeps_its_data_in_named_volumes_and_the_build_caches_dependencies() {
    let doc = compose();
    for (service, volume, path) in [
        ("postgres", "pgdata", "/var/lib/postgresql/data"),
        ("kafka", "kafkadata", "/var/lib/kafka/data"),
    ] {
        let mounts: Vec<&str> = doc["services"][service]["volumes"]
            .as_sequence()
            .map(|v| v.iter().filter_map(|m| m.as_str()).collect())
            .unwrap_or_default();
        assert!(
            mounts.contains(&format!("{volume}:{path}").as_str()),
            "{service}: {mounts:?}"
        );
        assert!(doc["volumes"][volume].is_null() && doc["volumes"].as_mapping().unwrap().contains_key(volume));
    }
    let start = kafka_start();
    assert!(start.contains(": \"${KAFKA_DATA:=/var/lib/kafka/data}\""));
    assert!(start.contains("log.dirs=$KAFKA_DATA\n"));
    let dockerfile = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../Dockerfile")).unwrap();
    assert!(
        dockerfile.starts_with("# syntax=docker/dockerfile:1"),
        "BuildKit syntax"
    );
    for cache in ["target=/usr/local/cargo/registry", "target=/src/target"] {
        assert!(dockerfile.contains(&format!("--mount=type=cache,{cache}")), "{cache}");
    }
}

/// The one-shot seed service: the stack's own image, after a healthy API and
/// inventory, running docker/seed.sh with the variables it reads — the
/// operator credential from .env.
#[test]
fn compose_seeds_stock_and_an_api_key_once_the_stack_is_up() {
    let doc = compose();
    let seed = &doc["services"]["seed"];
    assert_eq!(seed["image"], doc["x-service"]["image"], "the stack's own image");
    for dep in ["order-api", "inventory-service"] {
        assert_eq!(
            seed["depends_on"][dep]["condition"].as_str(),
            Some("service_healthy"),
            "{dep}"
        );
    }
    assert_eq!(seed["entrypoint"][1].as_str(), Some("/seed.sh"));
    assert_eq!(seed["restart"].as_str(), Some("no"), "one-shot");
    let script = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docker/seed.sh")).unwrap();
    for var in ["INVENTORY_URL", "INVENTORY_OPERATOR_KEY", "DATABASE_URL"] {
        assert!(script.contains(&format!("${{{var}")), "seed.sh reads {var}");
        assert!(!seed["environment"][var].is_null(), "compose sets {var} for the seed");
    }
    assert!(seed["environment"]["INVENTORY_OPERATOR_KEY"]
        .as_str()
        .unwrap_or_default()
        .starts_with("${INVENTORY_OPERATOR_KEY:?"));
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap();
    assert!(
        readme.contains("\"sku\":\"WIDGET\"") && script.contains("WIDGET"),
        "the README's order is for seeded stock"
    );
}

/// docker/seed.sh run as compose runs it, against a running stack (the
/// inventory's operator endpoint, order-api's `keys create`): the key it
/// prints places the README's order, which ends CONFIRMED.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_seed_script_makes_the_readmes_first_order_end_confirmed() {
    use e2e::stack::Service;
    let stack = crate::stack("seed").await;
    let bin_dir = e2e::stack::default_bin_dir().unwrap();
    let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap_or_default());
    let out = tokio::process::Command::new("sh")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/../docker/seed.sh"))
        .env("PATH", path)
        .env("INVENTORY_URL", stack.url(Service::Inventory))
        .env("INVENTORY_OPERATOR_KEY", &stack.secrets().operator)
        .env("DATABASE_URL", stack.db_url("orders"))
        .output()
        .await
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{log}");
    assert!(log.contains("API key for client demo-shop"), "{log}");
    // Standard output is the key alone: the README's `KEY=$(docker compose
    // run --rm -T seed)` takes it as it is.
    let key = String::from_utf8(out.stdout).unwrap();
    assert_eq!(key.lines().count(), 1, "one line, the key: {key:?}");
    let key = key.trim().to_owned();
    let http = reqwest::Client::new();
    let placed = http
        .post(format!("{}/orders", stack.url(Service::OrderApi)))
        .bearer_auth(&key)
        .header("Idempotency-Key", "6f1c1f8e-3c11-4a77-9a59-0d6c1b1d2a01")
        .json(&serde_json::json!({"sku": "WIDGET", "quantity": 2, "amount_cents": 2500, "card": "4242424242424242"}))
        .send()
        .await
        .unwrap();
    assert_eq!(placed.status(), 201);
    let id = placed.json::<serde_json::Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let end = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let status = loop {
        let order: serde_json::Value = http
            .get(format!("{}/orders/{id}", stack.url(Service::OrderApi)))
            .bearer_auth(&key)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let status = order["status"].as_str().unwrap_or_default().to_owned();
        if ["CONFIRMED", "CANCELLED"].contains(&status.as_str()) || std::time::Instant::now() > end {
            break status;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    assert_eq!(status, "CONFIRMED", "{log}");
    stack.shutdown(true).await.unwrap();
}
