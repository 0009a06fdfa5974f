//! What an installation knows of its channels: whether each is private
//! (learned from events or `conversations.info`, kept for an hour), and the
//! shared Slack read budgets that every replica draws from together.

use sqlx::PgPool;
use uuid::Uuid;

/// What the installation learned within the hour about whether `channel`
/// is private (a channel can be converted, so nothing is kept for ever).
pub async fn channel_kind(pool: &PgPool, inst: Uuid, channel: &str) -> sqlx::Result<Option<bool>> {
    sqlx::query_scalar!(
        "SELECT is_private FROM channel_kinds
          WHERE installation_id = $1 AND channel_id = $2 AND checked_at > now() - interval '1 hour'",
        inst,
        channel
    )
    .fetch_optional(pool)
    .await
}

/// Remembers whether `channel` is private; writes only when the answer
/// changed or is getting old, so message traffic does not churn the row.
pub async fn learn_channel_kind(
    pool: &PgPool,
    inst: Uuid,
    channel: &str,
    private: bool,
    from: &str,
) -> sqlx::Result<()> {
    // The NOT EXISTS keeps the common case (nothing new) a plain read: an
    // ON CONFLICT that updates nothing still locks the row and commits a
    // write, and every message of a channel would queue on it.
    sqlx::query!(
        "INSERT INTO channel_kinds (installation_id, channel_id, is_private, learned_from)
         SELECT $1, $2, $3, $4
          WHERE NOT EXISTS (SELECT 1 FROM channel_kinds
                             WHERE installation_id = $1 AND channel_id = $2 AND is_private = $3
                               AND checked_at >= now() - interval '10 minutes')
         ON CONFLICT (installation_id, channel_id) DO UPDATE
            SET is_private = EXCLUDED.is_private, learned_from = EXCLUDED.learned_from, checked_at = now()
          WHERE channel_kinds.is_private IS DISTINCT FROM EXCLUDED.is_private
             OR channel_kinds.checked_at < now() - interval '10 minutes'",
        inst,
        channel,
        private,
        from
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Takes one call of `method` from the installation's shared budget of
/// `per_minute` calls; false when the budget is spent or paused.
pub async fn take_read_budget(
    pool: &PgPool,
    inst: Uuid,
    method: &str,
    per_minute: i32,
) -> sqlx::Result<bool> {
    // Two statements: an UPDATE does not see a row that a data-modifying
    // CTE of its own statement inserted.
    sqlx::query!(
        "INSERT INTO slack_read_budgets (installation_id, method) VALUES ($1, $2) ON CONFLICT DO NOTHING",
        inst,
        method
    )
    .execute(pool)
    .await?;
    let r = sqlx::query!(
        "UPDATE slack_read_budgets
            SET calls = CASE WHEN window_start <= now() - interval '1 minute' THEN 1 ELSE calls + 1 END,
                window_start = CASE WHEN window_start <= now() - interval '1 minute' THEN now() ELSE window_start END
          WHERE installation_id = $1 AND method = $2
            AND (paused_until IS NULL OR paused_until <= now())
            AND (window_start <= now() - interval '1 minute' OR calls < $3)",
        inst,
        method,
        per_minute
    )
    .execute(pool)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// Pauses the budget for `wait` seconds (Slack said so with a 429).
pub async fn pause_read_budget(
    pool: &PgPool,
    inst: Uuid,
    method: &str,
    wait_secs: f64,
) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE slack_read_budgets SET paused_until = now() + make_interval(secs => $3)
          WHERE installation_id = $1 AND method = $2",
        inst,
        method,
        wait_secs
    )
    .execute(pool)
    .await?;
    Ok(())
}
