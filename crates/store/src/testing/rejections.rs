//! Test fixtures and reads for the `rejections` family (see `crate::rejections`).

/// How many deliveries were rejected.
pub async fn count_rejections(pool: &sqlx::PgPool) -> sqlx::Result<i64> {
    sqlx::query_scalar!(r#"SELECT count(*) AS "n!" FROM rejections"#)
        .fetch_one(pool)
        .await
}

/// Rejections counted by reason, by reason.
pub async fn rejections_by_reason(pool: &sqlx::PgPool) -> sqlx::Result<Vec<(String, i64)>> {
    let rows = sqlx::query!(
        r#"SELECT reason, count(*) AS "n!" FROM rejections GROUP BY reason ORDER BY reason"#
    )
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().map(|r| (r.reason, r.n)).collect())
}

/// Every rejection's event id (when it had one) and reason.
pub async fn rejected_events(pool: &sqlx::PgPool) -> sqlx::Result<Vec<(Option<String>, String)>> {
    let rows = sqlx::query!("SELECT event_id, reason FROM rejections")
        .fetch_all(pool)
        .await?;
    Ok(rows.into_iter().map(|r| (r.event_id, r.reason)).collect())
}

/// How many `app_rate_limited` notices were recorded.
pub async fn count_app_rate_limit_notices(pool: &sqlx::PgPool) -> sqlx::Result<i64> {
    sqlx::query_scalar!(r#"SELECT count(*) AS "n!" FROM app_rate_limit_notices"#)
        .fetch_one(pool)
        .await
}
