//! threadline context-builder: the thread synchronizer. It classifies each
//! accepted event, keeps the thread store current (new messages, replies,
//! edits, deletions, our own posts; every change bumps the thread's
//! version), backfills threads it has never seen, and for each triggering
//! event builds a versioned, permission-filtered, deterministically
//! truncated context and publishes it.

pub mod backfill;
pub mod config;
pub mod context;
pub mod handler;
pub mod store;

use std::sync::Arc;

use anyhow::Context as _;
use threadline_runtime::bus::{Topic, Topology};
use threadline_runtime::shutdown::CancellationToken;
use threadline_slack::WebClient;

pub use config::ContextConfig;
pub use handler::Handler;

/// Runs until `shutdown`: consumes `tl.events`, finishing in-flight work;
/// serves `/healthz`, `/readyz` and `/metrics` on `listener`.
pub async fn run(
    cfg: ContextConfig,
    listener: tokio::net::TcpListener,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let pool = threadline_runtime::db::pool(&cfg.common)?;
    threadline_runtime::db::ensure_schema_current(&pool)
        .await
        .context("checking the database schema")?;
    let nats = threadline_runtime::bus::connect(&cfg.common.nats_url, "threadline-context-builder")
        .await?;
    let js = async_nats::jetstream::new(nats.clone());
    let topology = Topology::new(cfg.common.bus_prefix.clone());
    topology
        .declare(&js)
        .await
        .context("declaring the bus topology")?;
    let web = WebClient::new(&cfg.common.slack_api_url, cfg.slack_timeout)
        .context("building the Slack client")?;
    let handler = Arc::new(Handler {
        pool: pool.clone(),
        js: js.clone(),
        topology: topology.clone(),
        web,
        cipher: cfg.cipher,
        limits: cfg.limits,
        backfill: cfg.backfill,
    });
    let health = threadline_runtime::health::router(
        threadline_runtime::health::Readiness::default()
            .postgres(pool.clone())
            .nats(nats.clone()),
    );
    let http_stop = shutdown.clone();
    let http = tokio::spawn(async move {
        axum::serve(listener, health)
            .with_graceful_shutdown(http_stop.cancelled_owned())
            .await
    });
    tracing::info!(concurrency = cfg.concurrency, "context-builder consuming");
    let reconsider = {
        let (js, topology, shutdown, handler) = (
            js.clone(),
            topology.clone(),
            shutdown.clone(),
            handler.clone(),
        );
        tokio::spawn(threadline_runtime::worker::run(
            js,
            topology,
            Topic::Reconsider,
            2,
            shutdown,
            move |msg| {
                let handler = handler.clone();
                async move { handler.reconsider(&msg.payload).await }
            },
        ))
    };
    threadline_runtime::worker::run(
        js,
        topology,
        Topic::Events,
        cfg.concurrency,
        shutdown,
        move |msg| {
            let handler = handler.clone();
            async move { handler.handle(&msg.payload).await }
        },
    )
    .await?;
    reconsider.await.context("reconsider worker")??;
    let _ = http.await;
    let _ = nats.flush().await;
    pool.close().await;
    tracing::info!("context-builder stopped");
    Ok(())
}
