//! Reads of the feedback on answers for the tests and the soak.

use sqlx::PgPool;

/// Every person's recorded verdict on every answer: (decision, Slack user
/// id, verdict), in that order.
pub async fn verdicts(pool: &PgPool) -> sqlx::Result<Vec<(uuid::Uuid, String, String)>> {
    Ok(sqlx::query!(
        "SELECT decision_id, user_id, verdict FROM answer_feedback ORDER BY decision_id, user_id"
    )
    .fetch_all(pool)
    .await?
    .into_iter()
    .map(|r| (r.decision_id, r.user_id, r.verdict))
    .collect())
}
