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
    .ok()
    .flatten()
}
