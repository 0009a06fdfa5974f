//! Test fixtures and reads for the `oauth_states` table (see `crate::oauth_states`).

/// Makes every pending OAuth state expired (a second ago).
pub async fn expire_oauth_states(pool: &sqlx::PgPool) -> sqlx::Result<()> {
    sqlx::query!("UPDATE oauth_states SET expires_at = now() - interval '1 second'")
        .execute(pool)
        .await?;
    Ok(())
}

/// How many OAuth states are stored.
pub async fn count_oauth_states(pool: &sqlx::PgPool) -> sqlx::Result<i64> {
    sqlx::query_scalar!(r#"SELECT count(*) AS "n!" FROM oauth_states"#)
        .fetch_one(pool)
        .await
}
