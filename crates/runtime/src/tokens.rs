//! Bot tokens for outbound work: opened from their sealed form and, for
//! installations with token rotation, refreshed before they expire. A
//! refresh Slack refuses disables the installation visibly instead of
//! looping.

use std::time::Duration;

use secrecy::{ExposeSecret as _, SecretString};
use sqlx::PgPool;
use threadline_slack::{WebClient, WebError};
use uuid::Uuid;

use crate::config::{ConfigError, Source};
use crate::secrets::{Sealed, TokenCipher, token_aad};

/// Refresh this long before expiry.
const REFRESH_AHEAD_SECS: f64 = 300.0;

/// The app's client credentials, to exchange refresh tokens.
pub struct Refresher {
    pub web: WebClient,
    pub client_id: String,
    pub client_secret: SecretString,
}

impl Refresher {
    /// `SLACK_CLIENT_ID` and `SLACK_CLIENT_SECRET`, when token rotation is
    /// in use; none otherwise.
    pub fn from_source(src: &Source, slack_api_url: &str) -> Result<Option<Self>, ConfigError> {
        let Some(client_id) = src.get("SLACK_CLIENT_ID") else {
            return Ok(None);
        };
        let client_secret = src
            .secret("SLACK_CLIENT_SECRET")?
            .ok_or(ConfigError::Missing {
                key: "SLACK_CLIENT_SECRET".into(),
            })?;
        let web = WebClient::new(slack_api_url, Duration::from_secs(10)).map_err(|e| {
            ConfigError::Invalid {
                key: "SLACK_API_URL".into(),
                message: e.to_string(),
            }
        })?;
        Ok(Some(Self {
            web,
            client_id: client_id.to_owned(),
            client_secret,
        }))
    }
}

type Row = (
    String,
    Option<Vec<u8>>,
    Option<String>,
    Option<Vec<u8>>,
    Option<String>,
    Option<f64>,
);

/// Slack's answers to a refresh that mean the refresh token or the app's
/// credentials are refused for good; anything else (`internal_error`,
/// `fatal_error`, `ratelimited`, an answer without `ok`…) is transient.
const REFUSALS: &[&str] = &[
    "invalid_refresh_token",
    "token_revoked",
    "token_expired",
    "invalid_client",
    "invalid_client_id",
    "bad_client_secret",
    "invalid_grant_type",
    "invalid_auth",
    "account_inactive",
];

/// A token refresh that Slack did not refuse but did not grant either
/// (unreachable, failing, rate-limited, an answer threadline cannot read):
/// transient, so the work that needs the token waits and retries.
#[derive(Debug, thiserror::Error)]
#[error("the token expired and its refresh did not go through ({0})")]
pub struct RefreshUnavailable(pub String);

/// The installation's bot token, refreshed first when it is about to
/// expire; `None` when the installation is disabled or has no token.
pub async fn bot_token(
    pool: &PgPool,
    cipher: &TokenCipher,
    refresher: Option<&Refresher>,
    inst: Uuid,
) -> anyhow::Result<Option<SecretString>> {
    let row: Option<Row> = sqlx::query_as(
        "SELECT status, bot_token_sealed, bot_token_key_id, refresh_token_sealed, refresh_token_key_id,
                extract(epoch FROM token_expires_at - now())::float8
           FROM installations WHERE id = $1",
    )
    .bind(inst)
    .fetch_optional(pool)
    .await?;
    let Some((status, Some(bytes), Some(key_id), refresh, refresh_key, expires_in)) = row else {
        return Ok(None);
    };
    if status != "active" {
        return Ok(None);
    }
    let current = cipher.open(&Sealed { key_id, bytes }, &token_aad(&inst, "bot"))?;
    let due = expires_in.is_some_and(|t| t < REFRESH_AHEAD_SECS);
    let (Some(refresher), Some(rbytes), Some(rkey), true) = (refresher, refresh, refresh_key, due)
    else {
        return Ok(Some(current));
    };
    let refresh_token = cipher.open(
        &Sealed {
            key_id: rkey,
            bytes: rbytes.clone(),
        },
        &token_aad(&inst, "refresh"),
    )?;
    let answer = refresher
        .web
        .oauth_v2_access(&[
            ("client_id", refresher.client_id.as_str()),
            ("client_secret", refresher.client_secret.expose_secret()),
            ("grant_type", "refresh_token"),
            ("refresh_token", refresh_token.expose_secret()),
        ])
        .await;
    let v = match answer {
        Ok(v) => v,
        // A definite refusal of the refresh token we used: stop outbound
        // work visibly rather than loop — but only if the installation still
        // holds that refresh token (another refresher that won the race has
        // stored new tokens, which stand).
        Err(WebError::Api { code }) if REFUSALS.contains(&code.as_str()) => {
            let disabled = sqlx::query(
                "UPDATE installations SET status = 'disabled', disabled_reason = 'token_refresh_failed',
                        bot_token_sealed = NULL, bot_token_key_id = NULL, refresh_token_sealed = NULL,
                        refresh_token_key_id = NULL, updated_at = now()
                  WHERE id = $1 AND refresh_token_sealed = $2",
            )
            .bind(inst)
            .bind(&rbytes)
            .execute(pool)
            .await?;
            if disabled.rows_affected() == 0 {
                // Refreshed meanwhile by someone else: use what they stored.
                return Box::pin(bot_token(pool, cipher, None, inst)).await;
            }
            metrics::counter!("threadline_token_refresh_total", "result" => "refused").increment(1);
            let code: String = code
                .chars()
                .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
                .take(64)
                .collect();
            tracing::error!(alert = "installation_disabled", installation_id = %inst, code, "token refresh refused; installation disabled");
            return Ok(None);
        }
        Err(e) if expires_in.is_some_and(|t| t > 0.0) => {
            metrics::counter!("threadline_token_refresh_total", "result" => "deferred")
                .increment(1);
            tracing::warn!(error = %e, installation_id = %inst, "token refresh failed; the current token is still valid");
            return Ok(Some(current));
        }
        // Slack away, failing on its side or answering something that is
        // not a refusal: transient, retried with the work that needs it.
        Err(e) => {
            metrics::counter!("threadline_token_refresh_total", "result" => "failed").increment(1);
            return Err(RefreshUnavailable(e.to_string()).into());
        }
    };
    let text = |k: &str| {
        v.get(k)
            .and_then(serde_json::Value::as_str)
            .filter(|s| !s.is_empty())
            .map(|s| SecretString::from(s.to_owned()))
    };
    let (Some(token), Some(new_refresh)) = (text("access_token"), text("refresh_token")) else {
        return Err(RefreshUnavailable("an answer without tokens".into()).into());
    };
    let expires = v
        .get("expires_in")
        .and_then(serde_json::Value::as_i64)
        .unwrap_or(43_200);
    let sealed = cipher.seal(token.expose_secret().as_bytes(), &token_aad(&inst, "bot"))?;
    let sealed_refresh = cipher.seal(
        new_refresh.expose_secret().as_bytes(),
        &token_aad(&inst, "refresh"),
    )?;
    // Compare-and-set on the refresh token we used: if another replica
    // refreshed first, its tokens stand and we use those.
    let stored = sqlx::query(
        "UPDATE installations
            SET bot_token_sealed = $2, bot_token_key_id = $3, refresh_token_sealed = $4, refresh_token_key_id = $5,
                token_expires_at = now() + make_interval(secs => $6::bigint), updated_at = now()
          WHERE id = $1 AND refresh_token_sealed = $7",
    )
    .bind(inst)
    .bind(&sealed.bytes)
    .bind(&sealed.key_id)
    .bind(&sealed_refresh.bytes)
    .bind(&sealed_refresh.key_id)
    .bind(expires)
    .bind(&rbytes)
    .execute(pool)
    .await?;
    metrics::counter!("threadline_token_refresh_total", "result" => "refreshed").increment(1);
    if stored.rows_affected() == 1 {
        Ok(Some(token))
    } else {
        Box::pin(bot_token(pool, cipher, None, inst)).await
    }
}
