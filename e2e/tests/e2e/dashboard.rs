//! The Grafana dashboard compose provisions (docker/grafana/): its JSON is
//! what Grafana loads, its data source is compose's Prometheus, and every
//! panel's PromQL, run by a real Prometheus (Debian's package) scraping a
//! running stack with traffic, returns data.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use e2e::demo::{self, Mix};
use e2e::stack::Service;
use serde_json::Value;

const DASHBOARD: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../docker/grafana/dashboards/effectively-once.json"
);

/// The panels' queries that may rightly be empty after a calm run: what
/// only a fault makes happen (a dead letter moved, a credential refused, a
/// relay publish failing, a row re-sent by a deadline, a reconciler's
/// action). An inbox miss is not among them: the test republishes a fact
/// under a new id to make one. Their panels have other queries that must
/// return data.
const QUIET_ON_A_CALM_RUN: [&str; 7] = [
    "http_idempotent_in_flight_total",
    "consumer_dead_lettered_total",
    "gateway_credential_refusals_total",
    "relay_publish_errors_total",
    "relay_resent_total",
    "saga_deadline_actions_total",
    "payment_reconciliations_total",
];

fn dashboard() -> Value {
    serde_json::from_str(&std::fs::read_to_string(DASHBOARD).unwrap()).expect("the dashboard is JSON")
}

fn yaml(path: &str) -> serde_yaml_ng::Value {
    let path = format!("{}/../{path}", env!("CARGO_MANIFEST_DIR"));
    serde_yaml_ng::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// (panel title, [(refId, expr)]) of every panel.
fn panels(dashboard: &Value) -> Vec<(String, Vec<(String, String)>)> {
    dashboard["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .map(|p| {
            let targets = p["targets"]
                .as_array()
                .expect("targets")
                .iter()
                .map(|t| {
                    (
                        t["refId"].as_str().expect("refId").to_owned(),
                        t["expr"].as_str().expect("expr").to_owned(),
                    )
                })
                .collect();
            (p["title"].as_str().expect("title").to_owned(), targets)
        })
        .collect()
}

/// The dashboard as Grafana 11 loads it (schema version 39, a uid, panels
/// placed on the 24-column grid without overlap, each query with a unique
/// refId on the provisioned data source), compose mounts it and its
/// provisioning, and every metric a panel reads is one the services describe.
#[test]
fn the_dashboard_is_provisioned_and_reads_metrics_that_exist() {
    let dash = dashboard();
    assert_eq!(dash["schemaVersion"].as_u64(), Some(39), "Grafana 11's schema version");
    assert_eq!(dash["uid"].as_str(), Some("effectively-once"));
    let datasources = yaml("docker/grafana/provisioning/datasources/prometheus.yml");
    let source = &datasources["datasources"][0];
    assert_eq!(source["type"].as_str(), Some("prometheus"));
    assert_eq!(
        source["url"].as_str(),
        Some("http://prometheus:9090"),
        "compose's Prometheus"
    );
    let uid = source["uid"].as_str().expect("data source uid");
    let described = crate::metrics::described();
    let mut cells = BTreeSet::new();
    let mut ids = BTreeSet::new();
    for p in dash["panels"].as_array().expect("panels") {
        let title = p["title"].as_str().expect("title");
        assert!(ids.insert(p["id"].as_u64().expect("id")), "{title}: id twice");
        assert_eq!(p["type"].as_str(), Some("timeseries"), "{title}");
        assert_eq!(p["datasource"]["uid"].as_str(), Some(uid), "{title}");
        assert!(
            !p["description"].as_str().unwrap_or_default().is_empty(),
            "{title}: say what it shows"
        );
        let g = &p["gridPos"];
        let (x, y, w, h) = (
            g["x"].as_u64().unwrap(),
            g["y"].as_u64().unwrap(),
            g["w"].as_u64().unwrap(),
            g["h"].as_u64().unwrap(),
        );
        assert!(x + w <= 24 && w > 0 && h > 0, "{title}: off the grid");
        for cx in x..x + w {
            for cy in y..y + h {
                assert!(cells.insert((cx, cy)), "{title} overlaps another panel");
            }
        }
        let mut refs = BTreeSet::new();
        for t in p["targets"].as_array().expect("targets") {
            assert!(refs.insert(t["refId"].as_str().expect("refId")), "{title}: refId twice");
            assert_eq!(t["datasource"]["uid"].as_str(), Some(uid), "{title}");
            let expr = t["expr"].as_str().expect("expr");
            let read = crate::metrics::metrics_read(expr);
            assert!(!read.is_empty(), "{title}: {expr} reads no metric");
            for name in read {
                assert!(
                    described.contains(name.as_str()),
                    "{title}: {expr}: {name} is not a metric"
                );
            }
        }
    }
    let provider = yaml("docker/grafana/provisioning/dashboards/effectively-once.yml");
    let path = provider["providers"][0]["options"]["path"]
        .as_str()
        .expect("dashboards path");
    let compose = crate::compose::compose();
    let grafana = &compose["services"]["grafana"];
    let mounts = crate::compose::mounts(grafana);
    assert!(
        mounts.contains(&format!("./docker/grafana/dashboards:{path}:ro").as_str()),
        "{mounts:?}"
    );
    assert!(
        mounts.contains(&"./docker/grafana/provisioning:/etc/grafana/provisioning:ro"),
        "{mounts:?}"
    );
    let password = grafana["environment"]["GF_SECURITY_ADMIN_PASSWORD"]
        .as_str()
        .unwrap_or_default();
    assert!(password.starts_with("${GRAFANA_ADMIN_PASSWORD:?"), "{password}");
}

/// Runs `expr` at Prometheus now; the number of series it returns.
async fn series(http: &reqwest::Client, prometheus: &str, expr: &str) -> usize {
    // Grafana's own variables, as it would fill them at a 1 s scrape.
    let expr = expr.replace("$__rate_interval", "1m");
    let body: Value = http
        .get(format!("{prometheus}/api/v1/query"))
        .query(&[("query", expr.as_str())])
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(body["status"].as_str(), Some("success"), "{expr}: {body}");
    body["data"]["result"].as_array().map_or(0, Vec::len)
}

/// Every panel of the dashboard shows data from a stack with traffic: a
/// Prometheus of the test's own scrapes the five services every second
/// while orders of each kind run and copies of recent messages are put
/// back on the topics (duplicates for every inbox to absorb); then each
/// panel's queries run as Grafana would send them. Every query returns at
/// least one series, except the fault-only ones listed in
/// [`QUIET_ON_A_CALM_RUN`], and even then their panel returns some.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_panel_returns_data_from_a_running_stack() {
    let stack = crate::stack("dashboard").await;
    let targets: Vec<(&str, String)> = Service::ALL
        .into_iter()
        .filter(|s| *s != Service::Broker)
        .map(|s| (s.name(), stack.admin_url(s).trim_start_matches("http://").to_owned()))
        .collect();
    let prometheus = testkit::promtool::Server::start(&targets).expect("prometheus starts");
    let outcome = demo::run(
        &stack,
        Mix {
            payable: 12,
            declined: 2,
            out_of_stock: 2,
        },
    )
    .await
    .expect("demo runs");
    outcome.check_endings().expect("endings");
    for topic in contract::topics::ALL {
        e2e::chaos::copy_recent(&stack, topic, 3).await.expect("copies");
    }
    // A retried request at each key layer, so that its panel has data:
    // a client's POST again (layer 1), a charge again at the gateway
    // under its key, as payment-service would send it (layer 4).
    replay_at_each_key_layer(&stack).await;
    // And one fact again under a new event id on each topic: past every
    // inbox, stopped by its business key, counted as an inbox miss.
    for topic in contract::topics::ALL {
        e2e::chaos::republish_as_new(&stack, topic).await.expect("republished");
    }
    let http = reqwest::Client::new();
    let absorbed = "sum by (consumer) (consumer_duplicates_absorbed_total)";
    let deadline = Instant::now() + Duration::from_secs(60);
    while series(&http, prometheus.url(), absorbed).await < 3 {
        assert!(
            Instant::now() < deadline,
            "the three consumers' absorbed copies never reached Prometheus: {}",
            prometheus.log()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    // Lag and dead-letter gauges refresh every 5 s; a rate wants two samples.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let mut empty = Vec::new();
    for (title, queries) in panels(&dashboard()) {
        let mut panel_series = 0;
        for (ref_id, expr) in queries {
            let n = series(&http, prometheus.url(), &expr).await;
            panel_series += n;
            let quiet = crate::metrics::metrics_read(&expr)
                .iter()
                .any(|m| QUIET_ON_A_CALM_RUN.contains(&m.as_str()));
            if n == 0 && !quiet {
                empty.push(format!("{title} / {ref_id}: {expr}"));
            }
        }
        if panel_series == 0 {
            empty.push(format!("{title}: no query returned data"));
        }
    }
    assert!(empty.is_empty(), "queries without data:\n{}", empty.join("\n"));
    drop(prometheus);
    stack.shutdown(true).await.unwrap();
}

/// One request sent twice under its Idempotency-Key at order-api and at
/// the gateway: each is answered the second time from its stored answer.
async fn replay_at_each_key_layer(stack: &e2e::Stack) {
    use e2e::driver::{new_key, Client, OrderRequest, GOOD_CARD};
    let client = Client::new(stack, Duration::from_secs(5)).unwrap();
    let order = OrderRequest {
        sku: "WIDGET".into(),
        quantity: 1,
        amount_cents: 100,
        card: GOOD_CARD.into(),
    };
    let key = new_key();
    for replayed in [false, true] {
        let posted = client.post_order(&key, &order).await.unwrap();
        assert_eq!(posted.replayed, replayed, "{}", posted.body);
    }
    let http = stack.http_client(Duration::from_secs(5)).unwrap();
    let gateway = stack.url(Service::Gateway);
    let secrets = stack.secrets();
    let token: Value = http
        .post(format!("{gateway}/v1/tokens"))
        .bearer_auth(&secrets.order_api_gateway)
        .json(&serde_json::json!({"card": GOOD_CARD}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let charge = serde_json::json!({
        "order_id": uuid::Uuid::new_v4(),
        "amount_cents": 100,
        "card_token": token["token"],
    });
    let key = new_key();
    for replayed in [false, true] {
        let r = http
            .post(format!("{gateway}/v1/charges"))
            .bearer_auth(&secrets.payment_gateway)
            .header("idempotency-key", &key)
            .json(&charge)
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "{}", r.status());
        assert_eq!(r.headers().contains_key("idempotent-replayed"), replayed);
    }
}
