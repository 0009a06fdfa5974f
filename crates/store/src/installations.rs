//! Installations: one per workspace (or organisation) that installed the
//! app, never deleted (receipts and audit records refer to them).

use sqlx::PgPool;
use threadline_domain::InstallationKey;
use threadline_domain::classify::BotIdentity;
use threadline_domain::state::{InstallationStatus, Machine as _};
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
    Ok(lookup_with_bot(pool, key).await?.0)
}

/// [`lookup`], with the installation's bot (what tells our own messages
/// from others').
pub async fn lookup_with_bot(
    pool: &PgPool,
    key: &InstallationKey,
) -> Result<(Resolved, Option<BotIdentity>), sqlx::Error> {
    let team = if key.is_enterprise_install {
        None
    } else {
        key.team_id.as_ref().map(|t| t.as_str())
    };
    let row = sqlx::query!(
        "SELECT id, status, app_id, bot_id, bot_user_id FROM installations
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
        None => (Resolved::Unknown, None),
        Some(r) => {
            let resolved = if r.status == "active" {
                Resolved::Active(r.id)
            } else {
                Resolved::Disabled(r.id)
            };
            let bot = BotIdentity {
                app_id: r.app_id,
                bot_id: r.bot_id,
                bot_user_id: r.bot_user_id,
            };
            (resolved, Some(bot))
        }
    })
}

/// Whether the installation exists.
pub async fn exists(pool: &PgPool, id: Uuid) -> sqlx::Result<bool> {
    sqlx::query_scalar!(
        r#"SELECT EXISTS (SELECT 1 FROM installations WHERE id = $1) AS "exists!""#,
        id
    )
    .fetch_one(pool)
    .await
}

/// An installation as `threadline install list` shows it: identifiers and
/// status, never token material.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Listed {
    pub id: Uuid,
    pub app_id: String,
    pub enterprise_id: Option<String>,
    pub team_id: Option<String>,
    pub org_wide: bool,
    pub status: InstallationStatus,
    pub token_key_id: Option<String>,
}

pub async fn list(pool: &PgPool) -> sqlx::Result<Vec<Listed>> {
    let rows = sqlx::query!(
        r#"SELECT id, app_id, enterprise_id, team_id, is_enterprise_install AS org_wide, status,
                  bot_token_key_id AS token_key_id
             FROM installations ORDER BY created_at"#
    )
    .fetch_all(pool)
    .await?;
    rows.into_iter()
        .map(|r| {
            Ok(Listed {
                id: r.id,
                app_id: r.app_id,
                enterprise_id: r.enterprise_id,
                team_id: r.team_id,
                org_wide: r.org_wide,
                status: InstallationStatus::parse(&r.status).map_err(|e| {
                    sqlx::Error::Decode(format!("installations.status: {e}").into())
                })?,
                token_key_id: r.token_key_id,
            })
        })
        .collect()
}

/// Which of an installation's sealed tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenKind {
    Bot,
    Refresh,
}

impl TokenKind {
    /// The purpose its sealing binds (the AAD's).
    pub fn purpose(self) -> &'static str {
        match self {
            TokenKind::Bot => "bot",
            TokenKind::Refresh => "refresh",
        }
    }
}

/// A sealed token: the installation, the sealed bytes and the id of the
/// key that sealed them.
#[derive(Debug, Clone)]
pub struct SealedToken {
    pub id: Uuid,
    pub bytes: Vec<u8>,
    pub key_id: String,
}

/// The tokens of `kind` sealed with another key than `key_id`.
pub async fn sealed_with_other_key(
    pool: &PgPool,
    kind: TokenKind,
    key_id: &str,
) -> sqlx::Result<Vec<SealedToken>> {
    match kind {
        TokenKind::Bot => {
            sqlx::query_as!(
                SealedToken,
                r#"SELECT id, bot_token_sealed AS "bytes!", bot_token_key_id AS "key_id!" FROM installations
                    WHERE bot_token_sealed IS NOT NULL AND bot_token_key_id <> $1"#,
                key_id
            )
            .fetch_all(pool)
            .await
        }
        TokenKind::Refresh => {
            sqlx::query_as!(
                SealedToken,
                r#"SELECT id, refresh_token_sealed AS "bytes!", refresh_token_key_id AS "key_id!" FROM installations
                    WHERE refresh_token_sealed IS NOT NULL AND refresh_token_key_id <> $1"#,
                key_id
            )
            .fetch_all(pool)
            .await
        }
    }
}

/// Stores a token sealed anew (`new`) in place of `old`, compare-and-set
/// on the old sealed bytes, and only while no refresh holds the
/// installation's lease: a token refreshed meanwhile (under any key) is
/// never overwritten with the stale one, and a refresh under way never
/// finds its spent token re-sealed (its store would then fail and lose
/// what Slack granted). True when stored; false means read it again.
pub async fn reseal(
    pool: &PgPool,
    kind: TokenKind,
    old: &SealedToken,
    new: &SealedToken,
) -> sqlx::Result<bool> {
    let r = match kind {
        TokenKind::Bot => {
            sqlx::query!(
                "UPDATE installations SET bot_token_sealed = $2, bot_token_key_id = $3, updated_at = now()
                  WHERE id = $1 AND bot_token_key_id = $4 AND bot_token_sealed = $5
                    AND (refresh_lease_until IS NULL OR refresh_lease_until < now())",
                old.id,
                new.bytes,
                new.key_id,
                old.key_id,
                old.bytes
            )
            .execute(pool)
            .await?
        }
        TokenKind::Refresh => {
            sqlx::query!(
                "UPDATE installations SET refresh_token_sealed = $2, refresh_token_key_id = $3, updated_at = now()
                  WHERE id = $1 AND refresh_token_key_id = $4 AND refresh_token_sealed = $5
                    AND (refresh_lease_until IS NULL OR refresh_lease_until < now())",
                old.id,
                new.bytes,
                new.key_id,
                old.key_id,
                old.bytes
            )
            .execute(pool)
            .await?
        }
    };
    Ok(r.rows_affected() == 1)
}
