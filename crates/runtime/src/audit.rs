//! The audit log's key (DESIGN invariant 9): the records themselves are
//! written by `threadline_store::audit`, with codes cut to short tokens; this
//! process holds the key that turns a channel into its pseudonym.
//!
//! Channels are pseudonymised: `channel_ref` is a keyed hash (HMAC-SHA256 of
//! installation and channel id) so records of one channel can be correlated
//! without naming it. The key is `THREADLINE_AUDIT_KEY` (64 hex digits), the
//! same in every process; it is never derived from the token keys, which
//! the gateway does not hold. The services that open tokens require it
//! ([`require`]); elsewhere, without it, `channel_ref` stays empty (with a
//! warning). The key is set once per process by [`configure`] or
//! [`require`].

use std::sync::OnceLock;

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use uuid::Uuid;

use crate::config::{ConfigError, Source};

type HmacSha256 = Hmac<Sha256>;

pub const AUDIT_KEY_SETTING: &str = "THREADLINE_AUDIT_KEY";

static KEY: OnceLock<Option<[u8; 32]>> = OnceLock::new();

/// The pseudonymisation key from the settings (see the module docs).
pub fn key_from(src: &Source) -> Result<Option<[u8; 32]>, ConfigError> {
    let Some(raw) = src.get(AUDIT_KEY_SETTING) else {
        return Ok(None);
    };
    let bytes = hex::decode(raw.trim())
        .ok()
        .and_then(|b| <[u8; 32]>::try_from(b).ok())
        .ok_or_else(|| ConfigError::Invalid {
            key: AUDIT_KEY_SETTING.into(),
            message: "expected 64 hex digits (32 bytes)".into(),
        })?;
    Ok(Some(bytes))
}

/// Sets this process's pseudonymisation key, if configured (the first call
/// wins); without one, audit records carry no channel reference.
pub fn configure(src: &Source) -> Result<(), ConfigError> {
    let key = key_from(src)?;
    if key.is_none() {
        tracing::warn!("THREADLINE_AUDIT_KEY is not set: audit records carry no channel reference");
    }
    let _ = KEY.set(key);
    Ok(())
}

/// [`configure`], refusing to start without the key: the services that
/// open tokens, whose records must correlate with every other service's.
pub fn require(src: &Source) -> Result<(), ConfigError> {
    let key = key_from(src)?.ok_or_else(|| ConfigError::Invalid {
        key: AUDIT_KEY_SETTING.into(),
        message: "required (64 hex digits, the same in every service): the key of the audit \
                  log's channel pseudonyms, no longer derived from THREADLINE_TOKEN_KEYS"
            .into(),
    })?;
    let _ = KEY.set(Some(key));
    Ok(())
}

/// The pseudonym of `channel` in `installation`, if a key is configured.
pub fn channel_ref(installation: Uuid, channel: &str) -> Option<String> {
    let key = KEY.get().copied().flatten()?;
    pseudonym(&key, installation, channel)
}

fn pseudonym(key: &[u8; 32], installation: Uuid, channel: &str) -> Option<String> {
    if channel.is_empty() {
        return None;
    }
    let mut mac = <HmacSha256 as KeyInit>::new_from_slice(key).ok()?;
    mac.update(installation.as_bytes());
    mac.update(channel.as_bytes());
    Some(hex::encode(&mac.finalize().into_bytes()[..16]))
}

pub use threadline_domain::audit::sanitise_code;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pseudonyms_are_keyed_per_installation_and_never_the_id() {
        let (a, b) = (Uuid::now_v7(), Uuid::now_v7());
        let k1 = [7u8; 32];
        let k2 = [8u8; 32];
        let p = pseudonym(&k1, a, "C0123").expect("pseudonym");
        assert_eq!(p.len(), 32);
        assert!(!p.contains("C0123"));
        assert_eq!(Some(p.clone()), pseudonym(&k1, a, "C0123"), "stable");
        assert_ne!(
            Some(p.clone()),
            pseudonym(&k1, b, "C0123"),
            "per installation"
        );
        assert_ne!(Some(p), pseudonym(&k2, a, "C0123"), "keyed");
        assert_eq!(pseudonym(&k1, a, ""), None);
    }

    #[test]
    fn the_key_comes_from_its_setting_only() {
        let explicit = Source::from_pairs([(AUDIT_KEY_SETTING, "11".repeat(32))]);
        assert_eq!(key_from(&explicit).expect("key"), Some([0x11; 32]));
        let bad = Source::from_pairs([(AUDIT_KEY_SETTING, "nothex")]);
        let err = key_from(&bad).expect_err("refused").to_string();
        assert!(err.contains(AUDIT_KEY_SETTING), "{err}");
        let token_keys_only =
            Source::from_pairs([("THREADLINE_TOKEN_KEYS", format!("k1:{}", "33".repeat(32)))]);
        assert_eq!(key_from(&token_keys_only).expect("ok"), None, "not derived");
        let err = require(&token_keys_only).expect_err("required").to_string();
        assert!(err.contains(AUDIT_KEY_SETTING), "{err}");
    }
}
