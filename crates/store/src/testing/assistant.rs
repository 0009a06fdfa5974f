//! Reads for the `assistant_threads` family (see `crate::assistant`).

/// The context channel recorded for an assistant thread (`None`: no such
/// thread).
pub async fn context_channel(
    pool: &sqlx::PgPool,
    channel: &str,
    thread_ts: &str,
) -> Option<Option<String>> {
    sqlx::query_scalar!(
        "SELECT context_channel_id FROM assistant_threads WHERE channel_id = $1 AND thread_ts = $2",
        channel,
        thread_ts
    )
    .fetch_optional(pool)
    .await
    .ok()
    .flatten()
}
