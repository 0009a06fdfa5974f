//! The audit log's key (DESIGN invariant 9): the records themselves are
//! written by `threadline_store::audit`, with codes cut to short tokens; this
//! process holds the key that turns a channel into its pseudonym.
//!
//! Channels are pseudonymised: `channel_ref` is a keyed hash (HMAC-SHA256 of
//! installation and channel id) so records of one channel can be correlated
//! without naming it. The key is `THREADLINE_AUDIT_KEY` (64 hex digits), or,
//! when unset, derived from the first `THREADLINE_TOKEN_KEYS` key (then a
//! token-key rotation starts new pseudonyms). Without either, `channel_ref`
//! stays empty. The key is set once per process by [`configure`].

use std::sync::OnceLock;

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use uuid::Uuid;

use crate::config::{ConfigError, Source};

type HmacSha256 = Hmac<Sha256>;

pub const AUDIT_KEY_SETTING: &str = "THREADLINE_AUDIT_KEY";
/// The token keys (`threadline_tenancy::secrets`), read here only to
/// derive the pseudonym key when [`AUDIT_KEY_SETTING`] is unset.
const TOKEN_KEYS_SETTING: &str = "THREADLINE_TOKEN_KEYS";

static KEY: OnceLock<Option<[u8; 32]>> = OnceLock::new();

/// The pseudonymisation key from the settings (see the module docs).
pub fn key_from(src: &Source) -> Result<Option<[u8; 32]>, ConfigError> {
    let invalid = |key: &str, message: &str| ConfigError::Invalid {
        key: key.into(),
        message: message.into(),
    };
    if let Some(raw) = src.get(AUDIT_KEY_SETTING) {
        let bytes = hex::decode(raw.trim())
            .ok()
            .and_then(|b| <[u8; 32]>::try_from(b).ok())
            .ok_or_else(|| invalid(AUDIT_KEY_SETTING, "expected 64 hex digits (32 bytes)"))?;
        return Ok(Some(bytes));
    }
    let Some(first) = src
        .get(TOKEN_KEYS_SETTING)
        .and_then(|raw| raw.split(',').map(str::trim).find(|e| !e.is_empty()))
    else {
        return Ok(None);
    };
    let Some(key) = first
        .split_once(':')
        .and_then(|(_, h)| hex::decode(h).ok())
        .filter(|b| b.len() == 32)
    else {
        // The token cipher reports a malformed key list with its own error.
        return Ok(None);
    };
    let mut mac = <HmacSha256 as KeyInit>::new_from_slice(&key)
        .map_err(|_| invalid(TOKEN_KEYS_SETTING, "unusable key"))?;
    mac.update(b"threadline audit channel pseudonym v1");
    Ok(Some(mac.finalize().into_bytes().into()))
}

/// Sets this process's pseudonymisation key (the first call wins).
pub fn configure(src: &Source) -> Result<(), ConfigError> {
    let key = key_from(src)?;
    if key.is_none() {
        tracing::warn!(
            "neither THREADLINE_AUDIT_KEY nor THREADLINE_TOKEN_KEYS is set: audit records carry no channel reference"
        );
    }
    let _ = KEY.set(key);
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
    fn the_key_comes_from_its_setting_or_from_the_token_keys() {
        let explicit = Source::from_pairs([(AUDIT_KEY_SETTING, "11".repeat(32))]);
        assert_eq!(key_from(&explicit).expect("key"), Some([0x11; 32]));
        let bad = Source::from_pairs([(AUDIT_KEY_SETTING, "nothex")]);
        let err = key_from(&bad).expect_err("refused").to_string();
        assert!(err.contains(AUDIT_KEY_SETTING), "{err}");
        let derived = Source::from_pairs([(
            TOKEN_KEYS_SETTING,
            format!("k2:{},k1:{}", "22".repeat(32), "33".repeat(32)),
        )]);
        let k = key_from(&derived).expect("key").expect("derived");
        assert_ne!(k, [0x22; 32], "derived, not the token key itself");
        let none = Source::from_pairs(Vec::<(String, String)>::new());
        assert_eq!(key_from(&none).expect("ok"), None);
    }
}
