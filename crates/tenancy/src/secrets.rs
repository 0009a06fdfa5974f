//! Encryption of tokens at rest (DESIGN §8): XChaCha20-Poly1305 with a key
//! from the environment. Each ciphertext is stored with the id of the key
//! that sealed it, so keys rotate: new tokens use the first key, old ones
//! stay readable while their key is still listed.
//!
//! `THREADLINE_TOKEN_KEYS` = `id:hex64[,id:hex64…]` (32-byte keys, hex). The
//! associated data binds a ciphertext to its row (installation and purpose),
//! so a ciphertext copied to another installation does not decrypt.

use std::fmt;

use chacha20poly1305::aead::{Aead, AeadCore, KeyInit, OsRng, Payload};
use chacha20poly1305::{Key, XChaCha20Poly1305, XNonce};
use secrecy::{ExposeSecret, SecretString};

use threadline_runtime::settings::{ConfigError, Source};

const NONCE_LEN: usize = 24;
pub const TOKEN_KEYS_SETTING: &str = "THREADLINE_TOKEN_KEYS";

#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("no key with id {0:?} is configured in THREADLINE_TOKEN_KEYS")]
    UnknownKey(String),
    #[error("ciphertext does not decrypt (wrong key, wrong row, or tampered)")]
    Decrypt,
    #[error("encryption failed")]
    Encrypt,
}

/// A token sealed for storage: the key id and `nonce || ciphertext`.
#[derive(Clone, PartialEq, Eq)]
pub struct Sealed {
    pub key_id: String,
    pub bytes: Vec<u8>,
}

impl fmt::Debug for Sealed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Sealed {{ key_id: {:?}, len: {} }}",
            self.key_id,
            self.bytes.len()
        )
    }
}

struct NamedKey {
    id: String,
    cipher: XChaCha20Poly1305,
}

/// The configured keys; the first one seals.
pub struct TokenCipher {
    keys: Vec<NamedKey>,
}

impl fmt::Debug for TokenCipher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ids: Vec<&str> = self.keys.iter().map(|k| k.id.as_str()).collect();
        write!(f, "TokenCipher {{ key_ids: {ids:?} }}")
    }
}

fn invalid_in(setting: &str, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: setting.into(),
        message: message.into(),
    }
}

impl TokenCipher {
    pub fn from_source(src: &Source) -> Result<Self, ConfigError> {
        let raw = src.required(TOKEN_KEYS_SETTING)?;
        Self::parse(&SecretString::from(raw.to_owned()))
    }

    pub fn parse(raw: &SecretString) -> Result<Self, ConfigError> {
        Self::parse_setting(raw, TOKEN_KEYS_SETTING)
    }

    /// Keys in the same `id:hex64[,…]` form under another setting (errors
    /// name that setting).
    pub fn parse_setting(raw: &SecretString, setting: &str) -> Result<Self, ConfigError> {
        let invalid = |m: String| invalid_in(setting, m);
        let mut keys = Vec::new();
        for (n, entry) in raw
            .expose_secret()
            .split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .enumerate()
        {
            let (id, hex_key) = entry
                .split_once(':')
                .ok_or_else(|| invalid(format!("entry {} is not id:hex", n + 1)))?;
            if id.is_empty()
                || id.len() > 32
                || !id
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            {
                return Err(invalid(format!(
                    "entry {}: key id must be 1-32 characters of [A-Za-z0-9_-]",
                    n + 1
                )));
            }
            let bytes = hex::decode(hex_key)
                .ok()
                .filter(|b| b.len() == 32)
                .ok_or_else(|| {
                    invalid(format!(
                        "entry {} ({id}): key must be 64 hex digits (32 bytes)",
                        n + 1
                    ))
                })?;
            if keys.iter().any(|k: &NamedKey| k.id == id) {
                return Err(invalid(format!("key id {id:?} is listed twice")));
            }
            keys.push(NamedKey {
                id: id.to_owned(),
                cipher: XChaCha20Poly1305::new(Key::from_slice(&bytes)),
            });
        }
        if keys.is_empty() {
            return Err(invalid("no keys listed".into()));
        }
        Ok(Self { keys })
    }

    /// A fresh random key in the `id:hex` form, for `threadline keys generate`.
    pub fn generate_entry(id: &str) -> String {
        let key = XChaCha20Poly1305::generate_key(&mut OsRng);
        format!("{id}:{}", hex::encode(key))
    }

    pub fn active_key_id(&self) -> &str {
        &self.keys[0].id
    }

    pub fn seal(&self, plaintext: &[u8], aad: &[u8]) -> Result<Sealed, SecretError> {
        let key = &self.keys[0];
        let nonce = XChaCha20Poly1305::generate_nonce(&mut OsRng);
        let ct = key
            .cipher
            .encrypt(
                &nonce,
                Payload {
                    msg: plaintext,
                    aad,
                },
            )
            .map_err(|_| SecretError::Encrypt)?;
        let mut bytes = Vec::with_capacity(NONCE_LEN + ct.len());
        bytes.extend_from_slice(&nonce);
        bytes.extend_from_slice(&ct);
        Ok(Sealed {
            key_id: key.id.clone(),
            bytes,
        })
    }

    pub fn open(&self, sealed: &Sealed, aad: &[u8]) -> Result<SecretString, SecretError> {
        String::from_utf8(self.open_bytes(sealed, aad)?)
            .map(SecretString::from)
            .map_err(|_| SecretError::Decrypt)
    }

    /// Opens a sealed binary payload (a dead letter's message).
    pub fn open_bytes(&self, sealed: &Sealed, aad: &[u8]) -> Result<Vec<u8>, SecretError> {
        let key = self
            .keys
            .iter()
            .find(|k| k.id == sealed.key_id)
            .ok_or_else(|| SecretError::UnknownKey(sealed.key_id.clone()))?;
        if sealed.bytes.len() < NONCE_LEN {
            return Err(SecretError::Decrypt);
        }
        let (nonce, ct) = sealed.bytes.split_at(NONCE_LEN);
        key.cipher
            .decrypt(XNonce::from_slice(nonce), Payload { msg: ct, aad })
            .map_err(|_| SecretError::Decrypt)
    }
}

/// The associated data for a token column of an installation.
pub fn token_aad(installation_id: &uuid::Uuid, purpose: &str) -> Vec<u8> {
    format!("threadline/token/v1/{installation_id}/{purpose}").into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cipher(spec: &str) -> TokenCipher {
        TokenCipher::parse(&SecretString::from(spec.to_owned())).expect("valid keys")
    }

    #[test]
    fn seals_and_opens_with_rotation() {
        let k1 = TokenCipher::generate_entry("k1");
        let k2 = TokenCipher::generate_entry("k2");
        let old = cipher(&k1);
        let id = uuid::Uuid::new_v4();
        let aad = token_aad(&id, "bot");
        let sealed = old.seal(b"xoxb-1-2-3", &aad).expect("seal");
        assert_eq!(sealed.key_id, "k1");
        assert!(
            !sealed.bytes.windows(4).any(|w| w == b"xoxb"),
            "plaintext leaked"
        );
        let rotated = cipher(&format!("{k2},{k1}"));
        assert_eq!(
            rotated
                .open(&sealed, &aad)
                .expect("old key still opens")
                .expose_secret(),
            "xoxb-1-2-3"
        );
        assert_eq!(rotated.seal(b"t", &aad).expect("seal").key_id, "k2");
        assert!(matches!(
            cipher(&k2).open(&sealed, &aad),
            Err(SecretError::UnknownKey(_))
        ));
    }

    #[test]
    fn ciphertext_is_bound_to_its_row_and_tamper_evident() {
        let c = cipher(&TokenCipher::generate_entry("k"));
        let a = uuid::Uuid::new_v4();
        let sealed = c.seal(b"xoxb-secret", &token_aad(&a, "bot")).expect("seal");
        assert!(matches!(
            c.open(&sealed, &token_aad(&uuid::Uuid::new_v4(), "bot")),
            Err(SecretError::Decrypt)
        ));
        assert!(matches!(
            c.open(&sealed, &token_aad(&a, "refresh")),
            Err(SecretError::Decrypt)
        ));
        let mut bad = sealed.clone();
        let last = bad.bytes.len() - 1;
        bad.bytes[last] ^= 1;
        assert!(matches!(
            c.open(&bad, &token_aad(&a, "bot")),
            Err(SecretError::Decrypt)
        ));
    }

    #[test]
    fn bad_key_specs_name_the_setting_and_never_echo_keys() {
        for spec in [
            "",
            "nocolon",
            "k:abcd",
            "k:zz",
            &format!("a b:{}", "0".repeat(64)),
            &format!("k:{0},k:{0}", "1".repeat(64)),
        ] {
            let err = TokenCipher::parse(&SecretString::from(spec.to_owned()))
                .expect_err(spec)
                .to_string();
            assert!(err.contains(TOKEN_KEYS_SETTING), "{err}");
            assert!(!err.contains("abcd") && !err.contains("1111"), "{err}");
        }
        let c = cipher(&TokenCipher::generate_entry("visible"));
        assert_eq!(format!("{c:?}"), "TokenCipher { key_ids: [\"visible\"] }");
    }
}
