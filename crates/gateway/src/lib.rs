//! threadline gateway: the only public HTTP surface. It verifies Slack
//! deliveries, records a durable receipt and an outbox row in one
//! transaction, answers, and relays committed outbox rows to JetStream.
//! It never fetches threads, calls a model or posts.

pub mod config;
pub mod drain;
pub mod events;
pub mod feedback;
pub mod installations;
pub mod intake;
pub mod interactions;
pub mod listener;
pub mod oauth;
pub mod page;
pub mod ratelimit;
pub mod relay;
pub mod shed;
pub mod socket;
pub mod spool;
pub mod unverified;
pub mod wake;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use axum::Router;
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::{get, post};
use sqlx::PgPool;
use threadline_runtime::bus::Topology;
use threadline_runtime::config::CommonConfig;
use threadline_runtime::health::{self, Readiness};
use threadline_runtime::shutdown::CancellationToken;
use threadline_slack::Verifier;
use tokio::net::TcpListener;
use tower_http::timeout::TimeoutLayer;
use tower_http::trace::TraceLayer;

pub use config::GatewayConfig;
use installations::Resolver;
use intake::Intake;
use relay::{Relay, RelayConfig, Wake};

#[derive(Clone)]
pub struct AppState {
    pub verifier: Arc<Verifier>,
    pub intake: Intake,
    pub resolver: Arc<Resolver>,
    pub pool: PgPool,
    /// Larger bodies get 413 (`THREADLINE_GATEWAY_MAX_BODY_BYTES`).
    pub max_body_bytes: usize,
    /// How long a body may take to arrive once its head has.
    pub body_timeout: Duration,
    /// Bytes of bodies not yet verified that may be in memory at once.
    pub unverified: unverified::Budget,
    /// Wakes the outbox relays after a commit outside the intake (a
    /// reviewer's click).
    pub wake: Wake,
    /// Tells a person whose click was not counted why (its `response_url`).
    pub responder: interactions::Responder,
    /// Where deliveries go when Postgres cannot take them in time (`None`:
    /// `THREADLINE_SPOOL_ENABLED=false`, they get 503).
    pub spool: Option<Arc<spool::Spool>>,
    /// New work shed while the pipeline is behind.
    pub shed: Arc<shed::Shedder>,
}

/// The gateway's routes: Slack intake, the OAuth install flow (when
/// configured), health, readiness and metrics. Every answer carries the
/// headers of [`page::secure_headers`].
pub fn router(state: AppState, oauth: Option<oauth::OAuthState>, readiness: Readiness) -> Router {
    let install = match oauth {
        Some(o) => Router::new()
            .route("/slack/install", get(oauth::install))
            .route("/slack/oauth/callback", get(oauth::callback))
            .with_state(o),
        None => Router::new().route(
            "/slack/install",
            get(|| async {
                (
                    StatusCode::NOT_FOUND,
                    "OAuth installs are not configured (set SLACK_CLIENT_ID)",
                )
            }),
        ),
    };
    Router::new()
        .route("/slack/events", post(events::slack_events))
        .route("/slack/interactions", post(interactions::slack_interactions))
        .with_state(state)
        .merge(install)
        .merge(health::router(readiness))
        .layer(TimeoutLayer::with_status_code(StatusCode::SERVICE_UNAVAILABLE, Duration::from_secs(10)))
        .layer(
            TraceLayer::new_for_http().make_span_with(|req: &axum::http::Request<_>| {
                // Named by the route's template, never the raw path: a
                // request to any path cannot mint span attributes.
                let path = req
                    .extensions()
                    .get::<axum::extract::MatchedPath>()
                    .map(|m| m.as_str())
                    .unwrap_or("unmatched");
                // Probes and scrapes every few seconds would bury the
                // traces of events, and unmatched paths are noise: debug
                // spans, never exported.
                if matches!(path, "/healthz" | "/readyz" | "/metrics" | "unmatched") {
                    tracing::debug_span!("http.request", method = %req.method(), path = %path)
                } else {
                    let span = tracing::info_span!("http.request", method = %req.method(), path = %path, trace_id = tracing::field::Empty);
                    threadline_runtime::telemetry::record_trace_id(&span);
                    span
                }
            }),
        )
        .layer(axum::middleware::map_response(
            |mut resp: Response| async move {
                page::secure_headers(resp.headers_mut());
                resp
            },
        ))
}

/// The configured pool for a writer that wakes the outbox relays itself
/// after each commit (`threadline_store::outbox::wake`, or in-process): its
/// inserts into the outbox do not NOTIFY, so its commits do not queue on
/// NOTIFY's cluster-wide lock (migration 0018).
fn pool_waking_after_commit(cfg: &CommonConfig) -> anyhow::Result<PgPool> {
    Ok(threadline_runtime::db::pool_options(cfg)
        .after_connect(|conn, _| {
            Box::pin(async move { threadline_store::outbox::wake_after_commit(conn).await })
        })
        .connect_lazy_with(threadline_runtime::db::connect_options(cfg)?))
}

/// Runs the gateway on `listener` until `shutdown`: HTTP drains first, then
/// the intake writers finish their last commits, then the relay stops.
pub async fn run(
    cfg: GatewayConfig,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    // The intake wakes the relays itself after each commit (no NOTIFY in
    // its transactions: see migration 0018).
    let letters = threadline_tenancy::dead_letter::Letters::shared(&cfg.common)?;
    let pool = pool_waking_after_commit(&cfg.common)?;
    if cfg.spool_enabled {
        // A gateway with a spool takes deliveries while Postgres is away,
        // started during the outage too: the schema is checked once it can
        // be read, and a schema behind the binary stops the gateway then.
        let first = tokio::time::timeout(
            Duration::from_secs(2),
            threadline_runtime::db::missing_migrations(&pool, &threadline_store::schema::MIGRATOR),
        )
        .await;
        match first {
            Ok(Ok(missing)) => threadline_runtime::db::schema_verdict(missing)?,
            _ => {
                tracing::warn!(
                    "Postgres cannot be read at start: deliveries go to the spool until it can"
                );
                let (pool, shutdown) = (pool.clone(), shutdown.clone());
                tokio::spawn(async move {
                    // (however long the outage lasts: the spool holds)
                    let missing = loop {
                        match threadline_runtime::db::missing_migrations(
                            &pool,
                            &threadline_store::schema::MIGRATOR,
                        )
                        .await
                        {
                            Ok(missing) => break missing,
                            Err(_) => tokio::select! {
                                () = shutdown.cancelled() => return,
                                () = tokio::time::sleep(Duration::from_secs(2)) => {}
                            },
                        }
                    };
                    if let Err(e) = threadline_runtime::db::schema_verdict(missing) {
                        tracing::error!(
                            error = format!("{e:#}"),
                            "stopping: the schema cannot serve this gateway"
                        );
                        shutdown.cancel();
                    }
                });
            }
        }
    } else if !threadline_runtime::service::schema_checked(
        &pool,
        &threadline_store::schema::MIGRATOR,
        &shutdown,
    )
    .await?
    {
        return Ok(());
    }
    if cfg.relay_enabled {
        relay::check_role(&pool).await?;
    }
    // The relay and the spool use the bus. A gateway that does not relay
    // (the public one, under per-role NATS users) connects only to spool,
    // and neither waits for NATS nor counts it in its readiness, so a
    // broker outage does not take intake out of service.
    let nats = match cfg.relay_enabled || cfg.spool_enabled {
        true => Some(
            threadline_runtime::bus::connect(&cfg.common.nats_url, "threadline-gateway").await?,
        ),
        false => None,
    };
    let topology = Topology::from_config(&cfg.common);
    let spool = match (&nats, cfg.spool_enabled) {
        (Some(nats), true) => Some(spool::Spool::new(
            async_nats::jetstream::new(nats.clone()),
            topology.clone(),
            cfg.spool_after,
        )),
        _ => None,
    };
    let verifier = Verifier::new(cfg.signing_secrets.0.clone()).context("SLACK_SIGNING_SECRET")?;

    let relay_stop = CancellationToken::new();
    let mut wake = None;
    let relay = nats.as_ref().filter(|_| cfg.relay_enabled).map(|nats| {
        let relay = Relay::new(
            pool.clone(),
            async_nats::jetstream::new(nats.clone()),
            topology.clone(),
            RelayConfig {
                pipeline: cfg.relay_pipeline,
                ..RelayConfig::new(cfg.relay_batch, cfg.relay_sweep)
            },
        );
        wake = Some(relay.waker());
        tokio::spawn(relay.run(relay_stop.clone()))
    });
    // Without a relay here, the relays elsewhere are woken after each commit.
    let wake = wake.unwrap_or_else(|| Wake::remote(pool.clone()));

    let (intake, mut writers) = Intake::spawn(
        pool.clone(),
        cfg.intake_writers,
        cfg.intake_max_batch,
        cfg.intake_timeout,
        wake.clone(),
    );
    let state = AppState {
        verifier: Arc::new(verifier),
        intake,
        resolver: Arc::new(Resolver::new(pool.clone(), cfg.installation_cache_ttl)),
        pool: pool.clone(),
        max_body_bytes: cfg.max_body_bytes,
        unverified: unverified::Budget::new(cfg.unverified_bytes, cfg.max_body_bytes),
        body_timeout: cfg.body_timeout,
        wake,
        responder: interactions::Responder::new(&cfg.common.slack_api_url)
            .context("building the client for click replies")?,
        spool: spool.clone(),
        shed: shed::Shedder::new(cfg.shed_parked),
    };
    let spool_stop = CancellationToken::new();
    let mut spool_tasks = tokio::task::JoinSet::new();
    if let Some(spool) = &spool {
        spool_tasks.spawn(spool.clone().watch(spool_stop.clone()));
    }
    spool_tasks.spawn(
        state
            .shed
            .clone()
            .watch(state.pool.clone(), spool_stop.clone()),
    );
    // The drainer runs beside the relay (its NATS user pulls the spool).
    if let (Some(nats), true) = (&nats, cfg.relay_enabled) {
        let (app, js, topology, stop) = (
            state.clone(),
            async_nats::jetstream::new(nats.clone()),
            topology.clone(),
            spool_stop.clone(),
        );
        spool_tasks.spawn(drain::drain(app, js, topology, letters, stop));
    }
    // With a spool, a gateway takes deliveries while Postgres or the broker
    // can keep them: it stays in service through a database outage.
    let mut readiness = match (&nats, &spool) {
        (Some(nats), Some(_)) => {
            let (pool, nats) = (pool.clone(), nats.clone());
            Readiness::default().check("intake", move || {
                let (pool, broker) = (pool.clone(), nats.connection_state());
                async move {
                    match threadline_store::schema::ping(&pool).await {
                        Ok(()) => Ok(()),
                        Err(_) if broker == async_nats::connection::State::Connected => Ok(()),
                        Err(e) => Err(format!(
                            "neither Postgres ({e}) nor the broker ({broker:?}) can keep deliveries"
                        )),
                    }
                }
            })
        }
        _ => Readiness::default().postgres(pool.clone()),
    };
    if let (Some(nats), true) = (&nats, cfg.relay_enabled) {
        readiness = readiness.nats(nats.clone());
    }
    // A Socket Mode gateway takes events only over its connections: it is
    // ready once one of them is open.
    if let Some(mode) = &cfg.socket_mode {
        let open = mode.open.clone();
        readiness = readiness.check("socket_mode", move || {
            let n = open.load(std::sync::atomic::Ordering::SeqCst);
            async move {
                if n > 0 {
                    Ok(())
                } else {
                    Err("no Socket Mode connection is open".to_owned())
                }
            }
        });
    }
    let oauth = match &cfg.oauth {
        Some(o) => Some(oauth::OAuthState {
            pool: pool.clone(),
            oauth: Arc::new(oauth::OAuth {
                settings: o.clone(),
                web: threadline_slack::WebClient::new(
                    &cfg.common.slack_api_url,
                    Duration::from_secs(10),
                )
                .context("building the Slack client")?,
            }),
            limiter: Arc::new(ratelimit::Limiter::new(
                o.install_rate_per_minute,
                o.install_rate_per_client_per_minute,
            )),
            trust_forwarded_for: cfg.trust_forwarded_for,
        }),
        None => None,
    };
    // Socket Mode: envelopes over connections the gateway opens, committed
    // like HTTP deliveries.
    let socket_stop = CancellationToken::new();
    let socket = match &cfg.socket_mode {
        Some(mode) => {
            let web = threadline_slack::WebClient::new(
                &cfg.common.slack_api_url,
                Duration::from_secs(10),
            )
            .context("building the Slack client")?;
            Some(tokio::spawn(socket::run(
                state.clone(),
                web,
                mode.clone(),
                socket_stop.clone(),
            )))
        }
        None => None,
    };
    let app = router(state, oauth, readiness);
    let cap = crate::listener::effective_cap(&cfg.connections, cfg.common.db_max_connections);
    tracing::info!(
        addr = %listener.local_addr()?,
        relay = cfg.relay_enabled,
        max_connections = cap,
        "gateway listening"
    );
    crate::listener::serve(listener, app, cfg.connections, cap, shutdown).await;
    socket_stop.cancel();
    if let Some(handle) = socket {
        let _ = handle.await;
    }

    // The drainer's last delivery commits through the intake: stopped first.
    spool_stop.cancel();
    while spool_tasks.join_next().await.is_some() {}
    while writers.join_next().await.is_some() {}
    relay_stop.cancel();
    if let Some(handle) = relay {
        let _ = handle.await;
    }
    if let Some(nats) = &nats {
        // (bounded: a broker that never came back must not hold the exit)
        let _ = tokio::time::timeout(Duration::from_secs(5), nats.flush()).await;
    }
    pool.close().await;
    tracing::info!("gateway stopped");
    Ok(())
}
