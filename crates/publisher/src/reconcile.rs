//! Reconciling a post whose outcome is unknown: read the thread for
//! evidence specific to the intent. The evidence is the intent's metadata
//! on a message our bot wrote; failing that, a message of our bot without
//! another intent's metadata whose text has the intent's approved body
//! hash, created inside the attempt's window and not already recorded as
//! another intent's post. One clear match is `sent`; ambiguity is `held`;
//! no match is read again until the evidence threshold, then `held` (or,
//! where policy allows, `pending` for one re-post, which reads Slack once
//! more before it posts). Never a blind re-post. A held intent is read
//! again later by the sweeper, so a post that lands after its intent was
//! given up on is still recorded.

use serde_json::Value;
use sha2::{Digest as _, Sha256};
use sqlx::PgPool;
use threadline_slack::WebClient;
use uuid::Uuid;

use crate::intents::{self, PostRecord};

#[derive(Debug, Clone, Copy)]
pub struct Evidence {
    /// Reads of the thread that must find nothing…
    pub reads: i32,
    /// …over at least this many seconds since the outcome became unknown.
    pub window_secs: f64,
    /// After that: `false` holds for an operator (default); `true` allows
    /// one re-post.
    pub allow_repost: bool,
    /// Seconds after holding an intent for lack of evidence before the
    /// sweeper reads its thread again (then less and less often).
    pub late_check_secs: f64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    Sent(String),
    /// The stream an unknown start created (its ts): ended, then the whole
    /// answer is posted.
    Stream(String),
    /// The intent's stream, already ended with its closing line: the whole
    /// answer is posted.
    Ended(String),
    Held(&'static str),
    Repost,
    /// Not yet decided: read again after a pause.
    Again,
}

/// What is reconciled: the intent and what its posts look like.
pub struct Subject<'a> {
    pub intent: Uuid,
    pub installation: Uuid,
    pub channel: &'a str,
    pub root_ts: &'a str,
    pub bot_id: &'a str,
    /// SHA-256 (hex) of the approved text of every decision an attempt of
    /// the intent posted.
    pub hashes: Vec<String>,
    /// The window a post of any attempt can have been created in (unix
    /// seconds: from its first attempt on); metadata matches need no window.
    pub window: (f64, f64),
    /// An attempt started a stream whose outcome was unknown: a stream of
    /// our bot in the window that no intent recorded may be its start.
    pub stream: bool,
}

/// What one read of the thread found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Seen {
    /// Messages of our bot carrying this intent's metadata.
    pub by_metadata: Vec<String>,
    /// Messages of our bot without another intent's metadata, with the
    /// approved body's hash, inside the window, not another intent's post.
    pub by_body: Vec<String>,
    /// The body hash of each message found (ts → SHA-256 of its text): which
    /// decision's text Slack holds.
    pub hashes: std::collections::BTreeMap<String, String>,
    /// For a stream's start: streams of our bot without metadata, inside
    /// the window, that no intent recorded.
    pub by_stream: Vec<String>,
    /// Streams of this intent already ended with their closing line (their
    /// metadata names the intent as interrupted).
    pub ended: Vec<String>,
}

impl Seen {
    /// The single post of the intent, when the evidence names one.
    pub fn post(&self) -> Option<&str> {
        match (self.by_metadata.as_slice(), self.by_body.as_slice()) {
            ([one], _) => Some(one),
            ([], [one]) => Some(one),
            _ => None,
        }
    }
}

fn ts_secs(ts: &str) -> f64 {
    ts.parse::<f64>().unwrap_or(0.0)
}

/// Classifies one message of the thread for `s`; `others` are the posts
/// recorded for other intents of the thread.
fn classify(m: &Value, s: &Subject<'_>, others: &[String]) -> (bool, bool) {
    let ours = m.get("bot_id").and_then(Value::as_str) == Some(s.bot_id);
    if !ours {
        return (false, false);
    }
    if stream_start(m, s, others) {
        return (false, false);
    }
    let named = m
        .pointer("/metadata/event_payload/intent_id")
        .and_then(Value::as_str);
    if named == Some(s.intent.to_string().as_str()) {
        return (true, false);
    }
    let ts = m.get("ts").and_then(Value::as_str).unwrap_or_default();
    let text = m.get("text").and_then(Value::as_str).unwrap_or_default();
    let hash = hex::encode(Sha256::digest(text.as_bytes()));
    let same_body = s.hashes.contains(&hash);
    let t = ts_secs(ts);
    let by_body = named.is_none()
        && same_body
        && t >= s.window.0
        && t <= s.window.1
        && !others.iter().any(|o| o == ts);
    (false, by_body)
}

/// Whether `m` may be the stream an unknown start of `s` created: a
/// stream (it has a streaming state) of our bot without any metadata yet
/// (a stream gets its metadata when it stops), inside the window, that no
/// other intent recorded.
fn stream_start(m: &Value, s: &Subject<'_>, others: &[String]) -> bool {
    let ts = m.get("ts").and_then(Value::as_str).unwrap_or_default();
    let t = ts_secs(ts);
    s.stream
        && m.get("bot_id").and_then(Value::as_str) == Some(s.bot_id)
        && m.get("streaming_state").is_some_and(Value::is_string)
        && m.get("metadata").is_none_or(Value::is_null)
        && t >= s.window.0
        && t <= s.window.1
        && !others.iter().any(|o| o == ts)
}

/// Reads the thread once for evidence of the intent's post (no state
/// changes). An error means Slack could not be read.
pub async fn read(
    pool: &PgPool,
    web: &WebClient,
    token: &str,
    s: &Subject<'_>,
) -> anyhow::Result<Seen> {
    let others =
        intents::other_posts_in_thread(pool, s.installation, s.channel, s.root_ts, s.intent)
            .await?;
    let mut seen = Seen::default();
    let mut cursor: Option<String> = None;
    for _ in 0..20 {
        let page = web
            .conversations_replies(token, s.channel, s.root_ts, cursor.as_deref(), 200)
            .await?;
        for m in &page.messages {
            let ts = m
                .get("ts")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            let text = m.get("text").and_then(Value::as_str).unwrap_or_default();
            let hash = || hex::encode(Sha256::digest(text.as_bytes()));
            if stream_start(m, s, &others) {
                // A stream that stopped without our metadata was stopped by
                // the person (our stops all carry it): what it shows is the
                // answer they wanted. One still open (or expired) is a start
                // to end.
                if m.get("streaming_state").and_then(Value::as_str) == Some("completed") {
                    seen.hashes.insert(ts.clone(), hash());
                    seen.by_body.push(ts);
                } else {
                    seen.by_stream.push(ts);
                }
                continue;
            }
            if s.stream
                && m.get("bot_id").and_then(Value::as_str) == Some(s.bot_id)
                && m.pointer("/metadata/event_payload/interrupted_intent_id")
                    .and_then(Value::as_str)
                    == Some(s.intent.to_string().as_str())
            {
                seen.ended.push(ts);
                continue;
            }
            match classify(m, s, &others) {
                (true, _) => {
                    seen.hashes.insert(ts.clone(), hash());
                    seen.by_metadata.push(ts);
                }
                (_, true) => {
                    seen.hashes.insert(ts.clone(), hash());
                    seen.by_body.push(ts);
                }
                _ => {}
            }
        }
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    Ok(seen)
}

/// One reconciliation step for an intent whose outcome is unknown.
pub async fn run(
    pool: &PgPool,
    web: &WebClient,
    token: &str,
    s: &Subject<'_>,
    ev: Evidence,
) -> anyhow::Result<Found> {
    let (decision, unknown_for) = intents::begin_reconciling(pool, s.intent).await?;
    let seen = match read(pool, web, token, s).await {
        Ok(seen) => seen,
        Err(e) => {
            tracing::warn!(error = %e, "reconciliation read failed; will read again");
            return Ok(Found::Again);
        }
    };
    let reads = intents::count_reconcile_read(pool, s.intent).await?;
    if seen.by_metadata.len() > 1 {
        // Slack shows more than one post carrying this intent: the very
        // thing threadline exists to prevent. Counted and raised, and held
        // for an operator (nothing more is posted).
        metrics::counter!("threadline_duplicate_reply_incidents_total").increment(1);
        tracing::error!(
            alert = "duplicate_reply",
            intent_id = %s.intent,
            posts = seen.by_metadata.len(),
            "more than one reply in Slack for one intent"
        );
    }
    let found = match (seen.by_metadata.len(), seen.by_body.len()) {
        (n, _) if n > 1 => Found::Held("duplicate_posts_found"),
        (1, _) => Found::Sent(seen.by_metadata[0].clone()),
        // Its stream was ended with its closing line: it answered nothing.
        (0, _) if !seen.ended.is_empty() => Found::Ended(seen.ended[0].clone()),
        (0, 1) => Found::Sent(seen.by_body[0].clone()),
        (0, 0) if seen.by_stream.len() == 1 => Found::Stream(seen.by_stream[0].clone()),
        (0, 0) if seen.by_stream.len() > 1 => Found::Held("ambiguous_evidence"),
        (0, 0) if reads >= ev.reads && unknown_for >= ev.window_secs => {
            if ev.allow_repost {
                Found::Repost
            } else {
                Found::Held("no_evidence_of_post")
            }
        }
        (0, 0) => Found::Again,
        _ => Found::Held("ambiguous_evidence"),
    };
    match &found {
        Found::Sent(ts) => {
            let posted =
                intents::decision_for_post(pool, s.intent, seen.hashes.get(ts), decision).await?;
            let r = intents::record_post(pool, s.intent, posted, ts, true).await?;
            if r.outcome == PostRecord::Duplicate {
                metrics::counter!("threadline_duplicate_reply_incidents_total").increment(1);
            }
            metrics::counter!("threadline_reconciliations_total", "result" => "sent").increment(1);
        }
        Found::Held(why) => {
            // No evidence yet is not proof of absence: the sweeper reads the
            // thread again later, in case the post lands after all.
            intents::hold_after_reconciling(pool, s.intent, why, ev.late_check_secs).await?;
            metrics::counter!("threadline_reconciliations_total", "result" => "held").increment(1);
            tracing::warn!(alert = "reply_held", reason = *why, intent_id = %s.intent, "reply held for an operator");
        }
        Found::Stream(ts) => {
            // The start landed: that stream is ended by the caller with its
            // closing line, and the whole answer posted once.
            threadline_store::streams::found_ended(pool, s.intent, ts, "start_unknown").await?;
            metrics::counter!("threadline_reconciliations_total", "result" => "stream_found")
                .increment(1);
        }
        Found::Ended(ts) => {
            threadline_store::streams::found_ended(pool, s.intent, ts, "ended_with_closing_line")
                .await?;
            metrics::counter!("threadline_reconciliations_total", "result" => "stream_ended")
                .increment(1);
        }
        Found::Repost => {
            intents::repost_after_reconciling(pool, s.intent).await?;
            metrics::counter!("threadline_reconciliations_total", "result" => "repost")
                .increment(1);
        }
        Found::Again => {}
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn subject<'a>(intent: Uuid, hash: &str) -> Subject<'a> {
        Subject {
            intent,
            installation: Uuid::nil(),
            channel: "C1",
            root_ts: "100.000000",
            bot_id: "B1",
            hashes: vec!["another decision's hash".into(), hash.to_owned()],
            window: (200.0, 300.0),
            stream: false,
        }
    }

    #[test]
    fn an_unknown_start_is_looked_for_as_a_stream_nobody_recorded() {
        let intent = Uuid::now_v7();
        let mut s = subject(intent, "h");
        let open = json!({"ts": "250.000001", "bot_id": "B1", "text": "", "streaming_state": "in_progress"});
        // Not for a post: a stream is never a post's evidence.
        assert!(!stream_start(&open, &s, &[]));
        s.stream = true;
        assert!(stream_start(&open, &s, &[]));
        assert_eq!(classify(&open, &s, &[]), (false, false));
        // Another intent's stream, one with metadata (finished or ended), one
        // outside the window, another bot's, a message that is no stream.
        assert!(!stream_start(&open, &s, &["250.000001".to_owned()]));
        let finished = json!({"ts": "250.000002", "bot_id": "B1", "text": "x", "streaming_state": "completed",
                              "metadata": {"event_type": "threadline_reply", "event_payload": {"interrupted_intent_id": "x"}}});
        assert!(!stream_start(&finished, &s, &[]));
        let early = json!({"ts": "150.000001", "bot_id": "B1", "text": "", "streaming_state": "in_progress"});
        assert!(!stream_start(&early, &s, &[]));
        let theirs = json!({"ts": "250.000003", "bot_id": "B2", "text": "", "streaming_state": "in_progress"});
        assert!(!stream_start(&theirs, &s, &[]));
        let post = json!({"ts": "250.000004", "bot_id": "B1", "text": ""});
        assert!(!stream_start(&post, &s, &[]));
    }

    #[test]
    fn evidence_is_specific_to_the_intent() {
        let (intent, other) = (Uuid::now_v7(), Uuid::now_v7());
        let text = "the fallback answer";
        let hash = hex::encode(Sha256::digest(text.as_bytes()));
        let s = subject(intent, &hash);
        let meta = |id: Uuid| json!({"event_type": "threadline_reply", "event_payload": {"intent_id": id.to_string()}});
        // Its own metadata, from our bot: evidence, whenever it was made.
        let m = json!({"ts": "150.000001", "bot_id": "B1", "text": "x", "metadata": meta(intent)});
        assert_eq!(classify(&m, &s, &[]), (true, false));
        // Its metadata on another bot's message is not.
        let m = json!({"ts": "250.000001", "bot_id": "B2", "text": text, "metadata": meta(intent)});
        assert_eq!(classify(&m, &s, &[]), (false, false));
        // The same text under another intent's metadata is that intent's.
        let m = json!({"ts": "250.000001", "bot_id": "B1", "text": text, "metadata": meta(other)});
        assert_eq!(classify(&m, &s, &[]), (false, false));
        // Without metadata: the body hash inside the window…
        let m = json!({"ts": "250.000001", "bot_id": "B1", "text": text});
        assert_eq!(classify(&m, &s, &[]), (false, true));
        // …but not before the attempt, nor a post recorded for another intent.
        let early = json!({"ts": "150.000001", "bot_id": "B1", "text": text});
        assert_eq!(classify(&early, &s, &[]), (false, false));
        assert_eq!(classify(&m, &s, &["250.000001".to_owned()]), (false, false));
        let other_text = json!({"ts": "250.000001", "bot_id": "B1", "text": "another answer"});
        assert_eq!(classify(&other_text, &s, &[]), (false, false));
    }
}
