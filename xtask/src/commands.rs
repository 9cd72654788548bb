//! One function per `cargo xtask` command (the ones with more than a line
//! to them); `main` only dispatches.

use e2e::demo::{self, Mix};
use e2e::interrupt::unless_interrupted;
use e2e::stack::Service;
use e2e::{Stack, StackOptions};

use crate::{cargo, lint, scenario, testrun, workspace_root, BenchArgs, ChaosArgs, DemoArgs};

/// `cargo xtask docs`: the committed API documents, regenerated.
pub fn docs() -> anyhow::Result<()> {
    for path in crate::documents::regenerate()? {
        println!("wrote {}", path.display());
    }
    Ok(())
}

/// `cargo xtask picture REPORT`: a chaos report's picture, drawn again.
pub fn picture(report: &std::path::Path) -> anyhow::Result<()> {
    let parsed: e2e::chaos::Report = serde_json::from_slice(&std::fs::read(report)?)?;
    let out = report.with_extension("svg");
    std::fs::write(&out, e2e::chaos::svg(&parsed))?;
    println!("wrote {}", out.display());
    Ok(())
}

/// `cargo xtask scenario`: the list.
pub fn list_scenarios() {
    for s in &scenario::ALL {
        println!("{:>2}  {}", s.n, s.title);
    }
    println!("\ncargo xtask scenario N tells one and runs its test.");
}

/// `cargo xtask test`: the gates first (a few minutes, mostly clippy's
/// check build), then the tests either way; either failing fails the
/// command.
pub fn test(args: &[String]) -> anyhow::Result<()> {
    let lint = lint::run(&workspace_root(), cargo);
    if let Err(e) = &lint {
        println!("{e:#}");
    }
    let code = testrun::run_tests(cargo(), args)?;
    if lint.is_err() {
        println!("lint: FAILED (its problems are printed before the tests)");
    }
    std::process::exit(if lint.is_err() { code.max(1) } else { code })
}

/// `cargo xtask chaos`: one run (or the catch matrix), its report, and the
/// verdict its switches ask for.
pub async fn chaos(args: ChaosArgs) -> anyhow::Result<()> {
    let ChaosArgs {
        orders,
        seed,
        clients,
        rate,
        fault_interval_ms,
        brokers,
        negative_control,
        layer_off,
        matrix,
        seeds,
        postgres_setting,
    } = args;
    let mut cfg = e2e::chaos::ChaosConfig::ci(seed);
    cfg.brokers = brokers;
    cfg.orders = orders;
    // Past `orders`, the clients go on (as in the test command's run) until
    // every fault kind and crash point has fired: a run is valid only then.
    cfg.max_orders = cfg.max_orders.max(orders);
    cfg.clients = clients;
    cfg.rate_per_sec = rate;
    cfg.fault_interval = std::time::Duration::from_millis(fault_interval_ms);
    cfg.quiesce_timeout = std::time::Duration::from_secs(300);
    cfg.negative_control = negative_control;
    cfg.layer_off = layer_off;
    cfg.postgres_settings = postgres_setting.join("\n");
    if matrix {
        return crate::chaos_matrix(cfg, seed, seeds).await;
    }
    let dir = workspace_root().join("target").join("chaos").join(format!(
        "seed-{seed}{}{}",
        if negative_control { "-negative" } else { "" },
        layer_off.map(|l| format!("-{}-off", l.name())).unwrap_or_default()
    ));
    cfg.report_dir = Some(dir.clone());
    let report = unless_interrupted(e2e::chaos::run(&cfg)).await?;
    println!("{}", e2e::chaos::markdown(&report));
    println!("report: {}/report.md and report.json", dir.display());
    if negative_control {
        anyhow::ensure!(
            !report.audit.double_charged.is_empty(),
            "negative control found no double charge"
        );
    } else if let Some(layer) = layer_off {
        anyhow::ensure!(
            report.caught() == Some(true),
            "{} off was not caught: \"{}\" held ({:?})",
            layer.name(),
            layer.expected().invariant,
            report.problems
        );
    } else {
        anyhow::ensure!(report.passed(), "chaos run failed: {:?}", report.problems);
    }
    Ok(())
}

/// `cargo xtask bench`: the saga's figures on a fresh stack (release builds).
pub async fn bench(args: BenchArgs) -> anyhow::Result<()> {
    let BenchArgs {
        window_secs,
        start_rate,
        trials,
        quick,
        instances,
        trace_cost,
        overload,
        pg_set,
        kafka_nodes,
        partitions,
        mix,
        prefill_rate,
        prefill_orders,
    } = args;
    if cfg!(debug_assertions) {
        // Measure release builds only, the driver included: re-run this command optimised.
        let status = cargo()
            .args(["run", "--quiet", "--release", "--package", "xtask", "--", "bench"])
            .args(["--window-secs", &window_secs.to_string()])
            .args(["--start-rate", &start_rate.to_string()])
            .args(["--trials", &trials.to_string()])
            .args(quick.then_some("--quick"))
            .args(["--instances", &instances.to_string()])
            .args(["--kafka-nodes", &kafka_nodes.to_string()])
            .args(["--partitions", &partitions.to_string()])
            .args(["--mix", &mix])
            .args(["--prefill-rate", &prefill_rate.to_string()])
            .args(["--prefill-orders", &prefill_orders.to_string()])
            .args(trace_cost.map(|r| format!("--trace-cost={r}")))
            .args(overload.map(|c| format!("--overload={c}")))
            .args(pg_set.iter().map(|(n, v)| format!("--pg-set={n}={v}")))
            .status()?;
        std::process::exit(status.code().unwrap_or(1));
    }
    if let Some(rate) = trace_cost {
        let opts = StackOptions::ephemeral("trace-cost")?;
        eprintln!("booting a fresh stack (logs in {})…", opts.run_dir.display());
        let mut stack = unless_interrupted(Stack::start(opts)).await?;
        let cost = unless_interrupted(e2e::bench::trace_cost::run(&mut stack, rate)).await;
        stack.shutdown(cost.is_ok()).await?;
        let cost = cost?;
        let dir = workspace_root().join("target").join("bench-results");
        std::fs::create_dir_all(&dir)?;
        let md = e2e::bench::trace_cost::markdown(&cost);
        std::fs::write(dir.join("trace-cost.json"), serde_json::to_vec_pretty(&cost)?)?;
        std::fs::write(dir.join("trace-cost.md"), &md)?;
        println!("{md}");
        return Ok(());
    }
    if let Some(capacity) = overload {
        let mut opts = StackOptions::ephemeral("overload")?;
        opts.postgres_socket = true;
        opts.extra_env
            .push((Service::Gateway, "GATEWAY_TOKENISE_PER_SEC".into(), "100000".into()));
        // So is order-api's allowance of new cards per client (four clients here).
        opts.extra_env
            .push((Service::OrderApi, "API_NEW_CARDS_PER_MIN".into(), "6000000".into()));
        eprintln!("booting a fresh stack (logs in {})…", opts.run_dir.display());
        let stack = unless_interrupted(Stack::start(opts)).await?;
        let client = e2e::driver::Client::new(&stack, e2e::bench::overload::CLIENT_TIMEOUT)?;
        let case = unless_interrupted(async {
            let load = e2e::bench::mix::Load::prepare(&stack, &client, e2e::bench::mix::Mix::realistic()).await?;
            e2e::bench::overload::run(&load, &stack.db_url("orders"), capacity).await
        })
        .await;
        stack.shutdown(case.is_ok()).await?;
        let case = case?;
        let dir = workspace_root().join("target").join("bench-results");
        std::fs::create_dir_all(&dir)?;
        let md = e2e::bench::overload::markdown(&case);
        std::fs::write(dir.join("overload.json"), serde_json::to_vec_pretty(&case)?)?;
        std::fs::write(dir.join("overload.md"), &md)?;
        println!("{md}");
        anyhow::ensure!(case.passed, "the overload case missed: {:?}", case.missed);
        return Ok(());
    }
    let cfg = e2e::bench::BenchConfig {
        window: std::time::Duration::from_secs(window_secs),
        start_rate,
        trials,
        quick,
        instances: instances.into(),
        postgres_settings: pg_set,
        mix: e2e::bench::mix::Mix::parse(&mix).map_err(anyhow::Error::msg)?,
        prefill: (prefill_rate > 0.0).then(|| e2e::bench::prefill::Prefill {
            rate: prefill_rate,
            ageing_secs: e2e::bench::prefill::DEFAULT_AGEING.as_secs(),
            body_orders: prefill_orders,
        }),
        ..Default::default()
    };
    let mut opts = StackOptions::ephemeral("bench")?;
    // The deployment's shape on one host: PostgreSQL over its Unix socket.
    opts.postgres_socket = true;
    opts.brokers = kafka_nodes;
    opts.partitions = partitions;
    // A provider's tokenise limit is set to the deployment's rate; the
    // mock's default (200/s per caller) would refuse a card per order.
    opts.extra_env
        .push((Service::Gateway, "GATEWAY_TOKENISE_PER_SEC".into(), "100000".into()));
    // So is order-api's allowance of new cards per client (four clients here).
    opts.extra_env
        .push((Service::OrderApi, "API_NEW_CARDS_PER_MIN".into(), "6000000".into()));
    eprintln!("booting a fresh stack (logs in {})…", opts.run_dir.display());
    let mut stack = unless_interrupted(Stack::start(opts)).await?;
    let figures = e2e::bench::run(&mut stack, &cfg).await;
    stack.shutdown(figures.is_ok()).await?;
    let figures = figures?;
    let dir = workspace_root().join("target").join("bench-results");
    std::fs::create_dir_all(&dir)?;
    let md = e2e::bench::markdown(&figures);
    std::fs::write(dir.join("e2e.json"), serde_json::to_vec_pretty(&figures)?)?;
    std::fs::write(dir.join("e2e.md"), &md)?;
    println!("{md}");
    println!("figures: {}/e2e.json and e2e.md", dir.display());
    Ok(())
}

/// `cargo xtask up`: the stack on the documented ports until ctrl-c.
pub async fn up(adopt: bool) -> anyhow::Result<()> {
    let mut opts = StackOptions::ephemeral("up")?;
    opts.adopt_databases = adopt;
    std::fs::remove_dir_all(&opts.run_dir).ok();
    opts.run_dir = workspace_root().join(".data");
    opts.db_prefix = String::new();
    opts.fixed_ports = true;
    opts.echo = true;
    opts.postgres_socket = true;
    // The databases outlive a stop, so do the secrets that key what
    // they store (card and request fingerprints).
    let secrets_file = workspace_root().join(".data/secrets.env");
    opts.secrets = std::fs::read_to_string(&secrets_file)
        .ok()
        .and_then(|t| e2e::stack::Secrets::from_env_file(&t));
    let stack = Stack::start(opts).await?;
    std::fs::write(&secrets_file, stack.secrets().to_env_file())?;
    std::fs::write(
        workspace_root().join(".data/kafka-admin.env"),
        stack.kafka_admin_env_file(),
    )?;
    let key = stack.create_api_key("shop-1").await?;
    std::fs::write(workspace_root().join(".data/api-key"), &key)?;
    eprintln!("API key of client shop-1 (also in .data/api-key): {key}");
    eprintln!(
        "the services' secrets (the operator's INVENTORY_OPERATOR_KEY and ORDER_API_OPERATOR_KEY, the gateway callers' keys): .data/secrets.env"
    );
    eprintln!(
        "Kafka as the operator (cargo xtask dlq, the admin principal over SASL/SCRAM and TLS): .data/kafka-admin.env"
    );
    eprintln!(
        "stack up: order-api http://127.0.0.1:8080, inventory :8081, gateway https://127.0.0.1:8083 (its CA: .data/tls/ca.pem), broker 127.0.0.1:9092; logs in .data/logs. ctrl-c stops."
    );
    eprintln!(
        "an order's journey (each step, each copy an inbox absorbed): http://127.0.0.1:9180/journey?order=<id> (user operator, password ORDER_API_OPERATOR_KEY)"
    );
    eprintln!(
        "admin endpoints (/health/ready, /metrics, /openapi.json): order-api :9180, inventory :9181, payment :9182, gateway :9183, relay :9184 (Prometheus text; queries in docs/observability.md)"
    );
    match std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT") {
        Ok(endpoint) => eprintln!("traces: exported over OTLP/HTTP to {endpoint}; trace ids are in every log line"),
        Err(_) => eprintln!(
            "traces: not exported (set OTEL_EXPORTER_OTLP_ENDPOINT, e.g. http://127.0.0.1:4318 for a local Jaeger); trace ids are in every log line"
        ),
    }
    stack.run_until_ctrl_c().await
}

/// `cargo xtask demo`: a mix of orders through a throw-away stack.
pub async fn demo(args: DemoArgs) -> anyhow::Result<()> {
    let DemoArgs {
        payable,
        declined,
        out_of_stock,
    } = args;
    let opts = StackOptions::ephemeral("demo")?;
    eprintln!("booting the stack (logs in {})…", opts.run_dir.display());
    let stack = unless_interrupted(Stack::start(opts)).await?;
    eprintln!("stack ready; placing {} orders…", payable + declined + out_of_stock);
    let outcome = unless_interrupted(demo::run(
        &stack,
        Mix {
            payable,
            declined,
            out_of_stock,
        },
    ))
    .await;
    let ok = match &outcome {
        Ok(o) => {
            println!("{}", o.summary());
            o.check_endings().map_err(|e| eprintln!("demo FAILED: {e}")).is_ok()
        }
        Err(e) => {
            eprintln!("demo FAILED: {e:#}");
            false
        }
    };
    if !ok {
        eprintln!("logs kept in {}", stack.options().run_dir.display());
    }
    stack.shutdown(ok).await?;
    anyhow::ensure!(ok, "the demo found a problem");
    println!("demo passed");
    Ok(())
}
