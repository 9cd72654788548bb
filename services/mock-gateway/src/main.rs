use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = mock_gateway::Config::parse();
    let _process = service_kit::init(mock_gateway::NAME, &config.log);
    let app = mock_gateway::build(config).await?;
    app.run(service_kit::shutdown::on_signal()).await
}
