//! Test fixtures and reads for the `installations` family (see `crate::installations` and `crate::tokens`).
/// Replaces the installation's sealed refresh token and sets its bot token to expire `expires_in_secs` from now (negative: ago).
pub async fn set_refresh_token_expiring(
    pool: &sqlx::PgPool,
    inst: uuid::Uuid,
    refresh: crate::tokens::SealedPair<'_>,
    expires_in_secs: i64,
) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE installations
            SET refresh_token_sealed = $2, refresh_token_key_id = $3,
                token_expires_at = now() + make_interval(secs => $4::bigint)
          WHERE id = $1",
        inst,
        refresh.bytes,
        refresh.key_id,
        expires_in_secs
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Stores both sealed tokens and a bot token expiry `expires_in_secs` from now, touching nothing else (no lease, no status).
pub async fn set_tokens(
    pool: &sqlx::PgPool,
    inst: uuid::Uuid,
    bot: crate::tokens::SealedPair<'_>,
    refresh: crate::tokens::SealedPair<'_>,
    expires_in_secs: i64,
) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE installations
            SET bot_token_sealed = $2, bot_token_key_id = $3, refresh_token_sealed = $4, refresh_token_key_id = $5,
                token_expires_at = now() + make_interval(secs => $6::bigint)
          WHERE id = $1",
        inst,
        bot.bytes,
        bot.key_id,
        refresh.bytes,
        refresh.key_id,
        expires_in_secs
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Sets the installation's bot token to have expired `secs_ago` seconds ago (negative: to expire in).
pub async fn expire_bot_token(
    pool: &sqlx::PgPool,
    inst: uuid::Uuid,
    secs_ago: i64,
) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE installations SET token_expires_at = now() - make_interval(secs => $2::bigint) WHERE id = $1",
        inst,
        secs_ago
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Disables the installation and drops its bot token (no reason recorded), as an uninstall leaves it.
pub async fn disable_without_bot_token(pool: &sqlx::PgPool, inst: uuid::Uuid) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE installations SET status = 'disabled', bot_token_sealed = NULL, bot_token_key_id = NULL WHERE id = $1",
        inst
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// An installation's status, why it is disabled, and whether it holds both its tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstallationState {
    pub status: String,
    pub disabled_reason: Option<String>,
    pub has_tokens: bool,
}

/// The installation's status, disabled reason and whether it holds both its bot and refresh tokens.
pub async fn installation_state(
    pool: &sqlx::PgPool,
    inst: uuid::Uuid,
) -> sqlx::Result<InstallationState> {
    sqlx::query_as!(
        InstallationState,
        r#"SELECT status, disabled_reason,
                  bot_token_sealed IS NOT NULL AND refresh_token_sealed IS NOT NULL AS "has_tokens!"
             FROM installations WHERE id = $1"#,
        inst
    )
    .fetch_one(pool)
    .await
}

/// Whether the installation's row records a refresh lease (`refresh_lease_until` set).
pub async fn refresh_leased(pool: &sqlx::PgPool, inst: uuid::Uuid) -> sqlx::Result<bool> {
    sqlx::query_scalar!(
        r#"SELECT refresh_lease_until IS NOT NULL AS "leased!" FROM installations WHERE id = $1"#,
        inst
    )
    .fetch_one(pool)
    .await
}

/// An installation row as a test writes it directly (no OAuth flow).
#[derive(Debug, Clone)]
pub struct NewInstallation<'a> {
    pub id: uuid::Uuid,
    pub app_id: &'a str,
    pub team_id: &'a str,
    pub bot_user_id: &'a str,
    pub bot_id: &'a str,
    pub bot_token_sealed: Option<&'a [u8]>,
    pub bot_token_key_id: Option<&'a str>,
    pub status: &'a str,
}

/// Inserts a workspace installation with the given identity, bot token and status.
pub async fn insert_installation(pool: &sqlx::PgPool, i: &NewInstallation<'_>) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO installations (id, app_id, team_id, bot_user_id, bot_id, bot_token_sealed, bot_token_key_id, status)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        i.id,
        i.app_id,
        i.team_id,
        i.bot_user_id,
        i.bot_id,
        i.bot_token_sealed,
        i.bot_token_key_id,
        i.status
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Replaces the installation's granted scopes.
pub async fn set_scopes(pool: &sqlx::PgPool, id: uuid::Uuid, scopes: &[&str]) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE installations SET scopes = $2 WHERE id = $1",
        id,
        scopes as _
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Sets the installation `disabled`, with `reason` when given (else its reason is left as it is).
pub async fn disable_installation(
    pool: &sqlx::PgPool,
    id: uuid::Uuid,
    reason: Option<&str>,
) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE installations SET status = 'disabled', disabled_reason = coalesce($2, disabled_reason) WHERE id = $1",
        id,
        reason
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Stores a sealed refresh token (and its key id) on the installation.
pub async fn set_refresh_token(
    pool: &sqlx::PgPool,
    id: uuid::Uuid,
    sealed: &[u8],
    key_id: &str,
) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE installations SET refresh_token_sealed = $2, refresh_token_key_id = $3 WHERE id = $1",
        id,
        sealed,
        key_id
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// The installation's status, and whether its bot and refresh tokens are all gone.
pub async fn status_and_tokens_purged(
    pool: &sqlx::PgPool,
    id: uuid::Uuid,
) -> sqlx::Result<(String, bool)> {
    let r = sqlx::query!(
        r#"SELECT status,
                  num_nonnulls(bot_token_sealed, bot_token_key_id, refresh_token_sealed, refresh_token_key_id) = 0
                    AS "purged!"
             FROM installations WHERE id = $1"#,
        id
    )
    .fetch_one(pool)
    .await?;
    Ok((r.status, r.purged))
}

/// How many installations exist, in any status.
pub async fn count_installations(pool: &sqlx::PgPool) -> sqlx::Result<i64> {
    sqlx::query_scalar!(r#"SELECT count(*) AS "n!" FROM installations"#)
        .fetch_one(pool)
        .await
}

/// The id of the workspace installation of `app_id` in `team_id`.
pub async fn installation_id(
    pool: &sqlx::PgPool,
    app_id: &str,
    team_id: &str,
) -> sqlx::Result<uuid::Uuid> {
    sqlx::query_scalar!(
        "SELECT id FROM installations WHERE app_id = $1 AND team_id = $2",
        app_id,
        team_id
    )
    .fetch_one(pool)
    .await
}

/// What an install stored: identity, scopes and the sealed bot token.
#[derive(Debug, Clone)]
pub struct Installed {
    pub id: uuid::Uuid,
    pub is_enterprise_install: bool,
    pub enterprise_id: Option<String>,
    pub team_id: Option<String>,
    pub bot_id: String,
    pub scopes: Vec<String>,
    pub bot_token_sealed: Option<Vec<u8>>,
    pub bot_token_key_id: Option<String>,
}

/// The first installation the database returns (the only one, in a test that installed once).
pub async fn first_installation(pool: &sqlx::PgPool) -> sqlx::Result<Installed> {
    sqlx::query_as!(
        Installed,
        "SELECT id, is_enterprise_install, enterprise_id, team_id, bot_id, scopes, bot_token_sealed, bot_token_key_id
           FROM installations"
    )
    .fetch_one(pool)
    .await
}

/// How many installations there are, with the first one's sealed bot token and its key id.
#[derive(Debug, Clone)]
pub struct CountAndBotToken {
    pub installations: i64,
    pub sealed: Vec<u8>,
    pub key_id: String,
}

/// The number of installations and the first one's sealed bot token (which must be set).
pub async fn count_and_bot_token(pool: &sqlx::PgPool) -> sqlx::Result<CountAndBotToken> {
    sqlx::query_as!(
        CountAndBotToken,
        r#"SELECT count(*) OVER () AS "installations!", bot_token_sealed AS "sealed!", bot_token_key_id AS "key_id!"
             FROM installations"#
    )
    .fetch_one(pool)
    .await
}

/// The id of the first installation (for a test that registered one).
pub async fn first_id(pool: &sqlx::PgPool) -> sqlx::Result<uuid::Uuid> {
    sqlx::query_scalar!("SELECT id FROM installations")
        .fetch_one(pool)
        .await
}

/// Installation `id`'s sealed token of `kind` and its key id (which must be set).
pub async fn sealed_token(
    pool: &sqlx::PgPool,
    kind: crate::installations::TokenKind,
    id: uuid::Uuid,
) -> sqlx::Result<(Vec<u8>, String)> {
    match kind {
        crate::installations::TokenKind::Bot => sqlx::query!(
            r#"SELECT bot_token_sealed AS "bytes!", bot_token_key_id AS "key_id!" FROM installations WHERE id = $1"#,
            id
        )
        .fetch_one(pool)
        .await
        .map(|r| (r.bytes, r.key_id)),
        crate::installations::TokenKind::Refresh => sqlx::query!(
            r#"SELECT refresh_token_sealed AS "bytes!", refresh_token_key_id AS "key_id!" FROM installations WHERE id = $1"#,
            id
        )
        .fetch_one(pool)
        .await
        .map(|r| (r.bytes, r.key_id)),
    }
}

/// The id of the installation of workspace `team_id`.
pub async fn id_by_team(pool: &sqlx::PgPool, team_id: &str) -> sqlx::Result<uuid::Uuid> {
    sqlx::query_scalar!("SELECT id FROM installations WHERE team_id = $1", team_id)
        .fetch_one(pool)
        .await
}

/// The first installation's status and why it is disabled, if it is.
pub async fn first_status_and_disabled_reason(
    pool: &sqlx::PgPool,
) -> sqlx::Result<(String, Option<String>)> {
    sqlx::query!("SELECT status, disabled_reason FROM installations")
        .fetch_one(pool)
        .await
        .map(|r| (r.status, r.disabled_reason))
}

/// The first installation's sealed bot token, none once purged.
pub async fn first_bot_token_sealed(pool: &sqlx::PgPool) -> sqlx::Result<Option<Vec<u8>>> {
    sqlx::query_scalar!("SELECT bot_token_sealed FROM installations")
        .fetch_one(pool)
        .await
}

/// Inserts an active installation of `(app_id, team_id)` with bot `UBOT`/`BBOT` and no token; returns its id.
pub async fn insert_active_installation(
    pool: &sqlx::PgPool,
    id: uuid::Uuid,
    app_id: &str,
    team_id: &str,
) -> sqlx::Result<uuid::Uuid> {
    sqlx::query_scalar!(
        "INSERT INTO installations (id, app_id, team_id, bot_user_id, bot_id) VALUES ($1, $2, $3, 'UBOT', 'BBOT') RETURNING id",
        id,
        app_id,
        team_id
    )
    .fetch_one(pool)
    .await
}
