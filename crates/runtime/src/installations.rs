//! Registering an installation with its sealed tokens, in one transaction:
//! never an active installation without its token. Used by
//! `threadline install add` and by the OAuth callback.

use anyhow::Context as _;
use secrecy::{ExposeSecret as _, SecretString};
use sqlx::PgPool;
use uuid::Uuid;

use crate::secrets::{TokenCipher, token_aad};

/// What Slack (or an operator) says about one installation. Identifiers are
/// validated by the caller.
pub struct Registration<'a> {
    pub app_id: &'a str,
    pub team_id: Option<&'a str>,
    pub enterprise_id: Option<&'a str>,
    pub org_wide: bool,
    pub bot_user_id: &'a str,
    pub bot_id: &'a str,
    pub scopes: &'a [String],
    pub bot_token: &'a SecretString,
    pub refresh_token: Option<&'a SecretString>,
    /// Seconds until the bot token expires (token rotation).
    pub expires_in: Option<i64>,
}

/// Inserts or updates (re-install) the installation; returns its id and the
/// id of the key that sealed its tokens.
pub async fn register(
    pool: &PgPool,
    cipher: &TokenCipher,
    r: &Registration<'_>,
) -> anyhow::Result<(Uuid, String)> {
    macro_rules! upsert_sql {
        ($conflict:literal) => {
            concat!(
                "INSERT INTO installations (id, app_id, enterprise_id, team_id, is_enterprise_install, bot_user_id, bot_id, scopes)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
                 ON CONFLICT ", $conflict, " DO UPDATE
                    SET enterprise_id = EXCLUDED.enterprise_id, bot_user_id = EXCLUDED.bot_user_id,
                        bot_id = EXCLUDED.bot_id, scopes = EXCLUDED.scopes, status = 'active',
                        disabled_reason = NULL, updated_at = now()
                 RETURNING id"
            )
        };
    }
    let sql: &'static str = if r.org_wide {
        upsert_sql!("(app_id, enterprise_id) WHERE is_enterprise_install")
    } else {
        upsert_sql!("(app_id, team_id) WHERE NOT is_enterprise_install")
    };
    let mut tx = pool.begin().await?;
    let id: Uuid = sqlx::query_scalar(sql)
        .bind(Uuid::now_v7())
        .bind(r.app_id)
        .bind(r.enterprise_id)
        .bind(if r.org_wide { None } else { r.team_id })
        .bind(r.org_wide)
        .bind(r.bot_user_id)
        .bind(r.bot_id)
        .bind(r.scopes)
        .fetch_one(&mut *tx)
        .await
        .context("registering the installation")?;
    let bot = cipher.seal(
        r.bot_token.expose_secret().as_bytes(),
        &token_aad(&id, "bot"),
    )?;
    let refresh = r
        .refresh_token
        .map(|t| cipher.seal(t.expose_secret().as_bytes(), &token_aad(&id, "refresh")))
        .transpose()?;
    sqlx::query(
        "UPDATE installations
            SET bot_token_sealed = $2, bot_token_key_id = $3, refresh_token_sealed = $4, refresh_token_key_id = $5,
                token_expires_at = CASE WHEN $6::bigint IS NULL THEN NULL ELSE now() + make_interval(secs => $6::bigint) END,
                refresh_lease_until = NULL, refresh_lease_holder = NULL, refresh_unknown_since = NULL,
                updated_at = now()
          WHERE id = $1",
    )
    .bind(id)
    .bind(&bot.bytes)
    .bind(&bot.key_id)
    .bind(refresh.as_ref().map(|s| s.bytes.clone()))
    .bind(refresh.as_ref().map(|s| s.key_id.clone()))
    .bind(r.expires_in)
    .execute(&mut *tx)
    .await
    .context("storing the sealed tokens")?;
    tx.commit().await.context("committing the installation")?;
    Ok((id, bot.key_id))
}
