use clap::{Parser, Subcommand};

/// This binary allocates with mimalloc (many small, short-lived
/// allocations: rows, JSON bodies, messages); the benches were measured
/// with it, and docs/results/e2e-bench.md says what it did and did not
/// change. Chosen here, not in a library, so a reader's binary chooses its own.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// order-api: serves the API and runs the saga.
#[derive(Parser)]
#[command(name = "order-api", about = "Orders HTTP API and saga orchestrator")]
#[command(after_help = "Operator commands (they need only DATABASE_URL): \
                        `order-api review --help`, `order-api keys --help`.")]
struct Serve {
    #[command(flatten)]
    config: order_api::Config,
}

/// `order-api <command>`: an operator's action against the service's
/// database. It needs the database and nothing else: no gateway
/// credential, no fingerprint key, no broker.
#[derive(Parser)]
#[command(name = "order-api")]
#[command(mut_arg("url", |a| a.default_value(order_api::DEFAULT_DATABASE_URL)))]
struct Operator {
    #[command(subcommand)]
    command: order_api::admin::Command,
    #[command(flatten)]
    db: service_kit::DbArgs,
    #[command(flatten)]
    log: service_kit::LogArgs,
}

fn main() -> anyhow::Result<()> {
    service_kit::run_main(serve())
}

async fn serve() -> anyhow::Result<()> {
    let first = std::env::args().nth(1).unwrap_or_default();
    if order_api::admin::Command::has_subcommand(&first) {
        let op = Operator::parse();
        let _process = service_kit::init(order_api::NAME, &op.log);
        return order_api::admin::run(op.command, &op.db).await;
    }
    let cli = Serve::parse();
    let _process = service_kit::init(order_api::NAME, &cli.config.log);
    let app = order_api::build(cli.config).await?;
    app.run(service_kit::shutdown::on_signal()).await
}
