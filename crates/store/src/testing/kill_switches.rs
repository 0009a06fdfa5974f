//! Test fixtures and reads for the `kill_switches` family (see `crate::kill_switches`).

/// How many switches are recorded, engaged or not.
pub async fn count_rows(pool: &sqlx::PgPool) -> sqlx::Result<i64> {
    sqlx::query_scalar!(r#"SELECT count(*) AS "n!" FROM kill_switches"#)
        .fetch_one(pool)
        .await
}

/// The targets of the engaged switches, sorted.
pub async fn engaged_targets(pool: &sqlx::PgPool) -> sqlx::Result<Vec<String>> {
    sqlx::query_scalar!("SELECT target FROM kill_switches WHERE engaged ORDER BY target")
        .fetch_all(pool)
        .await
}
