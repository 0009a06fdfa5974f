//! Reads of admission and budgets for the tests.

use sqlx::PgPool;

/// The context stage's audit records of parking and resuming: (outcome,
/// reason), oldest first.
pub async fn audit_outcomes(pool: &PgPool) -> sqlx::Result<Vec<(String, Option<String>)>> {
    Ok(sqlx::query!(
        "SELECT outcome, reason FROM audit_log
          WHERE stage = 'context' AND (outcome = 'resumed' OR reason LIKE 'parked:%') ORDER BY id"
    )
    .fetch_all(pool)
    .await?
    .into_iter()
    .map(|r| (r.outcome, r.reason))
    .collect())
}

/// The state of the request `receipt`'s place in its installation's line
/// (`parked` or `admitted`), if it holds one.
pub async fn work_state(pool: &PgPool, receipt: uuid::Uuid) -> sqlx::Result<Option<String>> {
    sqlx::query_scalar!(
        "SELECT state FROM tenant_work WHERE receipt_id = $1",
        receipt
    )
    .fetch_optional(pool)
    .await
}

/// The decision of the over-budget note of the thread at `root_ts`.
pub async fn note_decision(pool: &PgPool, root_ts: &str) -> sqlx::Result<Option<uuid::Uuid>> {
    sqlx::query_scalar!(
        "SELECT decision_id FROM budget_notes WHERE root_ts = $1",
        root_ts
    )
    .fetch_optional(pool)
    .await
}

/// A day's model tokens of `installation_id`, `days_ago` UTC days back.
pub async fn insert_tokens_days_ago(
    pool: &PgPool,
    installation_id: uuid::Uuid,
    days_ago: i32,
    tokens: i64,
) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO tenant_tokens (installation_id, day, tokens)
         VALUES ($1, (now() - make_interval(days => $2::int))::date, $3)",
        installation_id,
        days_ago,
        tokens
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// An over-budget note in thread `root_ts` of channel `C1`, given `ago`.
pub async fn insert_note_ago(
    pool: &PgPool,
    installation_id: uuid::Uuid,
    root_ts: &str,
    ago: std::time::Duration,
) -> sqlx::Result<()> {
    let ago = sqlx::postgres::types::PgInterval::try_from(ago).map_err(sqlx::Error::Encode)?;
    sqlx::query!(
        "INSERT INTO budget_notes (installation_id, channel_id, root_ts, decision_id, noted_at)
         VALUES ($1, 'C1', $2, $3, now() - $4::interval)",
        installation_id,
        root_ts,
        uuid::Uuid::now_v7(),
        ago
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// The budget records left: (days of token counts, note roots), sorted.
pub async fn retained(pool: &PgPool) -> sqlx::Result<(i64, Vec<String>)> {
    let days = sqlx::query_scalar!(r#"SELECT count(*) AS "n!" FROM tenant_tokens"#)
        .fetch_one(pool)
        .await?;
    let roots = sqlx::query_scalar!("SELECT root_ts FROM budget_notes ORDER BY root_ts")
        .fetch_all(pool)
        .await?;
    Ok((days, roots))
}

/// The model tokens `installation` has used today (UTC), as its budget
/// counts them.
pub async fn tokens_today(pool: &PgPool, installation: uuid::Uuid) -> sqlx::Result<i64> {
    sqlx::query_scalar!(
        r#"SELECT coalesce(sum(tokens), 0)::bigint AS "n!" FROM tenant_tokens
            WHERE installation_id = $1 AND day = (now() AT TIME ZONE 'UTC')::date"#,
        installation
    )
    .fetch_one(pool)
    .await
}
