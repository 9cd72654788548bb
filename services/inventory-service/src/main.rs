use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = inventory_service::Config::parse();
    let _process = service_kit::init(inventory_service::NAME, &config.log);
    let app = inventory_service::build(config).await?;
    app.run(service_kit::shutdown::on_signal()).await
}
