//! `/healthz` (the process answers), `/readyz` (its dependencies answer) and
//! `/metrics` (Prometheus text), shared by every service.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use serde_json::json;

/// One dependency check: a name and a probe that resolves to `Ok` when the
/// dependency is usable.
pub type Probe =
    Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>> + Send + Sync>;

#[derive(Clone, Default)]
pub struct Readiness {
    checks: Vec<(&'static str, Probe)>,
}

impl Readiness {
    pub fn check<F, Fut>(mut self, name: &'static str, probe: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), String>> + Send + 'static,
    {
        self.checks
            .push((name, Arc::new(move || Box::pin(probe()))));
        self
    }

    /// Postgres answers a ping on a connection of `pool`.
    pub fn postgres(self, pool: sqlx::PgPool) -> Self {
        self.check("postgres", move || {
            let pool = pool.clone();
            async move {
                use sqlx::Connection as _;
                let mut conn = pool.acquire().await.map_err(|e| e.to_string())?;
                conn.ping().await.map_err(|e| e.to_string())
            }
        })
    }

    /// The NATS client is connected.
    pub fn nats(self, client: async_nats::Client) -> Self {
        self.check("nats", move || {
            let state = client.connection_state();
            async move {
                match state {
                    async_nats::connection::State::Connected => Ok(()),
                    other => Err(format!("{other:?}")),
                }
            }
        })
    }
}

pub fn router(readiness: Readiness) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(ready))
        .route("/metrics", get(metrics))
        .with_state(Arc::new(readiness))
}

async fn ready(State(r): State<Arc<Readiness>>) -> impl IntoResponse {
    let mut all_ok = true;
    let mut report = serde_json::Map::new();
    for (name, probe) in &r.checks {
        let outcome = tokio::time::timeout(Duration::from_secs(2), probe())
            .await
            .unwrap_or_else(|_| Err("timed out".into()));
        all_ok &= outcome.is_ok();
        // Details go to the log, not to whoever can reach the listener.
        if let Err(e) = &outcome {
            tracing::warn!(dependency = *name, error = %e, "readiness check failed");
        }
        report.insert((*name).to_owned(), json!({"ok": outcome.is_ok()}));
    }
    let status = if all_ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, axum::Json(serde_json::Value::Object(report)))
}

async fn metrics() -> impl IntoResponse {
    let handle = crate::telemetry::metrics_handle();
    handle.run_upkeep();
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        handle.render(),
    )
}
