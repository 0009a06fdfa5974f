//! Dead letters that hold no message text. A dead letter is an envelope —
//! the original subject, the reason, the message id and the identities the
//! message names (installation, receipt, event, decision) as headers — and
//! the message itself only in a form that cannot be read on the stream:
//!
//! * `sealed`: with `THREADLINE_DEAD_LETTER_KEYS` set, the whole message
//!   sealed (XChaCha20-Poly1305, bound to its subject and message id), which
//!   `threadline dlq replay` opens and puts back;
//! * `whole`: without keys, a message that carries no text (`Reconsider`);
//! * `redacted`: without keys, a message with its text fields emptied. A
//!   proposal stays replayable (the publisher posts what the decision row
//!   holds); events, contexts and spooled deliveries do not (their text is
//!   their input);
//! * `dropped`: without keys, a message threadline cannot decode (so cannot
//!   tell what it holds): only the envelope is kept.
//!
//! Letters from before this format have no `Threadline-Payload` header and
//! are treated as `whole`.

use std::sync::Arc;

use async_nats::HeaderMap;
use bytes::Bytes;
use prost::Message as _;
use threadline_proto::v1::{
    ContextReady, EventAccepted, ProposalReady, Reconsider, SpooledDelivery,
};
use threadline_runtime::bus::Topic;
use threadline_runtime::config::{CommonConfig, ConfigError};
use threadline_runtime::worker::Contracts;

use crate::secrets::{Sealed, SymmetricKeys};

pub use threadline_runtime::config::DEAD_LETTER_KEYS_SETTING as KEYS_SETTING;

pub const REASON: &str = "Threadline-Dead-Letter-Reason";
pub const ORIGINAL: &str = "Threadline-Original-Subject";
/// How the message is kept: `sealed`, `whole`, `redacted` or `dropped`.
pub const PAYLOAD: &str = "Threadline-Payload";
/// The id of the key a `sealed` payload was sealed with.
pub const KEY_ID: &str = "Threadline-Payload-Key";
pub const INSTALLATION: &str = "Threadline-Installation";
pub const RECEIPT: &str = "Threadline-Receipt";
pub const EVENT: &str = "Threadline-Event";
pub const DECISION: &str = "Threadline-Decision";

/// The headers a dead letter adds; a replay removes them.
pub const HEADERS: [&str; 8] = [
    REASON,
    ORIGINAL,
    PAYLOAD,
    KEY_ID,
    INSTALLATION,
    RECEIPT,
    EVENT,
    DECISION,
];

/// How a dead letter keeps its message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kept {
    Sealed,
    Whole,
    Redacted,
    Dropped,
}

impl Kept {
    pub fn as_str(self) -> &'static str {
        match self {
            Kept::Sealed => "sealed",
            Kept::Whole => "whole",
            Kept::Redacted => "redacted",
            Kept::Dropped => "dropped",
        }
    }

    fn parse(s: Option<&str>) -> Option<Kept> {
        match s {
            None | Some("whole") => Some(Kept::Whole),
            Some("sealed") => Some(Kept::Sealed),
            Some("redacted") => Some(Kept::Redacted),
            Some("dropped") => Some(Kept::Dropped),
            Some(_) => None,
        }
    }
}

/// The identities a message names, as (header, value).
fn identities(topic: Topic, payload: &[u8]) -> Option<Vec<(&'static str, String)>> {
    let ids = match topic {
        Topic::Events => {
            let m = EventAccepted::decode(payload).ok()?;
            vec![
                (INSTALLATION, m.installation_id),
                (RECEIPT, m.receipt_id),
                (EVENT, m.event_id),
            ]
        }
        Topic::Contexts => {
            let m = ContextReady::decode(payload).ok()?;
            vec![
                (INSTALLATION, m.installation_id),
                (RECEIPT, m.receipt_id),
                (EVENT, m.event_id),
            ]
        }
        Topic::Proposals => {
            let m = ProposalReady::decode(payload).ok()?;
            vec![
                (INSTALLATION, m.installation_id),
                (RECEIPT, m.receipt_id),
                (EVENT, m.event_id),
                (DECISION, m.decision_id),
            ]
        }
        Topic::Reconsider => {
            let m = Reconsider::decode(payload).ok()?;
            vec![(INSTALLATION, m.installation_id), (RECEIPT, m.receipt_id)]
        }
        Topic::Spool => {
            let m = SpooledDelivery::decode(payload).ok()?;
            vec![(EVENT, m.event_id)]
        }
    };
    // Identities are ids; anything else is not copied into a header.
    Some(
        ids.into_iter()
            .filter(|(_, v)| {
                !v.is_empty()
                    && v.len() <= 128
                    && v.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b))
            })
            .collect(),
    )
}

/// The installation a message is for, when it decodes and names one.
pub fn installation_of(topic: Topic, payload: &[u8]) -> Option<String> {
    identities(topic, payload)?
        .into_iter()
        .find(|(h, _)| *h == INSTALLATION)
        .map(|(_, v)| v)
}

/// The message with its text fields emptied, or `None` when it does not
/// decode. `Whole` when it carries no text at all.
fn redacted(topic: Topic, payload: &[u8]) -> Option<(Kept, Bytes)> {
    let out = match topic {
        Topic::Events => {
            let mut m = EventAccepted::decode(payload).ok()?;
            m.event_json.clear();
            m.encode_to_vec()
        }
        Topic::Contexts => {
            let mut m = ContextReady::decode(payload).ok()?;
            // (the thread, and the channel the person looks at in the pane)
            for c in m.messages.iter_mut().chain(m.channel_context.iter_mut()) {
                c.text.clear();
            }
            m.encode_to_vec()
        }
        Topic::Proposals => {
            let mut m = ProposalReady::decode(payload).ok()?;
            m.text.clear();
            m.blocks_json.clear();
            // (the pane's title: the first line of a person's question)
            m.assistant_title.clear();
            m.encode_to_vec()
        }
        Topic::Reconsider => {
            Reconsider::decode(payload).ok()?;
            return Some((Kept::Whole, Bytes::copy_from_slice(payload)));
        }
        Topic::Spool => {
            // (the body is the delivery: without it nothing is left to
            // record, as for an event)
            let mut m = SpooledDelivery::decode(payload).ok()?;
            m.body.clear();
            m.encode_to_vec()
        }
    };
    Some((Kept::Redacted, out.into()))
}

/// `headers` without the named ones, nor NATS's own (`Nats-…`).
pub fn without(headers: Option<&HeaderMap>, names: &[&str]) -> HeaderMap {
    let mut out = HeaderMap::new();
    for (name, values) in headers.into_iter().flat_map(HeaderMap::iter) {
        let n: &str = name.as_ref();
        if names.contains(&n) || n.starts_with("Nats-") || n == "Threadline-Message-Id" {
            continue;
        }
        for v in values {
            out.append(n, v.as_str());
        }
    }
    out
}

fn aad(subject: &str, message_id: Option<&str>) -> Vec<u8> {
    format!(
        "threadline/dead-letter/v1/{subject}/{}",
        message_id.unwrap_or("")
    )
    .into_bytes()
}

/// The dead letter of a message that arrived on `subject` (of `topic`) with
/// `headers`: the headers to publish and the payload to keep.
pub fn letter(
    topic: Topic,
    subject: &str,
    headers: Option<&HeaderMap>,
    payload: &[u8],
    reason: &str,
    keys: Option<&SymmetricKeys>,
) -> (HeaderMap, Bytes) {
    let message_id = headers
        .and_then(|h| h.get("Nats-Msg-Id"))
        .map(|v| v.as_str().to_owned());
    // The original headers (trace context) without our marks and without
    // the message id: a second letter of the same message (replayed, failed
    // again) must not be dropped as a duplicate.
    let mut h = without(headers, &HEADERS);
    h.insert(REASON, reason);
    h.insert(ORIGINAL, subject);
    for (name, value) in identities(topic, payload).unwrap_or_default() {
        h.insert(name, value.as_str());
    }
    let sealed = keys.and_then(|k| k.seal(payload, &aad(subject, message_id.as_deref())).ok());
    let (kept, body) = match sealed {
        Some(s) => {
            h.insert(KEY_ID, s.key_id.as_str());
            (Kept::Sealed, Bytes::from(s.bytes))
        }
        None => redacted(topic, payload).unwrap_or((Kept::Dropped, Bytes::new())),
    };
    h.insert(PAYLOAD, kept.as_str());
    if let Some(id) = &message_id {
        h.insert("Threadline-Message-Id", id.as_str());
    }
    (h, body)
}

/// What a worker (and `threadline dlq`) knows of the messages on the bus:
/// whose each one is and what its dead letter keeps, sealed with the
/// dead-letter keys when there are some.
pub struct Letters {
    keys: Option<SymmetricKeys>,
}

impl Letters {
    /// The keys of `THREADLINE_DEAD_LETTER_KEYS`, if set (a malformed list
    /// is refused, naming the setting).
    pub fn from_config(common: &CommonConfig) -> Result<Self, ConfigError> {
        let keys = common
            .dead_letter_keys
            .as_ref()
            .map(|raw| SymmetricKeys::parse_setting(raw, KEYS_SETTING))
            .transpose()?;
        Ok(Self { keys })
    }

    /// Letters sealed with `keys`, or kept without text when `None`.
    pub fn new(keys: Option<SymmetricKeys>) -> Self {
        Self { keys }
    }

    /// The keys letters are sealed and opened with, if configured.
    pub fn keys(&self) -> Option<&SymmetricKeys> {
        self.keys.as_ref()
    }

    /// [`Letters::from_config`], shared by a worker's tasks.
    pub fn shared(common: &CommonConfig) -> Result<Arc<dyn Contracts>, ConfigError> {
        Ok(Arc::new(Self::from_config(common)?))
    }
}

impl Contracts for Letters {
    fn installation_of(&self, topic: Topic, payload: &[u8]) -> Option<String> {
        installation_of(topic, payload)
    }

    fn letter(
        &self,
        topic: Topic,
        subject: &str,
        headers: Option<&HeaderMap>,
        payload: &[u8],
        reason: &str,
    ) -> (HeaderMap, Bytes) {
        letter(topic, subject, headers, payload, reason, self.keys.as_ref())
    }

    fn letters_keep_messages(&self) -> bool {
        self.keys.is_some()
    }
}

/// Why a dead letter cannot be put back.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error(
        "its message was sealed with key {0:?} and {KEYS_SETTING} does not list it (set the keys the workers had)"
    )]
    NoKey(String),
    #[error("its sealed message does not open (wrong keys, or the letter was altered)")]
    Tampered,
    #[error(
        "its message was kept without its text ({0}: the worker had no {KEYS_SETTING}); nothing can restore it — drop it, and redo the work from its receipt"
    )]
    NotKept(&'static str),
    #[error("it names no known original subject")]
    NoSubject,
    #[error("its payload mark {0:?} is not one threadline writes")]
    Unknown(String),
    #[error(
        "it is stored under {letter} but names {original}: only the work subject of its own dead-letter subject is replayed"
    )]
    Misplaced { letter: String, original: String },
    #[error(
        "it has no payload mark (written before dead letters were sealed, or not by threadline): check it, then replay with --legacy"
    )]
    Legacy,
}

/// The original subject and message of a dead letter, ready to publish,
/// with the headers a replay keeps (trace context, the original message id
/// as `Threadline-Message-Id`).
///
/// `letter_subject` is the subject the letter itself was stored under: a
/// letter may only name the work subject of its own dead-letter subject
/// (`<prefix>.dlq.<topic>` → `<prefix>.<topic>`), so a process allowed to
/// dead-letter one topic cannot have an operator's replay put a message on
/// another. Letters without a payload mark (written before it existed) are
/// put back only when `legacy` allows it.
pub fn open(
    letter_subject: &str,
    headers: &HeaderMap,
    payload: &[u8],
    keys: Option<&SymmetricKeys>,
    legacy: bool,
) -> Result<(String, Bytes), ReplayError> {
    let subject = headers
        .get(ORIGINAL)
        .map(|v| v.as_str().to_owned())
        .ok_or(ReplayError::NoSubject)?;
    let (prefix, topic) = subject
        .rsplit_once('.')
        .and_then(|(p, t)| Some((p, Topic::parse(t)?)))
        .ok_or(ReplayError::NoSubject)?;
    if letter_subject != format!("{prefix}.dlq.{}", topic.as_str()) {
        return Err(ReplayError::Misplaced {
            letter: letter_subject.to_owned(),
            original: subject.clone(),
        });
    }
    let mark = headers.get(PAYLOAD).map(|v| v.as_str().to_owned());
    let kept = Kept::parse(mark.as_deref())
        .ok_or_else(|| ReplayError::Unknown(mark.clone().unwrap_or_default()))?;
    match kept {
        Kept::Whole if mark.is_none() && !legacy => Err(ReplayError::Legacy),
        // Workers keep only a Reconsider whole; any other "whole" letter
        // was not written by a worker.
        Kept::Whole if mark.is_some() && topic != Topic::Reconsider => {
            Err(ReplayError::Unknown("whole".into()))
        }
        Kept::Whole => Ok((subject, Bytes::copy_from_slice(payload))),
        // The publisher posts what the decision row holds: a proposal
        // without its text is still the whole instruction.
        Kept::Redacted if topic == Topic::Proposals => {
            Ok((subject, Bytes::copy_from_slice(payload)))
        }
        Kept::Redacted => Err(ReplayError::NotKept("redacted")),
        Kept::Dropped => Err(ReplayError::NotKept("dropped")),
        Kept::Sealed => {
            let key_id = headers
                .get(KEY_ID)
                .map(|v| v.as_str().to_owned())
                .unwrap_or_default();
            let keys = keys.ok_or_else(|| ReplayError::NoKey(key_id.clone()))?;
            let message_id = headers
                .get("Threadline-Message-Id")
                .map(|v| v.as_str().to_owned());
            let sealed = Sealed {
                key_id: key_id.clone(),
                bytes: payload.to_vec(),
            };
            keys.open_bytes(&sealed, &aad(&subject, message_id.as_deref()))
                .map(|b| (subject, Bytes::from(b)))
                .map_err(|e| match e {
                    crate::secrets::SecretError::UnknownKey(k) => ReplayError::NoKey(k),
                    _ => ReplayError::Tampered,
                })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use threadline_proto::v1::ContextMessage;

    const SECRET: &str = "the deploy password is hunter2";

    fn keys(spec: &str) -> SymmetricKeys {
        SymmetricKeys::parse_setting(&spec.to_owned().into(), KEYS_SETTING).expect("keys")
    }

    fn context() -> Vec<u8> {
        ContextReady {
            schema_version: 1,
            receipt_id: "0190c2f4-0000-7000-8000-000000000001".into(),
            installation_id: "0190c2f4-0000-7000-8000-000000000002".into(),
            event_id: "Ev0123ABC".into(),
            messages: vec![ContextMessage {
                ts: "1.000001".into(),
                text: SECRET.into(),
                ..Default::default()
            }],
            channel_context: vec![ContextMessage {
                ts: "2.000001".into(),
                text: format!("viewed: {SECRET}"),
                ..Default::default()
            }],
            ..Default::default()
        }
        .encode_to_vec()
    }

    fn headers() -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("Nats-Msg-Id", "ctx:r:1");
        h.insert(
            "traceparent",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        );
        h
    }

    fn contains(hay: &[u8], needle: &str) -> bool {
        hay.windows(needle.len()).any(|w| w == needle.as_bytes())
    }

    #[test]
    fn a_sealed_letter_shows_identities_not_text_and_opens_to_the_original() {
        let k = keys(&SymmetricKeys::generate_entry("d1"));
        let payload = context();
        let (h, body) = letter(
            Topic::Contexts,
            "tl.contexts",
            Some(&headers()),
            &payload,
            "poison",
            Some(&k),
        );
        assert!(!contains(&body, "hunter2"), "no text on the stream");
        assert_eq!(h.get(PAYLOAD).map(|v| v.as_str()), Some("sealed"));
        assert_eq!(h.get(KEY_ID).map(|v| v.as_str()), Some("d1"));
        assert_eq!(h.get(EVENT).map(|v| v.as_str()), Some("Ev0123ABC"));
        assert!(h.get("Nats-Msg-Id").is_none());
        for (name, values) in h.iter() {
            for v in values {
                assert!(!v.as_str().contains("hunter2"), "{name:?}");
            }
        }
        let (subject, restored) =
            open("tl.dlq.contexts", &h, &body, Some(&k), false).expect("opens");
        assert_eq!(
            (subject.as_str(), &restored[..]),
            ("tl.contexts", &payload[..])
        );
        // Moved to another subject, or altered, it does not open.
        let mut moved = h.clone();
        moved.insert(ORIGINAL, "tl.proposals");
        assert!(matches!(
            open("tl.dlq.contexts", &moved, &body, Some(&k), false),
            Err(ReplayError::Misplaced { .. })
        ));
        // Moved with its dead-letter subject, the seal still refuses it.
        assert!(matches!(
            open("tl.dlq.proposals", &moved, &body, Some(&k), false),
            Err(ReplayError::Tampered)
        ));
        let mut bent = body.to_vec();
        *bent.last_mut().expect("bytes") ^= 1;
        assert!(matches!(
            open("tl.dlq.contexts", &h, &bent, Some(&k), false),
            Err(ReplayError::Tampered)
        ));
        // Without the key it says which key it needs.
        assert!(
            matches!(open("tl.dlq.contexts", &h, &body, None, false), Err(ReplayError::NoKey(id)) if id == "d1")
        );
        let other = keys(&SymmetricKeys::generate_entry("d2"));
        assert!(
            matches!(open("tl.dlq.contexts", &h, &body, Some(&other), false), Err(ReplayError::NoKey(id)) if id == "d1")
        );
    }

    #[test]
    fn without_keys_text_is_removed_and_only_what_needs_no_text_is_replayable() {
        let (h, body) = letter(
            Topic::Contexts,
            "tl.contexts",
            Some(&headers()),
            &context(),
            "poison",
            None,
        );
        assert_eq!(h.get(PAYLOAD).map(|v| v.as_str()), Some("redacted"));
        assert!(!contains(&body, "hunter2"));
        assert_eq!(
            ContextReady::decode(&body[..]).expect("decodes").messages[0].ts,
            "1.000001"
        );
        assert!(matches!(
            open("tl.dlq.contexts", &h, &body, None, false),
            Err(ReplayError::NotKept("redacted"))
        ));

        let proposal = ProposalReady {
            decision_id: "0190c2f4-0000-7000-8000-000000000003".into(),
            text: SECRET.into(),
            blocks_json: format!("[{{\"text\":\"{SECRET}\"}}]"),
            assistant_title: format!("title {SECRET}"),
            ..Default::default()
        }
        .encode_to_vec();
        let (h, body) = letter(
            Topic::Proposals,
            "tl.proposals",
            None,
            &proposal,
            "poison",
            None,
        );
        assert!(!contains(&body, "hunter2"));
        let (_, back) = open("tl.dlq.proposals", &h, &body, None, false)
            .expect("a proposal needs no text to be replayed");
        assert_eq!(
            ProposalReady::decode(&back[..])
                .expect("decodes")
                .decision_id,
            "0190c2f4-0000-7000-8000-000000000003"
        );

        let event = EventAccepted {
            event_json: format!("{{\"text\":\"{SECRET}\"}}").into_bytes(),
            ..Default::default()
        }
        .encode_to_vec();
        let (h, body) = letter(Topic::Events, "tl.events", None, &event, "poison", None);
        assert!(!contains(&body, "hunter2"));
        assert!(matches!(
            open("tl.dlq.events", &h, &body, None, false),
            Err(ReplayError::NotKept("redacted"))
        ));

        let recon = Reconsider {
            installation_id: "0190c2f4-0000-7000-8000-000000000002".into(),
            ..Default::default()
        }
        .encode_to_vec();
        let (h, body) = letter(
            Topic::Reconsider,
            "tl.reconsider",
            None,
            &recon,
            "poison",
            None,
        );
        assert_eq!(h.get(PAYLOAD).map(|v| v.as_str()), Some("whole"));
        assert_eq!(
            &open("tl.dlq.reconsider", &h, &body, None, false)
                .expect("whole")
                .1[..],
            &recon[..]
        );

        // Bytes that do not decode could hold anything: only the envelope.
        let junk = format!("\u{1}\u{2}{SECRET}").into_bytes();
        let (h, body) = letter(
            Topic::Contexts,
            "tl.contexts",
            None,
            &junk,
            "undecodable",
            None,
        );
        assert_eq!(h.get(PAYLOAD).map(|v| v.as_str()), Some("dropped"));
        assert!(body.is_empty());
        assert!(matches!(
            open("tl.dlq.contexts", &h, &body, None, false),
            Err(ReplayError::NotKept("dropped"))
        ));
    }

    #[test]
    fn identities_that_are_not_ids_are_not_copied() {
        let m = ContextReady {
            event_id: format!("Ev {SECRET}"),
            installation_id: "0190c2f4-0000-7000-8000-000000000002".into(),
            ..Default::default()
        }
        .encode_to_vec();
        let (h, _) = letter(Topic::Contexts, "tl.contexts", None, &m, "poison", None);
        assert!(h.get(EVENT).is_none());
        assert!(h.get(INSTALLATION).is_some());
    }

    #[test]
    fn letters_from_before_this_format_replay_whole_only_when_asked() {
        let mut h = HeaderMap::new();
        h.insert(ORIGINAL, "tl.events");
        h.insert(REASON, "poison");
        assert!(matches!(
            open("tl.dlq.events", &h, b"raw", None, false),
            Err(ReplayError::Legacy)
        ));
        let (subject, body) = open("tl.dlq.events", &h, b"raw", None, true).expect("legacy");
        assert_eq!((subject.as_str(), &body[..]), ("tl.events", &b"raw"[..]));
    }

    #[test]
    fn a_letter_names_only_the_work_subject_of_its_own_dead_letter_subject() {
        // A process allowed to dead-letter contexts writes a letter that
        // claims to come from the events subject.
        let k = keys(&SymmetricKeys::generate_entry("d1"));
        let (mut h, body) = letter(
            Topic::Contexts,
            "tl.contexts",
            None,
            &context(),
            "x",
            Some(&k),
        );
        h.insert(ORIGINAL, "tl.events");
        assert!(matches!(
            open("tl.dlq.contexts", &h, &body, Some(&k), true),
            Err(ReplayError::Misplaced { .. })
        ));
        // Another deployment's subject, or a letter stored elsewhere.
        let (h, body) = letter(
            Topic::Contexts,
            "tl.contexts",
            None,
            &context(),
            "x",
            Some(&k),
        );
        assert!(matches!(
            open("other.dlq.contexts", &h, &body, Some(&k), true),
            Err(ReplayError::Misplaced { .. })
        ));
        assert!(open("tl.dlq.contexts", &h, &body, Some(&k), false).is_ok());
        // An unsealed context marked whole is not what a worker writes.
        let (mut h, _) = letter(Topic::Contexts, "tl.contexts", None, &context(), "x", None);
        h.insert(PAYLOAD, "whole");
        assert!(matches!(
            open("tl.dlq.contexts", &h, &context(), None, false),
            Err(ReplayError::Unknown(_))
        ));
    }
}
