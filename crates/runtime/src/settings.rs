//! Reading settings: built-in defaults, then an optional `KEY=VALUE` file
//! named by `THREADLINE_CONFIG_FILE`, then the process environment; every
//! error names the setting. What the settings are is [`crate::config`]'s
//! and each service's.

use std::collections::HashMap;
use std::fmt::Display;
use std::str::FromStr;
use std::time::Duration;

use secrecy::SecretString;

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
pub(crate) fn parse_env_file(text: &str) -> Result<HashMap<String, String>, String> {
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
