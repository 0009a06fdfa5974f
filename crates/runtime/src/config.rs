//! Layered configuration: built-in defaults, then an optional `KEY=VALUE`
//! file named by `THREADLINE_CONFIG_FILE`, then the process environment.
//! Every setting is read by its name, and every error names the setting.
//!
//! Settings shared by all services are documented here, next to their
//! defaults; service-specific ones live with the service.

use std::time::Duration;

use secrecy::{ExposeSecret as _, SecretString};
use std::fmt;

use crate::nats_role::Role;

/// Default Postgres URL: the local server on its standard port.
pub const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/threadline";
/// Default NATS URL: the local server on its standard port.
pub const DEFAULT_NATS_URL: &str = "nats://127.0.0.1:4222";
/// Default Slack Web API base.
pub const DEFAULT_SLACK_API_URL: &str = "https://slack.com/api/";

pub use crate::settings::{ConfigError, Source};

/// Settings every service shares. `Debug` hides credentials in URLs.
#[derive(Clone)]
pub struct CommonConfig {
    /// `DATABASE_URL`, default [`DEFAULT_DATABASE_URL`].
    pub database_url: String,
    /// `THREADLINE_DB_MAX_CONNECTIONS`, default 16.
    pub db_max_connections: u32,
    /// `THREADLINE_DB_ACQUIRE_TIMEOUT_MS`, default 1500: how long a request
    /// waits for a connection before failing (so Slack gets a 503 in time).
    pub db_acquire_timeout: Duration,
    /// The broker and this process's user on it: `NATS_URL`, default
    /// [`DEFAULT_NATS_URL`]; `NATS_USER` and `NATS_PASSWORD` (both or
    /// neither; unset: anonymous, for a broker without authorization). The
    /// user is one of the roles of [`crate::nats_auth`].
    pub nats_url: NatsEndpoint,
    /// `THREADLINE_BUS_PREFIX`, default `tl`: subject prefix and stream-name
    /// prefix, so several deployments (or tests) share one NATS server.
    pub bus_prefix: String,
    /// `SLACK_API_URL`, default [`DEFAULT_SLACK_API_URL`]: the Web API base,
    /// pointed at `slack-sim` in tests and demos.
    pub slack_api_url: String,
    /// `OTEL_EXPORTER_OTLP_ENDPOINT`: traces are exported only when set.
    pub otlp_endpoint: Option<String>,
    /// `THREADLINE_LOG_FORMAT`: `json` (default) or `text`. Level from `RUST_LOG`.
    pub log_json: bool,
    /// `THREADLINE_STREAM_REPLICAS`, default 1: JetStream replicas of every
    /// stream (3 on a 3-node cluster, so a node loss keeps queued work).
    pub stream_replicas: usize,
    /// `THREADLINE_DLQ_MAX_AGE_HOURS`, default 336 (14 days): how long a
    /// dead letter, which holds the failed message, is kept.
    pub dead_letter_max_age: Duration,
    /// `THREADLINE_REDELIVERY_MS`, default 60000: how long a message whose
    /// worker died (or froze, and stopped sending in-progress acks) waits
    /// before it is delivered again, however many times. The same in every
    /// service.
    pub redelivery: Duration,
    /// `THREADLINE_DEAD_LETTER_KEYS` (`id:hex64[,…]`, the first seals; like
    /// `THREADLINE_TOKEN_KEYS` but its own keys, since inference holds no
    /// token keys): dead letters keep their message sealed with them, so
    /// `threadline dlq replay` can restore it and nobody reading the stream
    /// sees message text. Unset: a dead letter keeps only what carries no
    /// message text. Kept as read: `threadline_tenancy::dead_letter`
    /// parses it (and refuses a malformed list) when a worker or the CLI
    /// builds its letters.
    pub dead_letter_keys: Option<SecretString>,
    /// `THREADLINE_TENANT_SHARE_PERCENT`, default 50: the share of a
    /// worker's concurrency one installation may hold while more work waits
    /// behind its message (100: no limit).
    pub tenant_share_percent: u8,
    /// `THREADLINE_STATEMENT_BATCH`, default 64: the most waiting handlers
    /// of one worker whose statement runs as one (see [`crate::batch`]).
    pub statement_batch: usize,
}

impl std::fmt::Debug for CommonConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CommonConfig")
            .field(
                "database_url",
                &crate::redact::redact_url(&self.database_url),
            )
            .field("db_max_connections", &self.db_max_connections)
            .field("db_acquire_timeout", &self.db_acquire_timeout)
            .field("nats_url", &self.nats_url)
            .field("bus_prefix", &self.bus_prefix)
            .field("slack_api_url", &self.slack_api_url)
            .field(
                "otlp_endpoint",
                &self.otlp_endpoint.as_deref().map(crate::redact::redact_url),
            )
            .field("log_json", &self.log_json)
            .field("stream_replicas", &self.stream_replicas)
            .field("dead_letter_max_age", &self.dead_letter_max_age)
            .field("redelivery", &self.redelivery)
            .field(
                "dead_letter_keys",
                &self.dead_letter_keys.as_ref().map(|_| "[redacted]"),
            )
            .field("tenant_share_percent", &self.tenant_share_percent)
            .field("statement_batch", &self.statement_batch)
            .finish()
    }
}

impl CommonConfig {
    pub fn from_source(src: &Source) -> Result<Self, ConfigError> {
        let bus_prefix = src.string("THREADLINE_BUS_PREFIX", "tl");
        if bus_prefix.is_empty()
            || bus_prefix.len() > 32
            || !bus_prefix
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_')
        {
            return Err(ConfigError::Invalid {
                key: "THREADLINE_BUS_PREFIX".into(),
                message: "expected 1-32 characters of [A-Za-z0-9_]".into(),
            });
        }
        let log_format = src.string("THREADLINE_LOG_FORMAT", "json");
        let log_json = match log_format.as_str() {
            "json" => true,
            "text" => false,
            other => {
                return Err(ConfigError::Invalid {
                    key: "THREADLINE_LOG_FORMAT".into(),
                    message: format!("expected json or text, got {other:?}"),
                });
            }
        };
        Ok(Self {
            database_url: src.url(
                "DATABASE_URL",
                DEFAULT_DATABASE_URL,
                &["postgres", "postgresql"],
            )?,
            db_max_connections: src.bounded("THREADLINE_DB_MAX_CONNECTIONS", 16, 1..=1000)? as u32,
            db_acquire_timeout: src.millis(
                "THREADLINE_DB_ACQUIRE_TIMEOUT_MS",
                1500,
                10..=60_000,
            )?,
            nats_url: NatsEndpoint::from_source(src)?,
            bus_prefix,
            slack_api_url: src.url("SLACK_API_URL", DEFAULT_SLACK_API_URL, &["http", "https"])?,
            otlp_endpoint: src
                .get("OTEL_EXPORTER_OTLP_ENDPOINT")
                .map(|_| src.url("OTEL_EXPORTER_OTLP_ENDPOINT", "", &["http", "https"]))
                .transpose()?,
            log_json,
            stream_replicas: src.bounded("THREADLINE_STREAM_REPLICAS", 1, 1..=5)? as usize,
            dead_letter_max_age: Duration::from_secs(
                src.bounded("THREADLINE_DLQ_MAX_AGE_HOURS", 336, 1..=8760)? * 3600,
            ),
            redelivery: src.millis("THREADLINE_REDELIVERY_MS", 60_000, 1_000..=3_600_000)?,
            dead_letter_keys: src.secret(DEAD_LETTER_KEYS_SETTING)?,
            tenant_share_percent: src.bounded("THREADLINE_TENANT_SHARE_PERCENT", 50, 1..=100)?
                as u8,
            statement_batch: src.bounded("THREADLINE_STATEMENT_BATCH", 64, 1..=1000)? as usize,
        })
    }
}

/// The keys dead letters are sealed with.
pub const DEAD_LETTER_KEYS_SETTING: &str = "THREADLINE_DEAD_LETTER_KEYS";

/// Where the broker is and who this process is on it: `NATS_URL`, and
/// `NATS_USER` with `NATS_PASSWORD` (both or neither). Without a user the
/// connection is anonymous, as a broker without authorization expects.
/// `Debug` hides the password and any credentials in the URL.
#[derive(Clone)]
pub struct NatsEndpoint {
    url: String,
    login: Option<(Role, SecretString)>,
}

impl NatsEndpoint {
    /// An anonymous endpoint (no authorization).
    pub fn anonymous(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            login: None,
        }
    }

    /// `NATS_URL` (default [`DEFAULT_NATS_URL`]), `NATS_USER`, `NATS_PASSWORD`.
    pub fn from_source(src: &Source) -> Result<Self, ConfigError> {
        let url = src.url("NATS_URL", DEFAULT_NATS_URL, &["nats", "tls", "ws", "wss"])?;
        let invalid = |key: &str, message: String| ConfigError::Invalid {
            key: key.to_owned(),
            message,
        };
        let login = match (src.get("NATS_USER"), src.secret("NATS_PASSWORD")?) {
            (None, None) => None,
            (Some(_), None) => {
                return Err(invalid(
                    "NATS_PASSWORD",
                    "not set, but NATS_USER is: set both or neither".into(),
                ));
            }
            (None, Some(_)) => {
                return Err(invalid(
                    "NATS_USER",
                    "not set, but NATS_PASSWORD is: set both or neither".into(),
                ));
            }
            (Some(user), Some(password)) => {
                let user = user.trim();
                let role = Role::parse(user).ok_or_else(|| {
                    invalid(
                        "NATS_USER",
                        format!(
                            "expected one of {} (the users `threadline nats auth` renders), got {user:?}",
                            Role::ALL.map(Role::user).join(", ")
                        ),
                    )
                })?;
                if crate::redact::redact_url(&url) != url {
                    return Err(invalid(
                        "NATS_URL",
                        "carries credentials while NATS_USER is set: give them once, in NATS_USER and NATS_PASSWORD".into(),
                    ));
                }
                Some((role, password))
            }
        };
        Ok(Self { url, login })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// The role this process logs in as; `None` when anonymous.
    pub fn role(&self) -> Option<Role> {
        self.login.as_ref().map(|(r, _)| *r)
    }

    /// User and password, for the connection only.
    pub(crate) fn credentials(&self) -> Option<(Role, &str)> {
        self.login.as_ref().map(|(r, p)| (*r, p.expose_secret()))
    }
}

impl fmt::Debug for NatsEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsEndpoint")
            .field("url", &crate::redact::redact_url(&self.url))
            .field("user", &self.role().map(Role::user))
            .field("password", &self.login.as_ref().map(|_| "[redacted]"))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_point_at_local_standard_ports() {
        let c = CommonConfig::from_source(&Source::default()).expect("defaults are valid");
        assert_eq!(c.database_url, DEFAULT_DATABASE_URL);
        assert_eq!(c.nats_url.url(), DEFAULT_NATS_URL);
        assert_eq!(c.nats_url.role(), None);
        assert_eq!(c.bus_prefix, "tl");
        assert!(c.otlp_endpoint.is_none());
    }

    #[test]
    fn errors_name_the_setting() {
        for (key, value) in [
            ("DATABASE_URL", "mysql://x"),
            ("NATS_URL", "http://x"),
            ("THREADLINE_BUS_PREFIX", "a.b"),
            ("THREADLINE_DB_MAX_CONNECTIONS", "zero"),
            ("THREADLINE_DB_MAX_CONNECTIONS", "0"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "localhost:4318"),
            ("THREADLINE_LOG_FORMAT", "xml"),
            ("SLACK_API_URL", "slack.com/api"),
            ("NATS_USER", "gateway"),
        ] {
            let err = CommonConfig::from_source(&Source::default().with(key, value))
                .expect_err(key)
                .to_string();
            assert!(err.contains(key), "{err}");
        }
        let err = Source::default()
            .required("SLACK_SIGNING_SECRET")
            .expect_err("missing")
            .to_string();
        assert_eq!(err, "setting SLACK_SIGNING_SECRET is required but not set");
    }

    #[test]
    fn debug_hides_url_credentials() {
        let c = CommonConfig::from_source(&Source::from_pairs([(
            "DATABASE_URL",
            "postgres://app:hunter2@db/x",
        )]))
        .expect("valid");
        assert!(!format!("{c:?}").contains("hunter2"));
        let c = CommonConfig::from_source(&Source::from_pairs([
            ("NATS_USER", "inference"),
            ("NATS_PASSWORD", "hunter3"),
        ]))
        .expect("valid");
        assert!(!format!("{c:?}").contains("hunter3"), "{c:?}");
    }

    #[test]
    fn env_file_lines() {
        let m = crate::settings::parse_env_file("# c\n\nexport A=1\nB = \"two words\"\n")
            .expect("parses");
        assert_eq!(m.get("A").map(String::as_str), Some("1"));
        assert_eq!(m.get("B").map(String::as_str), Some("two words"));
        assert!(crate::settings::parse_env_file("novalue").is_err());
    }

    #[test]
    fn flags_and_addresses() {
        let s = Source::from_pairs([("F", "off"), ("G", "maybe"), ("ADDR", "nope")]);
        assert!(!s.flag("F", true).expect("off"));
        assert!(s.flag("G", true).is_err());
        assert!(
            s.socket_addr("ADDR", "127.0.0.1:1")
                .expect_err("bad")
                .to_string()
                .contains("ADDR")
        );
    }
}
