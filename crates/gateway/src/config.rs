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

/// Least privilege for what threadline does: read mentions and the threads
/// it answers in, post replies.
pub const DEFAULT_BOT_SCOPES: &str = "app_mentions:read,channels:history,channels:read,chat:write";

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
    /// `THREADLINE_GATEWAY_UNVERIFIED_BYTES`, default 8 MiB (at least
    /// `THREADLINE_GATEWAY_MAX_BODY_BYTES`): how many bytes of bodies whose
    /// signature is not checked yet may be in memory at once. A delivery
    /// that does not fit is refused unread with 503 (Slack retries). Slack's
    /// deliveries are a few KiB, so 8 MiB holds about a thousand of them, or
    /// eight of the largest, while an unsigned flood costs at most 8 MiB.
    pub unverified_bytes: usize,
    /// `THREADLINE_GATEWAY_BODY_TIMEOUT_MS`, default 5000: how long a
    /// delivery's body may take to arrive after its head (Slack sends it at
    /// once); a slower one is refused with 408 and its share of the
    /// unverified budget freed.
    pub body_timeout: std::time::Duration,
    /// Limits on the listener's connections.
    pub connections: ConnectionLimits,
    /// `THREADLINE_GATEWAY_TRUST_FORWARDED_FOR`, default false: take the
    /// client's address (for per-client limits) from the last entry of
    /// `X-Forwarded-For`, the one the proxy in front of the gateway wrote.
    /// Only for a gateway reachable through that proxy alone.
    pub trust_forwarded_for: bool,
    /// `THREADLINE_INTAKE_TIMEOUT_MS`, default 2500: longest a delivery waits
    /// for its receipt to commit before the gateway answers 503 (Slack gives
    /// up at 3 s and retries).
    pub intake_timeout: Duration,
    /// `THREADLINE_SPOOL_ENABLED`, default true: a delivery Postgres cannot
    /// take within `spool_after` is kept in the broker's spool stream
    /// (acknowledged by JetStream before Slack's 200) and recorded by the
    /// drainer once Postgres is back; false answers 503 as without a spool.
    pub spool_enabled: bool,
    /// `THREADLINE_SPOOL_AFTER_MS`, default 1400: how long a delivery waits
    /// for Postgres before it is spooled (the spool's write, bounded by
    /// [`SPOOL_PUT_TIMEOUT`](crate::spool::PUT_TIMEOUT), must still fit in
    /// Slack's 3 s).
    pub spool_after: Duration,
    /// `THREADLINE_SHED_PARKED`, default 256 (0: never): while at least
    /// this many of an installation's requests wait parked for their turn
    /// (its share of the model's queue held), a person's new top-level
    /// message or mention in a channel of that installation is answered
    /// 503 before anything is written (Slack's first try and its immediate
    /// retry; the retries a minute and five minutes later are taken),
    /// until fewer than half of it wait. See [`crate::shed`].
    pub shed_parked: u64,
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
    /// `THREADLINE_RELAY_PIPELINE`, default 4: rounds awaiting their
    /// PubAcks while the next is claimed and sent.
    pub relay_pipeline: usize,
    /// The OAuth install flow, on when `SLACK_CLIENT_ID` is set.
    pub oauth: Option<std::sync::Arc<OAuthSettings>>,
    /// Socket Mode intake, on when `THREADLINE_SOCKET_MODE=true`
    /// (`SLACK_APP_TOKEN` then required; `THREADLINE_SOCKET_CONNECTIONS`,
    /// default 2, 1–10).
    pub socket_mode: Option<crate::socket::SocketMode>,
}

/// What the listener allows each connection (see [`crate::listener`]).
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// `THREADLINE_GATEWAY_HEADER_TIMEOUT_MS`, default 5000: a request's
    /// head must be complete this long after the connection opened, or
    /// after the first byte of a later request on a kept-alive connection.
    /// Slack and the ingress send a head in one go.
    pub header_timeout: std::time::Duration,
    /// `THREADLINE_GATEWAY_IDLE_TIMEOUT_MS`, default 75000: a kept-alive
    /// connection with no request under way is closed after this long.
    /// Longer than ingress-nginx's upstream keep-alive (60 s), so the proxy
    /// drops its idle connections before the gateway does.
    pub idle_timeout: std::time::Duration,
    /// `THREADLINE_GATEWAY_MAX_CONNECTIONS`, default 1024: open connections.
    /// At the cap a new connection takes the place of the one idle longest
    /// (or waiting longest for its head); if every connection is in a
    /// request, accepting waits. Lowered at start to fit the process's
    /// open-files limit.
    pub max_connections: usize,
}

/// `SLACK_CLIENT_ID`, `SLACK_CLIENT_SECRET`, `THREADLINE_OAUTH_REDIRECT_URL`
/// (this gateway's public `/slack/oauth/callback`),
/// `THREADLINE_TOKEN_PUBLIC_KEYS` (public keys only: the gateway seals the
/// tokens an install stores and can open none, DESIGN §8);
/// optional `SLACK_AUTHORIZE_URL` (default Slack's consent page),
/// `THREADLINE_BOT_SCOPES` (default least privilege),
/// `THREADLINE_OAUTH_STATE_TTL_MS` (default 10 minutes),
/// `THREADLINE_INSTALL_RATE_PER_MINUTE` (default 60) and
/// `THREADLINE_INSTALL_RATE_PER_CLIENT_PER_MINUTE` (default 10): install
/// links handed out per minute by this gateway, overall and to one client
/// address, each a token bucket holding a minute's worth; beyond them
/// `/slack/install` answers 429 with `Retry-After`. Installing is a rare,
/// human action; each link stores a state row for its validity, so a
/// replica holds at most rate × validity of them (600 by default).
#[derive(Debug)]
pub struct OAuthSettings {
    pub client_id: String,
    pub client_secret: secrecy::SecretString,
    pub redirect_url: String,
    pub authorize_url: String,
    pub scopes: String,
    pub state_ttl: Duration,
    pub install_rate_per_minute: u32,
    pub install_rate_per_client_per_minute: u32,
    pub cipher: threadline_tenancy::secrets::TokenSealer,
}

impl OAuthSettings {
    fn from_source(src: &Source) -> Result<Option<Self>, ConfigError> {
        let Some(client_id) = src.get("SLACK_CLIENT_ID") else {
            return Ok(None);
        };
        let scopes = src.string("THREADLINE_BOT_SCOPES", DEFAULT_BOT_SCOPES);
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
            install_rate_per_minute: src.bounded(
                "THREADLINE_INSTALL_RATE_PER_MINUTE",
                60,
                1..=60_000,
            )? as u32,
            install_rate_per_client_per_minute: src.bounded(
                "THREADLINE_INSTALL_RATE_PER_CLIENT_PER_MINUTE",
                10,
                1..=60_000,
            )? as u32,
            cipher: threadline_tenancy::secrets::TokenSealer::parse(
                src.required(threadline_tenancy::secrets::TOKEN_PUBLIC_KEYS_SETTING)?,
            )?,
        }))
    }
}

impl GatewayConfig {
    pub fn from_source(src: &Source) -> Result<Self, ConfigError> {
        // The internet-facing process never holds a key that opens a token
        // (DESIGN §8): private keys in its environment are a mistake to
        // refuse, not to ignore.
        if src
            .get(threadline_tenancy::secrets::TOKEN_KEYS_SETTING)
            .is_some()
        {
            return Err(ConfigError::Invalid {
                key: threadline_tenancy::secrets::TOKEN_KEYS_SETTING.into(),
                message: "the gateway must not hold the keys that open tokens; give it \
                          THREADLINE_TOKEN_PUBLIC_KEYS (`threadline keys public`) instead"
                    .into(),
            });
        }
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
        let max_body_bytes = src.bounded(
            "THREADLINE_GATEWAY_MAX_BODY_BYTES",
            1 << 20,
            1024..=(1 << 20),
        )? as usize;
        let unverified_bytes = src.bounded(
            "THREADLINE_GATEWAY_UNVERIFIED_BYTES",
            8 << 20,
            (64 << 10)..=(1 << 30),
        )? as usize;
        if unverified_bytes < max_body_bytes {
            return Err(ConfigError::Invalid {
                key: "THREADLINE_GATEWAY_UNVERIFIED_BYTES".into(),
                message: format!(
                    "{unverified_bytes} is below THREADLINE_GATEWAY_MAX_BODY_BYTES ({max_body_bytes}): the largest delivery could never be read"
                ),
            });
        }
        let common = CommonConfig::from_source(src)?;
        let allow_plain = common.slack_api_url.starts_with("http://");
        Ok(Self {
            common,
            addr: src.socket_addr("THREADLINE_GATEWAY_ADDR", "127.0.0.1:3000")?,
            signing_secrets: SigningSecrets(secrets),
            max_body_bytes,
            unverified_bytes,
            // Below the router's 10 s request timeout, or it would never fire.
            body_timeout: src.millis("THREADLINE_GATEWAY_BODY_TIMEOUT_MS", 5_000, 100..=9_000)?,
            connections: ConnectionLimits {
                header_timeout: src.millis(
                    "THREADLINE_GATEWAY_HEADER_TIMEOUT_MS",
                    5_000,
                    100..=60_000,
                )?,
                idle_timeout: src.millis(
                    "THREADLINE_GATEWAY_IDLE_TIMEOUT_MS",
                    75_000,
                    100..=3_600_000,
                )?,
                max_connections: src.bounded(
                    "THREADLINE_GATEWAY_MAX_CONNECTIONS",
                    1024,
                    16..=1_000_000,
                )? as usize,
            },
            trust_forwarded_for: src.flag("THREADLINE_GATEWAY_TRUST_FORWARDED_FOR", false)?,
            intake_timeout: src.millis("THREADLINE_INTAKE_TIMEOUT_MS", 2500, 50..=60_000)?,
            spool_enabled: src.flag("THREADLINE_SPOOL_ENABLED", true)?,
            // (with the spool's 1 s, inside the 2.5 s a delivery is answered in)
            spool_after: src.millis("THREADLINE_SPOOL_AFTER_MS", 1400, 50..=1_500)?,
            shed_parked: src.bounded("THREADLINE_SHED_PARKED", 256, 0..=10_000_000)?,
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
            relay_pipeline: src.bounded("THREADLINE_RELAY_PIPELINE", 4, 1..=64)? as usize,
            oauth: OAuthSettings::from_source(src)?.map(std::sync::Arc::new),
            socket_mode: match src.flag("THREADLINE_SOCKET_MODE", false)? {
                false => None,
                true => Some(crate::socket::SocketMode {
                    app_token: src.secret("SLACK_APP_TOKEN")?.ok_or(ConfigError::Missing {
                        key: "SLACK_APP_TOKEN".into(),
                    })?,
                    connections: src.bounded("THREADLINE_SOCKET_CONNECTIONS", 2, 1..=10)? as usize,
                    allow_plain,
                    open: Default::default(),
                }),
            },
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
    fn the_unverified_budget_holds_at_least_the_largest_body() {
        let base = || Source::from_pairs([("SLACK_SIGNING_SECRET", "s")]);
        let cfg = GatewayConfig::from_source(&base()).expect("defaults");
        assert_eq!(cfg.unverified_bytes, 8 << 20);
        assert!(cfg.unverified_bytes >= cfg.max_body_bytes);
        let err = GatewayConfig::from_source(
            &base()
                .with("THREADLINE_GATEWAY_MAX_BODY_BYTES", "1048576")
                .with("THREADLINE_GATEWAY_UNVERIFIED_BYTES", "524288"),
        )
        .expect_err("budget below the body limit")
        .to_string();
        assert!(err.contains("THREADLINE_GATEWAY_UNVERIFIED_BYTES"), "{err}");
        let err =
            GatewayConfig::from_source(&base().with("THREADLINE_GATEWAY_HEADER_TIMEOUT_MS", "0"))
                .expect_err("no header timeout")
                .to_string();
        assert!(
            err.contains("THREADLINE_GATEWAY_HEADER_TIMEOUT_MS"),
            "{err}"
        );
    }

    #[test]
    fn private_token_keys_are_refused_and_public_ones_seal() {
        use threadline_tenancy::secrets::{TOKEN_KEYS_SETTING, TokenKeys};
        let private = TokenKeys::generate_entry("k1");
        let err = GatewayConfig::from_source(&Source::from_pairs([
            ("SLACK_SIGNING_SECRET", "s"),
            (TOKEN_KEYS_SETTING, private.as_str()),
        ]))
        .expect_err("private keys refused")
        .to_string();
        assert!(err.contains(TOKEN_KEYS_SETTING), "{err}");
        assert!(!err.contains(&private[10..]), "{err}");
        let oauth = || {
            Source::from_pairs([
                ("SLACK_SIGNING_SECRET", "s"),
                ("SLACK_CLIENT_ID", "1.2"),
                ("SLACK_CLIENT_SECRET", "c"),
                (
                    "THREADLINE_OAUTH_REDIRECT_URL",
                    "https://example.com/slack/oauth/callback",
                ),
            ])
        };
        let err = GatewayConfig::from_source(&oauth())
            .expect_err("public keys required with OAuth")
            .to_string();
        assert!(err.contains("THREADLINE_TOKEN_PUBLIC_KEYS"), "{err}");
        let public = TokenKeys::parse(&private.clone().into())
            .expect("keys")
            .public_entries();
        let cfg = GatewayConfig::from_source(
            &oauth().with("THREADLINE_TOKEN_PUBLIC_KEYS", public.as_str()),
        )
        .expect("valid");
        assert!(cfg.oauth.is_some());
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
