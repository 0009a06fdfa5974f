//! The schema: every migration in `migrations/`, compiled in. Services
//! refuse to run on a schema behind their binary
//! (`threadline_runtime::db` compares a database with [`MIGRATOR`]); only
//! `threadline migrate` changes it.

use sqlx::PgPool;
use sqlx::migrate::Migrator;

/// Every migration in `migrations/`, compiled into the binaries.
pub static MIGRATOR: Migrator = sqlx::migrate!("../../migrations");

/// Whether the database answers (a readiness probe).
pub async fn ping(pool: &PgPool) -> sqlx::Result<()> {
    sqlx::query_scalar!(r#"SELECT 1 AS "one!""#)
        .fetch_one(pool)
        .await?;
    Ok(())
}
