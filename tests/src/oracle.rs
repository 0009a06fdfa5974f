//! An oracle that does not trust threadline. It judges a run only from what
//! Slack shows — slack-sim's messages (with their creation, edit and
//! deletion times), its Web API call log and its Events API delivery log —
//! and from the answer text the built-in model wrote, which states the
//! question it answers and every message it read (`Answering <ts>; read
//! <ts>/<digest> …`). It never reads threadline's tables or the metadata
//! threadline attaches to its posts.
//!
//! It checks:
//! * **at most one reply per question**, by the question the reply quotes,
//!   wherever it was posted, and every reply in its question's thread;
//! * **no reply missing a message Slack had delivered**: every human
//!   message of the reply's thread, older than the reply, whose first
//!   delivery threadline acknowledged at least `grace` before the reply's
//!   `chat.postMessage` reached Slack (and that was not deleted before),
//!   is among the messages the reply read; one acknowledged later than that
//!   is a *crossed-in-flight* answer, which threadline must reconsider (the
//!   caller checks that in threadline's records: Slack cannot show it);
//! * **each message read is as Slack had it**: its digest matches a text
//!   the message had before the reply was posted, and no older than an edit
//!   threadline acknowledged `grace` before the post; a message whose
//!   deletion was acknowledged by then is not read at all;
//! * a streamed reply counts as posted when its stream stopped: every
//!   human message said before the stop (while the stream was open too) is
//!   judged against the stop; one that was ended early with its closing
//!   line (an italic last line) answered nothing and is not judged as an
//!   answer;
//! * **at most one stream and one whole answer per question** (a stream
//!   states its question in its first words, as the built-in model writes
//!   them), and **no stream left open after its thread changed**: every
//!   stream of the app ended (stopped, or expired in Slack) no later than
//!   `stream_end` after the first change of its thread threadline
//!   acknowledged once it had started (a new message, an edit, a deletion);
//! * a stream Slack ended itself at its lifetime (`expired`) was never
//!   stopped: it answered nothing, whatever it shows, unless the app
//!   updated it since (`chat.update`: Slack shows an edit): then it is
//!   judged as what it shows now — a whole answer (labelled, stating its
//!   question), whole when its first update reached Slack, or a stream
//!   ended early (its closing line);
//! * **a source is a link the answer took from what it read**: every URL
//!   source a reply's steps show is in the reply's text, and in a message
//!   of its thread or, in a direct conversation, of a channel the person
//!   looked at from there (any text the message had, as Slack shows it);
//! * **every answer carries its feedback buttons** (a `context_actions`
//!   block with `feedback_buttons`, beside its AI label), and what is no
//!   answer carries none: a stream ended early with its closing line, the
//!   over-budget note;
//! * a review request (a message of the app with buttons) is not an
//!   answer, and is not judged as one; in a review channel every message
//!   of the app is a request, decided ones (no buttons) included;
//! * a context is truncated as threadline documents it (the root, the
//!   question and the newest replies, up to a message limit): a reply that
//!   read as many messages as the limit may leave out older ones;
//! * **no reply to a question whose deletion was acknowledged** `grace`
//!   before the reply was posted;
//! * **one person's action is one question**: messages of one person in a
//!   channel with the same `client_msg_id` (Slack has delivered one message
//!   as two, with different `ts`) are one question, answered at most once
//!   whichever of them a reply answers, and reading one of them is reading
//!   it (the others are neither missed nor crossing);
//! * **every question answered or explained**: each human message that
//!   mentions the bot (in a direct conversation, every human message) ends
//!   with exactly one reply, or Slack itself explains
//!   why not (it was deleted; it was never acknowledged, so Slack gave up on
//!   it; a later reply in its thread read it, answering both); what is
//!   left is returned for the caller to explain from what an operator sees.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde_json::Value;
use threadline_domain::feedback::carries_buttons;

/// The closing lines a stream ended early shows, as a reader sees them
/// (written out here, not imported: the oracle trusts Slack's text).
pub const CLOSING_LINES: [&str; 5] = [
    "The thread changed while I was answering, so I stopped here. I'm reconsidering with the new messages.",
    "The question was deleted, so I stopped here.",
    "Answers were switched off here, so I stopped.",
    "The rest of this answer needs a person's review before it is shown.",
    "This answer was interrupted before it finished.",
];

/// The note threadline posts, once per thread, when a workspace is over its
/// budget and the question waits (written out here, as Slack shows it).
pub const BUDGET_NOTE: &str = "This workspace has used its threadline budget for the moment, so this question waits in line. It will be answered here, in order, when the budget refills.";

/// Whether a message of the app is a stream ended early: a stream (it has
/// a streaming state) whose last line is one of the closing lines.
pub fn ended_early(m: &Value) -> bool {
    m["streaming_state"].is_string() && closes(m["text"].as_str().unwrap_or_default())
}

fn closes(text: &str) -> bool {
    text.lines()
        .last()
        .is_some_and(|l| CLOSING_LINES.iter().any(|c| l == format!("_{c}_")))
}

/// What a settled reply's thinking steps say that is not so (the tasks of
/// its `task_card` blocks, or of its `plan` block): a step still pending
/// or in progress on a message that is finished; a stream ended early
/// (`ended_early`) whose writing step shows complete; a whole answer with
/// a step of threadline's in error. (A stream the person stopped keeps what
/// it showed.)
fn untrue_step(m: &Value, ended_early: bool) -> Option<String> {
    if m["stream"]["ended"] == "stopped_by_user" {
        return None;
    }
    let blocks = m["blocks"].as_array().cloned().unwrap_or_default();
    let tasks: Vec<&Value> = blocks
        .iter()
        .flat_map(|b| match b["type"].as_str() {
            Some("task_card") => vec![b],
            Some("plan") => b["tasks"]
                .as_array()
                .map(|t| t.iter().collect())
                .unwrap_or_default(),
            _ => Vec::new(),
        })
        .collect();
    for t in tasks {
        let id = t["task_id"]
            .as_str()
            .or(t["id"].as_str())
            .unwrap_or_default();
        let status = t["status"].as_str().unwrap_or_default();
        if matches!(status, "pending" | "in_progress") {
            return Some(format!("finished, yet its step {id} shows {status}"));
        }
        if ended_early && id == "threadline_write" && status == "complete" {
            return Some("ended early, yet its writing step shows complete".to_owned());
        }
        if !ended_early && id.starts_with("threadline_") && status == "error" {
            return Some(format!("a whole answer whose step {id} shows error"));
        }
    }
    None
}

/// The URL sources a message's steps show (of its `task_card` blocks, or
/// of its `plan` block's tasks).
fn sources_shown(m: &Value) -> Vec<String> {
    let blocks = m["blocks"].as_array().cloned().unwrap_or_default();
    blocks
        .iter()
        .flat_map(|b| match b["type"].as_str() {
            Some("plan") => b["tasks"].as_array().cloned().unwrap_or_default(),
            Some("task_card") => vec![b.clone()],
            _ => Vec::new(),
        })
        .flat_map(|t| t["sources"].as_array().cloned().unwrap_or_default())
        .filter_map(|s| s["url"].as_str().map(str::to_owned))
        .collect()
}

/// Text as a reader sees Slack's escaping of it (`&amp;`, `&lt;`, `&gt;`).
fn as_shown(text: &str) -> String {
    text.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&")
}

/// A text a message had, as Slack shows it, with the message's ts.
type Had = ((u64, u64), String);

/// Every text `m` had as Slack shows it: its first, each edit's, its
/// latest.
fn texts_had(m: &Value) -> Vec<Had> {
    let ts = ts_key(m["ts"].as_str().unwrap_or_default());
    let edits = m["edits"].as_array().cloned().unwrap_or_default();
    [&m["original_text"], &m["text"]]
        .into_iter()
        .chain(edits.iter().map(|e| &e["text"]))
        .filter_map(Value::as_str)
        .map(|t| (ts, as_shown(t)))
        .collect()
}

/// Whether a message older than `reply` (by ts) had a text holding `url`.
fn held_before(had: &[Had], reply: (u64, u64), url: &str) -> bool {
    had.iter().any(|(ts, t)| *ts < reply && t.contains(url))
}

/// What a reply's sources say that is not so: a source its own text does
/// not hold, or that no message it may have read holds (`read`: whether a
/// text of an older message of its thread, or of a channel looked at from
/// a direct conversation, holds the URL).
fn untrue_source(m: &Value, read: impl Fn(&str) -> bool) -> Option<String> {
    let own = as_shown(m["text"].as_str().unwrap_or_default());
    for url in sources_shown(m) {
        if !own.contains(&url) {
            return Some(format!("its source {url} is not in its text"));
        }
        if !read(&url) {
            return Some(format!(
                "its source {url} is in no message of its thread, its viewed channel or its burst"
            ));
        }
    }
    None
}

/// The texts of every message of the channels the person looked at from
/// the direct conversation `dm` (its assistant threads, its agent tab),
/// as Slack shows them; each channel's read once per judgement (`read`).
async fn viewed_texts(sim: &str, dm: &str, read: &mut BTreeMap<String, Vec<Had>>) -> Vec<Had> {
    let threads = get(sim, &format!("assistant_threads?channel={dm}")).await;
    let tabs = get(sim, &format!("agent_tabs?channel={dm}")).await;
    let looked: BTreeSet<String> = [&threads["threads"], &tabs["tabs"]]
        .into_iter()
        .flat_map(|l| l.as_array().cloned().unwrap_or_default())
        .flat_map(|t| t["looked_at"].as_array().cloned().unwrap_or_default())
        .filter_map(|c| c.as_str().map(str::to_owned))
        .collect();
    let mut texts = Vec::new();
    for c in looked {
        if !read.contains_key(&c) {
            let all = get(sim, &format!("channels/{c}/messages")).await;
            let had = all["messages"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(texts_had)
                .collect();
            read.insert(c.clone(), had);
        }
        texts.extend(read[&c].iter().cloned());
    }
    texts
}

/// Whether `m` is a stream Slack expired (its lifetime ran out before its
/// stop) that the app never updated since: it answered nothing.
pub fn expired_unfinished(m: &Value) -> bool {
    m["stream"]["ended"] == "expired" && finished_at(m).is_none()
}

/// When a stream Slack expired was finished by an update of the app: the
/// first edit, as Slack records it, that made it show what it shows now
/// (an earlier edit to something else, a closing line say, does not make
/// a later whole answer whole any sooner).
fn finished_at(m: &Value) -> Option<u64> {
    if m["stream"]["ended"] != "expired" {
        return None;
    }
    let now = m["text"].as_str()?;
    m["edits"].as_array().and_then(|e| {
        e.iter()
            .filter(|e| e["text"].as_str() == Some(now))
            .filter_map(|e| e["at_micros"].as_u64())
            .min()
    })
}

/// What a conversation holds, which decides what a question is there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ScopeKind {
    /// A channel: a person's message that mentions the bot is a question.
    #[default]
    Mentions,
    /// A direct conversation with the app (the assistant pane's threads):
    /// every message of a person is a question. The app's opening message
    /// of a pane thread is no reply.
    Direct,
    /// A review channel: the app's messages are review requests (with
    /// buttons while undecided, without once decided), never answers, and
    /// nobody asks anything there.
    Review,
}

/// One conversation the oracle judges, and the bot a mention must name.
#[derive(Debug, Clone)]
pub struct Scope {
    pub channel: String,
    pub bot_user: String,
    pub kind: ScopeKind,
}

impl Scope {
    /// A channel where mentions of `bot_user` are questions.
    pub fn mentions(channel: &str, bot_user: &str) -> Self {
        Self {
            channel: channel.to_owned(),
            bot_user: bot_user.to_owned(),
            kind: ScopeKind::Mentions,
        }
    }
}

/// A reply that crossed a human message in flight.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Crossed {
    pub channel: String,
    pub reply_ts: String,
    pub crossing_ts: String,
}

/// A question (a human message mentioning the bot).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Question {
    pub channel: String,
    pub thread_ts: String,
    pub ts: String,
}

#[derive(Debug, Default)]
pub struct Judgement {
    pub replies: usize,
    pub questions: usize,
    pub answered: usize,
    /// Explained from Slack alone, by reason.
    pub explained: BTreeMap<&'static str, usize>,
    /// Each violation with its kind (`duplicate_reply`, `duplicate_stream`,
    /// `reply_outside_thread`, `missed_message`, `read_outdated_text`,
    /// `read_deleted_message`, `text_never_had`, `answered_deleted_question`,
    /// `unattributed_reply`, `post_without_call`, `unlabelled_reply`,
    /// `stream_left_open`, `budget_note_repeated`, `answer_without_feedback`,
    /// `feedback_on_no_answer`, `thinking_step_untrue`, `source_untrue`).
    pub violations: Vec<(&'static str, String)>,
    /// Threads the violations concern (channel, root).
    pub offending: BTreeSet<(String, String)>,
    pub crossed: Vec<Crossed>,
    /// Streamed replies ended early with a closing line (not answers).
    pub interrupted: usize,
    /// Streamed replies that stopped with the whole answer.
    pub streamed: usize,
    /// Replies posted whole (not streamed), answers all.
    pub whole: usize,
    /// Answers (whole or streamed) in direct conversations: the pane.
    pub pane: usize,
    /// Streams Slack ended itself at their lifetime, never updated since
    /// (not answers).
    pub expired: usize,
    /// Streams Slack expired that the app then updated to the whole answer
    /// (answers, counted in `streamed` too), or to a closing line (counted
    /// in `interrupted` too).
    pub expired_finished: usize,
    pub expired_closed: usize,
    /// Review requests of the app (not answers).
    pub review_requests: usize,
    /// Notes that a workspace is over its budget (not answers; at most one
    /// per thread).
    pub budget_notes: usize,
    /// Review requests decided (they show no buttons any more), and of
    /// those, the ones that say the answer was posted or was rejected.
    pub review_decided: usize,
    pub review_approved_posted: usize,
    pub review_rejected: usize,
    /// Messages a reply did not read that its context's message limit
    /// explains (older than every reply it read, with the limit reached).
    pub truncated: usize,
    /// Questions with no reply that Slack does not explain: the caller
    /// must find an operator-visible reason for each.
    pub unexplained: Vec<Question>,
}

/// What a built-in model's reply states: the question and what it read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stated {
    pub answering: String,
    pub read: Vec<(String, String)>,
    /// The person's earlier messages of a burst it answers too (double
    /// texting: top-level messages of their own, outside its thread).
    pub earlier: Vec<(String, String)>,
}

/// How the built-in model names the earlier messages of a burst it reads.
const EARLIER: &str = "earlier message(s) you sent just before: ";

/// `ts/digest` items, separated by spaces.
fn read_items(list: &str) -> Option<Vec<(String, String)>> {
    list.split_whitespace()
        .map(|item| {
            item.split_once('/')
                .map(|(ts, d)| (ts.to_owned(), d.to_owned()))
        })
        .collect()
}

/// Parses `Answering <ts>; read <ts>/<digest> <ts>/<digest> …` from a reply.
pub fn stated(text: &str) -> Option<Stated> {
    let line = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Answering "))
        .find(|l| l.contains("; read"))?;
    let (answering, rest) = line.split_once("; read")?;
    // (an answer in the assistant pane adds what it read of the channel
    // the person looks at: `; and N message(s) of channel C…, …`, which is
    // not part of the thread)
    let mut parts = rest.split("; and ");
    let read = read_items(parts.next().unwrap_or_default())?;
    // (and, under double texting, the earlier messages of the person's
    // burst: `; and N earlier message(s) you sent just before: …`)
    let earlier = match parts.find_map(|p| p.split_once(EARLIER)) {
        Some((_, list)) => read_items(list)?,
        None => Vec::new(),
    };
    Some(Stated {
        answering: answering.trim().to_owned(),
        read,
        earlier,
    })
}

/// The question a reply states in its first words (`… Answering <ts>.`
/// or `Answering <ts>;`), readable in a stream that showed only its start.
pub fn answering(text: &str) -> Option<String> {
    let (_, rest) = text.split_once("Answering ")?;
    let ts: String = rest
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    let ts = ts.trim_end_matches('.');
    (ts.contains('.') && ts.len() > 2 && rest[ts.len()..].starts_with(['.', ';']))
        .then(|| ts.to_owned())
}

/// The digest the built-in model states for a text (recomputed here from
/// its definition, not imported from threadline).
pub fn digest(text: &str) -> String {
    use sha2::{Digest as _, Sha256};
    hex::encode(&Sha256::digest(text.as_bytes())[..4])
}

fn ts_key(ts: &str) -> (u64, u64) {
    let (a, b) = ts.split_once('.').unwrap_or((ts, "0"));
    (a.parse().unwrap_or(0), b.parse().unwrap_or(0))
}

/// A Slack ts as microseconds since the epoch (its time).
fn ts_micros(ts: &str) -> u64 {
    let (a, b) = ts_key(ts);
    a * 1_000_000 + b
}

/// Whether `m` is a review request: a message with buttons.
fn is_review_request(m: &Value) -> bool {
    m["blocks"]
        .as_array()
        .is_some_and(|b| b.iter().any(|b| b["type"] == "actions"))
}

fn s(v: &Value, k: &str) -> String {
    v[k].as_str().unwrap_or_default().to_owned()
}

async fn get(base: &str, path: &str) -> Value {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .expect("client");
    client
        .get(format!("{base}/_sim/{path}"))
        .send()
        .await
        .expect("slack-sim inspection call")
        .json()
        .await
        .expect("slack-sim answers JSON")
}

/// When threadline acknowledged the deliveries about each message: its
/// first (creation), each edit's in order, and its deletion.
#[derive(Debug, Default)]
struct Acks {
    created: Option<u64>,
    /// Per `message_changed` event, in the order the edits happened: when
    /// it was first sent and when threadline first acknowledged it.
    edits: Vec<Sent>,
    deleted: Option<u64>,
}

/// A message of a channel: (channel, ts).
type MessageKey = (String, String);
/// A delivery's first sending and first acknowledgement (micros).
type Sent = (u64, Option<u64>);

/// How late the oracle lets things be.
#[derive(Debug, Clone, Default)]
pub struct Limits {
    /// How late after its acknowledgement a message may be missing from a
    /// reply without counting against it (then it crossed in flight).
    pub grace: Duration,
    /// How long a stream may stay open after the first change of its
    /// thread threadline acknowledged.
    pub stream_end: Duration,
    /// The text of the deterministic fallback answer, which states no
    /// question: a reply that starts with it answers one question of its
    /// thread, asked before it, that no other reply answers.
    pub fallback: Option<String>,
    /// The most messages a context holds (`THREADLINE_CONTEXT_MAX_MESSAGES`):
    /// a reply that read this many may leave out messages older than every
    /// reply it read (the root and the question are always kept).
    pub context_max_messages: Option<usize>,
    /// Streams seen open at a time (micros), by (channel, ts): one Slack
    /// expired ended no earlier, whatever end it shows (Slack dates an
    /// expiry at its start plus the lifetime in force when it noticed, and
    /// a test may shorten the lifetime while a stream is open).
    pub seen_open: BTreeMap<MessageKey, u64>,
}

/// Judges `scopes` of app `app_id` on the emulator at `sim`, with a stream
/// end bound of [`DEFAULT_STREAM_END`].
pub async fn judge(sim: &str, app_id: &str, scopes: &[Scope], grace: Duration) -> Judgement {
    judge_with(
        sim,
        app_id,
        scopes,
        Limits {
            grace,
            stream_end: DEFAULT_STREAM_END,
            ..Default::default()
        },
    )
    .await
}

/// The stream end bound by default: the publisher's default stream stale
/// time (45 s, after which a stream nobody drives is taken over and ended)
/// plus a sweep and two stops.
pub const DEFAULT_STREAM_END: Duration = Duration::from_secs(75);

/// Judges `scopes` of app `app_id` on the emulator at `sim`.
pub async fn judge_with(sim: &str, app_id: &str, scopes: &[Scope], limits: Limits) -> Judgement {
    let grace = limits.grace.as_micros() as u64;
    let stream_end = limits.stream_end.as_micros() as u64;
    let mut j = Judgement::default();
    // What threadline acknowledged, per message: (channel, ts) → acks.
    let deliveries = get(sim, &format!("deliveries?app_id={app_id}")).await;
    let mut acks: BTreeMap<MessageKey, Acks> = BTreeMap::new();
    // message_changed events: event id → (message, first sent, first ack)
    let mut changes: BTreeMap<String, (MessageKey, u64, Option<u64>)> = BTreeMap::new();
    for d in deliveries["deliveries"]
        .as_array()
        .cloned()
        .unwrap_or_default()
    {
        let (Some(channel), Some(ts)) = (d["channel"].as_str(), d["message_ts"].as_str()) else {
            continue;
        };
        let key = (channel.to_owned(), ts.to_owned());
        let ack = d["status"]
            .as_u64()
            .is_some_and(|c| (200..300).contains(&c))
            .then(|| d["at_micros"].as_u64().unwrap_or(u64::MAX));
        let min = |a: Option<u64>, b: Option<u64>| match (a, b) {
            (Some(x), Some(y)) => Some(x.min(y)),
            (x, y) => x.or(y),
        };
        match d["subtype"].as_str() {
            Some("message_deleted") => {
                let a = acks.entry(key).or_default();
                a.deleted = min(a.deleted, ack);
            }
            Some("message_changed") => {
                let sent = d["sent_at_micros"].as_u64().unwrap_or(0);
                let e = changes
                    .entry(s(&d, "event_id"))
                    .or_insert((key, sent, None));
                e.1 = e.1.min(sent);
                e.2 = min(e.2, ack);
            }
            _ => {
                let a = acks.entry(key).or_default();
                a.created = min(a.created, ack);
            }
        }
    }
    let mut by_message: BTreeMap<MessageKey, Vec<Sent>> = BTreeMap::new();
    for (key, sent, ack) in changes.into_values() {
        by_message.entry(key).or_default().push((sent, ack));
    }
    for (key, mut edits) in by_message {
        edits.sort();
        acks.entry(key).or_default().edits = edits;
    }
    // When each post reached Slack: the reply's ts → arrival micros. A
    // streamed reply is there from its `chat.startStream`, and its answer
    // is whole when its `chat.stopStream` arrived: that is when it counts
    // as posted (what it had not read by then, it missed).
    let arrivals = |method: &'static str| async move {
        let calls = get(sim, &format!("calls?method={method}")).await;
        calls["calls"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|c| c["outcome"] == "ok" || method == "chat.postMessage")
            .filter_map(|c| {
                Some((
                    c["ts"].as_str()?.to_owned(),
                    c["received_at_micros"].as_u64()?,
                ))
            })
            .collect::<BTreeMap<String, u64>>()
    };
    let mut arrived = arrivals("chat.postMessage").await;
    let started = arrivals("chat.startStream").await;
    let stopped = arrivals("chat.stopStream").await;
    for (ts, at) in &started {
        arrived
            .entry(ts.clone())
            .or_insert(*stopped.get(ts).unwrap_or(at));
    }
    let none = Acks::default();
    // The channels looked at from direct conversations, as read so far.
    let mut channels_read: BTreeMap<String, Vec<Had>> = BTreeMap::new();

    for scope in scopes {
        let all = get(sim, &format!("channels/{}/messages", scope.channel)).await;
        let msgs = all["messages"].as_array().cloned().unwrap_or_default();
        let root_of = |m: &Value| {
            m["thread_ts"]
                .as_str()
                .map(str::to_owned)
                .unwrap_or_else(|| s(m, "ts"))
        };
        if scope.kind == ScopeKind::Review {
            // Every message of the app here is a review request: it asks a
            // reviewer and answers nobody. Decided, it loses its buttons and
            // says what became of the answer.
            for m in msgs.iter().filter(|m| m["app_id"].as_str() == Some(app_id)) {
                j.review_requests += 1;
                if is_review_request(m) {
                    continue;
                }
                j.review_decided += 1;
                let text = m["text"].as_str().unwrap_or_default();
                if text.contains("Rejected by ") {
                    j.review_rejected += 1;
                } else if text.contains("Approved by ") && text.contains(": posted in ") {
                    j.review_approved_posted += 1;
                }
            }
            continue;
        }
        let copies = Copies::of(&msgs);
        // (read only where a reply shows sources)
        let viewed = if scope.kind == ScopeKind::Direct
            && msgs.iter().any(|m| !sources_shown(m).is_empty())
        {
            viewed_texts(sim, &scope.channel, &mut channels_read).await
        } else {
            Vec::new()
        };
        let mut threads: BTreeMap<String, Vec<Value>> = BTreeMap::new();
        for m in msgs {
            threads.entry(root_of(&m)).or_default().push(m);
        }
        // Every reply of the channel by the question it states (one
        // person's action once, whichever of its messages it states),
        // wherever it was posted: (reply ts, its thread, the ts stated).
        let mut answers: BTreeMap<String, Vec<(String, String, String)>> = BTreeMap::new();
        // Every stream of the channel by the question it states.
        let mut streams: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
        // Fallback replies (no question stated) by thread, oldest first.
        let mut fallbacks: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut read_by_later: BTreeSet<String> = BTreeSet::new();
        // The earlier messages of a person's burst each reply read with its
        // question (double texting): ts → (reply, its thread, the question
        // it answers, the digest it read).
        let mut read_as_earlier: BTreeMap<String, Vec<(String, String, String, String)>> =
            BTreeMap::new();
        // Every message of the channel by its ts (the earlier messages of a
        // burst an answer names are in threads of their own).
        let by_ts: BTreeMap<String, &Value> = threads
            .values()
            .flatten()
            .map(|m| (s(m, "ts"), m))
            .collect();
        for (root, thread) in &threads {
            let offend = |j: &mut Judgement| {
                j.offending.insert((scope.channel.clone(), root.clone()));
            };
            let humans: Vec<&Value> = thread
                .iter()
                .filter(|m| m["app_id"].is_null() && m["bot_id"].is_null() && m["user"].is_string())
                .collect();
            // (a reply deleted since still went out: it counts)
            let mut replies: Vec<&Value> = Vec::new();
            for m in thread
                .iter()
                .filter(|m| m["app_id"].as_str() == Some(app_id))
            {
                // A pane thread's opening message is the app's, and no reply.
                if m["subtype"] == "assistant_app_thread" {
                    continue;
                }
                // A note that the workspace is over budget answers nobody,
                // and is said once per thread.
                if m["text"].as_str() == Some(BUDGET_NOTE) {
                    j.budget_notes += 1;
                    // (no answer: nothing to rate)
                    if carries_buttons(&m["blocks"]) {
                        j.violations.push((
                            "feedback_on_no_answer",
                            format!("the budget note in thread {root} carries feedback buttons"),
                        ));
                        j.offending.insert((scope.channel.clone(), root.clone()));
                    }
                    if thread
                        .iter()
                        .filter(|o| o["app_id"].as_str() == Some(app_id))
                        .filter(|o| o["text"].as_str() == Some(BUDGET_NOTE))
                        .take_while(|o| o["ts"] != m["ts"])
                        .count()
                        > 0
                    {
                        j.violations.push((
                            "budget_note_repeated",
                            format!(
                                "thread {root} of {} was told of its budget twice",
                                scope.channel
                            ),
                        ));
                        j.offending.insert((scope.channel.clone(), root.clone()));
                    }
                    continue;
                }
                // A review request asks a person; it answers nobody.
                if is_review_request(m) {
                    j.review_requests += 1;
                } else {
                    replies.push(m);
                }
            }
            // When the thread first changed after `at` (micros), as far as
            // threadline acknowledged: a person's new message, an edit or a
            // deletion; never one of another message of an action `same`
            // says the answer has (Slack's second delivery of the message
            // it answers or read is no change of what it said).
            let changed_after = |at: u64, same: &dyn Fn(&str) -> bool| -> Option<u64> {
                thread
                    .iter()
                    .filter(|m| m["app_id"].is_null() && m["bot_id"].is_null())
                    .filter(|m| !same(&s(m, "ts")))
                    .filter_map(|m| acks.get(&(scope.channel.clone(), s(m, "ts"))))
                    .flat_map(|a| {
                        a.created
                            .into_iter()
                            .chain(a.edits.iter().filter_map(|(_, ack)| *ack))
                            .chain(a.deleted)
                    })
                    .filter(|t| *t > at)
                    .min()
            };
            // (what the thread's people and bots said: never the app's own
            // answers, whose made-up links are no source when repeated)
            let thread_texts: Vec<Had> = thread
                .iter()
                .filter(|m| m["app_id"].as_str() != Some(app_id))
                .flat_map(texts_had)
                .collect();
            for r in &replies {
                j.replies += 1;
                let rts = s(r, "ts");
                let text = r["text"].as_str().unwrap_or_default();
                let streamed = started.contains_key(&rts);
                if streamed {
                    // One stream per question at most (it states its
                    // question in its first words).
                    if let Some(q) = answering(text) {
                        streams
                            .entry(copies.action(&q))
                            .or_default()
                            .push((rts.clone(), root.clone()));
                    }
                    // Ended in time once its thread changed.
                    let begun = r["stream"]["started_at_micros"]
                        .as_u64()
                        .unwrap_or(started[&rts]);
                    let ended = r["stream"]["ended_at_micros"].as_u64().map(|e| {
                        match limits.seen_open.get(&(scope.channel.clone(), rts.clone())) {
                            Some(seen) if r["stream"]["ended"] == "expired" => e.max(*seen),
                            _ => e,
                        }
                    });
                    // (what it answers shows in its first words; what it
                    // read, once whole)
                    let asked = answering(text);
                    let read: Vec<String> = stated(text)
                        .map(|st| st.read.into_iter().map(|(t, _)| t).collect())
                        .unwrap_or_default();
                    let same = |ts: &str| {
                        !read.iter().any(|t| t == ts)
                            && copies
                                .others(ts)
                                .any(|o| asked.as_ref() == Some(o) || read.contains(o))
                    };
                    if let Some(changed) = changed_after(begun, &same)
                        && ended.is_none_or(|e| e > changed + stream_end)
                    {
                        j.violations.push((
                            "stream_left_open",
                            format!(
                                "stream {rts} in thread {root} was still open {} ms after its thread changed ({})",
                                ended.map_or(u64::MAX, |e| e - changed) / 1000,
                                match ended {
                                    Some(_) => "ended late",
                                    None => "never ended",
                                }
                            ),
                        ));
                        offend(&mut j);
                    }
                }
                if r["streaming_state"] == "in_progress" {
                    j.violations.push((
                        "stream_left_open",
                        format!("reply {rts} in thread {root} is a stream still open after the run settled"),
                    ));
                    offend(&mut j);
                    continue;
                }
                // A stream Slack ended at its lifetime was never stopped:
                // whatever it shows, it answered nothing (and was never
                // whole, so it carries no label) — unless the app updated
                // it since: then it is what it shows now.
                if streamed && expired_unfinished(r) {
                    j.expired += 1;
                    continue;
                }
                let finished = streamed.then(|| finished_at(r)).flatten();
                // Every reply carries the AI label (a context block).
                let labelled = r["blocks"]
                    .as_array()
                    .is_some_and(|b| b.iter().any(|b| b["type"] == "context"));
                if !labelled {
                    j.violations.push((
                        "unlabelled_reply",
                        format!("reply {rts} in thread {root} carries no AI label"),
                    ));
                    offend(&mut j);
                }
                // Thinking steps tell the truth: a stream ended early shows
                // its writing step not complete, and a whole answer none
                // still pending or in progress (an expired stream finished
                // by an update shows none at all).
                if let Some(untrue) = untrue_step(r, streamed && closes(text)) {
                    j.violations.push((
                        "thinking_step_untrue",
                        format!("reply {rts} in thread {root}: {untrue}"),
                    ));
                    offend(&mut j);
                }
                // A source is a link the answer took from what it read.
                let before = ts_key(&rts);
                let earlier_texts: Vec<Had> = stated(text)
                    .map(|st| st.earlier)
                    .unwrap_or_default()
                    .iter()
                    .filter_map(|(t, _)| by_ts.get(t))
                    .flat_map(|m| texts_had(m))
                    .collect();
                let read = |url: &str| {
                    held_before(&thread_texts, before, url)
                        || held_before(&viewed, before, url)
                        || held_before(&earlier_texts, before, url)
                };
                if let Some(untrue) = untrue_source(r, read) {
                    j.violations.push((
                        "source_untrue",
                        format!("reply {rts} in thread {root}: {untrue}"),
                    ));
                    offend(&mut j);
                }
                // A stream ended early says so in its last line (one of
                // threadline's closing lines): it answered nothing, so it
                // has nothing to rate.
                if streamed && closes(text) {
                    j.interrupted += 1;
                    if carries_buttons(&r["blocks"]) {
                        j.violations.push((
                            "feedback_on_no_answer",
                            format!(
                                "stream {rts} in thread {root} ended early with feedback buttons"
                            ),
                        ));
                        offend(&mut j);
                    }
                    if finished.is_some() {
                        j.expired_closed += 1;
                    }
                    continue;
                }
                // Every answer carries its feedback buttons (a stream the
                // person stopped was never stopped by threadline).
                if labelled
                    && r["stream"]["ended"] != "stopped_by_user"
                    && !carries_buttons(&r["blocks"])
                {
                    j.violations.push((
                        "answer_without_feedback",
                        format!("answer {rts} in thread {root} carries no feedback buttons"),
                    ));
                    offend(&mut j);
                }
                if streamed {
                    j.streamed += 1;
                    if finished.is_some() {
                        j.expired_finished += 1;
                    }
                } else {
                    j.whole += 1;
                }
                if scope.kind == ScopeKind::Direct {
                    j.pane += 1;
                }
                let fallback = limits
                    .fallback
                    .as_deref()
                    .is_some_and(|f| !f.is_empty() && text.starts_with(f));
                if fallback {
                    // (it answers a question of its thread; which one is
                    // settled with the questions below)
                    fallbacks.entry(root.clone()).or_default().push(rts.clone());
                    continue;
                }
                let Some(st) = stated(r["text"].as_str().unwrap_or_default()) else {
                    j.violations.push((
                        "unattributed_reply",
                        format!(
                            "reply {rts} in thread {root} of {} states no question and no messages read",
                            scope.channel
                        ),
                    ));
                    offend(&mut j);
                    continue;
                };
                answers
                    .entry(copies.action(&st.answering))
                    .or_default()
                    .push((rts.clone(), root.clone(), st.answering.clone()));
                let read: BTreeMap<&str, &str> = st
                    .read
                    .iter()
                    .map(|(t, d)| (t.as_str(), d.as_str()))
                    .collect();
                for (t, _) in &st.read {
                    if ts_key(t) < ts_key(&st.answering) {
                        read_by_later.insert(t.clone());
                    }
                }
                for (t, d) in &st.earlier {
                    read_by_later.insert(t.clone());
                    read_as_earlier.entry(t.clone()).or_default().push((
                        rts.clone(),
                        root.clone(),
                        st.answering.clone(),
                        d.clone(),
                    ));
                }
                // With its context full, a reply read the root, the
                // question and the newest replies: what is older than every
                // reply it read was left out by the limit, not missed.
                let truncated_before = limits
                    .context_max_messages
                    .filter(|max| st.read.len() >= *max)
                    .and_then(|_| {
                        st.read
                            .iter()
                            .map(|(t, _)| t)
                            .filter(|t| **t != *root && **t != st.answering)
                            .min_by_key(|t| ts_key(t))
                            .cloned()
                    });
                let Some(&call) = arrived.get(&rts) else {
                    j.violations.push((
                        "post_without_call",
                        format!("reply {rts} in thread {root}: Slack has no chat.postMessage call that made it"),
                    ));
                    offend(&mut j);
                    continue;
                };
                // A stream's answer became whole when Slack ended it (its
                // stop, whichever call's answer was lost), or, for one Slack
                // expired, when the app's first update of it reached Slack.
                let call = match finished {
                    Some(at) => at,
                    None if streamed => r["stream"]["ended_at_micros"].as_u64().unwrap_or(call),
                    None => call,
                };
                for h in &humans {
                    let hts = s(h, "ts");
                    // Said after the answer was whole: a post's own ts, a
                    // stream's stop (what was said while it streamed is
                    // judged against the stop).
                    let after = if streamed {
                        ts_micros(&hts) >= call
                    } else {
                        ts_key(&hts) >= ts_key(&rts)
                    };
                    if after {
                        continue;
                    }
                    // Another message of an action the reply read or
                    // answers: the reply has it.
                    if !read.contains_key(hts.as_str())
                        && copies
                            .others(&hts)
                            .any(|o| read.contains_key(o.as_str()) || *o == st.answering)
                    {
                        continue;
                    }
                    let a = acks
                        .get(&(scope.channel.clone(), hts.clone()))
                        .unwrap_or(&none);
                    let known = |ack: Option<u64>| ack.is_some_and(|t| t + grace <= call);
                    if let Some(d) = read.get(hts.as_str()) {
                        if known(a.deleted) {
                            j.violations.push((
                                "read_deleted_message",
                                format!("reply {rts} in thread {root} read message {hts}, whose deletion was acknowledged before the post"),
                            ));
                            offend(&mut j);
                            continue;
                        }
                        // The texts it may have read: the one current when
                        // the newest edit threadline had acknowledged
                        // (`grace` before the post) was made, and any later
                        // one made before the post.
                        let mut texts = vec![h["original_text"].as_str().unwrap_or_default()];
                        let edits = h["edits"].as_array().cloned().unwrap_or_default();
                        for e in &edits {
                            if e["at_micros"].as_u64().is_some_and(|t| t <= call) {
                                texts.push(e["text"].as_str().unwrap_or_default());
                            }
                        }
                        let floor = a
                            .edits
                            .iter()
                            .enumerate()
                            .filter(|(_, (_, ack))| known(*ack))
                            .map(|(i, _)| i + 1)
                            .max()
                            .unwrap_or(0)
                            .min(texts.len() - 1);
                        if texts[floor..].iter().any(|v| digest(v) == *d) {
                            continue;
                        }
                        let (kind, what) = if texts.iter().any(|v| digest(v) == *d) {
                            (
                                "read_outdated_text",
                                "an edit acknowledged before the post had replaced",
                            )
                        } else {
                            ("text_never_had", "it never had")
                        };
                        j.violations.push((
                            kind,
                            format!(
                                "reply {rts} in thread {root} read message {hts} with a text {what}"
                            ),
                        ));
                        offend(&mut j);
                        continue;
                    }
                    if h["deleted_at_micros"].as_u64().is_some_and(|d| d <= call) {
                        continue;
                    }
                    let Some(ack) = a.created else {
                        // Never acknowledged: threadline never had it.
                        continue;
                    };
                    if truncated_before
                        .as_ref()
                        .is_some_and(|floor| ts_key(&hts) < ts_key(floor))
                    {
                        j.truncated += 1;
                        continue;
                    }
                    if ack + grace <= call {
                        j.violations.push((
                            "missed_message",
                            format!(
                                "reply {rts} in thread {root} missed message {hts}, acknowledged {} ms before the post reached Slack",
                                (call - ack) / 1000
                            ),
                        ));
                        offend(&mut j);
                    } else {
                        j.crossed.push(Crossed {
                            channel: scope.channel.clone(),
                            reply_ts: rts.clone(),
                            crossing_ts: hts,
                        });
                    }
                }
                // A reply to a question whose deletion threadline had.
                let deleted = acks
                    .get(&(scope.channel.clone(), st.answering.clone()))
                    .and_then(|a| a.deleted);
                if let Some(del) = deleted
                    && del + grace <= call
                {
                    j.violations.push((
                        "answered_deleted_question",
                        format!(
                            "reply {rts} in thread {root} answers {}, whose deletion was acknowledged {} ms before the post",
                            st.answering,
                            (call - del) / 1000
                        ),
                    ));
                    offend(&mut j);
                }
            }
        }
        earlier_judged(&mut j, &scope.channel, &threads, &read_as_earlier, |q| {
            answers.contains_key(&copies.action(q))
        });
        // At most one stream per question.
        for (q, rs) in &streams {
            if rs.len() > 1 {
                j.violations.push((
                    "duplicate_stream",
                    format!(
                        "{} streams for question {q} in {}: {:?}",
                        rs.len(),
                        scope.channel,
                        rs.iter().map(|r| &r.0).collect::<Vec<_>>()
                    ),
                ));
                for (_, root) in rs {
                    j.offending.insert((scope.channel.clone(), root.clone()));
                }
            }
        }
        // At most one reply per question, in the question's own thread.
        let question_root: BTreeMap<String, String> = threads
            .iter()
            .flat_map(|(root, t)| t.iter().map(move |m| (s(m, "ts"), root.clone())))
            .collect();
        for (q, rs) in &answers {
            if rs.len() > 1 {
                j.violations.push((
                    "duplicate_reply",
                    format!(
                        "{} replies to question {q} in {}: {:?}",
                        rs.len(),
                        scope.channel,
                        rs.iter().map(|r| &r.0).collect::<Vec<_>>()
                    ),
                ));
                for (_, root, _) in rs {
                    j.offending.insert((scope.channel.clone(), root.clone()));
                }
            }
            for (rts, root, stated) in rs {
                if question_root.get(stated).is_some_and(|qr| qr != root) {
                    j.violations.push((
                        "reply_outside_thread",
                        format!("reply {rts} answers {stated} outside its thread (in {root})"),
                    ));
                    j.offending.insert((scope.channel.clone(), root.clone()));
                }
            }
        }
        // Every question answered once, or explained (one person's action
        // once, at the first of its messages met).
        let mention = format!("<@{}>", scope.bot_user);
        let deleted: BTreeSet<String> = threads
            .values()
            .flatten()
            .filter(|m| m["deleted"] == true)
            .map(|m| s(m, "ts"))
            .collect();
        let mut judged: BTreeSet<String> = BTreeSet::new();
        for (root, thread) in &threads {
            // Each fallback reply answers the oldest question before it
            // that nothing else answers.
            let mut unused: Vec<String> = fallbacks.remove(root).unwrap_or_default();
            unused.sort_by_key(|t| ts_key(t));
            for q in thread
                .iter()
                .filter(|m| m["app_id"].is_null() && m["bot_id"].is_null() && m["user"].is_string())
            {
                let qts = s(q, "ts");
                let asked = scope.kind == ScopeKind::Direct
                    || q["original_text"]
                        .as_str()
                        .or(q["text"].as_str())
                        .unwrap_or_default()
                        .contains(&mention);
                if !asked || !judged.insert(copies.action(&qts)) {
                    continue;
                }
                j.questions += 1;
                let all = copies.all(&qts);
                let mut n = answers.get(&copies.action(&qts)).map(Vec::len).unwrap_or(0);
                if n == 0
                    && let Some(k) = unused.iter().position(|f| ts_key(f) > ts_key(&qts))
                {
                    unused.remove(k);
                    n = 1;
                }
                match n {
                    0 => {
                        let acked = all.iter().any(|t| {
                            acks.get(&(scope.channel.clone(), t.clone()))
                                .is_some_and(|a| a.created.is_some())
                        });
                        let why = if all.iter().all(|t| deleted.contains(t)) {
                            Some("deleted")
                        } else if !acked {
                            Some("never_acknowledged")
                        } else if all.iter().any(|t| read_by_later.contains(t)) {
                            Some("answered_with_a_later_question")
                        } else {
                            None
                        };
                        match why {
                            Some(w) => *j.explained.entry(w).or_default() += 1,
                            None => j.unexplained.push(Question {
                                channel: scope.channel.clone(),
                                thread_ts: root.clone(),
                                ts: qts,
                            }),
                        }
                    }
                    _ => j.answered += 1,
                }
            }
            for f in unused {
                j.violations.push((
                    "unattributed_reply",
                    format!(
                        "fallback reply {f} in thread {root} of {} answers no question of its thread that nothing else answers",
                        scope.channel
                    ),
                ));
                j.offending.insert((scope.channel.clone(), root.clone()));
            }
        }
    }
    j
}

/// The earlier messages of bursts that replies read with their questions
/// (double texting): each is a top-level message of the person asking (or
/// of the one who asked at the thread's root), sent
/// before the question, with a text it had, and answered once — by the one
/// reply that read it, never also by a reply of its own or another's.
fn earlier_judged(
    j: &mut Judgement,
    channel: &str,
    threads: &BTreeMap<String, Vec<Value>>,
    read_as_earlier: &BTreeMap<String, Vec<(String, String, String, String)>>,
    answered: impl Fn(&str) -> bool,
) {
    let by_ts: BTreeMap<String, &Value> = threads
        .values()
        .flatten()
        .map(|m| (s(m, "ts"), m))
        .collect();
    for (t, readers) in read_as_earlier {
        if answered(t) || readers.len() > 1 {
            j.violations.push((
                "answered_twice",
                format!(
                    "message {t} in {channel} was read as an earlier message by {:?}{}",
                    readers.iter().map(|r| &r.0).collect::<Vec<_>>(),
                    if answered(t) {
                        " and has an answer of its own"
                    } else {
                        ""
                    }
                ),
            ));
            for r in readers {
                j.offending.insert((channel.to_owned(), r.1.clone()));
            }
        }
        for (rts, root, q, d) in readers {
            // (the person asking, or the one who asked at the thread's
            // root: an answer to a reply answers its root too while the
            // root has none, and reads the root's burst)
            let asked_by = |ts: &str, m: &Value| {
                by_ts
                    .get(ts)
                    .is_some_and(|a| a["user"] == m["user"] && ts_key(t) < ts_key(ts))
            };
            let fits = by_ts.get(t).is_some_and(|m| {
                m["thread_ts"].as_str().is_none_or(|r| r == t)
                    && (asked_by(q, m) || asked_by(root, m))
            });
            if !fits {
                j.violations.push((
                    "earlier_not_the_askers",
                    format!(
                        "reply {rts} in thread {root} read {t} as an earlier message of the person asking {q}, which it is not"
                    ),
                ));
                j.offending.insert((channel.to_owned(), root.clone()));
                continue;
            }
            let m = by_ts[t];
            let had = std::iter::once(&m["original_text"])
                .chain(
                    m["edits"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|e| &e["text"]),
                )
                .filter_map(Value::as_str)
                .any(|text| digest(text) == *d);
            if !had {
                j.violations.push((
                    "text_never_had",
                    format!("reply {rts} in thread {root} read earlier message {t} with a text it never had"),
                ));
                j.offending.insert((channel.to_owned(), root.clone()));
            }
        }
    }
}

/// One person's action delivered as more than one message: the messages
/// of one person in a channel with the same `client_msg_id`, as Slack
/// shows them.
#[derive(Debug, Default)]
struct Copies {
    /// Each message of an action with more than one: the `ts` of the
    /// action's first message.
    action: BTreeMap<String, String>,
    /// The messages of each such action, by its first message's `ts`.
    members: BTreeMap<String, Vec<String>>,
}

impl Copies {
    fn of(msgs: &[Value]) -> Self {
        let mut by_action: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
        for m in msgs {
            let (Some(user), Some(id)) = (m["user"].as_str(), m["client_msg_id"].as_str()) else {
                continue;
            };
            if m["app_id"].is_string() || m["bot_id"].is_string() {
                continue;
            }
            by_action
                .entry((user.to_owned(), id.to_owned()))
                .or_default()
                .push(s(m, "ts"));
        }
        let mut c = Copies::default();
        for mut ts in by_action.into_values().filter(|t| t.len() > 1) {
            ts.sort_by_key(|t| ts_key(t));
            for t in &ts {
                c.action.insert(t.clone(), ts[0].clone());
            }
            c.members.insert(ts[0].clone(), ts);
        }
        c
    }

    /// The action of message `ts`: its first message's `ts` (`ts` itself
    /// for a message of its own).
    fn action(&self, ts: &str) -> String {
        self.action
            .get(ts)
            .cloned()
            .unwrap_or_else(|| ts.to_owned())
    }

    /// Every message of the action of `ts`.
    fn all(&self, ts: &str) -> Vec<String> {
        self.members
            .get(&self.action(ts))
            .cloned()
            .unwrap_or_else(|| vec![ts.to_owned()])
    }

    /// The other messages of the action of `ts`.
    fn others<'a>(&'a self, ts: &'a str) -> impl Iterator<Item = &'a String> + 'a {
        self.action
            .get(ts)
            .and_then(|a| self.members.get(a))
            .into_iter()
            .flatten()
            .filter(move |t| *t != ts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_states_its_question_and_what_it_read() {
        let text = "[threadline built-in model] I read 2 message(s) … real answers.\nAnswering 1.000002; read 1.000001/ca978112 1.000002/3e23e816";
        assert_eq!(
            stated(text),
            Some(Stated {
                answering: "1.000002".into(),
                read: vec![
                    ("1.000001".into(), "ca978112".into()),
                    ("1.000002".into(), "3e23e816".into())
                ],
                earlier: Vec::new(),
            })
        );
        assert_eq!(stated("a fallback answer with nothing stated"), None);
        // Under double texting it names the earlier messages of the burst
        // apart from the thread (and from the channel the person views).
        let burst = "Answering 3.000001; read 3.000001/aa; and 1 message(s) of channel C1, the one you are looking at: 0.5/cc; and 2 earlier message(s) you sent just before: 1.000001/bb 2.000001/dd";
        let st = stated(burst).expect("stated");
        assert_eq!(st.read, vec![("3.000001".into(), "aa".into())]);
        assert_eq!(
            st.earlier,
            vec![
                ("1.000001".into(), "bb".into()),
                ("2.000001".into(), "dd".into())
            ]
        );
        // A stream ended early states its question in its first words.
        assert_eq!(
            answering("[threadline built-in model] Answering 1.000002. I read 2 mess"),
            Some("1.000002".into())
        );
        assert_eq!(answering(text), Some("1.000002".into()));
        assert_eq!(answering("[threadline built-in model] Answeri"), None);
        assert_eq!(
            answering("[threadline built-in model] Answering 1.00"),
            None
        );
        assert_eq!(digest("a"), "ca978112");
    }

    #[test]
    fn a_source_must_be_in_the_answer_and_in_what_it_read() {
        let reply = |sources: Value| {
            serde_json::json!({"text": "See https://ci.example.com/runs?id=42&amp;tab=log now.",
                "blocks": [{"type": "task_card", "task_id": "threadline_write", "status": "complete",
                            "sources": sources}]})
        };
        let question = serde_json::json!({"ts": "1.000001",
            "original_text": "why does <https://ci.example.com/runs?id=42&amp;tab=log> fail?",
            "text": "edited since", "edits": []});
        let later = serde_json::json!({"ts": "3.000001", "text": "https://only.example/y"});
        let mut texts = texts_had(&question);
        texts.extend(texts_had(&later));
        let read = |url: &str| held_before(&texts, ts_key("2.000001"), url);
        let source = |url: &str| serde_json::json!([{"type": "url", "url": url, "text": "x"}]);
        assert_eq!(
            untrue_source(
                &reply(source("https://ci.example.com/runs?id=42&tab=log")),
                read
            ),
            None,
            "in the answer, and in a text the question had"
        );
        assert!(
            untrue_source(&reply(source("https://elsewhere.example/x")), read)
                .is_some_and(|w| w.contains("not in its text"))
        );
        let mut invented = reply(source("https://only.example/y"));
        invented["text"] = "See https://only.example/y.".into();
        assert!(
            untrue_source(&invented, read).is_some_and(|w| w.contains("no message")),
            "a link only the answer names (or a later message) is no source"
        );
        assert_eq!(untrue_source(&reply(Value::Null), read), None);
    }
}
