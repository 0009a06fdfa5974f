//! Encryption of tokens at rest (DESIGN §8). Tokens are sealed to a public
//! key, so a process that only seals (the gateway's OAuth callback) cannot
//! open what it sealed, nor any other installation's token: HPKE (RFC 9180)
//! in base mode, DHKEM(X25519, HKDF-SHA256), HKDF-SHA256 and
//! ChaCha20Poly1305. Stored with each ciphertext is the id of the key it
//! was sealed to; the sealed bytes are the encapsulated key (32 bytes) and
//! the AEAD ciphertext. The info string binds the suite's use to threadline
//! and the key id; the associated data binds a ciphertext to its row
//! (installation and purpose), so a ciphertext copied to another
//! installation does not open.
//!
//! * `THREADLINE_TOKEN_PUBLIC_KEYS` = `id:x25519pub:hex64[,…]` (X25519
//!   public keys): the gateway's, seals only ([`TokenSealer`]); the first
//!   seals. The tag keeps a symmetric key (`id:hex64`, which opens what it
//!   seals) from being taken for a public one.
//! * `THREADLINE_TOKEN_KEYS` = `id:x25519:hex64[,…]` (X25519 private keys)
//!   where tokens are used ([`TokenKeys`]): every key listed opens, the
//!   first seals (a refreshed token). Entries of the older form `id:hex64`
//!   are symmetric XChaCha20-Poly1305 keys: they still open (and, listed
//!   first, seal) the tokens sealed before public-key sealing, until
//!   `threadline keys rotate` moved them to an X25519 key.
//!
//! Dead letters are sealed and opened by the same services, so they keep a
//! symmetric key ([`SymmetricKeys`], `THREADLINE_DEAD_LETTER_KEYS`).

use std::fmt;

use chacha20poly1305::aead::{Aead as _, AeadCore, KeyInit, OsRng, Payload};
use chacha20poly1305::{Key, XChaCha20Poly1305, XNonce};
use hpke::{Deserializable as _, Kem as _, OpModeR, OpModeS, Serializable as _};
use secrecy::{ExposeSecret, SecretString};

use threadline_runtime::settings::{ConfigError, Source};

type Kem = hpke::kem::X25519HkdfSha256;
type Kdf = hpke::kdf::HkdfSha256;
type Suite = hpke::aead::ChaCha20Poly1305;

const NONCE_LEN: usize = 24;
/// The length of an X25519 encapsulated key (and of a public key).
const ENC_LEN: usize = 32;
/// Where tokens are opened: X25519 private keys (and legacy symmetric keys).
pub const TOKEN_KEYS_SETTING: &str = "THREADLINE_TOKEN_KEYS";
/// Where tokens are only sealed (the gateway): X25519 public keys.
pub const TOKEN_PUBLIC_KEYS_SETTING: &str = "THREADLINE_TOKEN_PUBLIC_KEYS";
/// The marker of a private-key entry: `id:x25519:hex64`.
const X25519_TAG: &str = "x25519";
/// The marker of a public-key entry: `id:x25519pub:hex64`.
const X25519_PUB_TAG: &str = "x25519pub";

/// A key's fingerprint for logs: the first 8 hex digits of the SHA-256 of
/// the X25519 public key, equal for the two halves of a pair and telling
/// nothing of the private one.
fn fingerprint(pk: &<Kem as hpke::Kem>::PublicKey) -> String {
    use sha2::Digest as _;
    hex::encode(&sha2::Sha256::digest(pk.to_bytes())[..4])
}

#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("no key with id {0:?} is configured to open it")]
    UnknownKey(String),
    #[error("ciphertext does not decrypt (wrong key, wrong row, or tampered)")]
    Decrypt,
    #[error("encryption failed")]
    Encrypt,
}

/// A token sealed for storage: the key id and the sealed bytes
/// (`enc || ciphertext` for X25519, `nonce || ciphertext` for a symmetric
/// key).
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

/// Whatever seals a token for storage: the gateway's public keys, or the
/// keys of a service that also opens.
pub trait Seal {
    fn seal(&self, plaintext: &[u8], aad: &[u8]) -> Result<Sealed, SecretError>;
    /// The id of the key new tokens are sealed to.
    fn active_key_id(&self) -> &str;
}

fn invalid_in(setting: &str, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: setting.into(),
        message: message.into(),
    }
}

/// The entries of a key list, trimmed, with their position for errors.
fn entries(raw: &str) -> impl Iterator<Item = (usize, &str)> {
    raw.split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .enumerate()
        .map(|(n, e)| (n + 1, e))
}

fn check_id(id: &str, n: usize, setting: &str) -> Result<(), ConfigError> {
    if id.is_empty()
        || id.len() > 32
        || !id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(invalid_in(
            setting,
            format!("entry {n}: key id must be 1-32 characters of [A-Za-z0-9_-]"),
        ));
    }
    Ok(())
}

fn key_bytes(hex_key: &str, n: usize, id: &str, setting: &str) -> Result<[u8; 32], ConfigError> {
    hex::decode(hex_key)
        .ok()
        .and_then(|b| <[u8; 32]>::try_from(b).ok())
        .ok_or_else(|| {
            invalid_in(
                setting,
                format!("entry {n} ({id}): key must be 64 hex digits (32 bytes)"),
            )
        })
}

fn info(key_id: &str) -> Vec<u8> {
    format!("threadline/token/hpke/v1/{key_id}").into_bytes()
}

fn hpke_seal(
    key_id: &str,
    pk: &<Kem as hpke::Kem>::PublicKey,
    plaintext: &[u8],
    aad: &[u8],
) -> Result<Sealed, SecretError> {
    let (enc, ct) = hpke::single_shot_seal::<Suite, Kdf, Kem>(
        &OpModeS::Base,
        pk,
        &info(key_id),
        plaintext,
        aad,
    )
    .map_err(|_| SecretError::Encrypt)?;
    let mut bytes = Vec::with_capacity(ENC_LEN + ct.len());
    bytes.extend_from_slice(&enc.to_bytes());
    bytes.extend_from_slice(&ct);
    Ok(Sealed {
        key_id: key_id.to_owned(),
        bytes,
    })
}

fn hpke_open(
    key_id: &str,
    sk: &<Kem as hpke::Kem>::PrivateKey,
    sealed: &[u8],
    aad: &[u8],
) -> Result<Vec<u8>, SecretError> {
    if sealed.len() < ENC_LEN {
        return Err(SecretError::Decrypt);
    }
    let (enc, ct) = sealed.split_at(ENC_LEN);
    let enc = <Kem as hpke::Kem>::EncappedKey::from_bytes(enc).map_err(|_| SecretError::Decrypt)?;
    hpke::single_shot_open::<Suite, Kdf, Kem>(&OpModeR::Base, sk, &enc, &info(key_id), ct, aad)
        .map_err(|_| SecretError::Decrypt)
}

/// X25519 public keys: seal only (`THREADLINE_TOKEN_PUBLIC_KEYS`). Holds
/// nothing that opens a token.
pub struct TokenSealer {
    keys: Vec<(String, <Kem as hpke::Kem>::PublicKey)>,
}

impl fmt::Debug for TokenSealer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ids: Vec<&str> = self.keys.iter().map(|k| k.0.as_str()).collect();
        write!(f, "TokenSealer {{ key_ids: {ids:?} }}")
    }
}

impl TokenSealer {
    /// `id:x25519pub:hex64[,…]`, X25519 public keys in hex, as
    /// `THREADLINE_TOKEN_PUBLIC_KEYS` holds them (read by the gateway and
    /// `threadline install add`, which alone seal without opening). An
    /// untagged `id:hex64` is refused: that is how a symmetric key looks.
    pub fn parse(raw: &str) -> Result<Self, ConfigError> {
        let setting = TOKEN_PUBLIC_KEYS_SETTING;
        let mut keys: Vec<(String, _)> = Vec::new();
        for (n, entry) in entries(raw) {
            let (id, rest) = entry
                .split_once(':')
                .ok_or_else(|| invalid_in(setting, format!("entry {n} is not id:x25519pub:hex")))?;
            check_id(id, n, setting)?;
            let hex_key = match rest.split_once(':') {
                Some((X25519_PUB_TAG, hex_key)) => hex_key,
                Some((X25519_TAG, _)) => {
                    return Err(invalid_in(
                        setting,
                        format!(
                            "entry {n} ({id}) is a private key: list the public keys \
                             (`threadline keys public`)"
                        ),
                    ));
                }
                Some(_) => {
                    return Err(invalid_in(
                        setting,
                        format!("entry {n} ({id}): expected id:x25519pub:hex64"),
                    ));
                }
                None => {
                    return Err(invalid_in(
                        setting,
                        format!(
                            "entry {n} ({id}) has no x25519pub tag: an untagged id:hex64 is a \
                             symmetric key, which opens what it seals; list the public keys \
                             (`threadline keys public`: id:x25519pub:hex64)"
                        ),
                    ));
                }
            };
            let bytes = key_bytes(hex_key, n, id, setting)?;
            let pk = <Kem as hpke::Kem>::PublicKey::from_bytes(&bytes)
                .map_err(|_| invalid_in(setting, format!("entry {n} ({id}): not a public key")))?;
            if keys.iter().any(|k| k.0 == id) {
                return Err(invalid_in(
                    setting,
                    format!("key id {id:?} is listed twice"),
                ));
            }
            keys.push((id.to_owned(), pk));
        }
        if keys.is_empty() {
            return Err(invalid_in(setting, "no keys listed"));
        }
        Ok(Self { keys })
    }

    /// The keys for a start-up log line: `id=fingerprint`, the first (the
    /// one that seals) first. No key material.
    pub fn fingerprints(&self) -> String {
        self.keys
            .iter()
            .map(|(id, pk)| format!("{id}={}", fingerprint(pk)))
            .collect::<Vec<_>>()
            .join(",")
    }
}

impl Seal for TokenSealer {
    fn seal(&self, plaintext: &[u8], aad: &[u8]) -> Result<Sealed, SecretError> {
        let (id, pk) = &self.keys[0];
        hpke_seal(id, pk, plaintext, aad)
    }

    fn active_key_id(&self) -> &str {
        &self.keys[0].0
    }
}

enum TokenKey {
    X25519 {
        sk: <Kem as hpke::Kem>::PrivateKey,
        pk: <Kem as hpke::Kem>::PublicKey,
    },
    /// A key of the symmetric sealing tokens had before (`id:hex64`).
    Legacy(XChaCha20Poly1305),
}

/// The keys that open tokens (`THREADLINE_TOKEN_KEYS`): every one listed
/// opens, the first seals.
pub struct TokenKeys {
    keys: Vec<(String, TokenKey)>,
}

impl fmt::Debug for TokenKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ids: Vec<&str> = self.keys.iter().map(|k| k.0.as_str()).collect();
        write!(f, "TokenKeys {{ key_ids: {ids:?} }}")
    }
}

impl TokenKeys {
    /// `THREADLINE_TOKEN_KEYS`, required.
    pub fn from_source(src: &Source) -> Result<Self, ConfigError> {
        let raw = src.required(TOKEN_KEYS_SETTING)?;
        Self::parse(&SecretString::from(raw.to_owned()))
    }

    /// `id:x25519:hex64` (a private key) or `id:hex64` (a legacy symmetric
    /// key) entries, comma-separated.
    pub fn parse(raw: &SecretString) -> Result<Self, ConfigError> {
        let setting = TOKEN_KEYS_SETTING;
        let mut keys: Vec<(String, TokenKey)> = Vec::new();
        for (n, entry) in entries(raw.expose_secret()) {
            let (id, rest) = entry
                .split_once(':')
                .ok_or_else(|| invalid_in(setting, format!("entry {n} is not id:x25519:hex")))?;
            check_id(id, n, setting)?;
            let key = match rest.split_once(':') {
                Some((X25519_TAG, hex_key)) => {
                    let bytes = key_bytes(hex_key, n, id, setting)?;
                    let sk = <Kem as hpke::Kem>::PrivateKey::from_bytes(&bytes).map_err(|_| {
                        invalid_in(setting, format!("entry {n} ({id}): not an X25519 key"))
                    })?;
                    let pk = Kem::sk_to_pk(&sk);
                    TokenKey::X25519 { sk, pk }
                }
                Some((X25519_PUB_TAG, _)) => {
                    return Err(invalid_in(
                        setting,
                        format!(
                            "entry {n} ({id}) is a public key: this setting holds the private \
                             keys (id:x25519:hex64) that open tokens"
                        ),
                    ));
                }
                Some(_) => {
                    return Err(invalid_in(
                        setting,
                        format!("entry {n} ({id}): expected id:x25519:hex64 or id:hex64"),
                    ));
                }
                None => TokenKey::Legacy(XChaCha20Poly1305::new(Key::from_slice(&key_bytes(
                    rest, n, id, setting,
                )?))),
            };
            if keys.iter().any(|k| k.0 == id) {
                return Err(invalid_in(
                    setting,
                    format!("key id {id:?} is listed twice"),
                ));
            }
            keys.push((id.to_owned(), key));
        }
        if keys.is_empty() {
            return Err(invalid_in(setting, "no keys listed"));
        }
        Ok(Self { keys })
    }

    /// A fresh X25519 private key in the `id:x25519:hex64` form, for
    /// `threadline keys generate`.
    pub fn generate_entry(id: &str) -> String {
        let (sk, _) = Kem::gen_keypair();
        format!("{id}:{X25519_TAG}:{}", hex::encode(sk.to_bytes()))
    }

    /// The public halves of the X25519 keys, in order, in the
    /// `THREADLINE_TOKEN_PUBLIC_KEYS` form (`threadline keys public`).
    pub fn public_entries(&self) -> String {
        self.keys
            .iter()
            .filter_map(|(id, k)| match k {
                TokenKey::X25519 { pk, .. } => Some(format!(
                    "{id}:{X25519_PUB_TAG}:{}",
                    hex::encode(pk.to_bytes())
                )),
                TokenKey::Legacy(_) => None,
            })
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The keys for a start-up log line: `id=fingerprint` of each X25519
    /// key's public half (as the gateway logs its public keys, so that a
    /// mismatched pair shows), `id=symmetric` for a key of before; the
    /// first (the one that seals) first. No key material.
    pub fn fingerprints(&self) -> String {
        self.keys
            .iter()
            .map(|(id, k)| match k {
                TokenKey::X25519 { pk, .. } => format!("{id}={}", fingerprint(pk)),
                TokenKey::Legacy(_) => format!("{id}=symmetric"),
            })
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Whether the first key (the one that seals) is an X25519 key.
    pub fn seals_to_public_key(&self) -> bool {
        matches!(self.keys[0].1, TokenKey::X25519 { .. })
    }

    pub fn open(&self, sealed: &Sealed, aad: &[u8]) -> Result<SecretString, SecretError> {
        let (_, key) = self
            .keys
            .iter()
            .find(|k| k.0 == sealed.key_id)
            .ok_or_else(|| SecretError::UnknownKey(sealed.key_id.clone()))?;
        let bytes = match key {
            TokenKey::X25519 { sk, .. } => hpke_open(&sealed.key_id, sk, &sealed.bytes, aad)?,
            TokenKey::Legacy(cipher) => symmetric_open(cipher, &sealed.bytes, aad)?,
        };
        String::from_utf8(bytes)
            .map(SecretString::from)
            .map_err(|_| SecretError::Decrypt)
    }
}

impl Seal for TokenKeys {
    fn seal(&self, plaintext: &[u8], aad: &[u8]) -> Result<Sealed, SecretError> {
        let (id, key) = &self.keys[0];
        match key {
            TokenKey::X25519 { pk, .. } => hpke_seal(id, pk, plaintext, aad),
            TokenKey::Legacy(cipher) => symmetric_seal(id, cipher, plaintext, aad),
        }
    }

    fn active_key_id(&self) -> &str {
        &self.keys[0].0
    }
}

fn symmetric_seal(
    id: &str,
    cipher: &XChaCha20Poly1305,
    plaintext: &[u8],
    aad: &[u8],
) -> Result<Sealed, SecretError> {
    let nonce = XChaCha20Poly1305::generate_nonce(&mut OsRng);
    let ct = cipher
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
        key_id: id.to_owned(),
        bytes,
    })
}

fn symmetric_open(
    cipher: &XChaCha20Poly1305,
    sealed: &[u8],
    aad: &[u8],
) -> Result<Vec<u8>, SecretError> {
    if sealed.len() < NONCE_LEN {
        return Err(SecretError::Decrypt);
    }
    let (nonce, ct) = sealed.split_at(NONCE_LEN);
    cipher
        .decrypt(XNonce::from_slice(nonce), Payload { msg: ct, aad })
        .map_err(|_| SecretError::Decrypt)
}

/// Symmetric keys (XChaCha20-Poly1305), `id:hex64[,…]`, the first seals:
/// dead letters (`THREADLINE_DEAD_LETTER_KEYS`), sealed and opened by the
/// same services.
pub struct SymmetricKeys {
    keys: Vec<(String, XChaCha20Poly1305)>,
}

impl fmt::Debug for SymmetricKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ids: Vec<&str> = self.keys.iter().map(|k| k.0.as_str()).collect();
        write!(f, "SymmetricKeys {{ key_ids: {ids:?} }}")
    }
}

impl SymmetricKeys {
    /// Keys in the `id:hex64[,…]` form under `setting` (errors name it).
    pub fn parse_setting(raw: &SecretString, setting: &str) -> Result<Self, ConfigError> {
        let mut keys: Vec<(String, XChaCha20Poly1305)> = Vec::new();
        for (n, entry) in entries(raw.expose_secret()) {
            let (id, hex_key) = entry
                .split_once(':')
                .ok_or_else(|| invalid_in(setting, format!("entry {n} is not id:hex")))?;
            check_id(id, n, setting)?;
            let bytes = key_bytes(hex_key, n, id, setting)?;
            if keys.iter().any(|k| k.0 == id) {
                return Err(invalid_in(
                    setting,
                    format!("key id {id:?} is listed twice"),
                ));
            }
            keys.push((
                id.to_owned(),
                XChaCha20Poly1305::new(Key::from_slice(&bytes)),
            ));
        }
        if keys.is_empty() {
            return Err(invalid_in(setting, "no keys listed"));
        }
        Ok(Self { keys })
    }

    /// A fresh random key in the `id:hex64` form.
    pub fn generate_entry(id: &str) -> String {
        let key = XChaCha20Poly1305::generate_key(&mut OsRng);
        format!("{id}:{}", hex::encode(key))
    }

    pub fn active_key_id(&self) -> &str {
        &self.keys[0].0
    }

    pub fn seal(&self, plaintext: &[u8], aad: &[u8]) -> Result<Sealed, SecretError> {
        let (id, cipher) = &self.keys[0];
        symmetric_seal(id, cipher, plaintext, aad)
    }

    /// Opens a sealed binary payload (a dead letter's message).
    pub fn open_bytes(&self, sealed: &Sealed, aad: &[u8]) -> Result<Vec<u8>, SecretError> {
        let (_, cipher) = self
            .keys
            .iter()
            .find(|k| k.0 == sealed.key_id)
            .ok_or_else(|| SecretError::UnknownKey(sealed.key_id.clone()))?;
        symmetric_open(cipher, &sealed.bytes, aad)
    }
}

/// The associated data for a token column of an installation.
pub fn token_aad(installation_id: &uuid::Uuid, purpose: &str) -> Vec<u8> {
    format!("threadline/token/v1/{installation_id}/{purpose}").into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(spec: &str) -> TokenKeys {
        TokenKeys::parse(&SecretString::from(spec.to_owned())).expect("valid keys")
    }

    fn sealer(of: &TokenKeys) -> TokenSealer {
        TokenSealer::parse(&of.public_entries()).expect("public keys")
    }

    #[test]
    fn public_keys_seal_what_only_the_private_keys_open() {
        let k1 = keys(&TokenKeys::generate_entry("k1"));
        let public = sealer(&k1);
        let id = uuid::Uuid::new_v4();
        let aad = token_aad(&id, "bot");
        let sealed = public.seal(b"xoxb-1-2-3", &aad).expect("seal");
        assert_eq!(sealed.key_id, "k1");
        assert_eq!(sealed.bytes.len(), ENC_LEN + "xoxb-1-2-3".len() + 16);
        assert!(
            !sealed.bytes.windows(4).any(|w| w == b"xoxb"),
            "plaintext leaked"
        );
        assert_eq!(
            k1.open(&sealed, &aad).expect("opens").expose_secret(),
            "xoxb-1-2-3"
        );
        // Another private key under the same id does not open it.
        let impostor = keys(&TokenKeys::generate_entry("k1"));
        assert!(matches!(
            impostor.open(&sealed, &aad),
            Err(SecretError::Decrypt)
        ));
        // Two seals of one token differ (a fresh encapsulation each time).
        assert_ne!(public.seal(b"xoxb-1-2-3", &aad).expect("seal"), sealed);
        assert_eq!(
            format!("{public:?}"),
            "TokenSealer { key_ids: [\"k1\"] }",
            "no key material in Debug"
        );
    }

    #[test]
    fn rotation_of_both_halves_and_legacy_keys() {
        let legacy = SymmetricKeys::generate_entry("old");
        let k1 = TokenKeys::generate_entry("k1");
        let k2 = TokenKeys::generate_entry("k2");
        let id = uuid::Uuid::new_v4();
        let aad = token_aad(&id, "refresh");
        // Before: tokens sealed with the symmetric key.
        let before = keys(&legacy);
        assert!(!before.seals_to_public_key());
        assert_eq!(before.public_entries(), "");
        let old = before.seal(b"xoxe-1", &aad).expect("seal");
        // A private key first: it seals; the legacy key still opens.
        let both = keys(&format!("{k1},{legacy}"));
        assert!(both.seals_to_public_key());
        assert_eq!(
            both.open(&old, &aad).expect("legacy").expose_secret(),
            "xoxe-1"
        );
        let new = both.seal(b"xoxe-2", &aad).expect("seal");
        assert_eq!(new.key_id, "k1");
        // The next key pair: the public half first at the gateway, the
        // private half first where tokens are opened; k1 still opens.
        let rotated = keys(&format!("{k2},{k1}"));
        assert!(rotated.public_entries().starts_with("k2:x25519pub:"));
        assert_eq!(
            rotated.open(&new, &aad).expect("k1").expose_secret(),
            "xoxe-2"
        );
        let sealed_k2 = sealer(&rotated).seal(b"xoxe-3", &aad).expect("seal");
        assert_eq!(sealed_k2.key_id, "k2");
        assert!(matches!(
            keys(&k1).open(&sealed_k2, &aad),
            Err(SecretError::UnknownKey(_))
        ));
    }

    #[test]
    fn ciphertext_is_bound_to_its_row_and_tamper_evident() {
        let c = keys(&TokenKeys::generate_entry("k"));
        let a = uuid::Uuid::new_v4();
        let sealed = sealer(&c)
            .seal(b"xoxb-secret", &token_aad(&a, "bot"))
            .expect("seal");
        assert!(matches!(
            c.open(&sealed, &token_aad(&uuid::Uuid::new_v4(), "bot")),
            Err(SecretError::Decrypt)
        ));
        assert!(matches!(
            c.open(&sealed, &token_aad(&a, "refresh")),
            Err(SecretError::Decrypt)
        ));
        for at in [0, sealed.bytes.len() - 1] {
            let mut bad = sealed.clone();
            bad.bytes[at] ^= 1;
            assert!(matches!(
                c.open(&bad, &token_aad(&a, "bot")),
                Err(SecretError::Decrypt)
            ));
        }
        let short = Sealed {
            key_id: "k".into(),
            bytes: vec![1; 8],
        };
        assert!(matches!(
            c.open(&short, &token_aad(&a, "bot")),
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
            "k:x25519:abcd",
            &format!("k:rsa:{}", "1".repeat(64)),
            &format!("a b:{}", "0".repeat(64)),
            &format!("k:{0},k:x25519:{0}", "1".repeat(64)),
            &format!("k:x25519pub:{}", "1".repeat(64)),
        ] {
            let err = TokenKeys::parse(&SecretString::from(spec.to_owned()))
                .expect_err(spec)
                .to_string();
            assert!(err.contains(TOKEN_KEYS_SETTING), "{err}");
            assert!(!err.contains("abcd") && !err.contains("1111"), "{err}");
        }
        let private = TokenKeys::generate_entry("k");
        for spec in ["", "k:zz", private.as_str()] {
            let err = TokenSealer::parse(spec).expect_err(spec).to_string();
            assert!(err.contains(TOKEN_PUBLIC_KEYS_SETTING), "{err}");
            assert!(!err.contains(&private[10..]), "{err}");
        }
        let c = keys(&TokenKeys::generate_entry("visible"));
        assert_eq!(format!("{c:?}"), "TokenKeys { key_ids: [\"visible\"] }");
    }

    /// A public key used to look exactly like a symmetric key
    /// (`id:hex64`), so a symmetric key pasted into the gateway's public
    /// keys was taken. Public keys carry their own tag; an untagged entry is
    /// refused there, and a public key is refused among the private ones.
    #[test]
    fn public_keys_are_tagged_and_a_symmetric_key_is_not_one() {
        let symmetric = SymmetricKeys::generate_entry("k1");
        let err = TokenSealer::parse(&symmetric)
            .expect_err("a symmetric key")
            .to_string();
        assert!(
            err.contains("no x25519pub tag") && err.contains("symmetric"),
            "{err}"
        );
        assert!(!err.contains(&symmetric[3..]), "{err}");
        let private = keys(&TokenKeys::generate_entry("k1"));
        let public = private.public_entries();
        assert!(public.starts_with("k1:x25519pub:"), "{public}");
        TokenSealer::parse(&public).expect("its own public keys");
        // The untagged form of that same public key is refused too.
        let untagged = public.replace(":x25519pub:", ":");
        assert!(TokenSealer::parse(&untagged).is_err());
        let err = TokenKeys::parse(&SecretString::from(public.clone()))
            .expect_err("a public key among the private ones")
            .to_string();
        assert!(err.contains("is a public key"), "{err}");
    }

    #[test]
    fn fingerprints_match_across_the_halves_and_show_no_key() {
        let entry = TokenKeys::generate_entry("k2");
        let legacy = SymmetricKeys::generate_entry("k1");
        let private = keys(&format!("{entry},{legacy}"));
        let public = sealer(&private);
        let fp = public.fingerprints();
        assert!(fp.starts_with("k2=") && fp.len() == "k2=".len() + 8, "{fp}");
        assert_eq!(private.fingerprints(), format!("{fp},k1=symmetric"));
        let pk_hex = private
            .public_entries()
            .rsplit(':')
            .next()
            .unwrap()
            .to_owned();
        for material in [&entry[10..], &legacy[3..], &pk_hex] {
            assert!(!private.fingerprints().contains(&material[..8]));
        }
    }
}
