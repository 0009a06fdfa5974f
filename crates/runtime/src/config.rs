//! Layered configuration: built-in defaults, then an optional `KEY=VALUE`
//! file named by `THREADLINE_CONFIG_FILE`, then the process environment.
//! Every setting is read by its name, and every error names the setting.
//!
//! Settings shared by all services are documented here, next to their
//! defaults; service-specific ones live with the service.

use std::collections::HashMap;
use std::fmt::Display;
use std::str::FromStr;
use std::time::Duration;

use secrecy::SecretString;

/// Default Postgres URL: the local server on its standard port.
pub const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/threadline";
/// Default NATS URL: the local server on its standard port.
pub const DEFAULT_NATS_URL: &str = "nats://127.0.0.1:4222";
/// Default Slack Web API base.
pub const DEFAULT_SLACK_API_URL: &str = "https://slack.com/api/";

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("setting {key}: {message}")]
    Invalid { key: String, message: String },
    #[error("setting {key} is required but not set")]
    Missing { key: String },
    #[error("config file {path}: {message}")]
    File { path: String, message: String },
}

/// Where settings come from. Tests build one from a map; services from the
/// environment.
#[derive(Debug, Clone, Default)]
pub struct Source {
    values: HashMap<String, String>,
}

impl Source {
    /// The process environment over the optional `THREADLINE_CONFIG_FILE`.
    pub fn from_env() -> Result<Self, ConfigError> {
        let env: HashMap<String, String> = std::env::vars().collect();
        let mut values = HashMap::new();
        if let Some(path) = env.get("THREADLINE_CONFIG_FILE").filter(|p| !p.is_empty()) {
            let text = std::fs::read_to_string(path).map_err(|e| ConfigError::File {
                path: path.clone(),
                message: e.to_string(),
            })?;
            values = parse_env_file(&text).map_err(|message| ConfigError::File {
                path: path.clone(),
                message,
            })?;
        }
        values.extend(env);
        Ok(Self { values })
    }

    pub fn from_pairs<K: Into<String>, V: Into<String>>(
        pairs: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        Self {
            values: pairs
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
        }
    }

    pub fn with(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.values.insert(key.into(), value.into());
        self
    }

    /// The raw value; an empty string counts as unset.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.values
            .get(key)
            .map(String::as_str)
            .filter(|v| !v.trim().is_empty())
    }

    pub fn string(&self, key: &str, default: &str) -> String {
        self.get(key).unwrap_or(default).to_owned()
    }

    pub fn required(&self, key: &str) -> Result<&str, ConfigError> {
        self.get(key).ok_or_else(|| ConfigError::Missing {
            key: key.to_owned(),
        })
    }

    pub fn secret(&self, key: &str) -> Result<Option<SecretString>, ConfigError> {
        Ok(self.get(key).map(|v| SecretString::from(v.to_owned())))
    }

    pub fn parse<T>(&self, key: &str, default: T) -> Result<T, ConfigError>
    where
        T: FromStr,
        T::Err: Display,
    {
        match self.get(key) {
            None => Ok(default),
            Some(raw) => raw
                .trim()
                .parse()
                .map_err(|e: T::Err| ConfigError::Invalid {
                    key: key.to_owned(),
                    message: format!("{e} (got {raw:?})"),
                }),
        }
    }

    /// A positive integer within `range`.
    pub fn bounded(
        &self,
        key: &str,
        default: u64,
        range: std::ops::RangeInclusive<u64>,
    ) -> Result<u64, ConfigError> {
        let v = self.parse(key, default)?;
        if !range.contains(&v) {
            return Err(ConfigError::Invalid {
                key: key.to_owned(),
                message: format!("{v} is outside {}..={}", range.start(), range.end()),
            });
        }
        Ok(v)
    }

    /// Milliseconds, as a `Duration`, within `range` (in milliseconds).
    pub fn millis(
        &self,
        key: &str,
        default_ms: u64,
        range: std::ops::RangeInclusive<u64>,
    ) -> Result<Duration, ConfigError> {
        self.bounded(key, default_ms, range)
            .map(Duration::from_millis)
    }

    pub fn flag(&self, key: &str, default: bool) -> Result<bool, ConfigError> {
        match self.get(key).map(|v| v.trim().to_ascii_lowercase()) {
            None => Ok(default),
            Some(v) if ["1", "true", "yes", "on"].contains(&v.as_str()) => Ok(true),
            Some(v) if ["0", "false", "no", "off"].contains(&v.as_str()) => Ok(false),
            Some(v) => Err(ConfigError::Invalid {
                key: key.to_owned(),
                message: format!("expected true or false, got {v:?}"),
            }),
        }
    }

    /// A URL with one of the given schemes (checked by prefix; the clients
    /// that use it report anything finer).
    pub fn url(&self, key: &str, default: &str, schemes: &[&str]) -> Result<String, ConfigError> {
        let v = self.string(key, default);
        let ok = schemes.iter().any(|s| {
            v.strip_prefix(s)
                .and_then(|rest| rest.strip_prefix("://"))
                .is_some_and(|rest| !rest.is_empty() && !rest.contains(char::is_whitespace))
        });
        if !ok {
            return Err(ConfigError::Invalid {
                key: key.to_owned(),
                message: format!("expected a {} URL", schemes.join(" or ")),
            });
        }
        Ok(v)
    }

    pub fn socket_addr(
        &self,
        key: &str,
        default: &str,
    ) -> Result<std::net::SocketAddr, ConfigError> {
        let raw = self.string(key, default);
        raw.parse().map_err(|e| ConfigError::Invalid {
            key: key.to_owned(),
            message: format!("{e} (got {raw:?}; expected host:port such as 127.0.0.1:3000)"),
        })
    }
}

/// `KEY=VALUE` lines; `#` comments and blank lines skipped; optional
/// surrounding double quotes stripped.
fn parse_env_file(text: &str) -> Result<HashMap<String, String>, String> {
    let mut out = HashMap::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let line = line.strip_prefix("export ").unwrap_or(line);
        let (k, v) = line
            .split_once('=')
            .ok_or_else(|| format!("line {}: expected KEY=VALUE", n + 1))?;
        let v = v.trim();
        let v = v
            .strip_prefix('"')
            .and_then(|v| v.strip_suffix('"'))
            .unwrap_or(v);
        out.insert(k.trim().to_owned(), v.to_owned());
    }
    Ok(out)
}

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
    pub nats_url: crate::nats_auth::NatsEndpoint,
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
    /// message text (see `dead_letter`).
    pub dead_letter_keys: Option<std::sync::Arc<crate::secrets::TokenCipher>>,
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
        use crate::bus::redact_url;
        f.debug_struct("CommonConfig")
            .field("database_url", &redact_url(&self.database_url))
            .field("db_max_connections", &self.db_max_connections)
            .field("db_acquire_timeout", &self.db_acquire_timeout)
            .field("nats_url", &self.nats_url)
            .field("bus_prefix", &self.bus_prefix)
            .field("slack_api_url", &self.slack_api_url)
            .field(
                "otlp_endpoint",
                &self.otlp_endpoint.as_deref().map(redact_url),
            )
            .field("log_json", &self.log_json)
            .field("stream_replicas", &self.stream_replicas)
            .field("dead_letter_max_age", &self.dead_letter_max_age)
            .field("redelivery", &self.redelivery)
            .field("dead_letter_keys", &self.dead_letter_keys)
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
            nats_url: crate::nats_auth::NatsEndpoint::from_source(src)?,
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
            dead_letter_keys: src
                .secret(crate::dead_letter::KEYS_SETTING)?
                .map(|raw| {
                    crate::secrets::TokenCipher::parse_setting(
                        &raw,
                        crate::dead_letter::KEYS_SETTING,
                    )
                })
                .transpose()?
                .map(std::sync::Arc::new),
            tenant_share_percent: src.bounded("THREADLINE_TENANT_SHARE_PERCENT", 50, 1..=100)?
                as u8,
            statement_batch: src.bounded("THREADLINE_STATEMENT_BATCH", 64, 1..=1000)? as usize,
        })
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
        let m = parse_env_file("# c\n\nexport A=1\nB = \"two words\"\n").expect("parses");
        assert_eq!(m.get("A").map(String::as_str), Some("1"));
        assert_eq!(m.get("B").map(String::as_str), Some("two words"));
        assert!(parse_env_file("novalue").is_err());
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
