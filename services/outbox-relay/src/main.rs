use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = outbox_relay::Config::parse();
    telemetry::init("outbox-relay");
    let _failpoints = fail::FailScenario::setup();
    let shutdown = runtime::shutdown::on_signal();
    outbox_relay::build(config).await?.run(shutdown).await
}
