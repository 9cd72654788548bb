use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = mock_gateway::Config::parse();
    telemetry::init("mock-gateway");
    let shutdown = runtime::shutdown::on_signal();
    mock_gateway::build(config).await?.run(shutdown).await
}
