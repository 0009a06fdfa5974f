use std::process::ExitCode;

use threadline_publisher::PublisherConfig;
use threadline_runtime::config::Source;

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> ExitCode {
    threadline_runtime::exit_with("threadline-publisher", run().await)
}

async fn run() -> anyhow::Result<()> {
    let src = Source::from_env()?;
    threadline_runtime::audit::require(&src)?;
    let cfg = PublisherConfig::from_source(&src)?;
    let _telemetry = threadline_runtime::telemetry::init("threadline-publisher", &cfg.common)?;
    // Which keys, never what they are: a pair whose halves differ from
    // the gateway's public keys shows as different fingerprints.
    tracing::info!(
        token_keys = %cfg.cipher.fingerprints(),
        "token keys (id=first 8 hex of the SHA-256 of the public half; the first seals)"
    );
    let listener = tokio::net::TcpListener::bind(cfg.addr)
        .await
        .map_err(|e| anyhow::anyhow!("binding THREADLINE_PUBLISHER_ADDR {}: {e}", cfg.addr))?;
    let shutdown = threadline_runtime::shutdown::on_signal();
    threadline_publisher::run(cfg, listener, shutdown).await
}
