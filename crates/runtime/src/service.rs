//! What every bus-driven service does at start and stop: connect to
//! Postgres (checking the schema is current) and NATS, declare the bus
//! topology, serve health, readiness and metrics, and close in order.

use std::time::Duration;

use async_nats::jetstream;
use sqlx::PgPool;
use sqlx::migrate::Migrator;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::bus::Topology;
use crate::config::CommonConfig;
use crate::health::{self, Readiness};
use crate::shutdown::CancellationToken;

pub struct Deps {
    pub pool: PgPool,
    pub nats: async_nats::Client,
    pub js: jetstream::Context,
    pub topology: Topology,
}

/// How long a starting service keeps retrying a dependency that fails
/// (Postgres unreachable, a JetStream request timing out) before it exits
/// with the last error.
pub const STARTUP_PATIENCE: Duration = Duration::from_secs(60);

/// Connects `name` to its dependencies and declares the topology. Transient
/// failures are retried (with a warning each) for [`STARTUP_PATIENCE`]; a
/// schema behind `migrator` (the binary's: `threadline_store::schema::MIGRATOR`)
/// is reported at once. `Ok(None)` means `shutdown` came first.
pub async fn start(
    common: &CommonConfig,
    name: &str,
    migrator: &Migrator,
    shutdown: &CancellationToken,
) -> anyhow::Result<Option<Deps>> {
    let pool = crate::db::pool(common)?;
    if !schema_checked(&pool, migrator, shutdown).await? {
        return Ok(None);
    }
    let nats = crate::bus::connect(&common.nats_url, name).await?;
    let js = jetstream::new(nats.clone());
    let topology = Topology::from_config(common);
    if retrying("declaring the bus topology", shutdown, || {
        topology.declare(&js)
    })
    .await?
    .is_none()
    {
        return Ok(None);
    }
    Ok(Some(Deps {
        pool,
        nats,
        js,
        topology,
    }))
}

/// Waits (as [`retrying`]) until the database can be read, then refuses a
/// schema behind the binary at once. `Ok(false)` means `shutdown` came first.
pub async fn schema_checked(
    pool: &PgPool,
    migrator: &Migrator,
    shutdown: &CancellationToken,
) -> anyhow::Result<bool> {
    let Some(missing) = retrying("reading the database schema", shutdown, || {
        crate::db::missing_migrations(pool, migrator)
    })
    .await?
    else {
        return Ok(false);
    };
    crate::db::schema_verdict(missing)?;
    Ok(true)
}

/// Runs `attempt` until it succeeds, backing off from 100 ms to 5 s between
/// failures, for at most [`STARTUP_PATIENCE`]; `Ok(None)` on shutdown.
async fn retrying<T, F, Fut>(
    what: &str,
    shutdown: &CancellationToken,
    mut attempt: F,
) -> anyhow::Result<Option<T>>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<T>>,
{
    let give_up = Instant::now() + STARTUP_PATIENCE;
    let mut backoff = Duration::from_millis(100);
    loop {
        let err = match attempt().await {
            Ok(v) => return Ok(Some(v)),
            Err(e) => e,
        };
        if Instant::now() + backoff >= give_up {
            return Err(err.context(format!(
                "{what} (still failing after {} s)",
                STARTUP_PATIENCE.as_secs()
            )));
        }
        tracing::warn!(error = format!("{err:#}"), "{what} failed; retrying");
        tokio::select! {
            () = tokio::time::sleep(backoff) => {}
            () = shutdown.cancelled() => return Ok(None),
        }
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

impl Deps {
    /// `/healthz`, `/readyz` (Postgres and NATS) and `/metrics` on `listener`
    /// until `shutdown`.
    pub fn serve_health(
        &self,
        listener: tokio::net::TcpListener,
        shutdown: CancellationToken,
    ) -> JoinHandle<std::io::Result<()>> {
        let router = health::router(
            Readiness::default()
                .postgres(self.pool.clone())
                .nats(self.nats.clone()),
        );
        tokio::spawn(async move {
            axum::serve(listener, router)
                .with_graceful_shutdown(shutdown.cancelled_owned())
                .await
        })
    }

    /// Flushes NATS and closes the pool, after the work has stopped.
    pub async fn close(self, health: JoinHandle<std::io::Result<()>>) {
        let _ = health.await;
        let _ = self.nats.flush().await;
        self.pool.close().await;
    }
}
