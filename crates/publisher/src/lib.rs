//! threadline publisher: the only component that writes to Slack. It
//! re-checks kill switches and the thread version, claims one reply intent
//! per source event, respects per-channel budgets and `Retry-After` shared in
//! Postgres, posts into the thread root once, and reconciles unknown
//! outcomes from evidence instead of posting again.

pub mod config;
pub mod handler;
pub mod intents;
pub mod reconcile;

use std::sync::Arc;

use anyhow::Context as _;
use threadline_runtime::bus::{Topic, Topology};
use threadline_runtime::shutdown::CancellationToken;
use threadline_slack::WebClient;

pub use config::PublisherConfig;
pub use handler::Handler;

/// Builds the handler (also used by tests).
pub fn handler(
    cfg: PublisherConfig,
    pool: sqlx::PgPool,
    js: async_nats::jetstream::Context,
) -> anyhow::Result<Handler> {
    Ok(Handler {
        pool,
        js,
        topology: Topology::new(cfg.common.bus_prefix.clone()),
        web: WebClient::new(&cfg.common.slack_api_url, cfg.slack_timeout)
            .context("building the Slack client")?,
        cipher: cfg.cipher,
        evidence: cfg.evidence,
        post_spacing: cfg.post_spacing,
        max_attempts: cfg.max_attempts,
    })
}

pub async fn run(
    cfg: PublisherConfig,
    listener: tokio::net::TcpListener,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let pool = threadline_runtime::db::pool(&cfg.common)?;
    threadline_runtime::db::ensure_schema_current(&pool)
        .await
        .context("checking the database schema")?;
    let nats =
        threadline_runtime::bus::connect(&cfg.common.nats_url, "threadline-publisher").await?;
    let js = async_nats::jetstream::new(nats.clone());
    let topology = Topology::new(cfg.common.bus_prefix.clone());
    topology
        .declare(&js)
        .await
        .context("declaring the bus topology")?;
    let concurrency = cfg.concurrency;
    let handler = Arc::new(handler(cfg, pool.clone(), js.clone())?);
    let health = threadline_runtime::health::router(
        threadline_runtime::health::Readiness::default()
            .postgres(pool.clone())
            .nats(nats.clone()),
    );
    let stop = shutdown.clone();
    let http = tokio::spawn(async move {
        axum::serve(listener, health)
            .with_graceful_shutdown(stop.cancelled_owned())
            .await
    });
    tracing::info!(concurrency, "publisher consuming");
    threadline_runtime::worker::run(
        js,
        topology,
        Topic::Proposals,
        concurrency,
        shutdown,
        move |msg| {
            let handler = handler.clone();
            async move { handler.handle(&msg.payload).await }
        },
    )
    .await?;
    let _ = http.await;
    let _ = nats.flush().await;
    pool.close().await;
    Ok(())
}
