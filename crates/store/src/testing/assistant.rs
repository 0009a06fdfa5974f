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

/// Inserts an assistant thread of `installation_id` in `channel` last
/// changed `ago` ago.
pub async fn insert_updated_ago(
    pool: &sqlx::PgPool,
    installation_id: uuid::Uuid,
    channel: &str,
    thread_ts: &str,
    ago: std::time::Duration,
) -> sqlx::Result<()> {
    let ago = sqlx::postgres::types::PgInterval::try_from(ago).map_err(sqlx::Error::Encode)?;
    sqlx::query!(
        "INSERT INTO assistant_threads (installation_id, channel_id, thread_ts, user_id, updated_at)
         VALUES ($1, $2, $3, 'U1', now() - $4::interval)",
        installation_id,
        channel,
        thread_ts,
        ago
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// The thread roots of the assistant threads kept, in order.
pub async fn thread_roots(pool: &sqlx::PgPool) -> sqlx::Result<Vec<String>> {
    sqlx::query_scalar!("SELECT thread_ts FROM assistant_threads ORDER BY thread_ts")
        .fetch_all(pool)
        .await
}

/// The decision whose progress the publisher last set showing in the
/// thread (`None`: none showing).
pub async fn status_decision(
    pool: &sqlx::PgPool,
    channel: &str,
    thread_ts: &str,
) -> sqlx::Result<Option<uuid::Uuid>> {
    Ok(sqlx::query_scalar!(
        "SELECT status_decision FROM assistant_threads WHERE channel_id = $1 AND thread_ts = $2",
        channel,
        thread_ts
    )
    .fetch_optional(pool)
    .await?
    .flatten())
}

/// Seconds until the thread's progress is due to be looked at again
/// (`None`: not due).
pub async fn due_in(
    pool: &sqlx::PgPool,
    channel: &str,
    thread_ts: &str,
) -> sqlx::Result<Option<f64>> {
    Ok(sqlx::query_scalar!(
        r#"SELECT extract(epoch FROM status_due_at - now())::float8 AS "due_in"
             FROM assistant_threads WHERE channel_id = $1 AND thread_ts = $2"#,
        channel,
        thread_ts
    )
    .fetch_optional(pool)
    .await?
    .flatten())
}

/// Holds the thread's row locked (as a sweeper taking it would) until the
/// transaction ends.
pub async fn hold(
    pool: &sqlx::PgPool,
    channel: &str,
    thread_ts: &str,
) -> sqlx::Result<sqlx::Transaction<'static, sqlx::Postgres>> {
    let mut tx = pool.begin().await?;
    sqlx::query!(
        "SELECT 1 AS one FROM assistant_threads WHERE channel_id = $1 AND thread_ts = $2 FOR UPDATE",
        channel,
        thread_ts
    )
    .fetch_one(&mut *tx)
    .await?;
    Ok(tx)
}
