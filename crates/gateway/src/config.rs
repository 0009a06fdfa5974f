//! Gateway settings. Shared ones (database, NATS, bus prefix, telemetry) are
//! documented in `threadline_runtime::config`.

use std::net::SocketAddr;
use std::time::Duration;

use secrecy_free::SigningSecrets;
use threadline_runtime::config::{CommonConfig, ConfigError, Source};

/// Signing secrets kept out of `Debug`.
mod secrecy_free {
    use threadline_slack::SigningSecret;

    #[derive(Clone, Debug)]
    pub struct SigningSecrets(pub Vec<SigningSecret>);
}

#[derive(Debug, Clone)]
pub struct GatewayConfig {
    pub common: CommonConfig,
    /// `THREADLINE_GATEWAY_ADDR`, default `127.0.0.1:3000`.
    pub addr: SocketAddr,
    /// `SLACK_SIGNING_SECRET` (required) and `SLACK_SIGNING_SECRET_PREVIOUS`
    /// (optional: the old secret while Slack rotates it).
    pub signing_secrets: SigningSecrets,
    /// `THREADLINE_GATEWAY_MAX_BODY_BYTES`, default 1 MiB; larger bodies get 413.
    pub max_body_bytes: usize,
    /// `THREADLINE_INTAKE_TIMEOUT_MS`, default 2500: longest a delivery waits
    /// for its receipt to commit before the gateway answers 503 (Slack gives
    /// up at 3 s and retries).
    pub intake_timeout: Duration,
    /// `THREADLINE_INTAKE_WRITERS`, default 3: concurrent group commits. More
    /// writers mean smaller batches; raise it for a Postgres with many cores.
    pub intake_writers: usize,
    /// `THREADLINE_INTAKE_MAX_BATCH`, default 256: deliveries per group commit.
    pub intake_max_batch: usize,
    /// `THREADLINE_INSTALLATION_CACHE_MS`, default 2000: how long a resolved
    /// installation (or its absence) is reused before asking Postgres again.
    pub installation_cache_ttl: Duration,
    /// `THREADLINE_RELAY_ENABLED`, default true: run the outbox relay here.
    pub relay_enabled: bool,
    /// `THREADLINE_RELAY_BATCH`, default 256: outbox rows per publish round.
    pub relay_batch: i64,
    /// `THREADLINE_RELAY_SWEEP_MS`, default 1000: periodic sweep in case a
    /// notification was missed.
    pub relay_sweep: Duration,
    /// The OAuth install flow, on when `SLACK_CLIENT_ID` is set.
    pub oauth: Option<std::sync::Arc<OAuthSettings>>,
}

/// `SLACK_CLIENT_ID`, `SLACK_CLIENT_SECRET`, `THREADLINE_OAUTH_REDIRECT_URL`
/// (this gateway's public `/slack/oauth/callback`), `THREADLINE_TOKEN_KEYS`;
/// optional `SLACK_AUTHORIZE_URL` (default Slack's consent page),
/// `THREADLINE_BOT_SCOPES` (default least privilege) and
/// `THREADLINE_OAUTH_STATE_TTL_MS` (default 10 minutes).
#[derive(Debug)]
pub struct OAuthSettings {
    pub client_id: String,
    pub client_secret: secrecy::SecretString,
    pub redirect_url: String,
    pub authorize_url: String,
    pub scopes: String,
    pub state_ttl: Duration,
    pub cipher: threadline_runtime::secrets::TokenCipher,
}

impl OAuthSettings {
    fn from_source(src: &Source) -> Result<Option<Self>, ConfigError> {
        let Some(client_id) = src.get("SLACK_CLIENT_ID") else {
            return Ok(None);
        };
        let scopes = src.string("THREADLINE_BOT_SCOPES", crate::oauth::DEFAULT_BOT_SCOPES);
        if scopes
            .split(',')
            .any(|s| s.trim().is_empty() || s.contains(char::is_whitespace))
        {
            return Err(ConfigError::Invalid {
                key: "THREADLINE_BOT_SCOPES".into(),
                message: "expected comma-separated scopes".into(),
            });
        }
        Ok(Some(Self {
            client_id: client_id.to_owned(),
            client_secret: src
                .secret("SLACK_CLIENT_SECRET")?
                .ok_or(ConfigError::Missing {
                    key: "SLACK_CLIENT_SECRET".into(),
                })?,
            redirect_url: src
                .url("THREADLINE_OAUTH_REDIRECT_URL", "", &["http", "https"])
                .map_err(|_| ConfigError::Invalid {
                    key: "THREADLINE_OAUTH_REDIRECT_URL".into(),
                    message:
                        "the public URL of /slack/oauth/callback is required with SLACK_CLIENT_ID"
                            .into(),
                })?,
            authorize_url: src.url(
                "SLACK_AUTHORIZE_URL",
                "https://slack.com/oauth/v2/authorize",
                &["http", "https"],
            )?,
            scopes,
            state_ttl: src.millis("THREADLINE_OAUTH_STATE_TTL_MS", 600_000, 1_000..=3_600_000)?,
            cipher: threadline_runtime::secrets::TokenCipher::from_source(src)?,
        }))
    }
}

impl GatewayConfig {
    pub fn from_source(src: &Source) -> Result<Self, ConfigError> {
        let mut secrets = Vec::new();
        for key in ["SLACK_SIGNING_SECRET", "SLACK_SIGNING_SECRET_PREVIOUS"] {
            let value = if key == "SLACK_SIGNING_SECRET" {
                Some(src.required(key)?)
            } else {
                src.get(key)
            };
            if let Some(v) = value {
                secrets.push(threadline_slack::SigningSecret::new(v).map_err(|e| {
                    ConfigError::Invalid {
                        key: key.into(),
                        message: e.to_string(),
                    }
                })?);
            }
        }
        Ok(Self {
            common: CommonConfig::from_source(src)?,
            addr: src.socket_addr("THREADLINE_GATEWAY_ADDR", "127.0.0.1:3000")?,
            signing_secrets: SigningSecrets(secrets),
            max_body_bytes: src.bounded(
                "THREADLINE_GATEWAY_MAX_BODY_BYTES",
                1 << 20,
                1024..=(1 << 20),
            )? as usize,
            intake_timeout: src.millis("THREADLINE_INTAKE_TIMEOUT_MS", 2500, 50..=60_000)?,
            intake_writers: src.bounded("THREADLINE_INTAKE_WRITERS", 3, 1..=64)? as usize,
            intake_max_batch: src.bounded("THREADLINE_INTAKE_MAX_BATCH", 256, 1..=4096)? as usize,
            installation_cache_ttl: src.millis(
                "THREADLINE_INSTALLATION_CACHE_MS",
                2000,
                0..=600_000,
            )?,
            relay_enabled: src.flag("THREADLINE_RELAY_ENABLED", true)?,
            relay_batch: src.bounded("THREADLINE_RELAY_BATCH", 256, 1..=10_000)? as i64,
            relay_sweep: src.millis("THREADLINE_RELAY_SWEEP_MS", 1000, 10..=600_000)?,
            oauth: OAuthSettings::from_source(src)?.map(std::sync::Arc::new),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signing_secret_is_required_and_named() {
        let err = GatewayConfig::from_source(&Source::default())
            .expect_err("missing")
            .to_string();
        assert!(err.contains("SLACK_SIGNING_SECRET"), "{err}");
        let err = GatewayConfig::from_source(&Source::from_pairs([
            ("SLACK_SIGNING_SECRET", "s"),
            ("THREADLINE_GATEWAY_ADDR", "3000"),
        ]))
        .expect_err("bad addr")
        .to_string();
        assert!(err.contains("THREADLINE_GATEWAY_ADDR"), "{err}");
    }

    #[test]
    fn rotation_secret_is_optional_and_debug_is_redacted() {
        let cfg = GatewayConfig::from_source(&Source::from_pairs([
            ("SLACK_SIGNING_SECRET", "new-secret-value"),
            ("SLACK_SIGNING_SECRET_PREVIOUS", "old-secret-value"),
        ]))
        .expect("valid");
        assert_eq!(cfg.signing_secrets.0.len(), 2);
        let dbg = format!("{cfg:?}");
        assert!(!dbg.contains("secret-value"), "{dbg}");
    }
}
