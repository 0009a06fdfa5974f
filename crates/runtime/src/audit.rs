//! The audit log (DESIGN invariant 9): one append-only record per decision
//! point, holding identifiers, hashes, decisions and timings, never message
//! text, names, tokens or headers.
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
use sqlx::PgConnection;
use uuid::Uuid;

use crate::config::{ConfigError, Source};

type HmacSha256 = Hmac<Sha256>;

pub const AUDIT_KEY_SETTING: &str = "THREADLINE_AUDIT_KEY";

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
        .get(crate::secrets::TOKEN_KEYS_SETTING)
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
        .map_err(|_| invalid(crate::secrets::TOKEN_KEYS_SETTING, "unusable key"))?;
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

/// Keeps an error or reason code to a short token of `[a-z0-9_.:-]`, so no
/// free text (which could quote a message) reaches the log.
pub fn sanitise_code(code: &str) -> String {
    let cleaned: String = code
        .chars()
        .map(|c| c.to_ascii_lowercase())
        .map(|c| {
            if c.is_ascii_alphanumeric() || "_.:-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect();
    if cleaned.is_empty() {
        "unknown".into()
    } else {
        cleaned
    }
}

/// One decision point. `channel` is the raw id: only its pseudonym is written.
#[derive(Debug, Default, Clone)]
pub struct Record<'a> {
    pub stage: &'static str,
    pub outcome: &'a str,
    pub reason: Option<&'a str>,
    pub installation_id: Option<Uuid>,
    pub event_id: Option<&'a str>,
    pub receipt_id: Option<Uuid>,
    pub decision_id: Option<Uuid>,
    pub intent_id: Option<Uuid>,
    pub channel: Option<&'a str>,
    pub event_type: Option<&'a str>,
    pub thread_version: Option<i64>,
    pub model_config_id: Option<&'a str>,
    pub prompt_tokens: Option<i32>,
    pub completion_tokens: Option<i32>,
    pub output_hash: Option<&'a str>,
    pub delivery_status: Option<&'a str>,
    pub error_code: Option<&'a str>,
    pub retry_count: Option<i32>,
    pub reviewer: Option<&'a str>,
}

/// Appends `r` on `conn` (inside the caller's transaction when it has one,
/// so the record commits with the change it describes).
pub async fn append(conn: &mut PgConnection, r: &Record<'_>) -> sqlx::Result<()> {
    let channel_ref = match (r.installation_id, r.channel) {
        (Some(i), Some(c)) => channel_ref(i, c),
        _ => None,
    };
    sqlx::query(
        "INSERT INTO audit_log (stage, outcome, reason, installation_id, event_id, receipt_id, decision_id,
                                intent_id, channel_ref, event_type, thread_version, model_config_id,
                                prompt_tokens, completion_tokens, output_hash, delivery_status, error_code,
                                retry_count, reviewer)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19)",
    )
    .bind(r.stage)
    .bind(sanitise_code(r.outcome))
    .bind(r.reason.map(sanitise_code))
    .bind(r.installation_id)
    .bind(r.event_id)
    .bind(r.receipt_id)
    .bind(r.decision_id)
    .bind(r.intent_id)
    .bind(channel_ref)
    .bind(r.event_type.map(sanitise_code))
    .bind(r.thread_version)
    .bind(r.model_config_id)
    .bind(r.prompt_tokens)
    .bind(r.completion_tokens)
    .bind(r.output_hash)
    .bind(r.delivery_status.map(sanitise_code))
    .bind(r.error_code.map(sanitise_code))
    .bind(r.retry_count)
    .bind(r.reviewer.map(sanitise_code))
    .execute(conn)
    .await?;
    Ok(())
}

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
            crate::secrets::TOKEN_KEYS_SETTING,
            format!("k2:{},k1:{}", "22".repeat(32), "33".repeat(32)),
        )]);
        let k = key_from(&derived).expect("key").expect("derived");
        assert_ne!(k, [0x22; 32], "derived, not the token key itself");
        let none = Source::from_pairs(Vec::<(String, String)>::new());
        assert_eq!(key_from(&none).expect("ok"), None);
    }

    #[test]
    fn codes_are_short_tokens() {
        assert_eq!(sanitise_code("channel_not_found"), "channel_not_found");
        assert_eq!(
            sanitise_code("Bad thing: <@U1> said \"hi\""),
            "bad_thing:___u1__said__hi_"
        );
        assert_eq!(sanitise_code(&"x".repeat(100)).len(), 64);
        assert_eq!(sanitise_code(""), "unknown");
    }
}
