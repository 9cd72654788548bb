use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = inventory_service::Config::parse();
    telemetry::init("inventory-service");
    let _failpoints = fail::FailScenario::setup();
    let shutdown = runtime::shutdown::on_signal();
    inventory_service::build(config).await?.run(shutdown).await
}
