//! Postgres pool and the schema check. Services check that the schema is
//! current at start and refuse to run otherwise; only `threadline migrate`
//! changes it. The migrations themselves are the store's
//! (`threadline_store::schema::MIGRATOR`, compiled into each binary); this
//! module applies and compares whatever migrator it is given, through
//! sqlx's migrator alone (no statement of its own).

use std::str::FromStr;

use anyhow::Context as _;
use sqlx::migrate::{Migrate as _, MigrateError, Migrator};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

use crate::config::CommonConfig;

/// A lazily connecting pool: the process starts even while Postgres is down
/// (readiness reports it), and each acquire waits at most the configured time.
pub fn pool(cfg: &CommonConfig) -> anyhow::Result<PgPool> {
    Ok(pool_options(cfg).connect_lazy_with(connect_options(cfg)?))
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

/// The configured pool size and acquire timeout, for a pool that needs
/// more (a hook after each connect).
pub fn pool_options(cfg: &CommonConfig) -> PgPoolOptions {
    PgPoolOptions::new()
        .max_connections(cfg.db_max_connections)
        .acquire_timeout(cfg.db_acquire_timeout)
}

/// Where the configured database is (`DATABASE_URL`), as a service.
pub fn connect_options(cfg: &CommonConfig) -> anyhow::Result<PgConnectOptions> {
    Ok(PgConnectOptions::from_str(&cfg.database_url)
        .context("DATABASE_URL is not a valid Postgres URL")?
        .application_name("threadline"))
}

/// Applies `migrator`'s pending migrations. Idempotent.
pub async fn migrate(pool: &PgPool, migrator: &Migrator) -> anyhow::Result<usize> {
    let before = applied_versions(pool).await.unwrap_or_default().len();
    migrator.run(pool).await.context("applying migrations")?;
    let after = applied_versions(pool).await?.len();
    Ok(after.saturating_sub(before))
}

/// The versions of the migrations the database has applied successfully
/// (none when it never saw `threadline migrate`).
async fn applied_versions(pool: &PgPool) -> anyhow::Result<Vec<i64>> {
    let mut conn = pool.acquire().await.context("reading applied migrations")?;
    // A migration that failed half way (possible only outside a
    // transaction) is not applied.
    let read = async {
        let dirty = conn.dirty_version().await?;
        let applied = conn.list_applied_migrations().await?;
        Ok::<_, MigrateError>((dirty, applied))
    };
    match read.await {
        Ok((dirty, applied)) => Ok(applied
            .into_iter()
            .map(|m| m.version)
            .filter(|v| Some(*v) != dirty)
            .collect()),
        // No `_sqlx_migrations` table (42P01): never migrated.
        Err(MigrateError::Execute(sqlx::Error::Database(db)))
            if db.code().as_deref() == Some("42P01") =>
        {
            Ok(Vec::new())
        }
        Err(e) => Err(anyhow::Error::new(e).context("reading applied migrations")),
    }
}

/// Fails with an actionable message when the database lags `migrator`.
pub async fn ensure_schema_current(pool: &PgPool, migrator: &Migrator) -> anyhow::Result<()> {
    schema_verdict(missing_migrations(pool, migrator).await?)
}

/// The migrations of `migrator` (the binary's) that the database lacks; an
/// error means the database could not be read (unreachable, for example).
pub async fn missing_migrations(pool: &PgPool, migrator: &Migrator) -> anyhow::Result<Vec<i64>> {
    let applied = applied_versions(pool).await?;
    Ok(migrator
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
