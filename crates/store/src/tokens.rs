//! An installation's tokens as stored: sealed bytes and the id of the key
//! that sealed them (the caller seals and opens; this module never sees a
//! token in the clear), their expiry, and the refresh lease that lets one
//! process at a time exchange the refresh token. Every write after an
//! exchange is a compare-and-set on the refresh token exchanged, so a
//! reinstall meanwhile stands.

use sqlx::{PgConnection, PgPool};
use threadline_domain::state::{InstallationStatus, Machine as _};
use uuid::Uuid;

/// What the row says about the installation's tokens.
pub struct Stored {
    pub status: InstallationStatus,
    pub bot_sealed: Option<Vec<u8>>,
    pub bot_key_id: Option<String>,
    pub refresh_sealed: Option<Vec<u8>>,
    pub refresh_key_id: Option<String>,
    /// Seconds until the bot token expires (negative once expired); none
    /// when it does not expire.
    pub expires_in: Option<f64>,
    /// The bot the token speaks as, and its granted scopes (empty when
    /// never recorded: a manual install).
    pub bot_id: String,
    pub scopes: Vec<String>,
}

pub async fn read(pool: &PgPool, inst: Uuid) -> sqlx::Result<Option<Stored>> {
    let Some(r) = sqlx::query!(
        r#"SELECT status, bot_token_sealed AS bot_sealed, bot_token_key_id AS bot_key_id,
                  refresh_token_sealed AS refresh_sealed, refresh_token_key_id AS refresh_key_id,
                  extract(epoch FROM token_expires_at - now())::float8 AS expires_in, bot_id, scopes
             FROM installations WHERE id = $1"#,
        inst
    )
    .fetch_optional(pool)
    .await?
    else {
        return Ok(None);
    };
    Ok(Some(Stored {
        status: InstallationStatus::parse(&r.status)
            .map_err(|e| sqlx::Error::Decode(format!("installations.status: {e}").into()))?,
        bot_sealed: r.bot_sealed,
        bot_key_id: r.bot_key_id,
        refresh_sealed: r.refresh_sealed,
        refresh_key_id: r.refresh_key_id,
        expires_in: r.expires_in,
        bot_id: r.bot_id,
        scopes: r.scopes,
    }))
}

/// Takes the refresh lease for `holder`, for `secs` seconds, if the
/// installation is active, still holds `refresh` and nobody holds an
/// unexpired lease. `Some(unknown_before)` when taken: whether an earlier
/// exchange of this refresh token ended without a known outcome (a lease
/// that ran out with its holder counts as one).
pub async fn take_refresh_lease(
    pool: &PgPool,
    inst: Uuid,
    refresh: &[u8],
    holder: Uuid,
    secs: f64,
) -> sqlx::Result<Option<bool>> {
    sqlx::query_scalar!(
        r#"UPDATE installations
              SET refresh_unknown_since = CASE WHEN refresh_lease_holder IS NOT NULL
                                               THEN coalesce(refresh_unknown_since, refresh_lease_until)
                                               ELSE refresh_unknown_since END,
                  refresh_lease_holder = $3,
                  refresh_lease_until = now() + make_interval(secs => $4)
            WHERE id = $1 AND status = 'active' AND refresh_token_sealed = $2
              AND (refresh_lease_until IS NULL OR refresh_lease_until < now())
        RETURNING refresh_unknown_since IS NOT NULL AS "unknown_before!""#,
        inst,
        refresh,
        holder,
        secs
    )
    .fetch_optional(pool)
    .await
}

/// Keeps `holder`'s lease for another `secs` seconds.
pub async fn extend_refresh_lease(
    pool: &PgPool,
    inst: Uuid,
    holder: Uuid,
    secs: f64,
) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE installations SET refresh_lease_until = now() + make_interval(secs => $3)
          WHERE id = $1 AND refresh_lease_holder = $2",
        inst,
        holder,
        secs
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Gives `holder`'s lease back after an exchange that changed nothing
/// stored; `unknown` records that Slack may have spent the refresh token.
pub async fn give_back_refresh_lease(
    pool: &PgPool,
    inst: Uuid,
    holder: Uuid,
    unknown: bool,
) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE installations
            SET refresh_lease_until = NULL, refresh_lease_holder = NULL,
                refresh_unknown_since = CASE WHEN $3 THEN coalesce(refresh_unknown_since, now())
                                             ELSE refresh_unknown_since END
          WHERE id = $1 AND refresh_lease_holder = $2",
        inst,
        holder,
        unknown
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Disables the installation and drops its tokens because Slack refused
/// the refresh token `refresh` for good; false when the installation no
/// longer holds that refresh token (new tokens were stored meanwhile).
pub async fn disable_refused(
    pool: &PgPool,
    inst: Uuid,
    refresh: &[u8],
    reason: &str,
) -> sqlx::Result<bool> {
    let r = sqlx::query!(
        "UPDATE installations SET status = 'disabled', disabled_reason = $3,
                bot_token_sealed = NULL, bot_token_key_id = NULL, refresh_token_sealed = NULL,
                refresh_token_key_id = NULL, refresh_lease_until = NULL, refresh_lease_holder = NULL,
                updated_at = now()
          WHERE id = $1 AND refresh_token_sealed = $2",
        inst,
        refresh,
        reason
    )
    .execute(pool)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// A sealed token and the id of the key that sealed it.
pub struct SealedPair<'a> {
    pub bytes: &'a [u8],
    pub key_id: &'a str,
}

/// Stores the tokens a refresh of `spent` granted, ending the lease; false
/// when the installation no longer holds `spent` (a reinstall meanwhile).
pub async fn store_refreshed(
    pool: &PgPool,
    inst: Uuid,
    bot: SealedPair<'_>,
    refresh: SealedPair<'_>,
    expires_in_secs: i64,
    spent: &[u8],
) -> sqlx::Result<bool> {
    let r = sqlx::query!(
        "UPDATE installations
            SET bot_token_sealed = $2, bot_token_key_id = $3, refresh_token_sealed = $4, refresh_token_key_id = $5,
                token_expires_at = now() + make_interval(secs => $6::bigint), refresh_lease_until = NULL,
                refresh_lease_holder = NULL, refresh_unknown_since = NULL, updated_at = now()
          WHERE id = $1 AND refresh_token_sealed = $7",
        inst,
        bot.bytes,
        bot.key_id,
        refresh.bytes,
        refresh.key_id,
        expires_in_secs,
        spent
    )
    .execute(pool)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// An installation as an OAuth install or `threadline install` names it.
pub struct Registration<'a> {
    pub app_id: &'a str,
    pub team_id: Option<&'a str>,
    pub enterprise_id: Option<&'a str>,
    /// An org-wide (Enterprise Grid) install: keyed by enterprise.
    pub org_wide: bool,
    pub bot_user_id: &'a str,
    pub bot_id: &'a str,
    pub scopes: &'a [String],
}

/// Creates the installation or reactivates and updates the one of the same
/// app and workspace (or enterprise, org-wide); returns its id. The tokens
/// follow with [`store_installed`] in the same transaction (their sealing
/// binds the id).
pub async fn register(conn: &mut PgConnection, r: &Registration<'_>) -> sqlx::Result<Uuid> {
    if r.org_wide {
        sqlx::query_scalar!(
            "INSERT INTO installations (id, app_id, enterprise_id, team_id, is_enterprise_install, bot_user_id, bot_id, scopes)
             VALUES ($1, $2, $3, NULL, true, $4, $5, $6)
             ON CONFLICT (app_id, enterprise_id) WHERE is_enterprise_install DO UPDATE
                SET enterprise_id = EXCLUDED.enterprise_id, bot_user_id = EXCLUDED.bot_user_id,
                    bot_id = EXCLUDED.bot_id, scopes = EXCLUDED.scopes, status = 'active',
                    disabled_reason = NULL, updated_at = now()
             RETURNING id",
            Uuid::now_v7(),
            r.app_id,
            r.enterprise_id,
            r.bot_user_id,
            r.bot_id,
            r.scopes
        )
        .fetch_one(conn)
        .await
    } else {
        sqlx::query_scalar!(
            "INSERT INTO installations (id, app_id, enterprise_id, team_id, is_enterprise_install, bot_user_id, bot_id, scopes)
             VALUES ($1, $2, $3, $4, false, $5, $6, $7)
             ON CONFLICT (app_id, team_id) WHERE NOT is_enterprise_install DO UPDATE
                SET enterprise_id = EXCLUDED.enterprise_id, bot_user_id = EXCLUDED.bot_user_id,
                    bot_id = EXCLUDED.bot_id, scopes = EXCLUDED.scopes, status = 'active',
                    disabled_reason = NULL, updated_at = now()
             RETURNING id",
            Uuid::now_v7(),
            r.app_id,
            r.enterprise_id,
            r.team_id,
            r.bot_user_id,
            r.bot_id,
            r.scopes
        )
        .fetch_one(conn)
        .await
    }
}

/// Stores the tokens of an install (a refresh token and expiry only with
/// token rotation), clearing any refresh state of earlier tokens.
pub async fn store_installed(
    conn: &mut PgConnection,
    inst: Uuid,
    bot: SealedPair<'_>,
    refresh: Option<SealedPair<'_>>,
    expires_in_secs: Option<i64>,
) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE installations
            SET bot_token_sealed = $2, bot_token_key_id = $3, refresh_token_sealed = $4, refresh_token_key_id = $5,
                token_expires_at = CASE WHEN $6::bigint IS NULL THEN NULL ELSE now() + make_interval(secs => $6::bigint) END,
                refresh_lease_until = NULL, refresh_lease_holder = NULL, refresh_unknown_since = NULL,
                updated_at = now()
          WHERE id = $1",
        inst,
        bot.bytes,
        bot.key_id,
        refresh.as_ref().map(|s| s.bytes),
        refresh.as_ref().map(|s| s.key_id),
        expires_in_secs
    )
    .execute(conn)
    .await?;
    Ok(())
}
