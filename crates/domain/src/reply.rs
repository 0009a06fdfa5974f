//! The rules of the one reply mechanism that every form of answer goes
//! through (a whole post, a stream): what a reply carries so that Slack can
//! tell whose it is, why a stream ends before the whole answer and what it
//! then says, and what counts as evidence of an intent's reply when its
//! outcome is unknown. Pure: the publisher reads Slack and writes the
//! store; the rules are here, once, for every form.
//!
//! Evidence is always specific to the intent (DESIGN invariants 5 and 12):
//! a message of our bot whose metadata names the intent; its recorded
//! stream's ts; a post without metadata whose body hash is one the intent
//! posted, inside its own attempts' window; a stream without metadata that
//! an unknown start of the intent may have made, inside that start's own
//! window, and that no other intent's unresolved start could have made too
//! (such a stream is ended unclaimed instead: it answers nobody).
//!
//! A stream of the intent that Slack ended itself at its lifetime
//! (`streaming_state: errored`, nothing written over it yet) is
//! [`Seen::Expired`]: it is finished by updating that same message with the
//! whole answer (its label and [`answer_metadata`]), or, when the answer
//! may not be shown any more (the thread moved on, a switch, a review),
//! with its closing line and [`ending_metadata`] — never by a second
//! message beside it. Once the update landed, the message names the intent
//! like any reply ([`Seen::Named`], or [`Seen::Ended`] for a closing line),
//! so an update whose outcome is unknown is reconciled like a post, and
//! tried again (it is idempotent) while Slack still shows it expired.

use serde_json::{Value, json};

/// The `event_type` of the metadata every reply of threadline carries.
pub const METADATA_EVENT_TYPE: &str = "threadline_reply";

/// The metadata of an intent's whole answer (a post, or a stream's stop).
pub fn answer_metadata(intent: &str, body_hash: &str, source_ts: &str) -> Value {
    json!({
        "event_type": METADATA_EVENT_TYPE,
        "event_payload": {"intent_id": intent, "body_hash": body_hash, "source_ts": source_ts}
    })
}

/// The metadata of a stream stopped before the whole answer: it names the
/// intent as interrupted (never as answered, so that no reconciliation
/// takes it for the intent's answer), or nobody when the stream could not
/// be told apart from another intent's.
pub fn ending_metadata(intent: Option<&str>, ending: Ending) -> Value {
    match intent {
        Some(id) => json!({
            "event_type": METADATA_EVENT_TYPE,
            "event_payload": {"interrupted_intent_id": id, "reason": ending.reason()}
        }),
        None => json!({
            "event_type": METADATA_EVENT_TYPE,
            "event_payload": {"unclaimed_stream": true, "reason": ending.reason()}
        }),
    }
}

/// What a reply of threadline shows in blocks. Every form of reply gets
/// its blocks from [`blocks`], the one place they are built, so that every
/// answer carries its feedback buttons by construction (DESIGN invariant
/// 12: one reply mechanism) and nothing that is no answer does.
#[derive(Debug, Clone, Copy)]
pub enum Shown<'a> {
    /// An answer posted whole (also an approved review answer, or the
    /// whole answer after an interrupted stream): the decision's blocks
    /// (its body and its AI label), then its feedback buttons.
    Posted {
        blocks: Option<&'a Value>,
        decision: &'a str,
    },
    /// An answer's stream stopped with the whole answer: the AI label
    /// below the streamed text, then its feedback buttons.
    Stopped { label: &'a str, decision: &'a str },
    /// A stream ended before the whole answer (its closing line): the AI
    /// label only; it answered nothing, so nothing to rate.
    Ended { label: &'a str },
    /// threadline's own note (the over-budget note): its blocks as stored;
    /// no answer, no buttons.
    Note { blocks: Option<&'a Value> },
}

/// The AI label as a `context` block (the test oracle looks for it).
pub fn label_block(label: &str) -> Value {
    json!({"type": "context", "elements": [{"type": "mrkdwn", "text": label}]})
}

/// The blocks a reply carries (a JSON array; empty when it has none).
pub fn blocks(shown: Shown<'_>) -> Value {
    let stored = |b: Option<&Value>| b.and_then(Value::as_array).cloned().unwrap_or_default();
    let all = match shown {
        Shown::Posted { blocks, decision } => {
            let mut all = stored(blocks);
            all.push(crate::feedback::block(decision));
            all
        }
        Shown::Stopped { label, decision } => {
            vec![label_block(label), crate::feedback::block(decision)]
        }
        Shown::Ended { label } => vec![label_block(label)],
        Shown::Note { blocks } => stored(blocks),
    };
    Value::Array(all)
}

/// [`blocks`] as a Web API call's `blocks` argument: empty when the reply
/// has none.
pub fn blocks_arg(shown: Shown<'_>) -> String {
    match blocks(shown) {
        Value::Array(a) if a.is_empty() => String::new(),
        b => b.to_string(),
    }
}

/// Why a stream ended before the whole answer, and what it then says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    ThreadChanged,
    SourceDeleted,
    SwitchedOff,
    NeedsReview,
    /// The model failed, the answer changed, an append failed, the
    /// stream's publisher died, or the stream could not be told apart.
    Interrupted,
}

impl Ending {
    pub const ALL: [Ending; 5] = [
        Self::ThreadChanged,
        Self::SourceDeleted,
        Self::SwitchedOff,
        Self::NeedsReview,
        Self::Interrupted,
    ];

    /// The reason as the store keeps it and metrics label it.
    pub fn reason(self) -> &'static str {
        match self {
            Self::ThreadChanged => "thread_changed",
            Self::SourceDeleted => "source_deleted",
            Self::SwitchedOff => "switched_off",
            Self::NeedsReview => "needs_review",
            Self::Interrupted => "interrupted",
        }
    }

    /// The ending a stored reason names (an unknown one is `Interrupted`).
    pub fn of_reason(reason: &str) -> Self {
        Self::ALL
            .into_iter()
            .find(|e| e.reason() == reason)
            .unwrap_or(Self::Interrupted)
    }

    /// The closing line, threadline's own words (no message content).
    pub fn line(self) -> &'static str {
        match self {
            Self::ThreadChanged => {
                "The thread changed while I was answering, so I stopped here. I'm reconsidering with the new messages."
            }
            Self::SourceDeleted => "The question was deleted, so I stopped here.",
            Self::SwitchedOff => "Answers were switched off here, so I stopped.",
            Self::NeedsReview => {
                "The rest of this answer needs a person's review before it is shown."
            }
            Self::Interrupted => "This answer was interrupted before it finished.",
        }
    }

    /// The text that closes the stream, after what it showed (`shown`).
    pub fn closing(self, shown: bool) -> String {
        format!("{}_{}_", if shown { "\n\n" } else { "" }, self.line())
    }
}

/// The stream side of an intent whose outcome is unknown.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum StreamSide<'a> {
    /// Its stream's ts is known: that message is the evidence, whatever
    /// attempt of the intent made it or took it over.
    Known(&'a str),
    /// Its start's outcome is unknown: a stream may have been made within
    /// this window (unix seconds) of the start's sending.
    Start { window: (f64, f64) },
}

/// An intent whose reply's outcome is unknown, as reconciliation sees it.
#[derive(Debug, Clone, Copy)]
pub struct Subject<'a> {
    pub intent: &'a str,
    /// Our bot's id (a message of another bot is never evidence).
    pub bot_id: &'a str,
    /// SHA-256 (hex) of the approved text of every decision an attempt of
    /// the intent posted.
    pub hashes: &'a [String],
    /// The window (unix seconds) a post of one of its attempts can have
    /// been made in; metadata needs no window.
    pub window: (f64, f64),
    /// `None` for a post.
    pub stream: Option<StreamSide<'a>>,
    /// Posts and streams recorded for the thread's other intents.
    pub others: &'a [String],
    /// The windows of other intents' stream starts whose outcome is not
    /// known yet (a stream inside one of them may be theirs).
    pub rivals: &'a [(f64, f64)],
}

/// What one message of the thread is to the subject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    Nothing,
    /// Its whole answer: our bot's message whose metadata names it.
    Named,
    /// A post of our bot without metadata, with a body hash the intent
    /// posted, inside its window, recorded for no other intent.
    ByBody,
    /// Its stream, still open: it must be ended.
    Open,
    /// Its stream, ended without the answer (our closing line, an unclaimed
    /// end, an expired stream another start may have made).
    Ended,
    /// Its stream, expired in Slack (its lifetime ran out before its stop)
    /// and not written over since: finished by updating it.
    Expired,
    /// Its stream, stopped by the person before the end (completed without
    /// our metadata): what it shows is the answer they wanted.
    StoppedByPerson,
    /// An open stream that its start or another intent's may have made: it
    /// is ended unclaimed (it answers nobody).
    Unclaimed,
    /// A stream stopped by the person that its start or another intent's
    /// may have made: whose answer it is cannot be told.
    Ambiguous,
}

/// The `streaming_state` of a stream Slack ended itself at its lifetime.
pub const EXPIRED: &str = "errored";

fn str_at<'v>(m: &'v Value, pointer: &str) -> Option<&'v str> {
    m.pointer(pointer).and_then(Value::as_str)
}

fn secs(ts: &str) -> f64 {
    ts.parse().unwrap_or(0.0)
}

fn within((from, to): (f64, f64), t: f64) -> bool {
    t >= from && t <= to
}

/// What `m`, one message of the thread as `conversations.replies` shows
/// it (with metadata), is to `s`.
pub fn see(m: &Value, s: &Subject<'_>) -> Seen {
    if str_at(m, "/bot_id") != Some(s.bot_id) {
        return Seen::Nothing;
    }
    let ts = str_at(m, "/ts").unwrap_or_default();
    let named = str_at(m, "/metadata/event_payload/intent_id");
    if named == Some(s.intent) {
        return Seen::Named;
    }
    let streaming = str_at(m, "/streaming_state");
    let no_metadata = m.get("metadata").is_none_or(Value::is_null);
    match (s.stream, streaming) {
        (Some(StreamSide::Known(known)), Some(state)) if known == ts => {
            return match state {
                "in_progress" => Seen::Open,
                "completed" if no_metadata => Seen::StoppedByPerson,
                EXPIRED if no_metadata => Seen::Expired,
                _ => Seen::Ended,
            };
        }
        (Some(StreamSide::Start { window }), Some(state))
            if no_metadata && within(window, secs(ts)) && !s.others.iter().any(|o| o == ts) =>
        {
            let rival = s.rivals.iter().any(|w| within(*w, secs(ts)));
            return match (state, rival) {
                ("in_progress", false) => Seen::Open,
                ("in_progress", true) => Seen::Unclaimed,
                ("completed", false) => Seen::StoppedByPerson,
                ("completed", true) => Seen::Ambiguous,
                (EXPIRED, false) => Seen::Expired,
                _ => Seen::Ended,
            };
        }
        _ => {}
    }
    // An ending that names the intent is its stream's end, evidence only
    // for a stream attempt: a post that follows an ended stream (the whole
    // answer) is not answered by that stream, and must find its own post.
    if s.stream.is_some()
        && str_at(m, "/metadata/event_payload/interrupted_intent_id") == Some(s.intent)
    {
        return Seen::Ended;
    }
    // (a stream is never a post's evidence by its body)
    if s.stream.is_none() && named.is_none() && streaming.is_none() {
        let text = str_at(m, "/text").unwrap_or_default();
        let hash = text_hash(text);
        if s.hashes.contains(&hash)
            && within(s.window, secs(ts))
            && !s.others.iter().any(|o| o == ts)
        {
            return Seen::ByBody;
        }
    }
    Seen::Nothing
}

/// SHA-256 (hex) of a reply's text, as a post's evidence names it.
pub fn text_hash(text: &str) -> String {
    use sha2::{Digest as _, Sha256};
    hex::encode(Sha256::digest(text.as_bytes()))
}

/// Everything one read of the thread found for the subject (the ts of
/// each message, by what it is).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Read {
    pub named: Vec<String>,
    pub by_body: Vec<String>,
    pub open: Vec<String>,
    pub ended: Vec<String>,
    pub expired: Vec<String>,
    pub stopped: Vec<String>,
    pub unclaimed: Vec<String>,
    pub ambiguous: Vec<String>,
    /// The subject's known stream was among the messages read.
    pub known_seen: bool,
}

impl Read {
    /// Files message `ts` as `seen` said.
    pub fn add(&mut self, ts: &str, seen: Seen) {
        let ts = ts.to_owned();
        match seen {
            Seen::Nothing => {}
            Seen::Named => self.named.push(ts),
            Seen::ByBody => self.by_body.push(ts),
            Seen::Open => self.open.push(ts),
            Seen::Ended => self.ended.push(ts),
            Seen::Expired => self.expired.push(ts),
            Seen::StoppedByPerson => self.stopped.push(ts),
            Seen::Unclaimed => self.unclaimed.push(ts),
            Seen::Ambiguous => self.ambiguous.push(ts),
        }
    }

    /// The single post of the intent, when the evidence names one.
    pub fn post(&self) -> Option<&str> {
        match (self.named.as_slice(), self.by_body.as_slice()) {
            ([one], _) => Some(one),
            ([], [one]) => Some(one),
            _ => None,
        }
    }
}

/// How much looking for nothing it takes to conclude there is nothing.
#[derive(Debug, Clone, Copy)]
pub struct Patience {
    /// Reads of the thread that found nothing…
    pub reads: i32,
    /// …over at least this many seconds since the outcome became unknown.
    pub window_secs: f64,
    /// After that, a post: `false` holds for an operator, `true` allows
    /// one re-post.
    pub allow_repost: bool,
}

/// What the evidence of one read comes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// The intent's answer is in Slack (its ts).
    Sent(String),
    /// Its stream is open (its ts): it must be ended.
    Open(String),
    /// Its stream expired in Slack (its ts): it is finished by updating
    /// that message (the whole answer, or its closing line), never by a
    /// second message.
    Expired(String),
    /// Its stream ended without the answer (its ts when known): the whole
    /// answer may follow.
    Ended(Option<String>),
    /// Streams nobody can be told the owner of: end them unclaimed, then
    /// read again.
    Unclaimed(Vec<String>),
    Held(&'static str),
    Repost,
    /// Not decided yet: read again after a pause.
    Again,
}

/// What `read` (the `reads`th read, `unknown_for` seconds after the outcome
/// became unknown) comes to for `subject`.
pub fn conclude(
    subject: &Subject<'_>,
    read: &Read,
    reads: i32,
    unknown_for: f64,
    patience: Patience,
) -> Found {
    if read.named.len() > 1 {
        return Found::Held("duplicate_posts_found");
    }
    if let [one] = read.named.as_slice() {
        return Found::Sent(one.clone());
    }
    if !read.ambiguous.is_empty() {
        return Found::Held("ambiguous_evidence");
    }
    if let [one] = read.stopped.as_slice()
        && read.open.is_empty()
    {
        return Found::Sent(one.clone());
    }
    if !read.unclaimed.is_empty() || read.open.len() > 1 || read.stopped.len() > 1 {
        // (more than one stream its start may have made: none is its own)
        let mut all = read.unclaimed.clone();
        all.extend(read.open.iter().cloned());
        return Found::Unclaimed(all);
    }
    if let [one] = read.open.as_slice() {
        return Found::Open(one.clone());
    }
    if let Some(expired) = read.expired.first() {
        return Found::Expired(expired.clone());
    }
    if let Some(ended) = read.ended.first() {
        return Found::Ended(Some(ended.clone()));
    }
    match read.by_body.as_slice() {
        [one] => return Found::Sent(one.clone()),
        [] => {}
        _ => return Found::Held("ambiguous_evidence"),
    }
    match subject.stream {
        // Its stream is gone from the thread (deleted): it shows nothing.
        Some(StreamSide::Known(_)) if !read.known_seen => Found::Ended(None),
        _ if reads < patience.reads || unknown_for < patience.window_secs => Found::Again,
        // No stream shows anything of its start: the whole answer follows.
        Some(_) => Found::Ended(None),
        None if patience.allow_repost => Found::Repost,
        None => Found::Held("no_evidence_of_post"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_answer_carries_feedback_buttons_and_nothing_else_does() {
        use crate::feedback::carries_buttons;
        let stored = json!([{"type": "section", "text": {"type": "mrkdwn", "text": "hi"}},
                            label_block("AI-generated")]);
        let posted = blocks(Shown::Posted {
            blocks: Some(&stored),
            decision: "d1",
        });
        assert_eq!(
            posted.as_array().unwrap()[..2],
            stored.as_array().unwrap()[..]
        );
        assert!(carries_buttons(&posted));
        assert_eq!(
            posted[2]["elements"][0]["positive_button"]["value"],
            "positive:d1"
        );
        let stopped = blocks(Shown::Stopped {
            label: "AI-generated",
            decision: "d2",
        });
        assert_eq!(stopped[0], label_block("AI-generated"));
        assert!(carries_buttons(&stopped));
        assert_eq!(
            blocks(Shown::Ended {
                label: "AI-generated"
            }),
            json!([label_block("AI-generated")])
        );
        assert_eq!(
            blocks(Shown::Note {
                blocks: Some(&stored)
            }),
            stored
        );
        assert_eq!(blocks(Shown::Note { blocks: None }), json!([]));
    }

    const PATIENCE: Patience = Patience {
        reads: 3,
        window_secs: 10.0,
        allow_repost: false,
    };

    fn post_subject<'a>(hashes: &'a [String], others: &'a [String]) -> Subject<'a> {
        Subject {
            intent: "I1",
            bot_id: "B1",
            hashes,
            window: (200.0, 300.0),
            stream: None,
            others,
            rivals: &[],
        }
    }

    #[test]
    fn a_post_is_found_by_its_metadata_else_by_its_own_body_in_its_window() {
        let text = "the fallback answer";
        let hashes = vec!["another decision's hash".into(), text_hash(text)];
        let none: Vec<String> = Vec::new();
        let s = post_subject(&hashes, &none);
        let meta = |id: &str| json!({"event_type": METADATA_EVENT_TYPE, "event_payload": {"intent_id": id}});
        let m = json!({"ts": "150.000001", "bot_id": "B1", "text": "x", "metadata": meta("I1")});
        assert_eq!(see(&m, &s), Seen::Named, "metadata needs no window");
        let m = json!({"ts": "250.000001", "bot_id": "B2", "text": text, "metadata": meta("I1")});
        assert_eq!(see(&m, &s), Seen::Nothing, "another bot's message");
        let m = json!({"ts": "250.000001", "bot_id": "B1", "text": text, "metadata": meta("I2")});
        assert_eq!(see(&m, &s), Seen::Nothing, "another intent's");
        let m = json!({"ts": "250.000001", "bot_id": "B1", "text": text});
        assert_eq!(see(&m, &s), Seen::ByBody);
        let early = json!({"ts": "150.000001", "bot_id": "B1", "text": text});
        assert_eq!(see(&early, &s), Seen::Nothing, "before its attempts");
        let others = vec!["250.000001".to_owned()];
        assert_eq!(
            see(&m, &post_subject(&hashes, &others)),
            Seen::Nothing,
            "recorded as another intent's post"
        );
        let stream = json!({"ts": "250.000002", "bot_id": "B1", "text": text, "streaming_state": "completed"});
        assert_eq!(
            see(&stream, &s),
            Seen::Nothing,
            "a stream is no post's body"
        );
    }

    #[test]
    fn a_known_stream_is_its_intents_whatever_attempt_made_it() {
        let none: Vec<String> = Vec::new();
        let s = Subject {
            stream: Some(StreamSide::Known("250.000001")),
            ..post_subject(&none, &none)
        };
        let at = |state: &str, metadata: Value| {
            let mut m =
                json!({"ts": "250.000001", "bot_id": "B1", "text": "x", "streaming_state": state});
            if !metadata.is_null() {
                m["metadata"] = metadata;
            }
            see(&m, &s)
        };
        assert_eq!(at("in_progress", Value::Null), Seen::Open);
        assert_eq!(at("completed", Value::Null), Seen::StoppedByPerson);
        assert_eq!(
            at(
                "completed",
                ending_metadata(Some("I1"), Ending::ThreadChanged)
            ),
            Seen::Ended
        );
        assert_eq!(
            at("completed", ending_metadata(None, Ending::Interrupted)),
            Seen::Ended,
            "ended unclaimed"
        );
        assert_eq!(
            at("completed", answer_metadata("I1", "h", "1.1")),
            Seen::Named
        );
        assert_eq!(
            at("errored", Value::Null),
            Seen::Expired,
            "expired in Slack"
        );
        assert_eq!(
            at("errored", answer_metadata("I1", "h", "1.1")),
            Seen::Named,
            "expired, then updated to the whole answer"
        );
        assert_eq!(
            at(
                "errored",
                ending_metadata(Some("I1"), Ending::ThreadChanged)
            ),
            Seen::Ended,
            "expired, then updated to its closing line"
        );
        // Gone from the thread: it shows nothing any more.
        let read = Read::default();
        assert_eq!(conclude(&s, &read, 1, 0.0, PATIENCE), Found::Ended(None));
    }

    #[test]
    fn an_expired_stream_is_finished_by_updating_it_never_beside_it() {
        let none: Vec<String> = Vec::new();
        let s = Subject {
            stream: Some(StreamSide::Known("250.000001")),
            ..post_subject(&none, &none)
        };
        let expired = json!({"ts": "250.000001", "bot_id": "B1", "text": "Answering 1.1. I re",
            "streaming_state": EXPIRED});
        let mut read = Read::default();
        read.add("250.000001", see(&expired, &s));
        assert_eq!(
            conclude(&s, &read, 1, 0.0, PATIENCE),
            Found::Expired("250.000001".into()),
            "at once: Slack confirmed the stream ended without the answer"
        );
        // The update landed: the message names the intent, and is its
        // answer (the stream's state stays as Slack left it).
        let mut updated = expired.clone();
        updated["metadata"] = answer_metadata("I1", "h", "1.1");
        let mut read = Read::default();
        read.add("250.000001", see(&updated, &s));
        assert_eq!(
            conclude(&s, &read, 1, 0.0, PATIENCE),
            Found::Sent("250.000001".into())
        );
        // An unknown start's expired stream, which no other start may have
        // made, is its own; one another start may have made is nobody's.
        let start = Subject {
            stream: Some(StreamSide::Start {
                window: (248.0, 260.0),
            }),
            ..post_subject(&none, &none)
        };
        assert_eq!(see(&expired, &start), Seen::Expired);
        let rivals = [(249.0, 262.0)];
        let rivalled = Subject {
            rivals: &rivals,
            ..start
        };
        assert_eq!(see(&expired, &rivalled), Seen::Ended);
        // A post's attempt never takes an expired stream for its own.
        assert_eq!(see(&expired, &post_subject(&none, &none)), Seen::Nothing);
    }

    #[test]
    fn an_unknown_start_takes_only_a_stream_no_other_start_may_have_made() {
        let none: Vec<String> = Vec::new();
        let mut s = Subject {
            stream: Some(StreamSide::Start {
                window: (248.0, 260.0),
            }),
            ..post_subject(&none, &none)
        };
        let open = json!({"ts": "250.000001", "bot_id": "B1", "text": "", "streaming_state": "in_progress"});
        assert_eq!(see(&open, &s), Seen::Open);
        let late = json!({"ts": "270.000001", "bot_id": "B1", "text": "", "streaming_state": "in_progress"});
        assert_eq!(see(&late, &s), Seen::Nothing, "outside its start's window");
        let rivals = [(249.0, 262.0)];
        s.rivals = &rivals;
        assert_eq!(
            see(&open, &s),
            Seen::Unclaimed,
            "another start may have made it"
        );
        let mut read = Read::default();
        read.add("250.000001", see(&open, &s));
        assert_eq!(
            conclude(&s, &read, 1, 0.0, PATIENCE),
            Found::Unclaimed(vec!["250.000001".into()])
        );
        let others = vec!["250.000001".to_owned()];
        s.others = &others;
        assert_eq!(see(&open, &s), Seen::Nothing, "recorded as another's");
        // Nothing found over the whole window: no stream shows anything of
        // it, and the whole answer follows.
        assert_eq!(
            conclude(&s, &Read::default(), 1, 20.0, PATIENCE),
            Found::Again
        );
        assert_eq!(
            conclude(&s, &Read::default(), 3, 20.0, PATIENCE),
            Found::Ended(None)
        );
    }

    #[test]
    fn the_whole_answer_after_an_ended_stream_is_not_answered_by_that_stream() {
        // The intent streamed first; the stream ended early (held for
        // review, interrupted) and says so in its metadata. The whole
        // answer is then posted by a later attempt, whose outcome is
        // unknown: the ended stream is not its evidence, its own post is.
        let text = "the whole answer";
        let hashes = vec![text_hash(text)];
        let none: Vec<String> = Vec::new();
        let s = post_subject(&hashes, &none);
        let ended = json!({"ts": "220.000001", "bot_id": "B1", "text": "partial",
            "streaming_state": "completed",
            "metadata": ending_metadata(Some("I1"), Ending::NeedsReview)});
        assert_eq!(see(&ended, &s), Seen::Nothing, "an ended stream is no post");
        let mut read = Read::default();
        read.add("220.000001", see(&ended, &s));
        assert_eq!(
            conclude(&s, &read, 1, 0.0, PATIENCE),
            Found::Again,
            "its post may still land"
        );
        let post = json!({"ts": "230.000001", "bot_id": "B1", "text": text,
            "metadata": answer_metadata("I1", &hashes[0], "200.000001")});
        read.add("230.000001", see(&post, &s));
        assert_eq!(
            conclude(&s, &read, 1, 0.0, PATIENCE),
            Found::Sent("230.000001".into())
        );
        // For the stream's own attempt, the same message is its end.
        let stream = Subject {
            stream: Some(StreamSide::Start {
                window: (210.0, 225.0),
            }),
            ..s
        };
        assert_eq!(see(&ended, &stream), Seen::Ended);
    }

    #[test]
    fn nothing_found_for_a_post_holds_it_after_enough_looking() {
        let none: Vec<String> = Vec::new();
        let s = post_subject(&none, &none);
        assert_eq!(
            conclude(&s, &Read::default(), 2, 20.0, PATIENCE),
            Found::Again
        );
        assert_eq!(
            conclude(&s, &Read::default(), 3, 5.0, PATIENCE),
            Found::Again
        );
        assert_eq!(
            conclude(&s, &Read::default(), 3, 20.0, PATIENCE),
            Found::Held("no_evidence_of_post")
        );
        let repost = Patience {
            allow_repost: true,
            ..PATIENCE
        };
        assert_eq!(
            conclude(&s, &Read::default(), 3, 20.0, repost),
            Found::Repost
        );
        let two = Read {
            named: vec!["1".into(), "2".into()],
            ..Default::default()
        };
        assert_eq!(
            conclude(&s, &two, 1, 0.0, PATIENCE),
            Found::Held("duplicate_posts_found")
        );
    }

    #[test]
    fn endings_say_why_in_threadlines_words() {
        for e in Ending::ALL {
            assert_eq!(Ending::of_reason(e.reason()), e);
        }
        assert_eq!(Ending::of_reason("something else"), Ending::Interrupted);
        assert_eq!(
            Ending::ThreadChanged.closing(true),
            "\n\n_The thread changed while I was answering, so I stopped here. I'm reconsidering with the new messages._"
        );
        assert!(Ending::Interrupted.closing(false).starts_with('_'));
    }
}
