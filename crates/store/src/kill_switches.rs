//! Kill switches: global, per installation, per feature. Stored in Postgres
//! so every replica sees a change at once, without a deploy. Which switch
//! covers what is the schema's `engaged_switch(installation, feature)`
//! (migration 0019), the one definition every check uses.

use sqlx::PgExecutor;
use uuid::Uuid;

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Switch {
    pub scope: String,
    pub target: String,
    pub engaged: bool,
    pub reason: Option<String>,
    pub changed_by: String,
}

/// The first engaged switch that covers this installation and feature, as
/// `scope[:target]`, or none.
pub async fn engaged(
    conn: impl PgExecutor<'_>,
    installation: Uuid,
    feature: &str,
) -> sqlx::Result<Option<String>> {
    sqlx::query_scalar!(
        r#"SELECT (SELECT e.switch FROM engaged_switch($1, $2) e) AS "switch?""#,
        installation.to_string(),
        feature
    )
    .fetch_one(conn)
    .await
}

/// Engages or releases one switch.
pub async fn set(
    conn: impl PgExecutor<'_>,
    scope: &str,
    target: &str,
    engaged: bool,
    reason: Option<&str>,
    by: &str,
) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO kill_switches (scope, target, engaged, reason, changed_by) VALUES ($1, $2, $3, $4, $5)
         ON CONFLICT (scope, target) DO UPDATE
            SET engaged = EXCLUDED.engaged, reason = EXCLUDED.reason, changed_by = EXCLUDED.changed_by,
                changed_at = now()",
        scope,
        target,
        engaged,
        reason,
        by
    )
    .execute(conn)
    .await?;
    Ok(())
}

pub async fn list(conn: impl PgExecutor<'_>) -> sqlx::Result<Vec<Switch>> {
    sqlx::query_as!(
        Switch,
        "SELECT scope, target, engaged, reason, changed_by FROM kill_switches ORDER BY scope, target"
    )
    .fetch_all(conn)
    .await
}
