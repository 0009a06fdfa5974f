//! Kill switches: global, per installation, per feature. Stored in Postgres
//! so every replica sees a change at once, without a deploy.

use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;

/// The feature name of plain thread replies.
pub const FEATURE_REPLIES: &str = "replies";
/// The feature name of actions beyond a reply (a model's tool calls, posted
/// only after human review).
pub const FEATURE_TOOLS: &str = "tools";
/// Every feature a `feature` switch can name; each is consulted where its
/// work is done (inference before the model call and after it, the
/// publisher inside the claim and right before the post).
pub const FEATURES: [&str; 2] = [FEATURE_REPLIES, FEATURE_TOOLS];

/// The feature that governs an action kind (`thread_reply`, `tool:…`).
pub fn feature_of(action_kind: &str) -> &'static str {
    if action_kind.starts_with("tool:") {
        FEATURE_TOOLS
    } else {
        FEATURE_REPLIES
    }
}

/// A feature name an operator typed, checked against [`FEATURES`].
pub fn parse_feature(name: &str) -> Result<&'static str, String> {
    let name = name.trim();
    FEATURES.into_iter().find(|f| *f == name).ok_or_else(|| {
        format!(
            "unknown feature {name:?}: a feature switch governs one of {}",
            FEATURES.join(", ")
        )
    })
}

/// A scalar subquery naming the first engaged switch (`scope[:target]`)
/// that covers the installation and feature bound to the given statement
/// parameters (installation as text), or NULL: the one definition used by
/// [`engaged`] and by the statements that check switches inside a claim.
pub fn engaged_subquery(inst_param: &str, feature_param: &str) -> String {
    format!(
        "(SELECT CASE WHEN target = '' THEN scope ELSE scope || ':' || target END FROM kill_switches
           WHERE engaged
             AND (scope = 'global'
               OR (scope = 'installation' AND target = {inst_param})
               OR (scope = 'feature' AND target = {feature_param}))
           ORDER BY CASE scope WHEN 'global' THEN 0 WHEN 'installation' THEN 1 ELSE 2 END
           LIMIT 1)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn features_are_known_names_and_action_kinds_map_to_them() {
        assert_eq!(parse_feature(" replies "), Ok(FEATURE_REPLIES));
        assert_eq!(parse_feature("tools"), Ok(FEATURE_TOOLS));
        let err = parse_feature("reply").expect_err("a typo is refused");
        assert!(err.contains("replies, tools"), "{err}");
        assert_eq!(feature_of("thread_reply"), FEATURE_REPLIES);
        assert_eq!(feature_of("tool:create_ticket"), FEATURE_TOOLS);
    }
}

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
    sqlx::query_scalar(&format!("SELECT {}", engaged_subquery("$1", "$2")))
        .bind(installation.to_string())
        .bind(feature)
        .fetch_one(pool)
        .await
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
