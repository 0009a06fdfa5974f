use std::process::ExitCode;

use threadline_inference::InferenceConfig;
use threadline_runtime::config::Source;

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> ExitCode {
    threadline_runtime::exit_with("threadline-inference", run().await)
}

async fn run() -> anyhow::Result<()> {
    let src = Source::from_env()?;
    threadline_runtime::audit::configure(&src)?;
    let cfg = InferenceConfig::from_source(&src)?;
    let _telemetry = threadline_runtime::telemetry::init("threadline-inference", &cfg.common)?;
    let listener = tokio::net::TcpListener::bind(cfg.addr)
        .await
        .map_err(|e| anyhow::anyhow!("binding THREADLINE_INFERENCE_ADDR {}: {e}", cfg.addr))?;
    let shutdown = threadline_runtime::shutdown::on_signal();
    threadline_inference::run(cfg, listener, shutdown).await
}
