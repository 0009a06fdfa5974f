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
