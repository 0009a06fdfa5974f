//! Postgres pool and the embedded migrator. Services check that the schema is
//! current at start and refuse to run otherwise; only `threadline migrate`
//! changes it.

use std::str::FromStr;

use anyhow::Context as _;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

use crate::config::CommonConfig;

/// Every migration in `migrations/`, compiled into the binaries.
pub use threadline_store::schema::MIGRATOR;

/// A lazily connecting pool: the process starts even while Postgres is down
/// (readiness reports it), and each acquire waits at most the configured time.
pub fn pool(cfg: &CommonConfig) -> anyhow::Result<PgPool> {
    Ok(options(cfg).connect_lazy_with(connect_options(cfg)?))
}

/// [`pool`] for a writer that wakes the outbox relays itself after each
/// commit (`threadline_store::outbox::wake`, or in-process): its inserts into the
/// outbox do not NOTIFY, so its commits do not queue on NOTIFY's
/// cluster-wide lock (migration 0018).
pub fn pool_waking_after_commit(cfg: &CommonConfig) -> anyhow::Result<PgPool> {
    Ok(options(cfg)
        .after_connect(|conn, _| {
            Box::pin(async move { threadline_store::outbox::wake_after_commit(conn).await })
        })
        .connect_lazy_with(connect_options(cfg)?))
}

/// A pool of `connections` to `pool`'s database whose sessions always use
/// generic plans (`plan_cache_mode = force_generic_plan`), for the batched
/// `UNNEST` statements of [`crate::batch`]: given the arrays' values, the
/// planner costs a custom plan for the batch in hand below the generic one
/// (which assumes 10 rows) and so plans every execution again, about a
/// millisecond of Postgres CPU each time; the statements look rows up by
/// key, which a generic plan does as well.
pub fn generic_plan_pool(pool: &PgPool, connections: u32) -> PgPool {
    PgPoolOptions::new()
        .max_connections(connections.max(1))
        .acquire_timeout(pool.options().get_acquire_timeout())
        .connect_lazy_with(
            (*pool.connect_options())
                .clone()
                .options([("plan_cache_mode", "force_generic_plan")]),
        )
}

fn options(cfg: &CommonConfig) -> PgPoolOptions {
    PgPoolOptions::new()
        .max_connections(cfg.db_max_connections)
        .acquire_timeout(cfg.db_acquire_timeout)
}

fn connect_options(cfg: &CommonConfig) -> anyhow::Result<PgConnectOptions> {
    Ok(PgConnectOptions::from_str(&cfg.database_url)
        .context("DATABASE_URL is not a valid Postgres URL")?
        .application_name("threadline"))
}

/// Applies pending migrations. Idempotent.
pub async fn migrate(pool: &PgPool) -> anyhow::Result<usize> {
    let before = applied_versions(pool).await.unwrap_or_default().len();
    MIGRATOR.run(pool).await.context("applying migrations")?;
    let after = applied_versions(pool).await?.len();
    Ok(after.saturating_sub(before))
}

async fn applied_versions(pool: &PgPool) -> anyhow::Result<Vec<i64>> {
    threadline_store::schema::applied_versions(pool)
        .await
        .context("reading applied migrations")
}

/// Fails with an actionable message when the database lags the binary.
pub async fn ensure_schema_current(pool: &PgPool) -> anyhow::Result<()> {
    schema_verdict(missing_migrations(pool).await?)
}

/// The migrations this binary has that the database lacks; an error means
/// the database could not be read (unreachable, for example).
pub async fn missing_migrations(pool: &PgPool) -> anyhow::Result<Vec<i64>> {
    let applied = applied_versions(pool).await?;
    Ok(MIGRATOR
        .iter()
        .map(|m| m.version)
        .filter(|v| !applied.contains(v))
        .collect())
}

/// An actionable error when `missing` is not empty.
pub fn schema_verdict(missing: Vec<i64>) -> anyhow::Result<()> {
    if !missing.is_empty() {
        anyhow::bail!(
            "database schema is behind this binary (missing migrations {missing:?}); run `threadline migrate`"
        );
    }
    Ok(())
}

/// Connects now, so that a wrong URL or a stopped server is reported as such
/// (for one-shot commands; services use the lazy [`pool`]).
pub async fn connect(cfg: &CommonConfig) -> anyhow::Result<PgPool> {
    let opts = PgConnectOptions::from_str(&cfg.database_url)
        .context("DATABASE_URL is not a valid Postgres URL")?
        .application_name("threadline-cli");
    // One direct connection first: the pool would only say "timed out".
    use sqlx::Connection as _;
    sqlx::PgConnection::connect_with(&opts)
        .await
        .context("connecting to Postgres (DATABASE_URL)")?
        .close()
        .await
        .ok();
    PgPoolOptions::new()
        .max_connections(2)
        .connect_with(opts)
        .await
        .context("connecting to Postgres (DATABASE_URL)")
}
