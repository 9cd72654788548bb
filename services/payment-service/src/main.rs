use clap::Parser;

fn main() -> anyhow::Result<()> {
    service_kit::run_main(serve())
}

async fn serve() -> anyhow::Result<()> {
    let config = payment_service::Config::parse();
    let _process = service_kit::init(payment_service::NAME, &config.log);
    let app = payment_service::build(config).await?;
    app.run(service_kit::shutdown::on_signal()).await
}
