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

/// The decision of the over-budget note of the thread at `root_ts`.
pub async fn note_decision(pool: &PgPool, root_ts: &str) -> sqlx::Result<Option<uuid::Uuid>> {
    sqlx::query_scalar!(
        "SELECT decision_id FROM budget_notes WHERE root_ts = $1",
        root_ts
    )
    .fetch_optional(pool)
    .await
}
