//! Kill switches: global, per installation, per feature. Stored in Postgres
//! so every replica sees a change at once, without a deploy.

use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;

/// The feature name of plain thread replies.
pub const FEATURE_REPLIES: &str = "replies";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct Switch {
    pub scope: String,
    pub target: String,
    pub engaged: bool,
    pub reason: Option<String>,
    pub changed_by: String,
}

/// The first engaged switch that covers this installation and feature, as
/// `scope:target`, or none.
pub async fn engaged(
    pool: &PgPool,
    installation: Uuid,
    feature: &str,
) -> sqlx::Result<Option<String>> {
    let row: Option<(String, String)> = sqlx::query_as(
        "SELECT scope, target FROM kill_switches
          WHERE engaged
            AND (scope = 'global'
              OR (scope = 'installation' AND target = $1)
              OR (scope = 'feature' AND target = $2))
          ORDER BY CASE scope WHEN 'global' THEN 0 WHEN 'installation' THEN 1 ELSE 2 END
          LIMIT 1",
    )
    .bind(installation.to_string())
    .bind(feature)
    .fetch_optional(pool)
    .await?;
    Ok(row.map(|(scope, target)| {
        if target.is_empty() {
            scope
        } else {
            format!("{scope}:{target}")
        }
    }))
}

/// Engages or releases one switch.
pub async fn set(
    pool: &PgPool,
    scope: &str,
    target: &str,
    engaged: bool,
    reason: Option<&str>,
    by: &str,
) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO kill_switches (scope, target, engaged, reason, changed_by) VALUES ($1, $2, $3, $4, $5)
         ON CONFLICT (scope, target) DO UPDATE
            SET engaged = EXCLUDED.engaged, reason = EXCLUDED.reason, changed_by = EXCLUDED.changed_by, changed_at = now()",
    )
    .bind(scope)
    .bind(target)
    .bind(engaged)
    .bind(reason)
    .bind(by)
    .execute(pool)
    .await?;
    Ok(())
}

pub async fn list(pool: &PgPool) -> sqlx::Result<Vec<Switch>> {
    sqlx::query_as("SELECT scope, target, engaged, reason, changed_by FROM kill_switches ORDER BY scope, target")
        .fetch_all(pool)
        .await
}
