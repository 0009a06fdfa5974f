//! The chaos soak: a seeded generator drives several workspaces, channels
//! and threads with random human activity (mentions, replies, edits,
//! deletes, questions in the assistant pane) while faults are thrown at
//! every part: Slack retries, lost post responses, 429s, posts Slack
//! applies after the client gave up, human replies injected the moment an
//! answer reaches Slack, faults on the stream methods (429s on
//! `chat.appendStream` and `chat.stopStream`, lost responses of starts and
//! stops, a start answered 503 and not applied, streams Slack expires),
//! people's messages Slack delivers a second time as another message
//! (the same `client_msg_id`, before, during or after their answer),
//! questions Slack delivers late (one workspace skips late requests, one
//! answers them as if in time, the rest answer with a note of their
//! lateness),
//! services SIGKILLed and restarted (the publisher also while a stream is
//! open), services frozen (SIGSTOP) for longer than the sending stale time,
//! a Postgres outage and a NATS outage longer than the ack wait. Human
//! activity goes on through all of it.
//!
//! Answers come in every form: streamed (a third of the channels have
//! streaming off, and are answered whole), held for review in each
//! workspace's review channel, where a simulated reviewer clicks (Approve
//! mostly, Reject sometimes, sometimes late, sometimes twice, sometimes
//! after a click of someone who is not a reviewer), in the assistant pane
//! of a person's DM with the app, and, once the app has moved to Slack's
//! agent messaging experience halfway through the run, at the top of its
//! Messages tab (each question a thread of its own; what the person looks
//! at changes now and then). Streams show their thinking steps.
//!
//! The verdict comes from the oracle (`crate::oracle`), which reads only
//! what Slack shows and the answers' text, plus threadline's own records
//! for what Slack cannot show: every acknowledged delivery reaches a
//! terminal state, no dead letters (no fault here is poison), nothing stuck
//! without a reason, every crossed-in-flight answer recorded and
//! reconsidered, every unanswered question explained to an operator by a
//! reason the soak itself caused (a reviewer's rejection, a late question
//! in the workspace that skips them: the soak engages no kill switch). People send quick
//! bursts of top-level questions (double texting); the first workspace
//! answers the latest of each burst, reading the earlier ones, the others
//! answer each. From Slack's side also: a doubled action is answered once, a skipped
//! late question has no reply, an answer to a noted one carries the note
//! of its lateness beside the AI label, and no other answer does.
//!
//! A failure prints the seed and, for each offending thread, the actions
//! that touched it and what Slack shows of it (the minimal trace to
//! replay).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::Stack;
use crate::oracle::ScopeKind;

/// The emulator's seeded generator (SplitMix64), so a seed replays.
pub use threadline_slack_sim::model::Rng;

/// A number below `n` (0 for 0).
fn below(rng: &mut Rng, n: u64) -> u64 {
    if n == 0 { 0 } else { rng.next_u64() % n }
}

/// The app's events and the scopes of its installations: mentions and
/// public channels, the assistant pane, and the agent messaging experience
/// the app moves to halfway (as an existing app moves from the pane).
pub const EVENTS: &[&str] = &[
    "app_mention",
    "message.channels",
    "message.im",
    "assistant_thread_started",
    "assistant_thread_context_changed",
    "app_home_opened",
    "app_context_changed",
];
pub const SCOPES: &[&str] = &[
    "chat:write",
    "channels:history",
    "channels:read",
    "im:history",
    "assistant:write",
];

/// The settings a soak runs the stack with: a model that takes a moment
/// (so the thread can change under it), and short recovery times, so that
/// a killed worker's message is back in 3 s (not a minute), a post whose
/// publisher died counts as unknown after 4 s, a killed inference's model
/// call is taken over after 2 × 1 s + 10 s, a held reply's thread is read
/// again after 2 s, and a stream nobody drives is taken over after 3 s.
/// Answers stream (the built-in model writes a word every 20 ms, released
/// every 100 ms, appended every 250 ms). The context's byte limit is out of
/// reach, so that only its message limit truncates (which the oracle
/// allows for).
pub fn settings() -> Vec<(&'static str, String)> {
    [
        ("THREADLINE_STREAMING", "true"),
        ("THREADLINE_BUILTIN_STREAM_PACE_MS", "20"),
        ("THREADLINE_STREAM_RELEASE_MS", "100"),
        ("THREADLINE_STREAM_APPEND_MS", "250"),
        ("THREADLINE_STREAM_STALE_MS", "3000"),
        ("THREADLINE_CONTEXT_MAX_BYTES", "524288"),
        ("THREADLINE_BUILTIN_LATENCY_MS", "400"),
        ("THREADLINE_SLACK_TIMEOUT_MS", "800"),
        ("THREADLINE_RECONCILE_WINDOW_MS", "1500"),
        ("THREADLINE_REDELIVERY_MS", "3000"),
        ("THREADLINE_SENDING_STALE_MS", "4000"),
        ("THREADLINE_MODEL_TIMEOUT_MS", "1000"),
        ("THREADLINE_SWEEP_MS", "1000"),
        ("THREADLINE_SWEEP_IDLE_MS", "5000"),
        ("THREADLINE_LATE_CHECK_MS", "2000"),
        ("THREADLINE_INSTALLATION_CACHE_MS", "0"),
    ]
    .into_iter()
    .map(|(k, v)| (k, v.to_owned()))
    .collect()
}

/// Starts the stack a soak runs on ([`settings`], the app with the pane's
/// events and scopes), its services on `nats_url` when given.
pub async fn start_stack(nats_url: Option<String>) -> Stack {
    let mut settings = settings();
    if let Some(url) = nats_url {
        settings.push(("NATS_URL", url));
    }
    let extra: Vec<(&str, String)> = settings.iter().map(|(k, v)| (*k, v.clone())).collect();
    Stack::start_with_app(&extra, EVENTS, SCOPES).await
}

/// Slack's limits raised out of reach (posts a second per channel, the
/// stream and read tiers), so that every 429 the stack meets is one the
/// soak injected.
const SLACK_SETTINGS: &str = r#"{"posts_per_second": 1000.0, "post_burst": 1000.0,
    "tier2_per_minute": 1000000, "tier3_per_minute": 1000000, "tier4_per_minute": 1000000}"#;

/// How long streams live in Slack during an expiry episode (Slack's own
/// lifetime is 300 s): long enough to start, too short to finish.
const EXPIRING_LIFETIME_MS: u64 = 700;
const SLACK_STREAM_LIFETIME_MS: u64 = 300_000;

/// The faults beyond Slack's own (retries, 429s, lost responses), each
/// switched off by a zero.
#[derive(Debug, Clone)]
pub struct Adversary {
    /// Services frozen with SIGSTOP, each for `pause` (longer than the
    /// sending stale time), then resumed.
    pub pauses: usize,
    pub pause: Duration,
    /// One Postgres outage of this length (the database refuses
    /// connections and its sessions are cut).
    pub db_outage: Duration,
    /// One outage of the broker of this length (longer than the ack wait).
    pub nats_outage: Duration,
    /// Every service SIGKILLed and restarted this many times.
    pub kill_rounds: usize,
    /// The publisher SIGKILLed this many more times, and frozen as many,
    /// each when a stream is open (or 4 s later).
    pub stream_hits: usize,
    /// Episodes of 5 s in which Slack ends every stream 700 ms after its
    /// start (`message_not_in_streaming_state` to its next append or stop).
    pub expiries: usize,
}

impl Adversary {
    /// Everything, at the lengths the issue asks for.
    pub fn full() -> Self {
        Self {
            pauses: 4,
            pause: Duration::from_secs(6),
            db_outage: Duration::from_secs(90),
            nats_outage: Duration::from_secs(8),
            kill_rounds: 1,
            stream_hits: 1,
            expiries: 3,
        }
    }

    /// Slack's faults only.
    pub fn none() -> Self {
        Self {
            pauses: 0,
            pause: Duration::ZERO,
            db_outage: Duration::ZERO,
            nats_outage: Duration::ZERO,
            kill_rounds: 0,
            stream_hits: 0,
            expiries: 3,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Config {
    pub seed: u64,
    /// Human actions (posts, replies, edits, deletes), each a Slack event
    /// or two.
    pub events: usize,
    /// Workspaces besides the stack's own.
    pub extra_workspaces: usize,
    /// Channels of each workspace besides its first.
    pub extra_channels: usize,
    /// Mean human actions per second.
    pub rate: f64,
    pub adversary: Adversary,
    /// How late after its acknowledgement a message may be missing from a
    /// reply without counting against it (then it crossed in flight).
    pub grace: Duration,
    /// The share of human actions (percent) before which a fault is armed
    /// on a stream method.
    pub stream_fault_percent: u64,
}

#[derive(Debug, Default)]
pub struct Report {
    pub seed: u64,
    pub events: usize,
    /// Faults injected, by kind.
    pub faults: BTreeMap<&'static str, usize>,
    /// Kills and pauses that found acknowledged work not yet finished.
    pub hit_mid_flight: usize,
    /// Stream faults that fired, by kind, from Slack's call log (an armed
    /// fault fires on the method's next call, whoever makes it).
    pub stream_faults: BTreeMap<&'static str, usize>,
    pub replies: usize,
    pub questions: usize,
    pub answered: usize,
    /// Answers by form: posted whole (of which approved by a reviewer),
    /// streamed to their end, in the assistant pane (either way).
    pub whole: usize,
    pub approved: usize,
    pub streamed: usize,
    pub pane: usize,
    /// Questions asked at the top of the agent Messages tab (each its own
    /// thread) that hold an answer of the app.
    pub agent_tab_answered: usize,
    /// Messages of the app that answer nothing: streams ended early with
    /// a closing line, streams Slack expired never updated since, review
    /// requests (of which rejected).
    pub ended_early: usize,
    pub expired: usize,
    /// Streams Slack expired that threadline finished by updating them:
    /// with the whole answer (among `streamed`), or with their closing
    /// line (among `ended_early`).
    pub expired_answered: usize,
    pub expired_closed: usize,
    pub review_requests: usize,
    pub rejected: usize,
    /// Questions without a reply that Slack explains, by reason.
    pub explained: BTreeMap<String, usize>,
    /// Questions without a reply that threadline's records explain, by the
    /// reason an operator sees.
    pub reasons: BTreeMap<String, usize>,
    pub crossed: usize,
    /// Slack's late and doubled deliveries: people's messages Slack
    /// delivered a second time as another message, and questions it
    /// delivered late, by their workspace's late-event policy.
    pub doubled: usize,
    /// Doubled replies of which the person deleted one message at once.
    pub doubled_deleted: usize,
    pub late: BTreeMap<&'static str, usize>,
    /// Feedback clicks on answers Slack took (the gateway answered), and
    /// the (answer, person) verdicts they came to.
    pub feedback_clicks: usize,
    pub feedback_verdicts: usize,
    /// How long the actions took, and then the settling.
    pub acting: Duration,
    pub settling: Duration,
    /// Every violation, by kind.
    pub violations: Vec<(&'static str, String)>,
    /// Per offending thread, the actions that touched it.
    pub traces: Vec<String>,
}

/// `k n, k n, …`, or `none`.
fn listed<K: std::fmt::Display>(m: &BTreeMap<K, usize>) -> String {
    if m.is_empty() {
        return "none".to_owned();
    }
    m.iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

impl Report {
    pub fn violations_by_kind(&self) -> BTreeMap<&'static str, usize> {
        let mut m = BTreeMap::new();
        for (k, _) in &self.violations {
            *m.entry(*k).or_default() += 1;
        }
        m
    }

    pub fn render(&self) -> String {
        let list = listed::<&'static str>;
        let owned = listed::<String>;
        let mut out = format!(
            "chaos soak, seed {}: {} human events in {:.0} s, settled {:.0} s later\n\
             faults injected: {}\n\
             stream faults that fired (Slack's call log): {}\n\
             kills and pauses that hit acknowledged work mid-flight: {}\n\
             Slack shows {} replies to {} questions: {} answered once; explained by Slack: {}\n\
             answers by form: {} posted whole ({} approved by a reviewer), {} streamed, {} in the pane ({} questions of the agent Messages tab answered)\n\
             not answers: {} streams ended early, {} streams expired by Slack, {} review requests ({} rejected)\n\
             streams Slack expired, finished in place: {} with the whole answer, {} with their closing line\n\
             explained by threadline's records: {}\n\
             answers crossed in flight (recorded and reconsidered): {}\n\
             late and doubled deliveries: {} actions doubled ({} then one message deleted); late questions by policy: {}\n\
             feedback: {} clicks taken, {} verdicts (answer, person), each the person's last click\n\
             violations: {}\n",
            self.seed,
            self.events,
            self.acting.as_secs_f64(),
            self.settling.as_secs_f64(),
            list(&self.faults),
            list(&self.stream_faults),
            self.hit_mid_flight,
            self.replies,
            self.questions,
            self.answered,
            owned(&self.explained),
            self.whole,
            self.approved,
            self.streamed,
            self.pane,
            self.agent_tab_answered,
            self.ended_early,
            self.expired,
            self.review_requests,
            self.rejected,
            self.expired_answered,
            self.expired_closed,
            owned(&self.reasons),
            self.crossed,
            self.doubled,
            self.doubled_deleted,
            list(&self.late),
            self.feedback_clicks,
            self.feedback_verdicts,
            list(&self.violations_by_kind()),
        );
        if self.violations.is_empty() {
            out.push_str("every invariant held\n");
        } else {
            out.push_str(&format!(
                "INVARIANTS BROKEN (replay with --seed {}):\n",
                self.seed
            ));
            for (k, v) in self.violations.iter().take(200) {
                out.push_str(&format!("  - [{k}] {v}\n"));
            }
            for t in self.traces.iter().take(20) {
                out.push_str(t);
            }
        }
        out
    }
}

#[derive(Clone)]
struct Person {
    user: String,
    channel: String,
    bot: String,
    /// Which workspace (index into the soak's workspaces).
    ws: usize,
    /// A channel (mentions are questions) or the person's DM with the app
    /// (the pane: every message is a question).
    kind: ScopeKind,
}

struct Thread {
    person: usize,
    root: String,
    /// Live human messages (ts).
    messages: Vec<String>,
}

/// A workspace of the soak: its installation, its person, its review
/// channel with a reviewer and a member who is not one, and the person's
/// DM with the app once they opened the pane.
struct Ws {
    inst: String,
    user: String,
    bot: String,
    channel: String,
    review: String,
    reviewer: String,
    other: String,
    /// Index into the people of the person's DM, once opened.
    dm: Option<usize>,
}

/// The person of workspace `w` in their DM with the app (`dm`), added to
/// the people, and the DM to what the oracle judges, the first time.
fn dm_person(s: &Stack, people: &mut Vec<Person>, ws: &mut Ws, w: usize, dm: &str) -> usize {
    if let Some(p) = ws.dm {
        return p;
    }
    people.push(Person {
        user: ws.user.clone(),
        channel: dm.to_owned(),
        bot: ws.bot.clone(),
        ws: w,
        kind: ScopeKind::Direct,
    });
    s.judge_also_as(dm, &ws.bot, ScopeKind::Direct);
    ws.dm = Some(people.len() - 1);
    people.len() - 1
}

/// The stack's services by index (`Stack::services`; the relay, with the
/// spool's drainer, is its own process as deployed).
const SERVICES: [&str; 5] = [
    "gateway",
    "context-builder",
    "inference",
    "publisher",
    "relay",
];

/// Something under way that ends at a given time.
enum Episode {
    Paused {
        service: usize,
        pid: u32,
    },
    DbDown,
    NatsDown,
    /// Slack expires streams early.
    Expiring,
}

/// When Postgres, NATS or the gateway was away (unix µs, open while the
/// end is unknown): a delivery Slack made while only Postgres was away must
/// have been acknowledged (the spool keeps it).
#[derive(Debug, Default)]
struct Away {
    closed: Vec<(&'static str, u64, u64)>,
    open: BTreeMap<&'static str, u64>,
}

impl Away {
    fn begin(&mut self, what: &'static str) {
        self.open.insert(what, now_micros());
    }

    fn end(&mut self, what: &'static str) {
        if let Some(from) = self.open.remove(what) {
            self.closed.push((what, from, now_micros()));
        }
    }

    /// Whether `what` was away at `t`, give or take `margin` µs.
    fn at(&self, what: &str, t: u64, margin: u64) -> bool {
        self.closed
            .iter()
            .any(|(w, from, to)| *w == what && t + margin >= *from && t <= to + margin)
            || self.open.get(what).is_some_and(|from| t + margin >= *from)
    }
}

fn now_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// Deliveries Slack made while Postgres alone was away (not the broker,
/// not the gateway, with a margin for reconnects) that were not
/// acknowledged: the spool should have kept each. Also how many such
/// deliveries there were.
async fn refused_with_the_spool_up(s: &Stack, away: &Away) -> (usize, Vec<(&'static str, String)>) {
    const MARGIN: u64 = 3_000_000;
    let deliveries = crate::sim_get(&s.sim, "deliveries").await["deliveries"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let (mut during, mut refused) = (0, Vec::new());
    for d in &deliveries {
        let t = d["sent_at_micros"].as_u64().unwrap_or(0);
        if !away.at("postgres", t, 0)
            || away.at("nats", t, MARGIN)
            || away.at("gateway", t, MARGIN)
            // (the soak's own fault: Slack counts it late whatever the answer)
            || d["result"] == "held_past_deadline"
        {
            continue;
        }
        during += 1;
        if !d["status"]
            .as_u64()
            .is_some_and(|c| (200..300).contains(&c))
        {
            refused.push((
                "refused_with_the_spool_up",
                format!(
                    "event {} (attempt {}) was not acknowledged ({}) while only Postgres was away",
                    d["event_id"].as_str().unwrap_or_default(),
                    d["attempt"],
                    d["result"].as_str().unwrap_or_default()
                ),
            ));
        }
    }
    (during, refused)
}

fn signal(pid: u32, sig: &str) {
    let _ = std::process::Command::new("kill")
        .args([format!("-{sig}"), pid.to_string()])
        .status();
}

/// How often (percent) Slack delivers a person's message just posted a
/// second time, as another message (same `client_msg_id`), and within how
/// long after it: before its answer, while it is under way, or after.
const DOUBLE_PERCENT: u64 = 10;
const DOUBLE_WITHIN_MS: u64 = 5000;

/// How late Slack delivers a late question at the least: past
/// `THREADLINE_LATE_EVENT_MS` (five minutes, the default) with a margin.
const LATE_BY_MIN_SECS: u64 = 420;

/// The late-event policy of workspace `i`: the second skips late
/// requests, the third answers them as if in time, the others note their
/// lateness (threadline's default).
fn late_policy(i: usize) -> &'static str {
    match i {
        1 => "skip",
        2 => "answer",
        _ => "note",
    }
}

/// The reason threadline's records give for a request skipped as late.
const LATE_SKIPPED: &str = "event ignored:late_event";

/// The quiet period of workspace `i` when it answers the latest of a
/// person's burst (double texting): the first workspace answers the
/// latest after 1.5 s of quiet; the others answer each message
/// (threadline's default).
fn burst_policy(i: usize) -> Option<&'static str> {
    (i == 0).then_some("1500")
}

/// How often a person's top-level question is followed at once by another
/// (double texting), in percent.
const BURST_PERCENT: u64 = 15;

/// The note of lateness beside the AI label, as a reader sees it (written
/// out here: the judge trusts Slack's text).
const LATE_NOTE: &str = "Slack delivered this message to me ";

/// A question Slack delivered late, and its workspace's policy.
struct Late {
    channel: String,
    ts: String,
    policy: &'static str,
}

/// Of the doubled replies, the share the person tidies up at once by
/// deleting one of the two messages (the original or the copy, as a coin
/// falls), in percent.
const DOUBLED_DELETED_PERCENT: u64 = 30;

/// Slack delivers again each person's message that is due (all of them
/// when `all`, each when due): a copy with a new `ts` and the same
/// `client_msg_id`; counted in `report`. The person then deletes one of
/// a doubled reply's two messages now and then (a root's stays: its
/// thread goes on).
async fn double_due(
    s: &Stack,
    pending: &mut Vec<(Instant, String, String, String)>,
    all: bool,
    (log, step): (&mut Vec<(Option<String>, String)>, usize),
    rng: &mut Rng,
    report: &mut Report,
) {
    pending.sort_by_key(|(at, ..)| *at);
    let now = Instant::now();
    let due: Vec<_> = if all {
        std::mem::take(pending)
    } else {
        let k = pending.iter().take_while(|(at, ..)| *at <= now).count();
        pending.drain(..k).collect()
    };
    for (at, channel, ts, root) in due {
        tokio::time::sleep_until(at.into()).await;
        let copy = try_ctl(s, "act/double", json!({"channel": channel, "ts": ts}))
            .await
            .and_then(|v| v["ts"].as_str().map(str::to_owned));
        if let Some(copy) = copy {
            report.doubled += 1;
            log.push((
                Some(root.clone()),
                format!("step {step}: Slack delivers {ts} again as {copy}"),
            ));
            if ts != root && below(rng, 100) < DOUBLED_DELETED_PERCENT {
                let gone = if below(rng, 2) == 0 { &ts } else { &copy };
                if try_ctl(s, "act/delete", json!({"channel": channel, "ts": gone}))
                    .await
                    .is_some()
                {
                    report.doubled_deleted += 1;
                    log.push((
                        Some(root.clone()),
                        format!("step {step}: the person deletes {gone}, one of {ts} and {copy}"),
                    ));
                }
            }
            if ts == root {
                // (a root's copy is a thread of its own)
                log.push((
                    Some(copy.clone()),
                    format!("step {step}: Slack delivers {ts} again as {copy}"),
                ));
            }
        }
    }
}

/// The text of a message's context blocks (the AI label, and a note).
fn context_text(m: &Value) -> String {
    m["blocks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|b| b["type"] == "context")
        .flat_map(|b| b["elements"].as_array().cloned().unwrap_or_default())
        .filter_map(|e| e["text"].as_str().map(str::to_owned))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Late questions as Slack shows them: one its workspace skips has no
/// reply at all; each answer to one its workspace notes carries the note
/// of its lateness beside the AI label; no other answer carries one.
async fn late_answers(
    s: &Stack,
    late: &[Late],
    offending: &mut BTreeSet<(String, String)>,
) -> Vec<(&'static str, String)> {
    let mut v = Vec::new();
    for scope in s.scopes() {
        if scope.kind == ScopeKind::Review {
            continue;
        }
        let msgs = crate::sim_get(&s.sim, &format!("channels/{}/messages", scope.channel)).await;
        for m in msgs["messages"].as_array().cloned().unwrap_or_default() {
            if !m["app_id"].is_string() {
                continue;
            }
            let text = m["text"].as_str().unwrap_or_default();
            let rts = m["ts"].as_str().unwrap_or_default();
            let root = m["thread_ts"].as_str().unwrap_or(rts).to_owned();
            let answers = crate::oracle::answering(text);
            let of = |ts: &str| {
                late.iter()
                    .find(|l| l.channel == scope.channel && l.ts == ts)
            };
            if let Some(l) = of(&root)
                .or_else(|| answers.as_deref().and_then(of))
                .filter(|l| l.policy == "skip")
            {
                v.push((
                    "late_skipped_answered",
                    format!(
                        "reply {rts} in thread {root} of {} replies to question {} that Slack delivered late where late requests are skipped",
                        scope.channel, l.ts
                    ),
                ));
                offending.insert((scope.channel.clone(), root));
                continue;
            }
            // (not an answer: a stream ended early or expired by Slack)
            let Some(q) = answers else { continue };
            if crate::oracle::ended_early(&m) || crate::oracle::expired_unfinished(&m) {
                continue;
            }
            let noted = context_text(&m).contains(LATE_NOTE);
            let (kind, why) = match (of(&q).map(|l| l.policy), noted) {
                (Some("note"), false) => (
                    "late_note_missing",
                    "answers a question Slack delivered late without the note of its lateness",
                ),
                (Some("answer"), true) => (
                    "late_note_unwanted",
                    "notes the lateness of a question its workspace answers as if in time",
                ),
                (None, true) => (
                    "late_note_unwanted",
                    "notes lateness on an answer to a question Slack delivered in time",
                ),
                _ => continue,
            };
            v.push((
                kind,
                format!(
                    "reply {rts} in thread {root} of {} {why} ({q})",
                    scope.channel
                ),
            ));
            offending.insert((scope.channel.clone(), root));
        }
    }
    v
}

/// The settings the CLI needs on the soak's stack.
fn cli_env(s: &Stack) -> Vec<(&'static str, String)> {
    let nats = s
        .env
        .iter()
        .rev()
        .find(|(k, _)| k == "NATS_URL")
        .map(|(_, v)| v.clone())
        .unwrap_or_else(threadline_testkit::nats_url);
    vec![
        ("DATABASE_URL", s.db.url.clone()),
        ("NATS_URL", nats),
        ("THREADLINE_BUS_PREFIX", s.prefix.clone()),
    ]
}

/// Runs the CLI; a refusal stops the soak (its setup is wrong).
async fn run_cli(s: &Stack, args: &[&str]) {
    let out = crate::cli(args, &cli_env(s)).await;
    assert!(
        out.status.success(),
        "threadline {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A question's text: now and then one whose answer needs review (the
/// built-in model quotes the question, and a token in an answer is held
/// for a person).
fn question(rng: &mut Rng, mention: Option<&str>, step: usize, plain: &str) -> String {
    let at = mention.map(|b| format!("<@{b}> ")).unwrap_or_default();
    if below(rng, 100) < 12 {
        format!("{at}is xoxb-{step:08}-chaosplaceholder the deploy token? ({step})")
    } else {
        format!("{at}{plain}")
    }
}

/// Runs the soak on `s` (whose services use `broker`, when a NATS outage
/// is asked for) and checks the invariants. `s` is started by
/// [`start_stack`].
pub async fn soak(
    s: &mut Stack,
    mut broker: Option<&mut crate::broker::Broker>,
    cfg: &Config,
) -> Report {
    let mut rng = Rng::new(cfg.seed);
    // The reviewer's choices have a generator of their own: when a request
    // shows depends on the stack's timing, the people's actions do not.
    let mut reviewer_rng = Rng::new(cfg.seed ^ 0x5eed_0f7e_71e3_e7e1);
    // (their own generator: rating answers leaves the schedule as it was)
    let mut rating_rng = Rng::new(cfg.seed ^ 0x0fee_db0c_0c1c_0001);
    // (bursts draw from their own: the actions and faults of a seed stay
    // as they were without them)
    let mut burst_rng = Rng::new(cfg.seed ^ 0xb0b5_7e47_0000_0002);
    let mut double_rng = Rng::new(cfg.seed ^ 0xd0b1_ed00_0000_0003);
    let mut rating = Rating::default();
    let mut report = Report {
        seed: cfg.seed,
        events: cfg.events,
        ..Default::default()
    };
    try_ctl(
        s,
        "settings",
        serde_json::from_str(SLACK_SETTINGS).expect("settings"),
    )
    .await;
    // Clicks go to the gateway (restarted on the same address).
    crate::sim_ctl(
        &s.sim,
        &format!("apps/{}/interactivity", s.app),
        json!({"url": format!("{}/slack/interactions", s.services[0].base_url)}),
    )
    .await;
    let mut workspaces = vec![Ws {
        inst: crate::first_installation(s).await,
        user: s.user.clone(),
        bot: s.bot_user.clone(),
        channel: s.channel.clone(),
        review: String::new(),
        reviewer: String::new(),
        other: String::new(),
        dm: None,
    }];
    let mut teams = vec![s.team.clone()];
    for i in 0..cfg.extra_workspaces {
        let w = s
            .add_workspace_with_scopes(&format!("Chaos {i}"), SCOPES)
            .await;
        teams.push(w.team.clone());
        workspaces.push(Ws {
            inst: w.inst.to_string(),
            user: w.user,
            bot: w.bot_user,
            channel: w.channel,
            review: String::new(),
            reviewer: String::new(),
            other: String::new(),
            dm: None,
        });
    }
    let mut people = Vec::new();
    for (i, (w, team)) in workspaces.iter_mut().zip(&teams).enumerate() {
        // The pane is a DM: DMs allowed.
        run_cli(
            s,
            &["policy", "set", "--installation", &w.inst, "--dms", "on"],
        )
        .await;
        // Late requests: skipped in one workspace, answered as if in time
        // in another, noted (threadline's default) in the rest.
        if late_policy(i) != "note" {
            run_cli(
                s,
                &[
                    "policy",
                    "late-events",
                    "--installation",
                    &w.inst,
                    "--action",
                    late_policy(i),
                ],
            )
            .await;
        }
        if let Some(quiet) = burst_policy(i) {
            run_cli(
                s,
                &[
                    "policy",
                    "double-texting",
                    "--installation",
                    &w.inst,
                    "--action",
                    "latest",
                    "--quiet-ms",
                    quiet,
                ],
            )
            .await;
        }
        // A review channel with a reviewer and someone who is not one.
        for (name, who) in [("rita", &mut w.reviewer), ("otto", &mut w.other)] {
            *who =
                crate::sim_ctl(&s.sim, "users", json!({"team_id": team, "name": name})).await["id"]
                    .as_str()
                    .expect("a user id")
                    .to_owned();
        }
        w.review = crate::sim_ctl(
            &s.sim,
            "channels",
            json!({"team_id": team, "name": "answers-review", "kind": "public",
                   "members": [w.reviewer, w.other, w.bot]}),
        )
        .await["id"]
            .as_str()
            .expect("a channel id")
            .to_owned();
        run_cli(
            s,
            &[
                "review",
                "setup",
                "--installation",
                &w.inst,
                "--channel",
                &w.review,
                "--reviewers",
                &w.reviewer,
            ],
        )
        .await;
        s.judge_also_as(&w.review, &w.bot, ScopeKind::Review);
        people.push(Person {
            user: w.user.clone(),
            channel: w.channel.clone(),
            bot: w.bot.clone(),
            ws: i,
            kind: ScopeKind::Mentions,
        });
        // More channels, the bot a member: threads run in several channels
        // of each workspace at once.
        for c in 0..cfg.extra_channels {
            let channel = crate::sim_ctl(
                &s.sim,
                "channels",
                json!({"team_id": team, "name": format!("incidents-{c}"), "kind": "public",
                       "members": [w.user, w.bot]}),
            )
            .await["id"]
                .as_str()
                .expect("a channel id")
                .to_owned();
            s.judge_also(&channel, &w.bot);
            people.push(Person {
                user: w.user.clone(),
                channel,
                bot: w.bot.clone(),
                ws: i,
                kind: ScopeKind::Mentions,
            });
        }
    }
    // A third of the channels answer whole: streaming off there.
    for (k, p) in people.iter().enumerate() {
        if k % 3 == 2 {
            let inst = workspaces[p.ws].inst.clone();
            run_cli(
                s,
                &[
                    "policy",
                    "channel",
                    "--installation",
                    &inst,
                    "--channel",
                    &p.channel,
                    "--streaming",
                    "off",
                ],
            )
            .await;
        }
    }
    let mut reviewing = Reviewing::default();

    // The schedule of the big faults, by event index.
    let adv = &cfg.adversary;
    let n = cfg.events.max(1);
    let mut at: BTreeMap<usize, Vec<&'static str>> = BTreeMap::new();
    let mut spread = |rng: &mut Rng, k: usize, what: &'static str, from: f64, to: f64| {
        for i in 0..k {
            let lo = from + (to - from) * i as f64 / k as f64;
            let hi = from + (to - from) * (i + 1) as f64 / k as f64;
            let span = ((hi - lo) * n as f64).max(1.0) as u64;
            let step = (lo * n as f64) as usize + below(rng, span) as usize;
            at.entry(step.min(n - 1)).or_default().push(what);
        }
    };
    // Kills and pauses first, then the broker's outage, then the
    // database's (the longest): activity goes on through each, and what
    // Slack could not deliver during an outage it gives up on.
    for r in 0..adv.kill_rounds {
        let (from, to) = (
            0.05 + 0.5 * r as f64 / adv.kill_rounds as f64,
            0.05 + 0.5 * (r + 1) as f64 / adv.kill_rounds as f64,
        );
        for what in [
            "kill:context-builder",
            "kill:inference",
            "kill:publisher",
            "kill:gateway",
            "kill:relay",
        ] {
            spread(&mut rng, 1, what, from, to);
        }
    }
    spread(&mut rng, adv.pauses, "pause", 0.05, 0.6);
    if !adv.nats_outage.is_zero() && broker.is_some() {
        spread(&mut rng, 1, "nats_outage", 0.6, 0.65);
    }
    if !adv.db_outage.is_zero() {
        spread(&mut rng, 1, "db_outage", 0.7, 0.75);
    }
    // The publisher killed and frozen while a stream is open, and Slack
    // expiring streams, over the whole run.
    spread(&mut rng, adv.stream_hits, "kill:publisher", 0.1, 0.9);
    spread(&mut rng, adv.stream_hits, "pause:publisher", 0.1, 0.9);
    spread(&mut rng, adv.expiries, "expire", 0.05, 0.95);
    // Questions Slack delivers late (as it replays what an app missed),
    // over the whole run: at least one under each policy.
    spread(&mut rng, (n / 40).max(3), "late", 0.02, 0.98);
    // The channels (the DMs join the people as the pane is opened).
    let channels: Vec<usize> = (0..people.len()).collect();

    let mut threads: Vec<Thread> = Vec::new();
    // The questions asked at the top of the agent Messages tab: (DM, ts).
    let mut agent_questions: Vec<(String, String)> = Vec::new();
    let mut log: Vec<(Option<String>, String)> = Vec::new();
    // When the soak SIGKILLed the publisher (µs since the Unix epoch).
    let mut publisher_kills: Vec<u64> = Vec::new();
    let mut episodes: Vec<(Instant, Episode)> = Vec::new();
    let mut away = Away::default();
    let started = Instant::now();
    let mut faults: BTreeMap<&'static str, usize> = BTreeMap::new();
    let mut pauses_done = 0usize;
    // People's messages Slack is to deliver again (due, channel, ts,
    // thread), those it was asked to (never edited or deleted after:
    // the copy keeps the first text), and the late questions.
    let mut doubling: Vec<(Instant, String, String, String)> = Vec::new();
    let mut doubled: BTreeSet<String> = BTreeSet::new();
    let mut late: Vec<Late> = Vec::new();
    // Halfway, the app moves from the assistant pane to the agent
    // messaging experience, as an existing app does: its DMs' older pane
    // threads go on, and new questions are asked at the top of the
    // Messages tab, each its own thread.
    let mut agent_view = false;
    for step in 0..cfg.events {
        if !agent_view && step >= cfg.events / 2 {
            let set = try_ctl(
                s,
                &format!("apps/{}/experience", s.app),
                json!({"experience": "agent_view"}),
            )
            .await;
            agent_view = set.is_some_and(|v| v["experience"] == "agent_view");
            if agent_view {
                log.push((
                    None,
                    format!("step {step}: the app moves to the agent messaging experience"),
                ));
            }
        }
        double_due(
            s,
            &mut doubling,
            false,
            (&mut log, step),
            &mut double_rng,
            &mut report,
        )
        .await;
        // End what is due.
        let now = Instant::now();
        let (due, rest): (Vec<_>, Vec<_>) = episodes.into_iter().partition(|(end, _)| *end <= now);
        episodes = rest;
        for (_, e) in due {
            end_episode(s, broker.as_deref_mut(), e, step, &mut log, &mut away).await;
        }
        for what in at.remove(&step).unwrap_or_default() {
            let busy = episodes
                .iter()
                .any(|(_, e)| matches!(e, Episode::Paused { .. }));
            let outage = episodes
                .iter()
                .any(|(_, e)| matches!(e, Episode::DbDown | Episode::NatsDown));
            match what {
                // A service restarted during an outage waits for it at start
                // (up to a minute): kills wait for the outage to end.
                w if w.starts_with("kill:") && outage => {
                    at.entry(step + 1).or_default().push(w);
                }
                w if w.starts_with("kill:") => {
                    let i = SERVICES
                        .iter()
                        .position(|x| *x == &w[5..])
                        .expect("a service");
                    if episodes
                        .iter()
                        .any(|(_, e)| matches!(e, Episode::Paused { service, .. } if *service == i))
                    {
                        // Killed once it is running again.
                        at.entry(step + 1).or_default().push(w);
                        continue;
                    }
                    // The publisher is killed while a stream is open.
                    let mid_stream = i == 3 && wait_for_stream(s).await;
                    let in_flight = in_flight(s).await;
                    if i == 0 {
                        away.begin("gateway");
                    }
                    if i == 3 {
                        publisher_kills.push(now_micros());
                    }
                    s.kill_and_restart(i).await;
                    if i == 0 {
                        away.end("gateway");
                    }
                    *faults.entry("service_killed").or_default() += 1;
                    if mid_stream {
                        *faults.entry("publisher_killed_mid_stream").or_default() += 1;
                    }
                    if in_flight > 0 {
                        report.hit_mid_flight += 1;
                    }
                    log.push((
                        None,
                        format!(
                            "step {step}: SIGKILL {} and restart ({in_flight} items in flight{})",
                            SERVICES[i],
                            if mid_stream { ", a stream open" } else { "" }
                        ),
                    ));
                }
                w @ ("pause" | "pause:publisher") if !busy => {
                    // Each service in turn, the publisher first.
                    let i = if w == "pause" {
                        pauses_done += 1;
                        [3usize, 1, 2, 0, 4][(pauses_done - 1) % 5]
                    } else {
                        3
                    };
                    // The publisher is frozen while a stream is open.
                    let mid_stream = i == 3 && wait_for_stream(s).await;
                    if mid_stream {
                        *faults.entry("publisher_paused_mid_stream").or_default() += 1;
                    }
                    let pid = s.services[i].child.id().expect("a running service");
                    let in_flight = in_flight(s).await;
                    if i == 0 {
                        away.begin("gateway");
                    }
                    signal(pid, "STOP");
                    *faults
                        .entry(
                            [
                                "gateway_paused",
                                "context_builder_paused",
                                "inference_paused",
                                "publisher_paused",
                                "relay_paused",
                            ][i],
                        )
                        .or_default() += 1;
                    if in_flight > 0 {
                        report.hit_mid_flight += 1;
                    }
                    log.push((
                        None,
                        format!(
                            "step {step}: SIGSTOP {} for {:?} ({in_flight} items in flight)",
                            SERVICES[i], adv.pause
                        ),
                    ));
                    episodes.push((
                        Instant::now() + adv.pause,
                        Episode::Paused { service: i, pid },
                    ));
                }
                // Another service is frozen now: this one waits its turn.
                w @ ("pause" | "pause:publisher") => at.entry(step + 1).or_default().push(w),
                "expire" => {
                    // Streams open now that Slack expires were open at
                    // least until now (Slack dates their end earlier).
                    let now_micros = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map(|d| d.as_micros() as u64)
                        .unwrap_or(0);
                    for key in open_streams(s).await {
                        s.streams_seen_open
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .insert(key, now_micros);
                    }
                    set_stream_lifetime(s, EXPIRING_LIFETIME_MS).await;
                    *faults.entry("stream_expiry_episode").or_default() += 1;
                    log.push((
                        None,
                        format!(
                            "step {step}: Slack expires streams {EXPIRING_LIFETIME_MS} ms after their start, for 5 s"
                        ),
                    ));
                    episodes.push((Instant::now() + Duration::from_secs(5), Episode::Expiring));
                }
                "late" => {
                    // The k-th in workspace k (each policy in turn), in one
                    // of its channels, a new thread.
                    let w = late.len() % workspaces.len();
                    let mine: Vec<usize> = channels
                        .iter()
                        .copied()
                        .filter(|p| people[*p].ws == w)
                        .collect();
                    let who = &people[mine[below(&mut rng, mine.len() as u64) as usize]];
                    let by = LATE_BY_MIN_SECS + below(&mut rng, 1200);
                    let asked = try_ctl(
                        s,
                        "act/post",
                        json!({"user": who.user, "channel": who.channel, "late_by_secs": by,
                               "text": format!("<@{}> late question {step}?", who.bot)}),
                    )
                    .await
                    .and_then(|v| v["ts"].as_str().map(str::to_owned));
                    let policy = late_policy(w);
                    if let Some(ts) = asked {
                        *report.late.entry(policy).or_default() += 1;
                        log.push((
                            Some(ts.clone()),
                            format!(
                                "step {step}: Slack delivers question {ts} in {} {by} s late ({policy})",
                                who.channel
                            ),
                        ));
                        late.push(Late {
                            channel: who.channel.clone(),
                            ts,
                            policy,
                        });
                    }
                }
                "db_outage" => {
                    away.begin("postgres");
                    s.db.take_down().await;
                    *faults.entry("postgres_outage").or_default() += 1;
                    log.push((
                        None,
                        format!("step {step}: Postgres down for {:?}", adv.db_outage),
                    ));
                    episodes.push((Instant::now() + adv.db_outage, Episode::DbDown));
                }
                "nats_outage" => {
                    if let Some(b) = broker.as_deref_mut() {
                        away.begin("nats");
                        b.down().await;
                        *faults.entry("nats_outage").or_default() += 1;
                        log.push((
                            None,
                            format!("step {step}: NATS down for {:?}", adv.nats_outage),
                        ));
                        episodes.push((Instant::now() + adv.nats_outage, Episode::NatsDown));
                    }
                }
                _ => {}
            }
        }

        // The reviewer looks at the review channels now and then, and
        // clicks what is due.
        if step % 3 == 0 {
            reviewing
                .tick(s, &workspaces, &mut reviewer_rng, &mut faults, false)
                .await;
        }
        // Someone rates an answer now and then.
        if step % 4 == 1 {
            rating
                .tick(s, &people, &threads, &mut rating_rng, &mut log)
                .await;
        }
        // A fault on the stream methods, now and then.
        if below(&mut rng, 100) < cfg.stream_fault_percent {
            let (kind, body) = stream_fault(below(&mut rng, STREAM_FAULTS as u64) as usize);
            // (not while Postgres or NATS is away: nothing streams then, and
            // what is armed at the end of the activity is cleared unfired)
            let outage = episodes
                .iter()
                .any(|(_, e)| matches!(e, Episode::DbDown | Episode::NatsDown));
            if !outage {
                fault(s, body).await;
                *faults.entry(kind).or_default() += 1;
                log.push((
                    None,
                    format!("step {step}: the next call armed with {kind}"),
                ));
            }
        }

        let roll = below(&mut rng, 100);
        let pick_thread = |rng: &mut Rng, threads: &Vec<Thread>| {
            (!threads.is_empty()).then(|| below(rng, threads.len() as u64) as usize)
        };
        match roll {
            0..=3 if agent_view => {
                // A person opens the app's Messages tab looking at their
                // channel (and now and then looks at it again, told without
                // the DM as Slack's reference shows it), and asks at the
                // top of the tab: a thread of its own.
                let w = below(&mut rng, workspaces.len() as u64) as usize;
                let text = question(&mut rng, None, step, &format!("what about issue {step}?"));
                let opened = try_ctl(
                    s,
                    "act/agent_open",
                    json!({"user": workspaces[w].user, "app_id": s.app,
                           "channel": workspaces[w].channel}),
                )
                .await;
                let Some(dm) = opened.and_then(|o| Some(o["channel"].as_str()?.to_owned())) else {
                    continue;
                };
                *faults.entry("agent_tab_opened").or_default() += 1;
                if below(&mut rng, 100) < 30 {
                    try_ctl(
                        s,
                        "act/agent_context",
                        json!({"user": workspaces[w].user, "app_id": s.app,
                               "channel": workspaces[w].channel,
                               "without_channel": below(&mut rng, 2) == 0}),
                    )
                    .await;
                    *faults.entry("agent_context_changed").or_default() += 1;
                }
                let p = dm_person(s, &mut people, &mut workspaces[w], w, &dm);
                if let Some(root) = post(s, &people[p], &text, None).await {
                    log.push((
                        Some(root.clone()),
                        format!("step {step}: agent tab question starts thread {root} in {dm}"),
                    ));
                    agent_questions.push((dm.clone(), root.clone()));
                    threads.push(Thread {
                        person: p,
                        root: root.clone(),
                        messages: vec![root.clone()],
                    });
                    if below(&mut rng, 100) < DOUBLE_PERCENT {
                        let after = Duration::from_millis(below(&mut rng, DOUBLE_WITHIN_MS));
                        doubled.insert(root.clone());
                        doubling.push((Instant::now() + after, dm, root.clone(), root));
                    } else if below(&mut burst_rng, 100) < BURST_PERCENT {
                        // Double texting: another message at once, at the
                        // top of the tab (a thread of its own).
                        let more =
                            question(&mut burst_rng, None, step, &format!("and {step}, too?"));
                        if let Some(next) = post(s, &people[p], &more, None).await {
                            *faults.entry("burst").or_default() += 1;
                            log.push((
                                Some(next.clone()),
                                format!("step {step}: {next} follows {root} at once in {dm}"),
                            ));
                            threads.push(Thread {
                                person: p,
                                root: next.clone(),
                                messages: vec![next],
                            });
                        }
                    }
                }
            }
            0..=3 => {
                // A person opens the assistant pane (a new thread in their
                // DM with the app) looking at their channel, and asks.
                let w = below(&mut rng, workspaces.len() as u64) as usize;
                let text = question(&mut rng, None, step, &format!("what about issue {step}?"));
                let opened = try_ctl(
                    s,
                    "act/assistant_open",
                    json!({"user": workspaces[w].user, "app_id": s.app,
                           "context_channel": workspaces[w].channel}),
                )
                .await;
                let Some((dm, root)) = opened.and_then(|o| {
                    Some((
                        o["channel"].as_str()?.to_owned(),
                        o["ts"].as_str()?.to_owned(),
                    ))
                }) else {
                    continue;
                };
                let p = dm_person(s, &mut people, &mut workspaces[w], w, &dm);
                log.push((
                    Some(root.clone()),
                    format!("step {step}: the pane opens thread {root} in {dm}"),
                ));
                let asked = post(s, &people[p], &text, Some(&root)).await;
                threads.push(Thread {
                    person: p,
                    root: root.clone(),
                    messages: asked.iter().cloned().collect(),
                });
                if let Some(ts) = asked {
                    log.push((
                        Some(root.clone()),
                        format!("step {step}: pane question {ts}"),
                    ));
                    if below(&mut rng, 100) < DOUBLE_PERCENT {
                        let after = Duration::from_millis(below(&mut rng, DOUBLE_WITHIN_MS));
                        doubled.insert(ts.clone());
                        doubling.push((Instant::now() + after, dm, ts, root));
                    }
                }
            }
            4..=21 => {
                let p = channels[below(&mut rng, channels.len() as u64) as usize];
                let who = &people[p];
                let text = question(&mut rng, Some(&who.bot), step, &format!("issue {step}?"));
                let root = post(s, who, &text, None).await;
                if let Some(root) = root {
                    log.push((
                        Some(root.clone()),
                        format!(
                            "step {step}: mention starts thread {root} in {}",
                            who.channel
                        ),
                    ));
                    threads.push(Thread {
                        person: p,
                        root: root.clone(),
                        messages: vec![root.clone()],
                    });
                    if below(&mut rng, 100) < DOUBLE_PERCENT {
                        let after = Duration::from_millis(below(&mut rng, DOUBLE_WITHIN_MS));
                        doubled.insert(root.clone());
                        doubling.push((
                            Instant::now() + after,
                            who.channel.clone(),
                            root.clone(),
                            root,
                        ));
                    } else if below(&mut burst_rng, 100) < BURST_PERCENT {
                        // Double texting: another mention at once, at the
                        // top level (a thread of its own).
                        let more = question(
                            &mut burst_rng,
                            Some(&who.bot),
                            step,
                            &format!("and {step}, too?"),
                        );
                        if let Some(next) = post(s, who, &more, None).await {
                            *faults.entry("burst").or_default() += 1;
                            log.push((
                                Some(next.clone()),
                                format!(
                                    "step {step}: {next} follows {root} at once in {}",
                                    who.channel
                                ),
                            ));
                            threads.push(Thread {
                                person: p,
                                root: next.clone(),
                                messages: vec![next],
                            });
                        }
                    }
                }
            }
            22..=55 => {
                let Some(t) = pick_thread(&mut rng, &threads) else {
                    continue;
                };
                let mention = roll >= 42;
                let who = people[threads[t].person].clone();
                let text = match (mention, who.kind) {
                    (true, ScopeKind::Mentions) => question(
                        &mut rng,
                        Some(&who.bot),
                        step,
                        &format!("and now? ({step})"),
                    ),
                    // In the pane every message is a question.
                    (true, _) => question(&mut rng, None, step, &format!("and now? ({step})")),
                    (false, _) => format!("more detail {step}"),
                };
                let root = threads[t].root.clone();
                if let Some(ts) = post(s, &who, &text, Some(&root)).await {
                    threads[t].messages.push(ts.clone());
                    log.push((
                        Some(root.clone()),
                        format!(
                            "step {step}: {} reply {ts}",
                            if mention { "mention" } else { "plain" }
                        ),
                    ));
                    if below(&mut rng, 100) < DOUBLE_PERCENT {
                        let after = Duration::from_millis(below(&mut rng, DOUBLE_WITHIN_MS));
                        doubled.insert(ts.clone());
                        doubling.push((Instant::now() + after, who.channel.clone(), ts, root));
                    }
                }
            }
            56..=65 => {
                let Some(t) = pick_thread(&mut rng, &threads) else {
                    continue;
                };
                if threads[t].messages.is_empty() {
                    continue;
                }
                let m = threads[t].messages
                    [below(&mut rng, threads[t].messages.len() as u64) as usize]
                    .clone();
                if doubled.contains(&m) {
                    continue;
                }
                let who = people[threads[t].person].clone();
                try_ctl(
                    s,
                    "act/edit",
                    json!({"user": who.user, "channel": who.channel, "ts": m,
                                               "text": format!("<@{}> edited at {step}", who.bot)}),
                )
                .await;
                log.push((
                    Some(threads[t].root.clone()),
                    format!("step {step}: edit {m}"),
                ));
            }
            66..=70 => {
                let Some(t) = pick_thread(&mut rng, &threads) else {
                    continue;
                };
                if threads[t].messages.len() < 2 {
                    continue;
                }
                // Never the root: a deleted root leaves nothing to check.
                let k = 1 + below(&mut rng, (threads[t].messages.len() - 1) as u64) as usize;
                if doubled.contains(&threads[t].messages[k]) {
                    continue;
                }
                let m = threads[t].messages.remove(k);
                let who = people[threads[t].person].clone();
                try_ctl(s, "act/delete", json!({"channel": who.channel, "ts": m})).await;
                log.push((
                    Some(threads[t].root.clone()),
                    format!("step {step}: delete {m}"),
                ));
            }
            71..=77 => {
                fault(
                    s,
                    json!({"method": "events", "mode": "hold_past_deadline", "times": 3}),
                )
                .await;
                *faults.entry("slack_retries").or_default() += 1;
                log.push((
                    None,
                    format!("step {step}: the next 3 deliveries count as too late (retries)"),
                ));
            }
            78..=81 => {
                fault(s, json!({"method": "chat.postMessage", "mode": "lost_response", "latency_ms": 1500})).await;
                *faults.entry("post_response_lost").or_default() += 1;
                log.push((
                    None,
                    format!("step {step}: the next post's response is lost"),
                ));
            }
            82..=85 => {
                fault(
                    s,
                    json!({"method": "chat.postMessage", "mode": "ratelimited", "retry_after": 1}),
                )
                .await;
                *faults.entry("post_429").or_default() += 1;
                log.push((None, format!("step {step}: the next post is answered 429")));
            }
            86..=89 => {
                // Slower than the client waits; Slack applies it anyway.
                fault(
                    s,
                    json!({"method": "chat.postMessage", "mode": "latency", "latency_ms": 2500}),
                )
                .await;
                *faults.entry("post_slower_than_timeout").or_default() += 1;
                log.push((
                    None,
                    format!("step {step}: the next post is applied after the client gave up"),
                ));
            }
            _ => {
                // A person replies the moment an answer reaches Slack.
                let p = channels[below(&mut rng, channels.len() as u64) as usize];
                let who = &people[p];
                let question = roll >= 95;
                let text = if question {
                    format!("<@{}> crossing question {step}?", who.bot)
                } else {
                    format!("crossing detail {step}")
                };
                fault(
                    s,
                    json!({"method": "chat.postMessage", "mode": "inject_reply", "user": who.user,
                                 "channel": who.channel, "text": text, "latency_ms": 200}),
                )
                .await;
                *faults
                    .entry(if question {
                        "question_injected_at_post"
                    } else {
                        "reply_injected_at_post"
                    })
                    .or_default() += 1;
                log.push((
                    None,
                    format!(
                        "step {step}: the next post in {} is crossed by a reply",
                        who.channel
                    ),
                ));
            }
        }
        if cfg.events >= 1000 && step > 0 && step % (cfg.events / 10) == 0 {
            eprintln!(
                "  … {step}/{} human events, {:.0} s",
                cfg.events,
                started.elapsed().as_secs_f64()
            );
        }
        // Pace: a mean of `rate` actions a second.
        let mean = 1000.0 / cfg.rate.max(0.1);
        let pause = below(&mut rng, (2.0 * mean) as u64 + 1);
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
    // The copies still due arrive when due.
    double_due(
        s,
        &mut doubling,
        true,
        (&mut log, cfg.events),
        &mut double_rng,
        &mut report,
    )
    .await;
    // Whatever is still under way ends when it is due (an outage lasts
    // its whole length even when the activity ends first).
    episodes.sort_by_key(|(end, _)| *end);
    for (end, e) in std::mem::take(&mut episodes) {
        tokio::time::sleep_until(end.into()).await;
        end_episode(s, broker.as_deref_mut(), e, cfg.events, &mut log, &mut away).await;
    }
    // Kills that had to wait past the last action happen now.
    for w in at
        .into_values()
        .flatten()
        .filter(|w| w.starts_with("kill:"))
    {
        let i = SERVICES
            .iter()
            .position(|x| *x == &w[5..])
            .expect("a service");
        if i == 0 {
            away.begin("gateway");
        }
        if i == 3 {
            publisher_kills.push(now_micros());
        }
        s.kill_and_restart(i).await;
        if i == 0 {
            away.end("gateway");
        }
        *faults.entry("service_killed").or_default() += 1;
        log.push((
            None,
            format!("after the last action: SIGKILL {} and restart", SERVICES[i]),
        ));
    }
    // (people[0]'s channel streams: only every third channel answers whole)
    stream_faults_topped_up(s, &people[0], &mut faults, &mut log).await;
    crate::sim_clear_faults(&s.sim).await;
    set_stream_lifetime(s, SLACK_STREAM_LIFETIME_MS).await;
    let acting = started.elapsed();
    // Settled: nothing open in threadline's records or on the bus, no
    // stream open in Slack, and no review request showing its buttons (the
    // reviewer clicks what is still asked, again when a click was not
    // taken).
    let limit = Duration::from_secs(120 + cfg.events as u64 / 20);
    let unsettled = loop {
        // (a few seconds at a time: the reviewer looks in between)
        let open = crate::quiesce(
            &s.db.pool,
            Some((&s.js, &s.prefix)),
            Duration::from_secs(5),
            Duration::from_secs(3),
        )
        .await;
        let asking = reviewing
            .tick(s, &workspaces, &mut reviewer_rng, &mut faults, true)
            .await;
        let streams = open_streams(s).await;
        if open.is_none() && asking == 0 && streams.is_empty() {
            break None;
        }
        if started.elapsed() - acting >= limit {
            let showing = requests_showing_buttons(s, &workspaces).await;
            break Some(format!(
                "{}; {asking} review request(s) still showing buttons{}; {} stream(s) still open in Slack",
                open.unwrap_or_else(|| "threadline's records settled".to_owned()),
                showing
                    .iter()
                    .map(|r| format!("\n      {r}"))
                    .collect::<String>(),
                streams.len()
            ));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let settling = started.elapsed() - acting;

    let (j, records_verdict) = s.verdict_with_reasons(cfg.grace).await;
    let mut violations = j.violations.clone();
    violations.extend(records_verdict.violations.iter().cloned());
    let mut offending: BTreeSet<(String, String)> = j.offending.clone();
    // The reasons: only those the soak itself caused are expected — a
    // reviewer's rejection (the soak engages no kill switch; a deleted
    // question is explained by Slack). An answer held for lack of
    // evidence, still waiting for review, or dropped for any other reason
    // is a violation.
    let refused = posts_refused_429(s).await;
    let applied = posts_applied(s).await;
    for (q, reason) in &records_verdict.reasons {
        let own = reason
            .strip_prefix("with a later question: ")
            .unwrap_or(reason);
        // (a reason inherited from a later question may be of another
        // thread: the burst's latest, which read this one)
        let thread = (own == reason.as_str()).then_some(q.thread_ts.as_str());
        if own == HELD_NO_EVIDENCE
            && held_by_a_kill_before_its_post(s, &q.channel, thread, &publisher_kills, &applied)
                .await
        {
            // Held for lack of evidence, as designed, when a publisher the
            // soak killed had claimed the post and died before Slack
            // applied it: threadline cannot tell that from a post lost in
            // flight.
            *faults
                .entry("held_after_a_kill_before_its_post")
                .or_default() += 1;
            continue;
        }
        if own.contains(RATE_LIMITED_TOO_OFTEN) {
            // Given up after Slack refused its posts: expected only when
            // Slack refused that many posts in its thread (the soak raises
            // Slack's own post budget out of reach, so every 429 there is
            // one it injected) — for a reason inherited from a burst's
            // latest, in that one's thread.
            let mut answered_in = q.thread_ts.clone();
            if thread.is_none() {
                let mut ts = q.ts.clone();
                // (a burst is a chain: at most as long as the run's questions)
                for _ in 0..1000 {
                    match threadline_store::testing::threads::absorbed_by(
                        &s.db.pool, &q.channel, &ts,
                    )
                    .await
                    {
                        Some(later) => ts = later,
                        None => break,
                    }
                }
                if let Some(root) =
                    threadline_store::testing::threads::root_of(&s.db.pool, &q.channel, &ts).await
                {
                    answered_in = root;
                }
            }
            let n = refused
                .get(&(q.channel.clone(), answered_in))
                .copied()
                .unwrap_or(0);
            if n >= POST_MAX_ATTEMPTS {
                *faults.entry("answer_given_up_after_429s").or_default() += 1;
                continue;
            }
        }
        // Skipped by its workspace's policy: only a question the soak had
        // Slack deliver late, in the workspace that skips them.
        if reason == LATE_SKIPPED
            && late
                .iter()
                .any(|l| l.policy == "skip" && l.channel == q.channel && l.ts == q.ts)
        {
            continue;
        }
        if !own.starts_with("decision rejected:") {
            // (a doubled message: what became of the message kept for its
            // action)
            let kept =
                threadline_store::testing::threads::kept_for(&s.db.pool, &q.channel, &q.ts).await;
            let of_kept = match kept {
                Some(k) => format!(
                    "; kept {k}, which holds: {}",
                    crate::records_of(&s.db.pool, &q.channel, &k).await
                ),
                None => String::new(),
            };
            violations.push((
                "unexpected_reason",
                format!(
                    "question {} in thread {} of {} has no reply for a reason the soak did not cause: {reason}{of_kept}",
                    q.ts, q.thread_ts, q.channel
                ),
            ));
            offending.insert((q.channel.clone(), q.thread_ts.clone()));
        }
    }
    violations.extend(late_answers(s, &late, &mut offending).await);
    let mut roots: BTreeSet<String> = BTreeSet::new();
    violations.extend(records(s, &mut roots).await);
    // Intake that outlives its database: while Postgres alone was away,
    // every delivery was acknowledged (kept in the spool).
    let (during, refused) = refused_with_the_spool_up(s, &away).await;
    *faults
        .entry("deliveries_while_only_postgres_away")
        .or_default() += during;
    violations.extend(refused);
    if let Some(open) = unsettled {
        violations.push(("never_settled", open));
    }
    // Threads the records name by their root alone: their channel is the
    // one the soak started them in.
    for root in roots {
        let channel = threads
            .iter()
            .find(|t| t.root == root)
            .map(|t| people[t.person].channel.clone())
            .unwrap_or_default();
        offending.insert((channel, root));
    }
    let (verdicts, lost) = rating.judge(s).await;
    report.feedback_clicks = rating.taken;
    report.feedback_verdicts = verdicts;
    violations.extend(lost);
    report.stream_faults = stream_faults_fired(s).await;
    report.faults = faults;
    report.replies = j.replies;
    report.questions = j.questions;
    report.answered = j.answered;
    report.whole = j.whole;
    report.approved = j.review_approved_posted;
    report.streamed = j.streamed;
    report.pane = j.pane;
    for (dm, root) in &agent_questions {
        let thread = crate::sim_get(&s.sim, &format!("channels/{dm}/threads/{root}")).await;
        let answered = thread["messages"].as_array().is_some_and(|m| {
            m.iter().any(|m| {
                m["app_id"].is_string()
                    && m["text"]
                        .as_str()
                        .and_then(crate::oracle::answering)
                        .is_some()
            })
        });
        report.agent_tab_answered += usize::from(answered);
    }
    report.ended_early = j.interrupted;
    report.expired = j.expired;
    report.expired_answered = j.expired_finished;
    report.expired_closed = j.expired_closed;
    report.review_requests = j.review_requests;
    report.rejected = j.review_rejected;
    report.crossed = j.crossed.len();
    for (k, v) in &j.explained {
        report.explained.insert((*k).to_owned(), *v);
    }
    report.reasons = records_verdict.by_reason();
    report.acting = acting;
    report.settling = settling;
    report.violations = violations;
    let mut traces = Vec::new();
    for (channel, root) in offending.iter().take(20) {
        let mut t = format!("  trace of thread {root} in {channel} (with the global faults):\n");
        for (thread, line) in &log {
            if thread.as_deref().is_none_or(|r| r == root) {
                t.push_str(&format!("    {line}\n"));
            }
        }
        t.push_str(&slack_shows(s, channel, root).await);
        traces.push(t);
    }
    report.traces = traces;
    report
}

/// People rating answers with their feedback buttons: now and then the
/// person of a thread clicks 👍 or 👎 on an answer Slack shows there
/// (sometimes changing their mind on one they rated before), each click a
/// real `block_actions` through the gateway, through kills and outages.
/// Judged at the end from threadline's records: every (answer, person)
/// with a click the gateway answered 200 holds that person's last click,
/// and nothing else is recorded.
#[derive(Default)]
struct Rating {
    /// The clicks by (decision, user), in order: the verdict, and whether
    /// the gateway took it (answered 200; otherwise it may or may not have
    /// recorded it before it went away).
    clicks: BTreeMap<(String, String), Vec<(String, bool)>>,
    /// Answers rated before, to click again (channel, ts, user).
    rated: Vec<(String, String, String)>,
    taken: usize,
}

impl Rating {
    async fn tick(
        &mut self,
        s: &Stack,
        people: &[Person],
        threads: &[Thread],
        rng: &mut Rng,
        log: &mut Vec<(Option<String>, String)>,
    ) {
        // (a change of mind on an answer rated before, one time in four)
        let again = !self.rated.is_empty() && below(rng, 4) == 0;
        let target = if again {
            Some(self.rated[below(rng, self.rated.len() as u64) as usize].clone())
        } else if threads.is_empty() {
            None
        } else {
            let t = &threads[below(rng, threads.len() as u64) as usize];
            let who = &people[t.person];
            let shown = crate::sim_get(
                &s.sim,
                &format!("channels/{}/threads/{}", who.channel, t.root),
            )
            .await;
            let answers: Vec<String> = shown["messages"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .iter()
                .filter(|m| m["app_id"] == s.app.as_str() && m["deleted"] != true)
                .filter(|m| threadline_domain::feedback::carries_buttons(&m["blocks"]))
                .filter_map(|m| m["ts"].as_str().map(str::to_owned))
                .collect();
            (!answers.is_empty()).then(|| {
                let ts = answers[below(rng, answers.len() as u64) as usize].clone();
                (who.channel.clone(), ts, who.user.clone())
            })
        };
        let Some((channel, ts, user)) = target else {
            return;
        };
        let button = if below(rng, 3) == 0 {
            "negative"
        } else {
            "positive"
        };
        let Some(entry) = try_ctl(
            s,
            "act/click",
            json!({"user": user, "channel": channel, "ts": ts,
                   "action_id": threadline_domain::feedback::FEEDBACK_ACTION, "button": button}),
        )
        .await
        else {
            return;
        };
        let Some(decision) = entry["value"]
            .as_str()
            .and_then(|v| v.strip_prefix(&format!("{button}:")))
        else {
            return;
        };
        // (not answered 200: the gateway away, or killed after it recorded
        // the click; Slack shows the person an error)
        let taken = entry["status"] == 200;
        self.taken += usize::from(taken);
        self.clicks
            .entry((decision.to_owned(), user.clone()))
            .or_default()
            .push((button.to_owned(), taken));
        if !again {
            self.rated.push((channel.clone(), ts.clone(), user));
        }
        log.push((
            None,
            format!("a person rated answer {ts} in {channel}: {button}"),
        ));
    }

    /// How many verdicts are recorded, and a violation for each (answer,
    /// person) whose record is not their last click taken, or that has a
    /// record without a click.
    async fn judge(&self, s: &Stack) -> (usize, Vec<(&'static str, String)>) {
        let recorded = threadline_store::testing::feedback::verdicts(&s.db.pool)
            .await
            .expect("feedback records");
        let got: BTreeMap<(String, String), String> = recorded
            .into_iter()
            .map(|(d, u, v)| ((d.to_string(), u), v))
            .collect();
        let mut violations = Vec::new();
        for (key, clicks) in &self.clicks {
            // What may be recorded: the last click taken, or any click
            // after it whose outcome is unknown; nothing, if none was taken.
            let mut may: Vec<Option<&str>> = Vec::new();
            let mut taken = false;
            for (verdict, took) in clicks.iter().rev() {
                may.push(Some(verdict));
                if *took {
                    taken = true;
                    break;
                }
            }
            if !taken {
                may.push(None);
            }
            let recorded = got.get(key).map(String::as_str);
            if !may.contains(&recorded) {
                violations.push((
                    "feedback_lost",
                    format!(
                        "answer of decision {} rated by {} (clicks {clicks:?}): recorded {recorded:?}",
                        key.0, key.1
                    ),
                ));
            }
        }
        for key in got.keys().filter(|k| !self.clicks.contains_key(*k)) {
            violations.push((
                "feedback_unasked",
                format!(
                    "a verdict on decision {} by {} that no click gave",
                    key.0, key.1
                ),
            ));
        }
        (got.len(), violations)
    }
}

/// What Slack shows of thread `root` of `channel`, one line a message, for
/// a trace: who wrote it, when, its form (a post, a stream and how it
/// ended, a review request), and the question it states with how many
/// messages it read. No message text.
async fn slack_shows(s: &Stack, channel: &str, root: &str) -> String {
    if channel.is_empty() {
        return String::new();
    }
    let thread = crate::sim_get(&s.sim, &format!("channels/{channel}/threads/{root}")).await;
    let mut out = "    what Slack shows of it:\n".to_owned();
    for m in thread["messages"].as_array().cloned().unwrap_or_default() {
        let ts = m["ts"].as_str().unwrap_or_default();
        let created = m["created_at_micros"].as_u64().unwrap_or(0);
        let mut what = if m["app_id"].is_string() {
            let text = m["text"].as_str().unwrap_or_default();
            let form = if m["subtype"] == "assistant_app_thread" {
                "the pane's opening message".to_owned()
            } else if m["stream"].is_object() {
                format!(
                    "stream {} ({}, {} appends{})",
                    m["streaming_state"].as_str().unwrap_or("?"),
                    m["stream"]["ended"].as_str().unwrap_or("open"),
                    m["stream"]["appends"].as_array().map_or(0, Vec::len),
                    if crate::oracle::ended_early(&m) {
                        ", ended early with its closing line"
                    } else {
                        ""
                    }
                )
            } else {
                "post".to_owned()
            };
            let stated = match crate::oracle::stated(text) {
                Some(st) => format!(", answering {} having read {}", st.answering, st.read.len()),
                None => crate::oracle::answering(text)
                    .map(|q| format!(", answering {q} (unfinished)"))
                    .unwrap_or_default(),
            };
            format!("app: {form}{stated}")
        } else {
            format!("{}: message", m["user"].as_str().unwrap_or("?"))
        };
        if let Some(n) = m["edits"].as_array().map(Vec::len).filter(|n| *n > 0) {
            what.push_str(&format!(", edited {n}×"));
        }
        if m["deleted"] == true {
            what.push_str(", deleted");
        }
        out.push_str(&format!("      {ts} (at {created} µs) {what}\n"));
    }
    out
}

/// The review requests that still show their buttons, each with what
/// threadline recorded of its decision and request.
async fn requests_showing_buttons(s: &Stack, workspaces: &[Ws]) -> Vec<String> {
    let mut out = Vec::new();
    for w in workspaces {
        let msgs = crate::sim_get(&s.sim, &format!("channels/{}/messages", w.review)).await;
        for m in msgs["messages"].as_array().cloned().unwrap_or_default() {
            let buttons = m["blocks"]
                .as_array()
                .is_some_and(|b| b.iter().any(|b| b["type"] == "actions"));
            if m["app_id"].as_str() != Some(s.app.as_str()) || !buttons || m["deleted"] == true {
                continue;
            }
            let ts = m["ts"].as_str().unwrap_or_default();
            let decision = m
                .pointer("/metadata/event_payload/decision_id")
                .and_then(Value::as_str)
                .and_then(|d| uuid::Uuid::parse_str(d).ok());
            let record = match decision {
                Some(id) => {
                    threadline_store::testing::decisions::review_request_record(&s.db.pool, id)
                        .await
                        .unwrap_or_else(|e| format!("unreadable: {e}"))
                }
                None => "no decision in its metadata".to_owned(),
            };
            out.push(format!("{} {ts}: {record}", w.review));
        }
    }
    out
}

/// The error an intent is given up with after Slack refused
/// [`POST_MAX_ATTEMPTS`] of its posts with 429.
const RATE_LIMITED_TOO_OFTEN: &str = "rate_limited_too_often";
/// `THREADLINE_POST_MAX_ATTEMPTS` as the soak runs it (the default).
const POST_MAX_ATTEMPTS: usize = 5;

/// The reason threadline's records give for a reply held because reading
/// the thread found no evidence of its post.
const HELD_NO_EVIDENCE: &str = "reply held:no_evidence_of_post";

/// When Slack received each post or stream start it applied, by thread
/// (channel, root): µs since the Unix epoch.
async fn posts_applied(s: &Stack) -> BTreeMap<(String, String), Vec<u64>> {
    let mut at: BTreeMap<(String, String), Vec<u64>> = BTreeMap::new();
    for method in ["chat.postMessage", "chat.startStream"] {
        let calls = crate::sim_get(&s.sim, &format!("calls?method={method}")).await;
        for c in calls["calls"].as_array().cloned().unwrap_or_default() {
            if !c["effect"].as_str().unwrap_or("").starts_with("applied") {
                continue;
            }
            if let (Some(channel), Some(thread), Some(received)) = (
                c["channel"].as_str(),
                c["thread_ts"].as_str(),
                c["received_at_micros"].as_u64(),
            ) {
                at.entry((channel.to_owned(), thread.to_owned()))
                    .or_default()
                    .push(received);
            }
        }
    }
    at
}

/// Whether a reply held for want of evidence in this thread (any of the
/// channel's when `None`) is one the soak caused: an intent held so was
/// claimed at most [`KILL_AFTER_CLAIM_MICROS`] before a publisher kill,
/// and Slack applied no post or stream start in its thread from its claim
/// on (so the killed publisher died before its post, and threadline
/// rightly cannot tell).
async fn held_by_a_kill_before_its_post(
    s: &Stack,
    channel: &str,
    thread: Option<&str>,
    publisher_kills: &[u64],
    applied: &BTreeMap<(String, String), Vec<u64>>,
) -> bool {
    let held =
        threadline_store::testing::intents::held_without_evidence(&s.db.pool, channel, thread)
            .await
            .expect("the held intents of a thread");
    held.into_iter().any(|(root, claimed)| {
        let Some(claimed) = claimed.map(|c| c.max(0) as u64) else {
            return false;
        };
        let posts = applied
            .get(&(channel.to_owned(), root))
            .map(Vec::as_slice)
            .unwrap_or_default();
        publisher_kills
            .iter()
            .any(|k| *k >= claimed && *k - claimed <= KILL_AFTER_CLAIM_MICROS)
            && posts.iter().all(|p| *p < claimed)
    })
}

/// How long after its claim a publisher kill can have interrupted a post
/// (the claim, a freeze of the publisher, Slack's timeout): later, the
/// post had its outcome.
const KILL_AFTER_CLAIM_MICROS: u64 = 60_000_000;

/// How many `chat.postMessage` calls Slack answered 429, by (channel,
/// thread), from its call log.
async fn posts_refused_429(s: &Stack) -> BTreeMap<(String, String), usize> {
    let calls = crate::sim_get(&s.sim, "calls?method=chat.postMessage").await;
    let mut refused = BTreeMap::new();
    for c in calls["calls"].as_array().cloned().unwrap_or_default() {
        if c["http_status"].as_u64() != Some(429) {
            continue;
        }
        let (Some(channel), Some(thread)) = (c["channel"].as_str(), c["thread_ts"].as_str()) else {
            continue;
        };
        *refused
            .entry((channel.to_owned(), thread.to_owned()))
            .or_default() += 1;
    }
    refused
}

/// How many kinds of fault the soak arms on the stream methods.
const STREAM_FAULTS: usize = 5;

/// The `i`th kind of fault on the stream methods: its name in the
/// soak's counts (`stream_` and its name in Slack's call log) and what
/// arms it for the next call.
fn stream_fault(i: usize) -> (&'static str, Value) {
    match i {
        0 => (
            "stream_stop_429",
            json!({"method": "chat.stopStream", "mode": "ratelimited", "retry_after": 1}),
        ),
        1 => (
            "stream_append_429",
            json!({"method": "chat.appendStream", "mode": "ratelimited", "retry_after": 1}),
        ),
        2 => (
            "stream_start_response_lost",
            json!({"method": "chat.startStream", "mode": "lost_response", "latency_ms": 1500}),
        ),
        3 => (
            "stream_stop_response_lost",
            json!({"method": "chat.stopStream", "mode": "lost_response", "latency_ms": 1500}),
        ),
        _ => (
            "stream_start_503_not_applied",
            json!({"method": "chat.startStream", "mode": "http_error", "status": 503, "applied": false}),
        ),
    }
}

/// Every armable stream fault fires in every run: one armed late may meet
/// no call of its method before the activity ends (its arming is then
/// cleared unfired), and one armed behind another on the same method waits
/// its turn. Each that has not fired yet is armed again and one more
/// question is asked where answers stream, until Slack's call log shows it
/// fired (or a minute passes: the run's check then names it).
async fn stream_faults_topped_up(
    s: &Stack,
    who: &Person,
    faults: &mut BTreeMap<&'static str, usize>,
    log: &mut Vec<(Option<String>, String)>,
) {
    for i in 0..STREAM_FAULTS {
        let (kind, body) = stream_fault(i);
        let fired_as = &kind["stream_".len()..];
        if stream_faults_fired(s).await.contains_key(fired_as) {
            continue;
        }
        fault(s, body).await;
        *faults.entry(kind).or_default() += 1;
        let text = format!("<@{}> one more streamed answer, for {kind}?", who.bot);
        let asked = post(s, who, &text, None).await;
        log.push((
            asked.clone(),
            format!(
                "after the last action: {kind} armed again, and a question asked in {}",
                who.channel
            ),
        ));
        let until = Instant::now() + Duration::from_secs(60);
        while Instant::now() < until && !stream_faults_fired(s).await.contains_key(fired_as) {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

/// The stream faults that fired, from Slack's call log: 429s on appends
/// and stops (Slack's own tiers are out of reach), lost responses of
/// starts and stops, starts answered 503 and not applied, and appends or
/// stops Slack refused because it had expired the stream.
async fn stream_faults_fired(s: &Stack) -> BTreeMap<&'static str, usize> {
    let mut fired = BTreeMap::new();
    for method in ["chat.startStream", "chat.appendStream", "chat.stopStream"] {
        let calls = crate::sim_get(&s.sim, &format!("calls?method={method}")).await;
        for c in calls["calls"].as_array().cloned().unwrap_or_default() {
            let kind = match (
                method,
                c["http_status"].as_u64(),
                c["effect"].as_str(),
                c["outcome"].as_str(),
            ) {
                ("chat.stopStream", Some(429), _, _) => "stop_429",
                ("chat.appendStream", Some(429), _, _) => "append_429",
                ("chat.startStream", _, Some("applied_response_lost"), _) => "start_response_lost",
                ("chat.stopStream", _, Some("applied_response_lost"), _) => "stop_response_lost",
                ("chat.startStream", Some(503), Some("not_applied"), _) => "start_503_not_applied",
                (_, _, _, Some("message_not_in_streaming_state")) => "not_in_streaming_state",
                _ => continue,
            };
            *fired.entry(kind).or_default() += 1;
        }
    }
    fired
}

/// The app's streams open in Slack now, in the conversations the oracle
/// judges: (channel, ts).
async fn open_streams(s: &Stack) -> Vec<(String, String)> {
    let mut open = Vec::new();
    for scope in s.scopes() {
        if scope.kind == ScopeKind::Review {
            continue;
        }
        let msgs = crate::sim_get(&s.sim, &format!("channels/{}/messages", scope.channel)).await;
        for m in msgs["messages"].as_array().cloned().unwrap_or_default() {
            if m["streaming_state"] == "in_progress" {
                open.push((
                    scope.channel.clone(),
                    m["ts"].as_str().unwrap_or_default().to_owned(),
                ));
            }
        }
    }
    open
}

/// Waits (up to 4 s) until a stream is open in Slack; whether one is.
async fn wait_for_stream(s: &Stack) -> bool {
    let until = Instant::now() + Duration::from_secs(4);
    while Instant::now() < until {
        if !open_streams(s).await.is_empty() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

/// How long Slack keeps a stream open.
async fn set_stream_lifetime(s: &Stack, ms: u64) {
    try_ctl(s, "settings", json!({"stream_lifetime_ms": ms})).await;
}

/// A reviewer's click to send.
struct Click {
    user: String,
    channel: String,
    ts: String,
    approve: bool,
}

/// The simulated reviewers: each request that shows its buttons is
/// clicked by its workspace's reviewer — Approve mostly, Reject sometimes,
/// sometimes late (the thread may have moved on and the request been
/// decided meanwhile), sometimes twice, sometimes after a click of a member
/// who is not a reviewer — and clicked again while it still shows its
/// buttons well after the last click (a click the gateway did not take:
/// killed, frozen, or the database away).
#[derive(Default)]
struct Reviewing {
    /// Requests seen, by (channel, ts): the verdict chosen, and when the
    /// last click was (or is) due.
    seen: BTreeMap<(String, String), (bool, Instant)>,
    queue: Vec<(Instant, Click)>,
}

impl Reviewing {
    /// Looks at every review channel, plans clicks for new requests,
    /// clicks again where a click was not taken (after 10 s; 3 s once the
    /// activity ended, `settling`), and sends the clicks due. Returns how
    /// many requests show their buttons.
    async fn tick(
        &mut self,
        s: &Stack,
        workspaces: &[Ws],
        rng: &mut Rng,
        faults: &mut BTreeMap<&'static str, usize>,
        settling: bool,
    ) -> usize {
        let now = Instant::now();
        let mut showing = 0;
        for w in workspaces {
            let msgs = crate::sim_get(&s.sim, &format!("channels/{}/messages", w.review)).await;
            for m in msgs["messages"].as_array().cloned().unwrap_or_default() {
                let buttons = m["blocks"]
                    .as_array()
                    .is_some_and(|b| b.iter().any(|b| b["type"] == "actions"));
                if m["app_id"].as_str() != Some(s.app.as_str()) || !buttons || m["deleted"] == true
                {
                    continue;
                }
                showing += 1;
                let ts = m["ts"].as_str().unwrap_or_default().to_owned();
                let key = (w.review.clone(), ts.clone());
                let click = |user: &str, approve: bool| Click {
                    user: user.to_owned(),
                    channel: w.review.clone(),
                    ts: ts.clone(),
                    approve,
                };
                match self.seen.get_mut(&key) {
                    None => {
                        // (the first request of a run is rejected, in time)
                        let first = self.seen.is_empty();
                        let approve = below(rng, 100) >= 20 && !first;
                        let late = below(rng, 100) < 15 && !first;
                        let twice = below(rng, 100) < 15;
                        let stranger = below(rng, 100) < 10;
                        let at = now
                            + Duration::from_millis(if late {
                                8000 + below(rng, 7000)
                            } else {
                                300 + below(rng, 1700)
                            });
                        if stranger {
                            // Someone who is not a reviewer clicks first: refused.
                            self.queue
                                .push((at - Duration::from_millis(200), click(&w.other, true)));
                            *faults.entry("review_click_by_non_reviewer").or_default() += 1;
                        }
                        self.queue.push((at, click(&w.reviewer, approve)));
                        let mut last = at;
                        if twice {
                            last = at + Duration::from_millis(150);
                            self.queue.push((last, click(&w.reviewer, approve)));
                            *faults.entry("review_double_click").or_default() += 1;
                        }
                        *faults
                            .entry(if approve {
                                "review_approve"
                            } else {
                                "review_reject"
                            })
                            .or_default() += 1;
                        if late {
                            *faults.entry("review_late_click").or_default() += 1;
                        }
                        self.seen.insert(key, (approve, last));
                    }
                    Some((approve, last)) => {
                        let again = if settling { 3 } else { 10 };
                        if now > *last + Duration::from_secs(again) {
                            self.queue.push((now, click(&w.reviewer, *approve)));
                            *last = now;
                            *faults.entry("review_click_again").or_default() += 1;
                        }
                    }
                }
            }
        }
        let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.queue)
            .into_iter()
            .partition(|(at, _)| *at <= now);
        self.queue = later;
        for (_, c) in due {
            let url = format!("{}/_sim/act/click", s.sim.base_url);
            let body = json!({"user": c.user, "channel": c.channel, "ts": c.ts,
            "action_id": if c.approve {
                threadline_domain::review::APPROVE_ACTION
            } else {
                threadline_domain::review::REJECT_ACTION
            }});
            // Sent once, as Slack does, without holding up the people.
            tokio::spawn(async move {
                let _ = reqwest::Client::new().post(url).json(&body).send().await;
            });
        }
        showing
    }
}

async fn end_episode(
    s: &Stack,
    broker: Option<&mut crate::broker::Broker>,
    e: Episode,
    step: usize,
    log: &mut Vec<(Option<String>, String)>,
    away: &mut Away,
) {
    match e {
        Episode::Paused { service, pid } => {
            signal(pid, "CONT");
            if service == 0 {
                away.end("gateway");
            }
            log.push((None, format!("step {step}: SIGCONT {}", SERVICES[service])));
        }
        Episode::DbDown => {
            s.db.bring_up().await;
            away.end("postgres");
            log.push((None, format!("step {step}: Postgres back")));
        }
        Episode::NatsDown => {
            if let Some(b) = broker {
                b.up().await;
                away.end("nats");
                log.push((None, format!("step {step}: NATS back")));
            }
        }
        Episode::Expiring => {
            set_stream_lifetime(s, SLACK_STREAM_LIFETIME_MS).await;
            log.push((None, format!("step {step}: Slack's stream lifetime back")));
        }
    }
}

/// Acknowledged work not finished (for the log); -1 while Postgres is away.
async fn in_flight(s: &Stack) -> i64 {
    threadline_store::testing::receipts::in_flight_total(&s.db.pool)
        .await
        .unwrap_or(-1)
}

async fn try_ctl(s: &Stack, path: &str, body: Value) -> Option<Value> {
    let r = reqwest::Client::new()
        .post(format!("{}/_sim/{path}", s.sim.base_url))
        .json(&body)
        .send()
        .await
        .ok()?;
    if !r.status().is_success() {
        return None;
    }
    r.json().await.ok()
}

async fn fault(s: &Stack, body: Value) {
    try_ctl(s, "faults", body).await;
}

async fn post(s: &Stack, who: &Person, text: &str, thread: Option<&str>) -> Option<String> {
    let mut body = json!({"user": who.user, "channel": who.channel, "text": text});
    if let Some(t) = thread {
        body["thread_ts"] = t.into();
    }
    try_ctl(s, "act/post", body)
        .await
        .and_then(|v| v["ts"].as_str().map(str::to_owned))
}

/// What Slack cannot show, from threadline's records.
async fn records(s: &Stack, offending: &mut BTreeSet<String>) -> Vec<(&'static str, String)> {
    let mut violations = Vec::new();
    let pool = &s.db.pool;
    // Every delivery the gateway acknowledged has its receipt, and every
    // receipt reached a terminal state.
    let acked: BTreeSet<String> = crate::sim_get(&s.sim, "deliveries").await["deliveries"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|d| {
            d["status"]
                .as_u64()
                .is_some_and(|c| (200..300).contains(&c))
        })
        .filter_map(|d| d["event_id"].as_str().map(str::to_owned))
        .collect();
    let receipts: BTreeMap<String, (String, Option<String>)> =
        threadline_store::testing::receipts::receipt_outcomes(pool)
            .await
            .unwrap_or_default()
            .into_iter()
            .map(|r| (r.event_id, (r.state, r.thread_ts)))
            .collect();
    for event in &acked {
        match receipts.get(event) {
            None => violations.push((
                "lost_event",
                format!("acknowledged event {event} has no receipt"),
            )),
            Some((state, thread)) if state == "accepted" || state == "processing" => {
                violations.push((
                    "unfinished_event",
                    format!("event {event} never finished ({state})"),
                ));
                if let Some(t) = thread {
                    offending.insert(t.clone());
                }
            }
            _ => {}
        }
    }
    let outbox = threadline_store::testing::outbox::count_outbox(pool)
        .await
        .unwrap_or(-1);
    if outbox != 0 {
        violations.push(("stuck", format!("{outbox} outbox rows never published")));
    }
    let stuck = threadline_store::testing::decisions::stuck_work(pool)
        .await
        .unwrap_or_default();
    for threadline_store::testing::decisions::StuckWork {
        what,
        state,
        root_ts: root,
    } in stuck
    {
        violations.push(("stuck", format!("{what} stuck in {state} (thread {root})")));
        offending.insert(root);
    }
    let unreconsidered =
        threadline_store::testing::threads::count_unreconsidered_crossed_answers(pool)
            .await
            .unwrap_or(-1);
    if unreconsidered != 0 {
        violations.push((
            "crossed_not_reconsidered",
            format!(
                "{unreconsidered} answers recorded as crossed in flight were never reconsidered"
            ),
        ));
    }
    // No fault here is poison: a dead letter means work was given up.
    let dlq = threadline_runtime::bus::Topology::new(s.prefix.clone()).dead_letter_stream();
    let dead = threadline_testkit::stream_len(&s.js, &dlq).await;
    if dead > 0 {
        violations.push(("dead_letter", format!("{dead} message(s) dead-lettered")));
    }
    violations
}
