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
    let cfg = GatewayConfig::from_source(&src)?;
    // The relay writes the intake records and the OAuth install its own,
    // each naming its channel by pseudonym: they must correlate with every
    // other service's, so neither runs without the key.
    if cfg.relay_enabled || cfg.oauth.is_some() {
        threadline_runtime::audit::require(&src).context(
            "the outbox relay (THREADLINE_RELAY_ENABLED, on by default) and the OAuth install \
             (SLACK_CLIENT_ID) write audit records: give this gateway THREADLINE_AUDIT_KEY, the \
             same as every service's",
        )?;
    } else {
        threadline_runtime::audit::configure(&src)?;
    }
    let _telemetry = threadline_runtime::telemetry::init("threadline-gateway", &cfg.common)?;
    if let Some(oauth) = &cfg.oauth {
        // Which keys installs are sealed to, never what they are: the
        // context-builder and publisher log the same fingerprints for the
        // private halves that open them.
        tracing::info!(
            token_public_keys = %oauth.cipher.fingerprints(),
            "token public keys (id=first 8 hex of the SHA-256 of the key; the first seals)"
        );
    }
    let listener = threadline_gateway::listener::bind(cfg.addr)
        .with_context(|| format!("binding THREADLINE_GATEWAY_ADDR {}", cfg.addr))?;
    let shutdown = threadline_runtime::shutdown::on_signal();
    threadline_gateway::run(cfg, listener, shutdown).await
}
