use clap::Parser;

/// order-api: serves the API and runs the saga; with a subcommand, an
/// operator's action against its database.
#[derive(Parser)]
#[command(name = "order-api", about = "Orders HTTP API and saga orchestrator")]
struct Cli {
    #[command(subcommand)]
    command: Option<order_api::admin::Command>,
    #[command(flatten)]
    config: order_api::Config,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let _process = service_kit::init(order_api::NAME, &cli.config.log);
    match cli.command {
        Some(command) => order_api::admin::run(command, &cli.config).await,
        None => {
            let app = order_api::build(cli.config).await?;
            app.run(service_kit::shutdown::on_signal()).await
        }
    }
}
