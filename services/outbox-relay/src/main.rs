use clap::Parser;

fn main() -> anyhow::Result<()> {
    service_kit::run_main(serve())
}

async fn serve() -> anyhow::Result<()> {
    let config = outbox_relay::Config::parse();
    let _process = service_kit::init(outbox_relay::NAME, &config.log);
    let app = outbox_relay::build(config).await?;
    app.run(service_kit::shutdown::on_signal()).await
}
