//! Installations: one per workspace (or organisation) that installed the
//! app, never deleted (receipts and audit records refer to them).

use sqlx::PgPool;
use threadline_domain::InstallationKey;
use uuid::Uuid;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolved {
    Active(Uuid),
    Disabled(Uuid),
    Unknown,
}

/// A workspace install matches on (app, team); an org-wide install on
/// (app, enterprise). A workspace install wins when both exist.
pub async fn lookup(pool: &PgPool, key: &InstallationKey) -> Result<Resolved, sqlx::Error> {
    let team = if key.is_enterprise_install {
        None
    } else {
        key.team_id.as_ref().map(|t| t.as_str())
    };
    let row = sqlx::query!(
        "SELECT id, status FROM installations
          WHERE app_id = $1
            AND ((NOT is_enterprise_install AND team_id = $2)
              OR (is_enterprise_install AND enterprise_id = $3))
          ORDER BY is_enterprise_install
          LIMIT 1",
        key.app_id.as_str(),
        team,
        key.enterprise_id.as_ref().map(|e| e.as_str()),
    )
    .fetch_optional(pool)
    .await?;
    Ok(match row {
        None => Resolved::Unknown,
        Some(r) if r.status == "active" => Resolved::Active(r.id),
        Some(r) => Resolved::Disabled(r.id),
    })
}

/// The bot's identity in the installation's workspace and the scopes it
/// was granted.
pub async fn bot_identity(pool: &PgPool, id: Uuid) -> sqlx::Result<(String, Vec<String>)> {
    let r = sqlx::query!("SELECT bot_id, scopes FROM installations WHERE id = $1", id)
        .fetch_one(pool)
        .await?;
    Ok((r.bot_id, r.scopes))
}

/// Whether the installation exists and is active (not uninstalled, revoked
/// or disabled by an operator).
pub async fn is_active(pool: &PgPool, id: Uuid) -> sqlx::Result<bool> {
    let status = sqlx::query_scalar!("SELECT status FROM installations WHERE id = $1", id)
        .fetch_optional(pool)
        .await?;
    Ok(status.as_deref() == Some("active"))
}
