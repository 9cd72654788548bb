use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = order_api::Config::parse();
    telemetry::init("order-api");
    let _failpoints = fail::FailScenario::setup();
    let shutdown = runtime::shutdown::on_signal();
    let app = order_api::build(config).await?;
    app.run(shutdown).await
}
