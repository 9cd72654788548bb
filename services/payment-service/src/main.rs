use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = payment_service::Config::parse();
    telemetry::init("payment-service");
    let _failpoints = fail::FailScenario::setup();
    let shutdown = runtime::shutdown::on_signal();
    payment_service::build(config).await?.run(shutdown).await
}
