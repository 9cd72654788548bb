use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = order_api::Config::parse();
    let _process = service_kit::init(order_api::NAME, &config.log);
    let app = order_api::build(config).await?;
    app.run(service_kit::shutdown::on_signal()).await
}
