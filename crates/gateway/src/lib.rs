//! threadline gateway: the only public HTTP surface. It verifies Slack
//! deliveries, records a durable receipt and an outbox row in one
//! transaction, answers, and relays committed outbox rows to JetStream.
//! It never fetches threads, calls a model or posts.

pub mod config;
pub mod events;
pub mod installations;
pub mod intake;
pub mod oauth;
pub mod relay;
pub mod unparsed;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::serve::ListenerExt as _;
use sqlx::PgPool;
use threadline_runtime::bus::Topology;
use threadline_runtime::health::{self, Readiness};
use threadline_runtime::shutdown::CancellationToken;
use threadline_slack::Verifier;
use tokio::net::TcpListener;
use tower_http::timeout::TimeoutLayer;
use tower_http::trace::TraceLayer;

pub use config::GatewayConfig;
use installations::Resolver;
use intake::Intake;
use relay::{Relay, RelayConfig};

#[derive(Clone)]
pub struct AppState {
    pub verifier: Arc<Verifier>,
    pub intake: Intake,
    pub resolver: Arc<Resolver>,
    pub pool: PgPool,
}

/// The gateway's routes: Slack intake, the OAuth install flow (when
/// configured), health, readiness and metrics.
pub fn router(
    state: AppState,
    oauth: Option<oauth::OAuthState>,
    readiness: Readiness,
    max_body_bytes: usize,
) -> Router {
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
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .with_state(state)
        .merge(install)
        .merge(health::router(readiness))
        .layer(TimeoutLayer::with_status_code(StatusCode::SERVICE_UNAVAILABLE, Duration::from_secs(10)))
        .layer(
            TraceLayer::new_for_http().make_span_with(|req: &axum::http::Request<_>| {
                // Probes and scrapes every few seconds would bury the
                // traces of events: they are debug spans, never exported.
                let path = req.uri().path();
                if matches!(path, "/healthz" | "/readyz" | "/metrics") {
                    tracing::debug_span!("http.request", method = %req.method(), path = %path)
                } else {
                    let span = tracing::info_span!("http.request", method = %req.method(), path = %path, trace_id = tracing::field::Empty);
                    threadline_runtime::telemetry::record_trace_id(&span);
                    span
                }
            }),
        )
}

/// Runs the gateway on `listener` until `shutdown`: HTTP drains first, then
/// the intake writers finish their last commits, then the relay stops.
pub async fn run(
    cfg: GatewayConfig,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let pool = threadline_runtime::db::pool(&cfg.common)?;
    if !threadline_runtime::service::schema_checked(&pool, &shutdown).await? {
        return Ok(());
    }
    let nats = threadline_runtime::bus::connect(&cfg.common.nats_url, "threadline-gateway").await?;
    let verifier = Verifier::new(cfg.signing_secrets.0.clone()).context("SLACK_SIGNING_SECRET")?;

    let relay_stop = CancellationToken::new();
    let relay = cfg.relay_enabled.then(|| {
        let relay = Relay::new(
            pool.clone(),
            async_nats::jetstream::new(nats.clone()),
            Topology::from_config(&cfg.common),
            RelayConfig {
                batch: cfg.relay_batch,
                sweep: cfg.relay_sweep,
            },
        );
        tokio::spawn(relay.run(relay_stop.clone()))
    });

    let (intake, mut writers) = Intake::spawn(
        pool.clone(),
        cfg.intake_writers,
        cfg.intake_max_batch,
        cfg.intake_timeout,
    );
    let state = AppState {
        verifier: Arc::new(verifier),
        intake,
        resolver: Arc::new(Resolver::new(pool.clone(), cfg.installation_cache_ttl)),
        pool: pool.clone(),
    };
    let readiness = Readiness::default()
        .postgres(pool.clone())
        .nats(nats.clone());
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
        }),
        None => None,
    };
    let app = router(state, oauth, readiness, cfg.max_body_bytes);
    tracing::info!(addr = %listener.local_addr()?, relay = cfg.relay_enabled, "gateway listening");
    // Small request/response pairs: disable Nagle, or acks wait on delayed ACKs.
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
        .context("serving HTTP")?;

    while writers.join_next().await.is_some() {}
    relay_stop.cancel();
    if let Some(handle) = relay {
        let _ = handle.await;
    }
    let _ = nats.flush().await;
    pool.close().await;
    tracing::info!("gateway stopped");
    Ok(())
}
