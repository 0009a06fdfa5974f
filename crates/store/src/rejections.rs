//! What the gateway answered but did not take on: signed deliveries that
//! did not become receipts (content-free: identifiers and a reason), and
//! Slack's notices that it is dropping the app's events.

use sqlx::PgPool;
use uuid::Uuid;

/// A signed delivery refused with `reason`, and what identifiers it had.
#[derive(Debug, Clone, Copy, Default)]
pub struct Rejection<'a> {
    pub reason: &'a str,
    pub api_app_id: Option<&'a str>,
    pub team_id: Option<&'a str>,
    pub enterprise_id: Option<&'a str>,
    pub event_id: Option<&'a str>,
    pub installation_id: Option<Uuid>,
}

pub async fn record(pool: &PgPool, r: &Rejection<'_>) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO rejections (reason, api_app_id, team_id, enterprise_id, event_id, installation_id)
         VALUES ($1, $2, $3, $4, $5, $6)",
        r.reason,
        r.api_app_id,
        r.team_id,
        r.enterprise_id,
        r.event_id,
        r.installation_id
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Slack's `app_rate_limited` notice: it is dropping this app's events.
pub async fn app_rate_limited(
    pool: &PgPool,
    api_app_id: Option<&str>,
    team_id: Option<&str>,
    minute_rate_limited: Option<i64>,
) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO app_rate_limit_notices (api_app_id, team_id, minute_rate_limited) VALUES ($1, $2, $3)",
        api_app_id,
        team_id,
        minute_rate_limited
    )
    .execute(pool)
    .await?;
    Ok(())
}
