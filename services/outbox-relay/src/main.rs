use clap::Parser;

/// This binary allocates with mimalloc (many small, short-lived
/// allocations: rows, JSON bodies, messages); the benches were measured
/// with it, and docs/results/e2e-bench.md says what it did and did not
/// change. Chosen here, not in a library, so a reader's binary chooses its own.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> anyhow::Result<()> {
    service_kit::run_main(serve())
}

async fn serve() -> anyhow::Result<()> {
    let config = outbox_relay::Config::parse();
    let _process = service_kit::init(outbox_relay::NAME, &config.log);
    let app = outbox_relay::build(config).await?;
    app.run(service_kit::shutdown::on_signal()).await
}
