//! Changes an operator makes are attributed: the audit triggers name the
//! actor a transaction declares.

use sqlx::{PgPool, Postgres, Transaction};

/// A transaction acting as `actor` (for example `cli:alice`), whom the
/// audit records of its changes name.
pub async fn begin_as(pool: &PgPool, actor: &str) -> sqlx::Result<Transaction<'static, Postgres>> {
    let mut tx = pool.begin().await?;
    sqlx::query_scalar!("SELECT set_config('threadline.actor', $1, true)", actor)
        .fetch_one(&mut *tx)
        .await?;
    Ok(tx)
}
