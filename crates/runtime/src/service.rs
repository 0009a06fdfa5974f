//! What every bus-driven service does at start and stop: connect to
//! Postgres (checking the schema is current) and NATS, declare the bus
//! topology, serve health, readiness and metrics, and close in order.

use anyhow::Context as _;
use async_nats::jetstream;
use sqlx::PgPool;
use tokio::task::JoinHandle;

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

/// Connects `name` to its dependencies and declares the topology.
pub async fn start(common: &CommonConfig, name: &str) -> anyhow::Result<Deps> {
    let pool = crate::db::pool(common)?;
    crate::db::ensure_schema_current(&pool)
        .await
        .context("checking the database schema")?;
    let nats = crate::bus::connect(&common.nats_url, name).await?;
    let js = jetstream::new(nats.clone());
    let topology = Topology::from_config(common);
    topology
        .declare(&js)
        .await
        .context("declaring the bus topology")?;
    Ok(Deps {
        pool,
        nats,
        js,
        topology,
    })
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
