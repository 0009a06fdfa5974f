//! Reconciling a reply whose outcome is unknown, whatever its form: read
//! the thread for evidence specific to the intent and settle the intent by
//! what Slack shows. The rules (what counts as evidence, what a read comes
//! to) are [`threadline_domain::reply`]'s, the same for posts and streams;
//! this module reads Slack and writes the store. One clear post of the
//! intent is `sent`; its stream still open is `ending` (the caller stops
//! it); its stream ended without the answer is `interrupted`; streams no
//! one can be told the owner of are ended unclaimed and the thread read
//! again; ambiguity is `held`; no match is read again until the evidence
//! threshold, then `held` (or, where policy allows, `pending` for one
//! re-post; for a stream's start, `interrupted`, and the whole answer
//! follows). Never a blind re-post. A held intent is read again later by
//! the sweeper, so a post that lands after its intent was given up on is
//! still recorded.

use serde_json::Value;
use sqlx::PgPool;
use threadline_domain::reply::{self, Found, Patience, Read, StreamSide, Subject};
use threadline_domain::state::IntentState;
use threadline_slack::WebClient;
use threadline_store::streams::{self, StreamEvidence};
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

impl Evidence {
    fn patience(self) -> Patience {
        Patience {
            reads: self.reads,
            window_secs: self.window_secs,
            allow_repost: self.allow_repost,
        }
    }

    /// How long to wait before the next read of an undecided outcome.
    pub fn pause(self) -> f64 {
        (self.window_secs / self.reads.max(1) as f64).clamp(0.5, 60.0)
    }
}

/// The thread an intent replies in.
#[derive(Debug, Clone, Copy)]
pub struct Thread<'a> {
    pub installation: Uuid,
    pub channel: &'a str,
    pub root_ts: &'a str,
}

/// An intent whose outcome is reconciled, with everything its evidence
/// needs (owned; [`Owned::subject`] lends it to the rules).
#[derive(Debug, Clone)]
pub struct Owned {
    pub intent: Uuid,
    intent_str: String,
    pub installation: Uuid,
    pub channel: String,
    pub root_ts: String,
    bot_id: String,
    hashes: Vec<String>,
    window: (f64, f64),
    stream: Option<StreamEvidence>,
    /// How far after its sending a start's stream may show.
    stream_reach: f64,
    others: Vec<String>,
    rivals: Vec<(f64, f64)>,
}

impl Owned {
    /// Everything reconciling `intent` (of thread `root_ts` in `channel`)
    /// needs: its posts' hashes and window, its stream side (when its
    /// current attempt streamed), the posts and streams recorded for the
    /// thread's other intents, and their unresolved starts. `stale` (the
    /// sending stale time) bounds how late a post or a start may land.
    pub async fn load(
        pool: &PgPool,
        intent: Uuid,
        thread: Thread<'_>,
        bot_id: &str,
        stale: f64,
        as_post: bool,
    ) -> anyhow::Result<Self> {
        let Thread {
            installation,
            channel,
            root_ts,
        } = thread;
        let (hashes, window) = intents::evidence(pool, intent, stale).await?;
        let stream = if as_post {
            None
        } else {
            streams::stream_evidence(pool, intent).await?
        };
        let others =
            intents::other_posts_in_thread(pool, installation, channel, root_ts, intent).await?;
        let reach = (2.0, stale);
        let rivals = match stream {
            Some(StreamEvidence::Start { .. }) => {
                streams::rival_starts(pool, installation, channel, root_ts, intent)
                    .await?
                    .into_iter()
                    .map(|t| (t - reach.0, t + reach.1))
                    .collect()
            }
            _ => Vec::new(),
        };
        Ok(Self {
            intent,
            intent_str: intent.to_string(),
            installation,
            channel: channel.to_owned(),
            root_ts: root_ts.to_owned(),
            bot_id: bot_id.to_owned(),
            hashes,
            window,
            stream,
            stream_reach: stale,
            others,
            rivals,
        })
    }

    pub fn subject(&self) -> Subject<'_> {
        Subject {
            intent: &self.intent_str,
            bot_id: &self.bot_id,
            hashes: &self.hashes,
            window: self.window,
            stream: self.stream.as_ref().map(|s| match s {
                StreamEvidence::Known(ts) => StreamSide::Known(ts),
                StreamEvidence::Start { sent_at } => StreamSide::Start {
                    window: (sent_at - 2.0, sent_at + self.stream_reach),
                },
            }),
            others: &self.others,
            rivals: &self.rivals,
        }
    }
}

/// What one read found, with the body hash of each message found (ts →
/// SHA-256 of its text: which decision's text Slack holds), and the text
/// each expired stream of the intent shows (kept in memory only, to close
/// it with what it showed).
#[derive(Debug, Default, Clone)]
pub struct Seen {
    pub read: Read,
    pub hashes: std::collections::BTreeMap<String, String>,
    pub expired_text: std::collections::BTreeMap<String, String>,
}

/// How long to wait before reading the thread again after a read that
/// failed: Slack's `Retry-After` when it refused the read (a 429), else
/// `otherwise`. Every reader of evidence waits by this, so a rate-limited
/// thread is not read again before Slack allows it.
pub fn wait_after(err: &anyhow::Error, otherwise: f64) -> f64 {
    match err.downcast_ref::<threadline_slack::WebError>() {
        Some(threadline_slack::WebError::RateLimited { retry_after }) => {
            retry_after.as_secs_f64().max(otherwise)
        }
        _ => otherwise,
    }
}

/// Reads the thread once for evidence of the intent's reply (no state
/// changes). An error means Slack could not be read.
pub async fn read(web: &WebClient, token: &str, o: &Owned) -> anyhow::Result<Seen> {
    let subject = o.subject();
    let mut seen = Seen::default();
    let mut cursor: Option<String> = None;
    for _ in 0..20 {
        let page = web
            .conversations_replies(token, &o.channel, &o.root_ts, cursor.as_deref(), 200)
            .await?;
        for m in &page.messages {
            let ts = m.get("ts").and_then(Value::as_str).unwrap_or_default();
            if matches!(subject.stream, Some(StreamSide::Known(k)) if k == ts) {
                seen.read.known_seen = true;
            }
            let s = reply::see(m, &subject);
            if s != reply::Seen::Nothing {
                let text = m.get("text").and_then(Value::as_str).unwrap_or_default();
                seen.hashes.insert(ts.to_owned(), reply::text_hash(text));
                if s == reply::Seen::Expired {
                    seen.expired_text.insert(ts.to_owned(), text.to_owned());
                }
            }
            seen.read.add(ts, s);
        }
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    Ok(seen)
}

/// One reconciliation step for an intent whose outcome is unknown: reads
/// the thread and settles the intent by what it found, with how long to
/// wait before the next step when it comes to `Found::Again` (longer when
/// Slack refused the read). `Found::Open` and `Found::Unclaimed` leave
/// streams for the caller to stop, `Found::Expired` one to finish by
/// update (what it shows is in the returned [`Seen`]).
pub async fn run(
    pool: &PgPool,
    web: &WebClient,
    token: &str,
    o: &Owned,
    ev: Evidence,
) -> anyhow::Result<(Found, f64, Seen)> {
    let (decision, unknown_for) = intents::begin_reconciling(pool, o.intent).await?;
    let seen = match read(web, token, o).await {
        Ok(seen) => seen,
        Err(e) => {
            tracing::warn!(error = %e, "reconciliation read failed; will read again");
            return Ok((Found::Again, wait_after(&e, ev.pause()), Seen::default()));
        }
    };
    let reads = intents::count_reconcile_read(pool, o.intent).await?;
    if seen.read.named.len() > 1 {
        // Slack shows more than one post carrying this intent: the very
        // thing threadline exists to prevent. Counted and raised, and held
        // for an operator (nothing more is posted).
        metrics::counter!("threadline_duplicate_reply_incidents_total").increment(1);
        tracing::error!(
            alert = "duplicate_reply",
            intent_id = %o.intent,
            posts = seen.read.named.len(),
            "more than one reply in Slack for one intent"
        );
    }
    let found = reply::conclude(&o.subject(), &seen.read, reads, unknown_for, ev.patience());
    settle(pool, o, &seen, decision, &found, ev).await?;
    Ok((found, ev.pause(), seen))
}

/// Writes what a reconciliation found.
async fn settle(
    pool: &PgPool,
    o: &Owned,
    seen: &Seen,
    decision: Uuid,
    found: &Found,
    ev: Evidence,
) -> anyhow::Result<()> {
    let result = match found {
        Found::Sent(ts) => {
            if matches!(o.stream, Some(StreamEvidence::Start { .. })) {
                // (a stream its start made, stopped by the person: it is
                // the intent's stream from now on)
                streams::adopt(pool, o.intent, ts).await?;
            }
            let posted =
                intents::decision_for_post(pool, o.intent, seen.hashes.get(ts), decision).await?;
            let r = intents::record_post(pool, o.intent, posted, ts, true).await?;
            if r.outcome == PostRecord::Duplicate {
                metrics::counter!("threadline_duplicate_reply_incidents_total").increment(1);
            }
            IntentState::Sent.name()
        }
        Found::Held(why) => {
            // No evidence yet is not proof of absence: the sweeper reads the
            // thread again later, in case the post lands after all.
            intents::hold_after_reconciling(pool, o.intent, why, ev.late_check_secs).await?;
            tracing::warn!(alert = "reply_held", reason = *why, intent_id = %o.intent, "reply held for an operator");
            IntentState::Held.name()
        }
        Found::Open(ts) => {
            // Its stream is open: it is stopped (by the caller, or whoever
            // finds it due) before anything else.
            streams::found_open(pool, o.intent, ts).await?;
            "stream_open"
        }
        Found::Expired(ts) => {
            // Its stream expired in Slack: finished by updating it (by the
            // caller); the one its unknown start made is its stream.
            if matches!(o.stream, Some(StreamEvidence::Start { .. })) {
                streams::adopt(pool, o.intent, ts).await?;
            }
            "stream_expired"
        }
        Found::Ended(ts) => {
            let why = match ts {
                Some(_) => "stream_ended",
                None => "stream_not_found",
            };
            streams::ended_in_slack(pool, o.intent, ts.as_deref(), why).await?;
            "stream_ended"
        }
        Found::Unclaimed(_) => "stream_unclaimed",
        Found::Repost => {
            intents::repost_after_reconciling(pool, o.intent).await?;
            "repost"
        }
        Found::Again => return Ok(()),
    };
    metrics::counter!("threadline_reconciliations_total", "result" => result).increment(1);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use threadline_slack::WebError;

    #[test]
    fn a_read_slack_refused_waits_for_its_retry_after() {
        let refused = anyhow::Error::from(WebError::RateLimited {
            retry_after: Duration::from_secs(30),
        });
        assert_eq!(wait_after(&refused, 2.0), 30.0);
        let short = anyhow::Error::from(WebError::RateLimited {
            retry_after: Duration::from_secs(1),
        });
        assert_eq!(wait_after(&short, 2.0), 2.0, "never sooner than usual");
        let other = anyhow::Error::from(WebError::Api {
            code: "internal_error".into(),
        });
        assert_eq!(wait_after(&other, 2.0), 2.0);
        let context = anyhow::Error::from(WebError::RateLimited {
            retry_after: Duration::from_secs(9),
        })
        .context("reading the thread");
        assert_eq!(wait_after(&context, 2.0), 9.0, "through added context");
    }
}
