//! threadline context-builder: the thread synchronizer. It classifies each
//! accepted event, keeps the thread store current (new messages, replies,
//! edits, deletions, our own posts; every change bumps the thread's
//! version), backfills threads it has never seen, and for each triggering
//! event builds a versioned, permission-filtered, deterministically
//! truncated context and publishes it.

pub mod admission;
pub mod agent;
pub mod backfill;
pub mod burst;
pub mod config;
/// The context window (pure; it lives in `domain`).
pub use threadline_domain::context;
pub mod handler;
pub mod store;

use std::sync::Arc;

use anyhow::Context as _;
use threadline_runtime::bus::Topic;
use threadline_runtime::shutdown::CancellationToken;
use threadline_runtime::worker;
use threadline_slack::WebClient;

pub use config::ContextConfig;
pub use handler::Handler;

/// Runs until `shutdown`: consumes `tl.events` and `tl.reconsider`,
/// finishing in-flight work; serves health and metrics on `listener`.
pub async fn run(
    cfg: ContextConfig,
    listener: tokio::net::TcpListener,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let letters = threadline_tenancy::dead_letter::Letters::shared(&cfg.common)?;
    let Some(deps) = threadline_runtime::service::start(
        // (the batched statements have connections of their own)
        &threadline_runtime::batch::share_connections(&cfg.common),
        "threadline-context-builder",
        &threadline_store::schema::MIGRATOR,
        &shutdown,
    )
    .await?
    else {
        return Ok(());
    };
    let web = WebClient::new(&cfg.common.slack_api_url, cfg.slack_timeout)
        .context("building the Slack client")?;
    let statements = handler::statement_pool(&deps.pool);
    let handler = Arc::new(Handler {
        pool: deps.pool.clone(),
        js: deps.js.clone(),
        topology: deps.topology.clone(),
        web,
        cipher: cfg.cipher,
        refresher: cfg.refresher,
        limits: cfg.limits,
        backfill: cfg.backfill,
        opens: handler::opens(&statements, cfg.common.statement_batch),
        applies: handler::applies(
            &deps.pool,
            cfg.common.statement_batch,
            cfg.admission.clone(),
        ),
        builds: handler::builds(&deps.pool, cfg.common.statement_batch),
        finishes: handler::finishes(&statements, cfg.common.statement_batch),
        late_after: cfg.late_after,
        admission: cfg.admission.clone(),
    });
    let health = deps.serve_health(listener, shutdown.clone());
    tracing::info!(concurrency = cfg.concurrency, "context-builder consuming");
    // Parked work resumed as there is room (DESIGN invariant 11).
    let resumer = admission::spawn_resumer(
        handler.clone(),
        cfg.admission.clone(),
        cfg.resume_every,
        cfg.concurrency,
        shutdown.clone(),
    );
    admission::spawn_gauges(deps.pool.clone(), shutdown.clone());
    let reconsider = {
        let (js, topology, letters, shutdown, handler) = (
            deps.js.clone(),
            deps.topology.clone(),
            letters.clone(),
            shutdown.clone(),
            handler.clone(),
        );
        tokio::spawn(worker::run(
            js,
            topology,
            letters,
            Topic::Reconsider,
            2,
            shutdown,
            move |msg| {
                let handler = handler.clone();
                async move { handler.reconsider(&msg.payload).await }
            },
        ))
    };
    worker::run(
        deps.js.clone(),
        deps.topology.clone(),
        letters,
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
    resumer.await.context("resumer")?;
    deps.close(health).await;
    tracing::info!("context-builder stopped");
    Ok(())
}
