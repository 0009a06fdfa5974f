//! Installation and channel policies: what an installation allows
//! (`installation_policies`) and what each channel overrides
//! (`channel_policies`). Operators set them with `threadline policy`.

use sqlx::PgPool;
use uuid::Uuid;

/// Whether Slack may unfurl the links and media of a reply in `channel`:
/// the channel's setting, else the installation's, else off.
pub async fn unfurl_allowed(
    pool: &PgPool,
    installation: Uuid,
    channel: &str,
) -> sqlx::Result<bool> {
    sqlx::query_scalar!(
        r#"SELECT coalesce(
                    (SELECT unfurl_allowed FROM channel_policies WHERE installation_id = $1 AND channel_id = $2),
                    (SELECT unfurl_allowed FROM installation_policies WHERE installation_id = $1),
                    false) AS "allowed!""#,
        installation,
        channel
    )
    .fetch_one(pool)
    .await
}
