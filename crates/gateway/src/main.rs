use std::process::ExitCode;

use anyhow::Context as _;
use threadline_gateway::GatewayConfig;
use threadline_runtime::config::Source;

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> ExitCode {
    threadline_runtime::exit_with("threadline-gateway", run().await)
}

async fn run() -> anyhow::Result<()> {
    let src = Source::from_env()?;
    // With the OAuth install its records must correlate with the others'.
    if src.get("SLACK_CLIENT_ID").is_some() {
        threadline_runtime::audit::require(&src)?;
    } else {
        threadline_runtime::audit::configure(&src)?;
    }
    let cfg = GatewayConfig::from_source(&src)?;
    let _telemetry = threadline_runtime::telemetry::init("threadline-gateway", &cfg.common)?;
    let listener = threadline_gateway::listener::bind(cfg.addr)
        .with_context(|| format!("binding THREADLINE_GATEWAY_ADDR {}", cfg.addr))?;
    let shutdown = threadline_runtime::shutdown::on_signal();
    threadline_gateway::run(cfg, listener, shutdown).await
}
