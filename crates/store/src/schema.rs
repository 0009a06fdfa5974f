//! The schema: every migration in `migrations/`, compiled in, and which of
//! them a database has applied. Services refuse to run on a schema behind
//! their binary; only `threadline migrate` changes it.

use sqlx::PgPool;
use sqlx::migrate::{Migrate as _, Migrator};

/// Every migration in `migrations/`, compiled into the binaries.
pub static MIGRATOR: Migrator = sqlx::migrate!("../../migrations");

/// The versions of the migrations the database has applied successfully
/// (none when it never saw `threadline migrate`).
pub async fn applied_versions(pool: &PgPool) -> sqlx::Result<Vec<i64>> {
    let exists =
        sqlx::query_scalar!(r#"SELECT to_regclass('_sqlx_migrations') IS NOT NULL AS "exists!""#)
            .fetch_one(pool)
            .await?;
    if !exists {
        return Ok(Vec::new());
    }
    let mut conn = pool.acquire().await?;
    // A migration that failed half way (possible only outside a
    // transaction) is not applied.
    let dirty = conn.dirty_version().await.map_err(migrate_error)?;
    let applied = conn
        .list_applied_migrations()
        .await
        .map_err(migrate_error)?;
    Ok(applied
        .into_iter()
        .map(|m| m.version)
        .filter(|v| Some(*v) != dirty)
        .collect())
}

fn migrate_error(e: sqlx::migrate::MigrateError) -> sqlx::Error {
    match e {
        sqlx::migrate::MigrateError::Execute(e) => e,
        other => sqlx::Error::Protocol(other.to_string()),
    }
}

/// Whether the database answers (a readiness probe).
pub async fn ping(pool: &PgPool) -> sqlx::Result<()> {
    sqlx::query_scalar!(r#"SELECT 1 AS "one!""#)
        .fetch_one(pool)
        .await?;
    Ok(())
}

/// Sets how long the rest of the caller's transaction waits for a lock
/// before it fails with `55P03` (`lock_timeout`, local to the transaction).
pub async fn lock_timeout_local(
    conn: &mut sqlx::PgConnection,
    timeout: std::time::Duration,
) -> sqlx::Result<()> {
    sqlx::query_scalar!(
        r#"SELECT set_config('lock_timeout', $1, true) AS "set!""#,
        format!("{}ms", timeout.as_millis())
    )
    .fetch_one(conn)
    .await?;
    Ok(())
}
