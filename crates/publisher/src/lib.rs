//! threadline publisher: the only component that writes to Slack. It
//! re-checks kill switches and the thread version, claims one reply intent
//! per source event, respects per-channel budgets and `Retry-After` shared in
//! Postgres, re-checks right before the post, posts into the thread root
//! once, reconciles unknown outcomes from evidence instead of posting again,
//! and sweeps intents that no delivery drives any more.

pub mod agent;
pub mod answer;
pub mod config;
pub mod dispatch;
pub mod ending;
pub mod expired;
pub mod handler;
pub mod intents;
pub mod ledger;
pub mod pane;
pub mod proposals;
pub mod reconcile;
pub mod reply;
pub mod review;
pub mod stream;
pub mod sweeper;

use std::sync::Arc;

use anyhow::Context as _;
use threadline_runtime::batch::Batcher;
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
    let records = {
        let pool = threadline_runtime::db::generic_plan_pool(
            &pool,
            threadline_runtime::batch::CONNECTIONS,
        );
        Batcher::spawn(
            "post_record",
            2,
            cfg.common.statement_batch,
            move |posts: Vec<_>| {
                let pool = pool.clone();
                async move {
                    let r = intents::record_posts(&pool, &posts).await;
                    (posts, r)
                }
            },
        )
    };
    Ok(Handler {
        pool,
        records,
        js,
        topology: Topology::from_config(&cfg.common),
        web: WebClient::new(&cfg.common.slack_api_url, cfg.slack_timeout)
            .context("building the Slack client")?,
        cipher: cfg.cipher,
        refresher: cfg.refresher,
        evidence: cfg.evidence,
        post_spacing: cfg.post_spacing,
        max_attempts: cfg.max_attempts,
        sending_stale: cfg.sending_stale.as_secs_f64(),
        slack_timeout: cfg.slack_timeout.as_secs_f64(),
        streams: cfg.streams,
    })
}

/// Runs until `shutdown`, consuming `tl.proposals`; serves health and metrics.
pub async fn run(
    cfg: PublisherConfig,
    listener: tokio::net::TcpListener,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let letters = threadline_tenancy::dead_letter::Letters::shared(&cfg.common)?;
    let Some(deps) = threadline_runtime::service::start(
        // (the batched statements have connections of their own)
        &threadline_runtime::batch::share_connections(&cfg.common),
        "threadline-publisher",
        &threadline_store::schema::MIGRATOR,
        &shutdown,
    )
    .await?
    else {
        return Ok(());
    };
    let (concurrency, sweep) = (cfg.concurrency, cfg.sweep);
    let handler = Arc::new(handler(cfg, deps.pool.clone(), deps.js.clone())?);
    let health = deps.serve_health(listener, shutdown.clone());
    ledger::spawn(deps.pool.clone(), shutdown.clone());
    sweeper::spawn(handler.clone(), sweep, shutdown.clone());
    tracing::info!(concurrency, "publisher consuming");
    threadline_runtime::worker::run(
        deps.js.clone(),
        deps.topology.clone(),
        letters,
        Topic::Proposals,
        concurrency,
        shutdown,
        move |msg| {
            let handler = handler.clone();
            async move { handler.handle(&msg.payload).await }
        },
    )
    .await?;
    deps.close(health).await;
    Ok(())
}
