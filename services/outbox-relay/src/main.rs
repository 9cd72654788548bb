use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = outbox_relay::Config::parse();
    let _process = service_kit::init(outbox_relay::NAME, &config.log);
    let app = outbox_relay::build(config).await?;
    app.run(service_kit::shutdown::on_signal()).await
}
