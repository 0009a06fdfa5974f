//! Reads for the `agent_views` table (see `crate::agent_view`).

/// The viewed channel recorded for an agent's Messages tab (`None`: no
/// such tab).
pub async fn context_channel(pool: &sqlx::PgPool, channel: &str) -> Option<Option<String>> {
    sqlx::query_scalar!(
        "SELECT context_channel_id FROM agent_views WHERE channel_id = $1",
        channel
    )
    .fetch_optional(pool)
    .await
    .unwrap_or_else(|e| panic!("reading agent_views: {e}"))
}

/// An agent Messaging tab last opened or changed `ago`.
pub async fn insert_ago(
    pool: &sqlx::PgPool,
    installation_id: uuid::Uuid,
    channel: &str,
    ago: std::time::Duration,
) -> sqlx::Result<()> {
    let ago = sqlx::postgres::types::PgInterval::try_from(ago).map_err(sqlx::Error::Encode)?;
    sqlx::query!(
        "INSERT INTO agent_views (installation_id, channel_id, user_id, opened_at, updated_at)
         VALUES ($1, $2, 'U0TAB', now() - $3::interval, now() - $3::interval)",
        installation_id,
        channel,
        ago
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// The channels of the agent Messaging tabs recorded, sorted.
pub async fn channels(pool: &sqlx::PgPool) -> sqlx::Result<Vec<String>> {
    sqlx::query_scalar!("SELECT channel_id FROM agent_views ORDER BY channel_id")
        .fetch_all(pool)
        .await
}

/// Holds the row of the agent tab in DM `channel` locked until the
/// returned transaction ends: recording a change of what the person looks
/// at waits for it.
pub async fn hold_tab(
    pool: &sqlx::PgPool,
    channel: &str,
) -> sqlx::Result<sqlx::Transaction<'static, sqlx::Postgres>> {
    let mut tx = pool.begin().await?;
    sqlx::query_scalar!(
        r#"SELECT 1 AS "one!" FROM agent_views WHERE channel_id = $1 FOR UPDATE"#,
        channel
    )
    .fetch_one(&mut *tx)
    .await?;
    Ok(tx)
}
