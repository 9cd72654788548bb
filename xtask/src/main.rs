//! `cargo xtask <command>`: run the tests, the stack, the demo.

/// The bench's load driver runs in this process: the same allocator as the
/// services it measures (docs/results/e2e-bench.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod commands;
mod documents;
mod lint;
mod scenario;
mod testrun;

use std::path::PathBuf;
use std::process::Command;

use anyhow::Context;
use clap::builder::TypedValueParser as _;
use clap::{Parser, Subcommand};
use e2e::interrupt::unless_interrupted;

#[derive(Parser)]
#[command(name = "xtask", about = "effectively-once developer commands")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Install what is missing (PostgreSQL, Apache Kafka), build the services and run every test
    /// of the workspace (the README's test command, also what CI runs).
    Test {
        /// Extra arguments for `cargo test` (e.g. a test name filter).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// The style and layout gates: `cargo fmt --check`, clippy with warnings
    /// denied, rustdoc with broken intra-doc links denied, and the layout
    /// rules over `cargo metadata` (no production crate on test support, no
    /// dev-dependency cycle, no file over 600 lines, README part table =
    /// members, docs/design.md's crate graph). Part of `cargo xtask test`.
    Lint,
    /// Start the broker and every service on the documented ports
    /// (databases orders, inventory, payments, gateway; data in .data/). Ctrl-c stops.
    Up {
        /// Take over existing databases of those names that `up` did not
        /// make (their owner and grants change); without it they are refused.
        #[arg(long)]
        adopt: bool,
    },
    /// The chaos suite: kill services mid-flow, inject faults and duplicates,
    /// then check every invariant. Reports go to target/chaos/seed-S/.
    Chaos(ChaosArgs),
    /// The saga's throughput and latency on one fresh stack (release build),
    /// beside the broker's and the database's ceilings. About 40 to 50 minutes with the default
    /// prefill (`--quick`: fewer trials);
    /// figures go to target/bench-results/e2e.json and e2e.md.
    Bench(BenchArgs),
    /// Tell one failure scenario of docs/scenarios.md (1..=28) — what is
    /// injected, which layer acts, what is checked — and run its test.
    /// Without a number: list them.
    Scenario {
        /// The scenario's number.
        #[arg(value_parser = clap::value_parser!(u8).range(1..=scenario::ALL.len() as i64))]
        n: Option<u8>,
    },
    /// List or replay the dead letters of a topic (e.g. inventory.commands),
    /// as an operator: the brokers' `admin` principal (under `cargo xtask
    /// up`, its settings are in .data/kafka-admin.env: `set -a; .
    /// .data/kafka-admin.env; set +a` first).
    Dlq {
        #[command(subcommand)]
        action: DlqAction,
        #[command(flatten)]
        kafka: kafka::KafkaArgs,
    },
    /// Boot a throw-away stack, run a mix of orders through it, print a
    /// summary and exit non-zero if any invariant is broken.
    Demo(DemoArgs),
    /// Regenerate the committed API documents from the code: docs/openapi
    /// (one OpenAPI document per HTTP service) and docs/contract (the
    /// AsyncAPI document and the message schemas). The tests only compare.
    Docs,
    /// Draw a chaos report's picture again from its report.json (e.g. a
    /// committed one under docs/results), beside it as NAME.svg.
    Picture {
        /// A chaos run's report.json.
        report: std::path::PathBuf,
    },
}

/// `cargo xtask chaos`'s arguments.
#[derive(clap::Args)]
pub struct ChaosArgs {
    /// Orders to place.
    #[arg(long, default_value_t = 300)]
    pub orders: usize,
    /// Seed of the order mix, the keys and the fault schedule.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Concurrent clients.
    #[arg(long, default_value_t = 8)]
    pub clients: usize,
    /// Orders started per second.
    #[arg(long, default_value_t = 6.0)]
    pub rate: f64,
    /// Pause between faults, in milliseconds.
    #[arg(long, default_value_t = 800)]
    pub fault_interval_ms: u64,
    /// Kafka nodes: 3 is a replicated cluster (replication factor 3,
    /// min.insync.replicas 2), 1 a single broker.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=3))]
    pub brokers: u32,
    /// Run the negative control (payment-service without deduplication):
    /// succeeds only if the checker finds double charges.
    #[arg(long)]
    pub negative_control: bool,
    /// Switch one layer of deduplication off (test builds only): succeeds
    /// only if the run fails on the invariant that layer protects.
    #[arg(long, value_enum)]
    pub layer_off: Option<e2e::chaos::LayerOff>,
    /// The catch matrix instead: the ordinary run and every switch under
    /// `--seeds` seeds (SEED, SEED+1, …), one after another; succeeds
    /// only if every switch is caught and every ordinary run passes.
    /// Cells go to target/chaos/matrix/ (matrix.md, matrix.json).
    #[arg(long, conflicts_with_all = ["negative_control", "layer_off"])]
    pub matrix: bool,
    /// Seeds of the matrix.
    #[arg(long, default_value_t = 5, requires = "matrix")]
    pub seeds: u64,
    /// A line appended to the run's own PostgreSQL settings, e.g.
    /// `synchronous_commit=off` (a removal: the run must then fail).
    #[arg(long, value_name = "SETTING")]
    pub postgres_setting: Vec<String>,
}

/// `cargo xtask bench`'s arguments.
#[derive(clap::Args)]
pub struct BenchArgs {
    /// Seconds per sustained-rate trial.
    #[arg(long, default_value_t = 60)]
    pub window_secs: u64,
    /// First arrival rate tried, orders per second.
    #[arg(long, default_value_t = 100.0)]
    pub start_rate: f64,
    /// Trials of the capacity search at most.
    #[arg(long, default_value_t = 20)]
    pub trials: usize,
    /// Only the ceilings and the capacity search (to try settings).
    #[arg(long)]
    pub quick: bool,
    /// Kafka nodes: 1, or 3 (replication factor 3, min ISR 2).
    #[arg(long, default_value_t = 1, value_parser = clap::builder::PossibleValuesParser::new(["1", "3"]).map(|s| s.parse::<u32>().unwrap_or(1)))]
    pub kafka_nodes: u32,
    /// Partitions of each topic (`KAFKA_PARTITIONS`).
    #[arg(long, default_value_t = kafka::PARTITIONS, value_parser = clap::value_parser!(i32).range(1..=1_000))]
    pub partitions: i32,
    /// The orders: `realistic` (1,000 SKUs, a card per order, 10 %
    /// cancelled and refunded, 4 API keys) or `single` (one SKU, one card,
    /// one key: the earlier benches' shape).
    #[arg(long, default_value = "realistic", value_parser = ["realistic", "single"])]
    pub mix: String,
    /// Orders per second whose prefilled rows age out during the run (0: no
    /// prefill; the tables hold only the run's orders).
    #[arg(long, default_value_t = 500.0)]
    pub prefill_rate: f64,
    /// Orders' worth of prefilled rows within retention.
    #[arg(long, default_value_t = 500_000)]
    pub prefill_orders: u64,
    /// Instances of each consumer service (inventory, payment, order-api's
    /// saga) in its consumer group; the report gives each one's handled count.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=4))]
    pub instances: u16,
    /// Instead: what tracing costs, one run in three modes (OpenTelemetry
    /// disabled, spans without export, spans exported) at this many
    /// orders/s; figures to target/bench-results/trace-cost.*.
    #[arg(long, value_name = "RATE")]
    pub trace_cost: Option<f64>,
    /// Instead: the overload case against this capacity (orders/s, from a
    /// search): half of it, three times it for 60 s, half again, from
    /// careful clients; figures to target/bench-results/overload.*.
    #[arg(long, value_name = "CAPACITY")]
    pub overload: Option<f64>,
    /// A PostgreSQL setting for this run, `name=value` (repeatable;
    /// applied with ALTER SYSTEM and reset after; not those needing a restart).
    #[arg(long = "pg-set", value_name = "NAME=VALUE", value_parser = e2e::bench::pg_settings::parse)]
    pub pg_set: Vec<(String, String)>,
}

/// `cargo xtask demo`'s arguments.
#[derive(clap::Args)]
pub struct DemoArgs {
    /// Payable orders.
    #[arg(long, default_value_t = 24)]
    pub payable: usize,
    /// Orders with the declined card.
    #[arg(long, default_value_t = 3)]
    pub declined: usize,
    /// Orders for more stock than exists.
    #[arg(long, default_value_t = 3)]
    pub out_of_stock: usize,
}

#[derive(Subcommand)]
enum DlqAction {
    /// Print every dead letter of TOPIC (from TOPIC.dlq) with its error.
    List {
        /// The original topic.
        topic: String,
    },
    /// Republish the dead letters of TOPIC not replayed before onto TOPIC.
    Replay {
        /// The original topic.
        topic: String,
    },
}

fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(workspace_root());
    cmd
}

fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

/// Debug builds carry the named crash points of the chaos suite (the `fail`
/// crate); they are inert unless `FAILPOINTS` is set. Tests and service
/// binaries are built with the same features so one build serves both.
/// Release builds leave them out.
const FAILPOINT_FEATURES: &str =
    "order-api/failpoints,outbox-relay/failpoints,inventory-service/failpoints,payment-service/failpoints,mock-gateway/failpoints";

/// Builds the service binaries (the same profile as this xtask).
fn build_services() -> anyhow::Result<()> {
    let mut cmd = cargo();
    cmd.arg("build");
    for bin in [
        "order-api",
        "outbox-relay",
        "inventory-service",
        "payment-service",
        "mock-gateway",
    ] {
        cmd.args(["-p", bin]);
    }
    if cfg!(debug_assertions) {
        cmd.args(["--features", FAILPOINT_FEATURES]);
    } else {
        cmd.arg("--release");
    }
    let status = cmd.status().context("running cargo build")?;
    anyhow::ensure!(status.success(), "building the services failed");
    Ok(())
}

/// `cargo xtask chaos --matrix`: every cell in turn, the table as it grows.
async fn chaos_matrix(mut cfg: e2e::chaos::ChaosConfig, first: u64, n: u64) -> anyhow::Result<()> {
    use e2e::chaos::matrix;
    let dir = workspace_root().join("target").join("chaos").join("matrix");
    std::fs::create_dir_all(&dir)?;
    cfg.report_dir = Some(dir.clone());
    let seeds: Vec<u64> = (first..first + n).collect();
    let mut done = Vec::new();
    let cells = unless_interrupted(async {
        Ok(matrix::run(&cfg, &seeds, |cell| {
            done.push(cell.clone());
            println!(
                "matrix: seed {} {}: {}",
                cell.seed,
                cell.layer_off.map_or("ordinary", e2e::chaos::LayerOff::name),
                if cell.ok { "ok" } else { "NOT OK" }
            );
            let _ = std::fs::write(dir.join("matrix.md"), matrix::markdown(&done));
            let _ = std::fs::write(
                dir.join("matrix.json"),
                serde_json::to_vec_pretty(&done).unwrap_or_default(),
            );
        })
        .await)
    })
    .await?;
    println!("{}", matrix::markdown(&cells));
    println!("cells: {}/matrix.md and matrix.json", dir.display());
    let bad: Vec<String> = cells
        .iter()
        .filter(|c| !c.ok)
        .map(|c| {
            format!(
                "seed {} {}",
                c.seed,
                c.layer_off.map_or("ordinary", e2e::chaos::LayerOff::name)
            )
        })
        .collect();
    anyhow::ensure!(bad.is_empty(), "cells not as they must be: {bad:?}");
    Ok(())
}

fn run_scenario(n: u8) -> anyhow::Result<i32> {
    let s = scenario::get(n).context("no such scenario")?;
    println!("Scenario {n}: {}\n", s.title);
    println!("  injected: {}", s.injected);
    println!("  acts:     {}", s.acts);
    println!("  checked:  {}", s.checked);
    let test = &s.test;
    println!(
        "  test:     {} ({}{})\n",
        test.name,
        test.package,
        test.target
            .map(|t| format!(", tests/{t}"))
            .unwrap_or_else(|| ", unit test".into())
    );
    let mut cmd = cargo();
    cmd.args(["test", "--quiet", "-p", test.package]);
    if test.package == "e2e" {
        // The stack runs the service binaries, built with their crash points.
        build_services()?;
    } else if [
        "order-api",
        "inventory-service",
        "payment-service",
        "mock-gateway",
        "kafka",
        "effectively-once-outbox",
    ]
    .contains(&test.package)
    {
        cmd.args(["--features", "failpoints"]);
    }
    match test.target {
        Some(target) => cmd.args(["--test", target]),
        None => cmd.arg("--lib"),
    };
    // A filter that matches no test (renamed, removed) makes cargo exit 0:
    // counted below, it is a failure, not a pass.
    cmd.args(["--", test.name, "--nocapture"]);
    let run = testrun::run_counted(cmd).context("running cargo test")?;
    if run.exit_code() != 0 {
        println!("\nScenario {n} FAILED: see the test output above");
        Ok(run.exit_code())
    } else if run.passed == 0 {
        println!("\nScenario {n} FAILED: no test named {} ran", test.name);
        Ok(1)
    } else {
        println!("\nScenario {n} held: {}", s.checked);
        Ok(0)
    }
}

async fn dlq(action: &DlqAction, brokers: &kafka::KafkaArgs) -> anyhow::Result<()> {
    match action {
        DlqAction::List { topic } => {
            let letters = kafka::dlq::list(brokers, topic)?;
            for l in &letters {
                println!(
                    "{}:{} key={} consumer={} error={}\n    {}",
                    l.partition,
                    l.offset,
                    l.key.as_deref().unwrap_or("-"),
                    l.consumer.as_deref().unwrap_or("-"),
                    l.error.as_deref().unwrap_or("-"),
                    String::from_utf8_lossy(&l.payload)
                        .chars()
                        .take(200)
                        .collect::<String>()
                );
            }
            println!("{} dead letters on {topic}.dlq", letters.len());
        }
        DlqAction::Replay { topic } => {
            let n = kafka::dlq::replay(brokers, topic).await?;
            println!("replayed {n} dead letters onto {topic}");
        }
    }
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        // Commands that need no database, broker or build.
        Cmd::Docs => commands::docs(),
        Cmd::Picture { report } => commands::picture(&report),
        Cmd::Lint => lint::run(&workspace_root(), cargo),
        Cmd::Dlq { action, kafka } => dlq(&action, &kafka).await,
        Cmd::Scenario { n: None } => {
            commands::list_scenarios();
            Ok(())
        }
        command => {
            testkit::postgres::ensure().await?;
            testkit::broker::ensure()?;
            build_services()?;
            match command {
                Cmd::Chaos(args) => commands::chaos(args).await,
                Cmd::Test { args } => commands::test(&args),
                Cmd::Scenario { n: Some(n) } => std::process::exit(run_scenario(n)?),
                Cmd::Bench(args) => commands::bench(args).await,
                Cmd::Up { adopt } => commands::up(adopt).await,
                Cmd::Demo(args) => commands::demo(args).await,
                Cmd::Docs | Cmd::Picture { .. } | Cmd::Lint | Cmd::Dlq { .. } | Cmd::Scenario { n: None } => {
                    unreachable!("handled above")
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    /// Every scenario docs/scenarios.md lists can be asked for by its
    /// number, and none past the last (the parser once stopped at 26 of 27).
    #[test]
    fn every_listed_scenario_number_parses_and_the_next_does_not() {
        let n = super::scenario::ALL.len();
        for k in 1..=n {
            assert!(
                super::Cli::try_parse_from(["xtask", "scenario", &k.to_string()]).is_ok(),
                "scenario {k}"
            );
        }
        assert!(super::Cli::try_parse_from(["xtask", "scenario", &(n + 1).to_string()]).is_err());
    }
}
