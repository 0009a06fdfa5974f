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

/// A person's verdict on an answer, last changed `ago`.
pub async fn insert_ago(
    pool: &PgPool,
    installation_id: uuid::Uuid,
    user: &str,
    ago: std::time::Duration,
) -> sqlx::Result<()> {
    let ago = sqlx::postgres::types::PgInterval::try_from(ago).map_err(sqlx::Error::Encode)?;
    sqlx::query!(
        "INSERT INTO answer_feedback (decision_id, user_id, installation_id, verdict, action_ts, updated_at)
         VALUES ($1, $2, $3, 'positive', 1, now() - $4::interval)",
        uuid::Uuid::now_v7(),
        user,
        installation_id,
        ago
    )
    .execute(pool)
    .await?;
    Ok(())
}
