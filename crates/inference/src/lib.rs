//! threadline inference: turns a versioned context into a labelled
//! proposal bound to that version — kill switches first, the thread as
//! untrusted data, one model call per binding, output policy, breaker and a
//! deterministic fallback.

pub mod config;
pub mod decisions;
pub mod handler;
pub mod provider;

use std::sync::Arc;

use threadline_runtime::batch::Batcher;
use threadline_runtime::bus::{Topic, Topology};
use threadline_runtime::shutdown::CancellationToken;

pub use config::InferenceConfig;
pub use handler::{Guarded, Handler};
use provider::{Breaker, OpenAiClient};

/// Builds the handler from configuration (also used by tests).
pub fn handler(
    cfg: &InferenceConfig,
    pool: sqlx::PgPool,
    js: async_nats::jetstream::Context,
) -> anyhow::Result<Handler> {
    let guard = |name: &str, m: &config::ModelConfig| -> anyhow::Result<Guarded> {
        Ok(Guarded {
            client: OpenAiClient::new(
                name,
                &m.base_url,
                &m.model,
                m.api_key.clone(),
                cfg.timeout,
                cfg.max_tokens,
            )?,
            breaker: Breaker::new(name, cfg.breaker_failures, cfg.breaker_cooldown),
        })
    };
    let primary = cfg
        .primary
        .as_ref()
        .map(|m| guard("primary", m))
        .transpose()?;
    let backup = cfg
        .backup
        .as_ref()
        .map(|m| guard("backup", m))
        .transpose()?;
    let described = primary
        .as_ref()
        .map(|g| g.client.describe())
        .unwrap_or_else(|| "builtin".into());
    let batch = cfg.common.statement_batch;
    let generic =
        threadline_runtime::db::generic_plan_pool(&pool, threadline_runtime::batch::CONNECTIONS);
    let claims = {
        let pool = generic.clone();
        Batcher::spawn("decision_claim", 2, batch, move |reqs: Vec<_>| {
            let pool = pool.clone();
            async move {
                let r = decisions::claim_many(&pool, &reqs).await;
                (reqs, r)
            }
        })
    };
    let settles = {
        let pool = generic.clone();
        Batcher::spawn("decision_settle", 2, batch, move |all: Vec<_>| {
            let pool = pool.clone();
            async move {
                let r = decisions::settle_many(&pool, &all).await;
                (all, r)
            }
        })
    };
    Ok(Handler {
        pool,
        claims,
        settles,
        js,
        topology: Topology::from_config(&cfg.common),
        model_config_id: handler::model_config_id(&[&described, &cfg.system_prompt, &cfg.label]),
        primary,
        backup,
        system_prompt: cfg.system_prompt.clone(),
        label: cfg.label.clone(),
        fallback_text: cfg.fallback_text.clone(),
        reply_max_chars: cfg.reply_max_chars,
        model_timeout: cfg.timeout,
        builtin_latency: cfg.builtin_latency,
        streaming: cfg.streaming,
    })
}

/// Runs until `shutdown`, consuming `tl.contexts`; serves health and metrics.
pub async fn run(
    cfg: InferenceConfig,
    listener: tokio::net::TcpListener,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let letters = threadline_tenancy::dead_letter::Letters::shared(&cfg.common)?;
    let Some(deps) = threadline_runtime::service::start(
        // (the batched statements have connections of their own)
        &threadline_runtime::batch::share_connections(&cfg.common),
        "threadline-inference",
        &threadline_store::schema::MIGRATOR,
        &shutdown,
    )
    .await?
    else {
        return Ok(());
    };
    let handler = Arc::new(handler(&cfg, deps.pool.clone(), deps.js.clone())?);
    let health = deps.serve_health(listener, shutdown.clone());
    tracing::info!(concurrency = cfg.concurrency, model_config_id = %handler.model_config_id, "inference consuming");
    threadline_runtime::worker::run(
        deps.js.clone(),
        deps.topology.clone(),
        letters,
        Topic::Contexts,
        cfg.concurrency,
        shutdown,
        move |msg| {
            let handler = handler.clone();
            async move {
                let seq = msg.info().ok().map(|i| i.stream_sequence);
                handler.handle_delivery(&msg.payload, seq).await
            }
        },
    )
    .await?;
    deps.close(health).await;
    Ok(())
}
