//! Bot tokens for outbound work: opened from their sealed form and, for
//! installations with token rotation, refreshed before they expire, one
//! refresh at a time per installation (a lease in the row). A refresh token
//! Slack refuses for good disables the installation visibly instead of
//! looping; the app's credentials refused disable nothing (a configuration
//! error, alerted); any other failure is transient.

use std::time::Duration;

use secrecy::{ExposeSecret as _, SecretString};
use sqlx::PgPool;
use threadline_slack::{WebClient, WebError};
use threadline_store::tokens::{self, SealedPair};
use uuid::Uuid;

use crate::secrets::{Seal as _, Sealed, TokenKeys, token_aad};
use threadline_runtime::config::{ConfigError, Source};

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

/// Slack's answers to a refresh that mean the refresh token is refused for
/// good; the app's credentials refused are [`CLIENT_REFUSALS`]; anything
/// else (`internal_error`, `fatal_error`, `ratelimited`, an answer without
/// `ok`…) is transient.
const REFUSALS: &[&str] = &[
    "invalid_refresh_token",
    "token_revoked",
    "token_expired",
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

/// How long a caller whose token has already expired waits for another
/// caller's refresh of the same installation before giving up (transient).
const REFRESH_WAIT: Duration = Duration::from_secs(20);

/// How long a refresh lease lasts: longer than the exchange (the client's
/// 10 s timeout) and the retried store that follows it, so only a holder
/// frozen past it can lose it.
const LEASE_SECS: f64 = 60.0;

/// Slack's answers that refuse the app's client credentials: a
/// configuration error of threadline, not a fault of any installation, so
/// no installation is disabled for it.
const CLIENT_REFUSALS: &[&str] = &["invalid_client", "invalid_client_id", "bad_client_secret"];

/// What the row says about the installation's token.
enum Current {
    /// Disabled, or no token: no outbound work.
    None,
    /// Usable as it is.
    Token(SecretString),
    /// Due for a refresh (`expires_in` seconds left, negative once expired).
    Due {
        current: SecretString,
        refresh: Vec<u8>,
        refresh_key: String,
        expires_in: f64,
    },
}

fn read_current(
    cipher: &TokenKeys,
    refresher: Option<&Refresher>,
    inst: Uuid,
    row: Option<tokens::Stored>,
) -> anyhow::Result<Current> {
    let Some(tokens::Stored {
        status,
        bot_sealed: Some(bytes),
        bot_key_id: Some(key_id),
        refresh_sealed: refresh,
        refresh_key_id: refresh_key,
        expires_in,
        ..
    }) = row
    else {
        return Ok(Current::None);
    };
    if status != threadline_domain::state::InstallationStatus::Active {
        return Ok(Current::None);
    }
    let token = cipher.open(&Sealed { key_id, bytes }, &token_aad(&inst, "bot"))?;
    match (refresher, refresh, refresh_key, expires_in) {
        (Some(_), Some(refresh), Some(refresh_key), Some(t)) if t < REFRESH_AHEAD_SECS => {
            Ok(Current::Due {
                current: token,
                refresh,
                refresh_key,
                expires_in: t,
            })
        }
        _ => Ok(Current::Token(token)),
    }
}

/// The installation's bot token, refreshed first when it is about to
/// expire; `None` when the installation is disabled or has no token.
///
/// One refresh at a time per installation, across processes: the caller
/// that takes the installation's refresh lease (a due time in the row,
/// conditional on the refresh token it read) exchanges that token, holding
/// no database connection meanwhile; the others use the current token while
/// it is still valid, or wait for the holder's result once it has expired.
/// The lease lives in the row, so a holder whose connection breaks keeps it.
pub async fn bot_token(
    pool: &PgPool,
    cipher: &TokenKeys,
    refresher: Option<&Refresher>,
    inst: Uuid,
) -> anyhow::Result<Option<SecretString>> {
    bot_token_seen(pool, cipher, refresher, inst, &mut None).await
}

/// The bot an installation's token speaks as: its `bot_id` and granted
/// scopes (empty when never recorded: a manual install).
pub struct BotIdentity {
    pub bot_id: String,
    pub scopes: Vec<String>,
}

/// [`bot_token`] and the bot's identity, from the same read of the row.
pub async fn bot(
    pool: &PgPool,
    cipher: &TokenKeys,
    refresher: Option<&Refresher>,
    inst: Uuid,
) -> anyhow::Result<Option<(SecretString, BotIdentity)>> {
    let mut seen = None;
    let token = bot_token_seen(pool, cipher, refresher, inst, &mut seen).await?;
    Ok(token.zip(seen))
}

/// [`bot_token`], keeping the identity of the last read in `seen`.
async fn bot_token_seen(
    pool: &PgPool,
    cipher: &TokenKeys,
    refresher: Option<&Refresher>,
    inst: Uuid,
    seen: &mut Option<BotIdentity>,
) -> anyhow::Result<Option<SecretString>> {
    let waited_since = std::time::Instant::now();
    let mut pause = Duration::from_millis(20);
    loop {
        let row = tokens::read(pool, inst).await?;
        if let Some(r) = &row {
            *seen = Some(BotIdentity {
                bot_id: r.bot_id.clone(),
                scopes: r.scopes.clone(),
            });
        }
        let (current, refresh, refresh_key, expires_in) =
            match read_current(cipher, refresher, inst, row)? {
                Current::None => return Ok(None),
                Current::Token(t) => return Ok(Some(t)),
                Current::Due {
                    current,
                    refresh,
                    refresh_key,
                    expires_in,
                } => (current, refresh, refresh_key, expires_in),
            };
        let Some(refresher) = refresher else {
            return Ok(Some(current));
        };
        let holder = Uuid::now_v7();
        // The lease, only on the refresh token just read: whoever stored
        // new tokens meanwhile is not refreshed over. A lease that ran out
        // with its holder never heard of again leaves the token's fate
        // unknown (it may have been exchanged).
        let leased = tokens::take_refresh_lease(pool, inst, &refresh, holder, LEASE_SECS).await?;
        if let Some(unknown_before) = leased {
            let lease = Lease {
                holder,
                refresh,
                refresh_key,
                unknown_before,
            };
            return refresh_leased(pool, cipher, refresher, inst, current, lease, expires_in).await;
        }
        // Someone else is refreshing (or just did: the next read shows it):
        // a token that is still valid serves meanwhile; an expired one
        // waits for their result.
        if expires_in > 0.0 {
            return Ok(Some(current));
        }
        if waited_since.elapsed() > REFRESH_WAIT {
            metrics::counter!("threadline_token_refresh_total", "result" => "waited_out")
                .increment(1);
            return Err(RefreshUnavailable(
                "another refresh of this installation is still running".into(),
            )
            .into());
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(500));
    }
}

/// A refresh lease this process holds, and the refresh token it covers.
struct Lease {
    holder: Uuid,
    refresh: Vec<u8>,
    refresh_key: String,
    /// An earlier exchange of this refresh token ended without a known
    /// outcome.
    unknown_before: bool,
}

/// Gives the lease back after an exchange that changed nothing stored;
/// `unknown` records that Slack may have spent the refresh token.
async fn give_back(pool: &PgPool, inst: Uuid, lease: &Lease, unknown: bool) {
    give_back_holder(pool, inst, lease.holder, unknown).await;
}

async fn give_back_holder(pool: &PgPool, inst: Uuid, holder: Uuid, unknown: bool) {
    let r = tokens::give_back_refresh_lease(pool, inst, holder, unknown).await;
    if let Err(e) = r {
        // The lease runs out by itself; an unknown outcome not recorded
        // is recorded then, by the next lease.
        tracing::warn!(error = %e, installation_id = %inst, "giving back a token refresh lease failed");
    }
}

/// Whether Slack may have applied an exchange that failed this way.
fn maybe_applied(e: &WebError) -> bool {
    match e {
        // Refused before anything happened.
        WebError::RateLimited { .. } | WebError::Http(429) => false,
        WebError::Transport(t) => t != "connect",
        WebError::Api { code } => code != "ratelimited",
        WebError::Http(_) | WebError::Decode => true,
    }
}

/// The exchange itself, under the lease. Every write is a compare-and-set on
/// the refresh token exchanged.
async fn refresh_leased(
    pool: &PgPool,
    cipher: &TokenKeys,
    refresher: &Refresher,
    inst: Uuid,
    current: SecretString,
    lease: Lease,
    expires_in: f64,
) -> anyhow::Result<Option<SecretString>> {
    let refresh_token = match cipher.open(
        &Sealed {
            key_id: lease.refresh_key.clone(),
            bytes: lease.refresh.clone(),
        },
        &token_aad(&inst, "refresh"),
    ) {
        Ok(t) => t,
        Err(e) => {
            give_back(pool, inst, &lease, false).await;
            return Err(e.into());
        }
    };
    let answer = refresher
        .web
        .oauth_v2_access(&[
            ("client_id", refresher.client_id.as_str()),
            ("client_secret", refresher.client_secret.expose_secret()),
            ("grant_type", "refresh_token"),
            ("refresh_token", refresh_token.expose_secret()),
        ])
        .await;
    let code_of = |code: &str| -> String {
        code.chars()
            .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
            .take(64)
            .collect()
    };
    let v = match answer {
        Ok(v) => v,
        // The app's own credentials refused: threadline's configuration,
        // not this installation. Nothing is disabled; the work retries and
        // an operator fixes SLACK_CLIENT_ID/SLACK_CLIENT_SECRET.
        Err(WebError::Api { code }) if CLIENT_REFUSALS.contains(&code.as_str()) => {
            give_back(pool, inst, &lease, false).await;
            metrics::counter!("threadline_token_refresh_total", "result" => "client_refused")
                .increment(1);
            tracing::error!(alert = "slack_client_credentials_refused", installation_id = %inst, code = code_of(&code),
                "Slack refused the app's client credentials for a token refresh; check SLACK_CLIENT_ID and SLACK_CLIENT_SECRET");
            return if expires_in > 0.0 {
                Ok(Some(current))
            } else {
                Err(RefreshUnavailable(code_of(&code)).into())
            };
        }
        // A definite refusal of the refresh token: stop outbound work
        // visibly rather than loop — only if the installation still holds
        // that refresh token (a reinstall meanwhile stands). If an earlier
        // exchange of it ended without a known outcome, Slack most likely
        // spent it then: the tokens it granted are lost.
        Err(WebError::Api { code }) if REFUSALS.contains(&code.as_str()) => {
            let reason = if lease.unknown_before {
                "token_refresh_lost"
            } else {
                "token_refresh_failed"
            };
            let disabled = tokens::disable_refused(pool, inst, &lease.refresh, reason).await;
            let disabled = match disabled {
                Ok(d) => d,
                Err(e) => {
                    // Not recorded: the next exchange is refused again.
                    give_back(pool, inst, &lease, false).await;
                    return Err(e.into());
                }
            };
            if !disabled {
                // New tokens were stored meanwhile: use them.
                give_back(pool, inst, &lease, false).await;
                return Box::pin(bot_token(pool, cipher, None, inst)).await;
            }
            metrics::counter!("threadline_token_refresh_total", "result" => "refused").increment(1);
            tracing::error!(alert = "installation_disabled", installation_id = %inst, code = code_of(&code), reason,
                "token refresh refused; installation disabled (reinstall to resume)");
            return Ok(None);
        }
        Err(e) => {
            let unknown = maybe_applied(&e);
            give_back(pool, inst, &lease, unknown).await;
            if expires_in > 0.0 {
                metrics::counter!("threadline_token_refresh_total", "result" => "deferred")
                    .increment(1);
                tracing::warn!(error = %e, installation_id = %inst, unknown, "token refresh failed; the current token is still valid");
                return Ok(Some(current));
            }
            // Slack away, failing on its side or answering something that
            // is not a refusal: transient, retried with the work that
            // needs it.
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
        give_back(pool, inst, &lease, true).await;
        return Err(RefreshUnavailable("an answer without tokens".into()).into());
    };
    let expires = v
        .get("expires_in")
        .and_then(serde_json::Value::as_i64)
        .unwrap_or(43_200);
    // From here Slack has spent the old refresh token: a failure leaves its
    // fate recorded as unknown.
    let sealed = cipher
        .seal(token.expose_secret().as_bytes(), &token_aad(&inst, "bot"))
        .and_then(|bot| {
            cipher
                .seal(
                    new_refresh.expose_secret().as_bytes(),
                    &token_aad(&inst, "refresh"),
                )
                .map(|refresh| (bot, refresh))
        });
    let (sealed, sealed_refresh) = match sealed {
        Ok(s) => s,
        Err(e) => {
            give_back(pool, inst, &lease, true).await;
            return Err(e.into());
        }
    };
    // Slack has spent the old refresh token: the new ones must be stored,
    // so a database blip here is retried rather than losing them (the
    // lease keeps everyone else from exchanging the spent token meanwhile).
    let mut attempt = 0u32;
    let stored = loop {
        let r = tokens::store_refreshed(
            pool,
            inst,
            SealedPair {
                bytes: &sealed.bytes,
                key_id: &sealed.key_id,
            },
            SealedPair {
                bytes: &sealed_refresh.bytes,
                key_id: &sealed_refresh.key_id,
            },
            expires,
            &lease.refresh,
        )
        .await;
        match r {
            Ok(r) => break r,
            Err(e) if attempt < 6 => {
                attempt += 1;
                tracing::warn!(error = %e, installation_id = %inst, attempt, "storing refreshed tokens failed; retrying");
                // Keep the lease while retrying, so nobody exchanges the
                // spent token meanwhile.
                let _ = tokens::extend_refresh_lease(pool, inst, lease.holder, LEASE_SECS).await;
                tokio::time::sleep(Duration::from_millis(100 << attempt)).await;
            }
            Err(e) => {
                metrics::counter!("threadline_token_refresh_total", "result" => "lost")
                    .increment(1);
                tracing::error!(alert = "refreshed_tokens_lost", installation_id = %inst, error = %e, "refreshed tokens could not be stored");
                give_back(pool, inst, &lease, true).await;
                return Err(e.into());
            }
        }
    };
    metrics::counter!("threadline_token_refresh_total", "result" => "refreshed").increment(1);
    if stored {
        Ok(Some(token))
    } else {
        // A reinstall replaced the tokens meanwhile: those stand.
        give_back(pool, inst, &lease, false).await;
        Box::pin(bot_token(pool, cipher, None, inst)).await
    }
}
