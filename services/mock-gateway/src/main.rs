use clap::Parser;

fn main() -> anyhow::Result<()> {
    service_kit::run_main(serve())
}

async fn serve() -> anyhow::Result<()> {
    let config = mock_gateway::Config::parse();
    let _process = service_kit::init(mock_gateway::NAME, &config.log);
    let app = mock_gateway::build(config).await?;
    app.run(service_kit::shutdown::on_signal()).await
}
