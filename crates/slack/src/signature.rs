use std::fmt;

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

type HmacSha256 = Hmac<Sha256>;

/// Largest clock difference Slack's SDKs accept, in either direction.
pub const DEFAULT_TOLERANCE_SECS: i64 = 300;

/// A signing secret. Its `Debug` never prints the value.
#[derive(Clone)]
pub struct SigningSecret(Vec<u8>);

impl SigningSecret {
    /// Rejects an empty or blank secret, which would make every signature
    /// trivially forgeable by anyone who guesses the configuration mistake.
    pub fn new(secret: impl AsRef<[u8]>) -> Result<Self, SignatureError> {
        let bytes = secret.as_ref();
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Err(SignatureError::EmptySecret);
        }
        Ok(Self(bytes.to_vec()))
    }
}

impl fmt::Debug for SigningSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SigningSecret([redacted])")
    }
}

/// Why a request was not accepted as Slack's. Deliberately coarse: the HTTP
/// answer is a bare 401 whatever the variant; the variant only feeds metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("signing secret is empty")]
    EmptySecret,
    #[error("X-Slack-Request-Timestamp is missing")]
    MissingTimestamp,
    #[error("X-Slack-Request-Timestamp is not an integer")]
    BadTimestamp,
    #[error("request timestamp is more than the allowed skew away from now")]
    Stale,
    #[error("X-Slack-Signature is missing")]
    MissingSignature,
    #[error("X-Slack-Signature is not of the form v0=<64 hex digits>")]
    BadSignatureFormat,
    #[error("signature mismatch")]
    Mismatch,
}

impl SignatureError {
    pub fn reason_code(self) -> &'static str {
        match self {
            Self::EmptySecret => "empty_secret",
            Self::MissingTimestamp => "missing_timestamp",
            Self::BadTimestamp => "bad_timestamp",
            Self::Stale => "stale_timestamp",
            Self::MissingSignature => "missing_signature",
            Self::BadSignatureFormat => "bad_signature_format",
            Self::Mismatch => "signature_mismatch",
        }
    }
}

fn mac(secret: &[u8], timestamp: &[u8], body: &[u8]) -> HmacSha256 {
    // HMAC accepts keys of any length; this cannot fail.
    let mut mac = <HmacSha256 as KeyInit>::new_from_slice(secret)
        .unwrap_or_else(|_| unreachable!("HMAC takes any key length"));
    mac.update(b"v0:");
    mac.update(timestamp);
    mac.update(b":");
    mac.update(body);
    mac
}

/// Signs a body the way Slack does; used by the emulator and tests.
pub fn sign(secret: &SigningSecret, timestamp: &str, body: &[u8]) -> String {
    let tag = mac(&secret.0, timestamp.as_bytes(), body)
        .finalize()
        .into_bytes();
    format!("v0={}", hex::encode(tag))
}

/// Verifies requests against one or more secrets (two while a secret is
/// being rotated).
#[derive(Debug, Clone)]
pub struct Verifier {
    secrets: Vec<SigningSecret>,
    tolerance_secs: i64,
}

impl Verifier {
    pub fn new(secrets: Vec<SigningSecret>) -> Result<Self, SignatureError> {
        if secrets.is_empty() {
            return Err(SignatureError::EmptySecret);
        }
        Ok(Self {
            secrets,
            tolerance_secs: DEFAULT_TOLERANCE_SECS,
        })
    }

    /// Checks the headers against the raw body as received, with `now` in
    /// seconds since the epoch. The comparison is constant-time.
    pub fn verify(
        &self,
        timestamp: Option<&[u8]>,
        signature: Option<&[u8]>,
        body: &[u8],
        now: i64,
    ) -> Result<(), SignatureError> {
        let timestamp = timestamp.ok_or(SignatureError::MissingTimestamp)?;
        let ts: i64 = std::str::from_utf8(timestamp)
            .ok()
            .filter(|s| !s.is_empty() && s.len() <= 12 && s.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|s| s.parse().ok())
            .ok_or(SignatureError::BadTimestamp)?;
        if (now - ts).abs() > self.tolerance_secs {
            return Err(SignatureError::Stale);
        }
        let signature = signature.ok_or(SignatureError::MissingSignature)?;
        let received = signature
            .strip_prefix(b"v0=")
            .filter(|h| h.len() == 64)
            .and_then(|h| hex::decode(h).ok())
            .ok_or(SignatureError::BadSignatureFormat)?;
        let mut matched = subtle::Choice::from(0);
        for secret in &self.secrets {
            let expected = mac(&secret.0, timestamp, body).finalize().into_bytes();
            matched |= expected.as_slice().ct_eq(&received);
        }
        if bool::from(matched) {
            Ok(())
        } else {
            Err(SignatureError::Mismatch)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn signing_fixture(name: &str) -> Vec<u8> {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/slack/signing")
            .join(name);
        std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    const DOCS_SECRET: &str = "8f742231b10e8888abcd99yyyzzz85a5";
    const DOCS_TS: &str = "1531420618";
    const DOCS_SIG: &str = "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503";

    fn docs_verifier() -> Verifier {
        Verifier::new(vec![SigningSecret::new(DOCS_SECRET).expect("secret")]).expect("verifier")
    }

    #[test]
    fn slacks_documented_example_verifies_at_its_own_time() {
        let body = signing_fixture("body.txt");
        assert_eq!(body.len(), 362);
        let vector: serde_json::Value =
            serde_json::from_slice(&signing_fixture("vector.json")).expect("vector.json");
        assert_eq!(vector["signature"], DOCS_SIG);
        assert_eq!(
            sign(
                &SigningSecret::new(DOCS_SECRET).expect("secret"),
                DOCS_TS,
                &body
            ),
            DOCS_SIG
        );
        docs_verifier()
            .verify(
                Some(DOCS_TS.as_bytes()),
                Some(DOCS_SIG.as_bytes()),
                &body,
                1_531_420_618,
            )
            .expect("documented example verifies");
    }

    #[test]
    fn other_known_answer_vectors_verify() {
        let vectors: Vec<serde_json::Value> =
            serde_json::from_slice(&signing_fixture("other_vectors.json")).expect("json");
        assert_eq!(vectors.len(), 3);
        for v in vectors {
            let secret = SigningSecret::new(v["secret"].as_str().expect("secret")).expect("secret");
            let ts = v["timestamp"].as_str().expect("ts");
            let now = v["verified_at_unix_time"]
                .as_i64()
                .unwrap_or_else(|| ts.parse().expect("ts"));
            let body = v["body"].as_str().expect("body").as_bytes();
            let sig = v["signature"].as_str().expect("sig");
            Verifier::new(vec![secret])
                .expect("verifier")
                .verify(Some(ts.as_bytes()), Some(sig.as_bytes()), body, now)
                .unwrap_or_else(|e| panic!("{}: {e}", v["id"]));
        }
    }

    #[test]
    fn tampering_and_bad_headers_fail() {
        let body = signing_fixture("body.txt");
        let ts = Some(DOCS_TS.as_bytes());
        let sig = Some(DOCS_SIG.as_bytes());
        let now = 1_531_420_618;
        let v = docs_verifier();
        let mut tampered = body.clone();
        tampered.extend_from_slice(b"------");
        assert_eq!(
            v.verify(ts, sig, &tampered, now),
            Err(SignatureError::Mismatch)
        );
        let wrong =
            Verifier::new(vec![SigningSecret::new("another-secret").expect("s")]).expect("v");
        assert_eq!(
            wrong.verify(ts, sig, &body, now),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            v.verify(None, sig, &body, now),
            Err(SignatureError::MissingTimestamp)
        );
        assert_eq!(
            v.verify(ts, None, &body, now),
            Err(SignatureError::MissingSignature)
        );
        assert_eq!(
            v.verify(Some(b"15314x0618"), sig, &body, now),
            Err(SignatureError::BadTimestamp)
        );
        assert_eq!(
            v.verify(Some(b""), sig, &body, now),
            Err(SignatureError::BadTimestamp)
        );
        assert_eq!(
            v.verify(Some(b"-5"), sig, &body, now),
            Err(SignatureError::BadTimestamp)
        );
        for garbled in [
            &b"a2114d57b4"[..],
            b"v1=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503",
            b"v0=zz",
            b"v0=",
        ] {
            assert_eq!(
                v.verify(ts, Some(garbled), &body, now),
                Err(SignatureError::BadSignatureFormat)
            );
        }
    }

    #[test]
    fn timestamps_beyond_five_minutes_either_way_are_stale() {
        let body = signing_fixture("body.txt");
        let (ts, sig) = (Some(DOCS_TS.as_bytes()), Some(DOCS_SIG.as_bytes()));
        let v = docs_verifier();
        let t = 1_531_420_618;
        assert!(v.verify(ts, sig, &body, t + 300).is_ok());
        assert!(v.verify(ts, sig, &body, t - 300).is_ok());
        assert_eq!(
            v.verify(ts, sig, &body, t + 301),
            Err(SignatureError::Stale)
        );
        assert_eq!(
            v.verify(ts, sig, &body, t - 301),
            Err(SignatureError::Stale)
        );
    }

    #[test]
    fn either_secret_verifies_during_rotation() {
        let body = signing_fixture("body.txt");
        let v = Verifier::new(vec![
            SigningSecret::new("new-secret").expect("s"),
            SigningSecret::new(DOCS_SECRET).expect("s"),
        ])
        .expect("v");
        assert!(
            v.verify(
                Some(DOCS_TS.as_bytes()),
                Some(DOCS_SIG.as_bytes()),
                &body,
                1_531_420_618
            )
            .is_ok()
        );
    }

    #[test]
    fn blank_secrets_and_empty_sets_are_configuration_errors() {
        assert_eq!(
            SigningSecret::new("").err(),
            Some(SignatureError::EmptySecret)
        );
        assert_eq!(
            SigningSecret::new("  ").err(),
            Some(SignatureError::EmptySecret)
        );
        assert_eq!(
            Verifier::new(vec![]).err(),
            Some(SignatureError::EmptySecret)
        );
        assert_eq!(
            format!("{:?}", SigningSecret::new("hunter2").expect("s")),
            "SigningSecret([redacted])"
        );
    }
}
