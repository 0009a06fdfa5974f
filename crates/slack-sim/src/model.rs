//! The emulator's world: workspaces, users, channels, apps and their
//! installations, messages, and the logs tests judge by. In memory, behind
//! one lock; every id comes from a seeded generator so a scenario replays
//! the same way.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;
use serde_json::Value;

/// SplitMix64: small, seedable, good enough for ids and fault dice.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// `len` characters of [0-9A-Z], as Slack ids use.
    pub fn id(&mut self, prefix: &str, len: usize) -> String {
        const ALPHABET: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ";
        let mut s = String::with_capacity(prefix.len() + len);
        s.push_str(prefix);
        for _ in 0..len {
            s.push(ALPHABET[(self.next_u64() % ALPHABET.len() as u64) as usize] as char);
        }
        s
    }

    pub fn hex(&mut self, len: usize) -> String {
        let mut s = String::with_capacity(len);
        while s.len() < len {
            s.push_str(&format!("{:016x}", self.next_u64()));
        }
        s.truncate(len);
        s
    }

    /// True with probability `p` (0..=1).
    pub fn chance(&mut self, p: f64) -> bool {
        (self.next_u64() as f64 / u64::MAX as f64) < p
    }
}

pub fn now_unix() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

pub fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// Message timestamps: unique per workspace and strictly increasing, close
/// to the wall clock like Slack's.
#[derive(Debug, Default)]
pub struct TsClock {
    last: u64,
}

impl TsClock {
    pub fn next_ts(&mut self) -> String {
        let now = now_micros().max(self.last + 1);
        self.last = now;
        format!("{}.{:06}", now / 1_000_000, now % 1_000_000)
    }
}

/// A Slack timestamp as (seconds, microseconds), ordered numerically.
pub type TsKey = (u64, u64);

/// Compares Slack timestamps numerically.
pub fn ts_key(ts: &str) -> TsKey {
    let (a, b) = ts.split_once('.').unwrap_or((ts, "0"));
    (a.parse().unwrap_or(0), b.parse().unwrap_or(0))
}

#[derive(Debug, Clone, Serialize)]
pub struct Team {
    pub id: String,
    pub name: String,
    pub domain: String,
    pub enterprise_id: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct User {
    pub id: String,
    pub team_id: String,
    pub name: String,
    pub is_bot: bool,
    /// For bot users: the bot and app behind them.
    pub bot_id: Option<String>,
    pub app_id: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChannelKind {
    Public,
    Private,
    Im,
    Mpim,
}

impl ChannelKind {
    /// `channel_type` in message events.
    pub fn channel_type(self) -> &'static str {
        match self {
            ChannelKind::Public => "channel",
            ChannelKind::Private => "group",
            ChannelKind::Im => "im",
            ChannelKind::Mpim => "mpim",
        }
    }

    /// The `message.*` subscription that carries messages of this kind.
    pub fn message_subscription(self) -> &'static str {
        match self {
            ChannelKind::Public => "message.channels",
            ChannelKind::Private => "message.groups",
            ChannelKind::Im => "message.im",
            ChannelKind::Mpim => "message.mpim",
        }
    }

    /// The scope needed to read history of this kind.
    pub fn history_scope(self) -> &'static str {
        match self {
            ChannelKind::Public => "channels:history",
            ChannelKind::Private => "groups:history",
            ChannelKind::Im => "im:history",
            ChannelKind::Mpim => "mpim:history",
        }
    }

    pub fn id_prefix(self) -> &'static str {
        match self {
            ChannelKind::Public => "C",
            ChannelKind::Private | ChannelKind::Mpim => "G",
            ChannelKind::Im => "D",
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Channel {
    pub id: String,
    pub team_id: String,
    pub name: String,
    pub kind: ChannelKind,
    pub is_ext_shared: bool,
    pub is_archived: bool,
    pub members: BTreeSet<String>,
    pub created: i64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Install {
    /// The workspace, or for an org-wide install the enterprise (`E…`):
    /// the key of `App::installs`.
    pub team_id: String,
    /// Installed org-wide: the bot sees every workspace of the enterprise.
    pub is_enterprise_install: bool,
    pub bot_user_id: String,
    pub bot_id: String,
    pub bot_token: String,
    pub scopes: BTreeSet<String>,
    pub refresh_token: Option<String>,
    pub expires_at: Option<i64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct App {
    pub id: String,
    pub name: String,
    #[serde(skip)]
    pub signing_secret: String,
    pub client_id: String,
    #[serde(skip)]
    pub client_secret: String,
    /// Verification token carried in envelopes (deprecated by Slack, still sent).
    pub verification_token: String,
    /// App-level token (`xapp-…`) for `apps.event.authorizations.list`
    /// and `apps.connections.open`.
    pub app_token: String,
    /// Events API request URLs; normally only the first is used.
    pub request_urls: Vec<String>,
    /// Socket Mode on: events and interactions go over the app's
    /// WebSocket connections (`apps.connections.open`), not its URLs.
    pub socket_mode: bool,
    /// Interactivity request URL: where a person's clicks on the app's
    /// buttons go as `block_actions` payloads (none: they go nowhere).
    pub interactivity_url: Option<String>,
    /// Bot event subscriptions: `app_mention`, `message.channels`, …
    pub events: BTreeSet<String>,
    /// Token rotation on: tokens expire and come with refresh tokens.
    pub token_rotation: bool,
    /// A non-Marketplace app created after May 2025: `conversations.replies`
    /// and `conversations.history` are limited to 1 request a minute and 15
    /// messages.
    pub non_marketplace_limits: bool,
    /// Which AI messaging experience the app has (`features.agent_view`
    /// or `features.assistant_view` in its manifest).
    pub experience: Experience,
    pub installs: BTreeMap<String, Install>,
}

/// An app's AI messaging experience: Slack's agent messaging experience
/// (`agent_view`, the only one a new app gets), whose Messages tab is the
/// person's DM with the app, or the assistant pane (`assistant_view`, kept
/// for existing apps). slack-sim's apps default to `assistant_view`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Experience {
    #[default]
    AssistantView,
    AgentView,
}

#[derive(Debug, Clone, Serialize)]
pub struct Message {
    pub channel: String,
    pub ts: String,
    pub user: Option<String>,
    pub bot_id: Option<String>,
    pub app_id: Option<String>,
    /// Legacy `bot_message` username.
    pub username: Option<String>,
    pub subtype: Option<String>,
    pub text: String,
    pub thread_ts: Option<String>,
    pub blocks: Option<Value>,
    /// Legacy secondary attachments, as posted.
    pub attachments: Option<Value>,
    pub metadata: Option<Value>,
    pub edited: Option<(String, String)>,
    pub deleted: bool,
    pub client_msg_id: Option<String>,
    /// Inspection only (never in Web API answers or events): when the
    /// message was created, when it was deleted, and every edit in order
    /// (`text` above is the current text).
    pub created_at_micros: u64,
    pub deleted_at_micros: Option<u64>,
    pub edits: Vec<Edit>,
    /// The text as first posted (before any edit).
    pub original_text: String,
    /// A streamed message's `streaming_state` as the Web API and events
    /// show it: `in_progress` from `chat.startStream`, `completed` after
    /// `chat.stopStream` (or the person's Stop), `errored` once the stream
    /// expired unstopped. `None` for a message that was never streamed.
    pub streaming_state: Option<String>,
    /// Inspection only: how the stream went (`None` when never streamed).
    pub stream: Option<Stream>,
}

/// An ephemeral message: shown to one person in a conversation, never in
/// its history and never announced by events.
#[derive(Debug, Clone, Serialize)]
pub struct Ephemeral {
    pub channel: String,
    /// The one person who sees it.
    pub user: String,
    pub ts: String,
    /// The thread it shows in, if any.
    pub thread_ts: Option<String>,
    pub text: String,
    pub blocks: Option<Value>,
    /// The app and bot it shows as from.
    pub app_id: String,
    pub bot_id: String,
    /// How it was sent: `response_url`.
    pub via: String,
    pub created_at_micros: u64,
}

/// How a streamed message went, for inspection (never in Web API answers).
#[derive(Debug, Clone, Serialize)]
pub struct Stream {
    /// What the stream carries its text in: `markdown_text` or `chunks`,
    /// set by the first call that carried content (an empty start, as the
    /// SDK helpers send for short replies, sets nothing).
    pub mode: Option<String>,
    pub recipient_user_id: Option<String>,
    pub recipient_team_id: Option<String>,
    pub started_at_micros: u64,
    /// `chat.appendStream` calls applied.
    pub appends: u32,
    /// Chunks other than text (`task_update`, `plan_update`, `blocks`), in
    /// the order received.
    pub other_chunks: Vec<Value>,
    /// How its tasks show: `timeline` (task cards) or `plan` (one plan
    /// block), from the start's `task_display_mode`.
    pub task_display_mode: String,
    /// Its tasks, one per `id` in the order first seen; a later update of
    /// an id replaces the fields it carries (the latest status wins).
    pub tasks: Vec<Value>,
    /// The plan's title, from the latest `plan_update`.
    pub plan_title: Option<String>,
    pub ended_at_micros: Option<u64>,
    /// How it ended: `stopped` (`chat.stopStream`), `stopped_by_user` (the
    /// person pressed Stop), `expired` (still open at the lifetime) or
    /// `deleted` (deleted while open).
    pub ended: Option<String>,
}

/// One edit of a message, for inspection.
#[derive(Debug, Clone, Serialize)]
pub struct Edit {
    /// The text after the edit.
    pub text: String,
    /// The `ts` of the edit's `message_changed` event.
    pub edit_ts: String,
    pub at_micros: u64,
}

impl Message {
    /// `edited` as Slack shows it, in the Web API and in events: who edited
    /// it last and when, in whole seconds (`"1665102362.000000"`), so two
    /// edits within a second show the same time.
    pub fn edited_json(&self) -> Option<Value> {
        let (user, ts) = self.edited.as_ref()?;
        let secs = ts.split('.').next().unwrap_or(ts);
        Some(serde_json::json!({"user": user, "ts": format!("{secs}.000000")}))
    }

    /// The message as the Web API returns it.
    /// The tombstone Slack keeps in place of a thread's root deleted while
    /// it has replies ("This message was deleted.", by USLACKBOT).
    pub fn tombstone(&self, reply_count: usize) -> Value {
        serde_json::json!({
            "type": "message", "subtype": "tombstone", "text": "This message was deleted.",
            "user": "USLACKBOT", "hidden": true, "ts": self.ts, "thread_ts": self.ts,
            "parent_user_id": "USLACKBOT", "reply_count": reply_count,
            "is_locked": false, "subscribed": false
        })
    }

    pub fn to_api(
        &self,
        parent_user: Option<&str>,
        reply_count: usize,
        include_metadata: bool,
    ) -> Value {
        let mut m = serde_json::json!({"type": "message", "text": self.text, "ts": self.ts});
        let o = m.as_object_mut().expect("object");
        if let Some(u) = &self.user {
            o.insert("user".into(), u.clone().into());
        }
        if let Some(b) = &self.bot_id {
            o.insert("bot_id".into(), b.clone().into());
        }
        if let Some(a) = &self.app_id {
            o.insert("app_id".into(), a.clone().into());
        }
        if let Some(n) = &self.username {
            o.insert("username".into(), n.clone().into());
        }
        if let Some(s) = &self.subtype {
            o.insert("subtype".into(), s.clone().into());
        }
        if let Some(t) = &self.thread_ts {
            o.insert("thread_ts".into(), t.clone().into());
            if t != &self.ts
                && let Some(p) = parent_user
            {
                o.insert("parent_user_id".into(), p.into());
            }
        }
        if reply_count > 0 {
            o.insert("reply_count".into(), reply_count.into());
            o.insert("thread_ts".into(), self.ts.clone().into());
        }
        if let Some(b) = &self.blocks {
            o.insert("blocks".into(), b.clone());
        }
        if let Some(a) = &self.attachments {
            o.insert("attachments".into(), a.clone());
        }
        if let Some(c) = &self.client_msg_id {
            o.insert("client_msg_id".into(), c.clone().into());
        }
        if let Some(e) = self.edited_json() {
            o.insert("edited".into(), e);
        }
        if include_metadata && let Some(md) = &self.metadata {
            o.insert("metadata".into(), md.clone());
        }
        if let Some(s) = &self.streaming_state {
            o.insert("streaming_state".into(), s.clone().into());
        }
        m
    }
}

/// One Web API call as received (identifiers and outcome only).
#[derive(Debug, Clone, Serialize)]
pub struct CallRecord {
    pub seq: u64,
    pub method: String,
    pub team_id: Option<String>,
    pub app_id: Option<String>,
    pub channel: Option<String>,
    pub thread_ts: Option<String>,
    pub http_status: u16,
    /// `ok` or Slack's error code.
    pub outcome: String,
    /// What the emulator did: `applied`, `not_applied`,
    /// `applied_response_lost`, `applied_connection_reset`, or
    /// `applied_client_gone` (applied after the client had hung up).
    pub effect: String,
    /// When the call was answered (or given up on) and recorded.
    pub at_micros: u64,
    /// When the request arrived, before any fault latency.
    pub received_at_micros: u64,
    /// For an applied `chat.postMessage` / `chat.update` / `chat.delete` /
    /// `chat.*Stream`: the message it created or touched.
    pub ts: Option<String>,
    /// For an `inject_reply` fault: the human reply posted when the call
    /// arrived.
    pub injected_ts: Option<String>,
    /// For `chat.postMessage` / `chat.update`: the `unfurl_links` and
    /// `unfurl_media` arguments as sent (`None`: not sent, so Slack's
    /// defaults apply, which unfurl media).
    pub unfurl_links: Option<bool>,
    pub unfurl_media: Option<bool>,
}

/// One delivery attempt of an event to an app.
#[derive(Debug, Clone, Serialize)]
pub struct DeliveryRecord {
    pub event_id: String,
    pub app_id: String,
    pub event_type: String,
    pub url: String,
    pub attempt: u32,
    pub retry_reason: Option<String>,
    /// HTTP status, or none for a timeout / connection failure.
    pub status: Option<u16>,
    pub result: String,
    /// When the attempt's outcome was known.
    pub at_micros: u64,
    /// When the attempt was sent.
    pub sent_at_micros: u64,
    /// The conversation the event is about (none for lifecycle events).
    pub channel: Option<String>,
    /// The message the event is about: `ts` of a new message or
    /// `app_mention`, `message.ts` of `message_changed`, `deleted_ts` of
    /// `message_deleted`.
    pub message_ts: Option<String>,
    /// The event's `subtype`, if any.
    pub subtype: Option<String>,
    /// Socket Mode (`url` is `socket`): the envelope's id (none when no
    /// connection was open), the connection it went over, and the one its
    /// ack came back on.
    pub envelope_id: Option<String>,
    pub connection: Option<u64>,
    pub ack_connection: Option<u64>,
}

/// One interaction sent to an app: a person's click on a button of the
/// app's message, sent once (Slack does not retry interactions).
#[derive(Debug, Clone, Serialize)]
pub struct InteractionRecord {
    /// 1, 2, … in the order the interactions' outcomes were known.
    pub id: u64,
    pub app_id: String,
    /// The workspace the click happened in.
    pub team_id: String,
    pub user: String,
    pub channel: String,
    pub message_ts: String,
    pub action_id: String,
    /// The button's `value` (none when it has none).
    pub value: Option<String>,
    pub status: InteractionStatus,
    /// From sending the request to its outcome.
    pub elapsed_ms: u64,
}

/// How the app answered an interaction: its HTTP status, or `timeout` (no
/// answer within the deadline) or `connect_error`; in Socket Mode,
/// `acked`, `ack_timeout`, `connection_closed` or `no_connection`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum InteractionStatus {
    Http(u16),
    Failed(&'static str),
    Socket(&'static str),
}

/// A fault armed by `POST /_sim/faults`. Each matching call takes at most
/// one fault (the first armed that matches).
///
/// `latency` always applies the call: the wait and the call run to
/// completion even when the client gives up and closes the connection
/// meanwhile (Slack keeps processing a request whose client went away);
/// such a call is recorded with effect `applied_client_gone`.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Fault {
    /// A Web API method name, `events` for Events API deliveries, or
    /// `socket` for Socket Mode envelopes of events.
    pub method: String,
    pub mode: FaultMode,
    /// How many calls it affects (default 1); `0` for every call until cleared.
    #[serde(default = "one")]
    pub times: u32,
    /// Probability that a matching call is affected (default 1).
    #[serde(default = "certain")]
    pub probability: f64,
    /// For `latency`, `lost_response` and `inject_reply`: milliseconds to
    /// wait.
    #[serde(default)]
    pub latency_ms: u64,
    /// For `ratelimited`: the `Retry-After` seconds.
    #[serde(default = "one")]
    pub retry_after: u32,
    /// For `http_error`: the status (default 503).
    #[serde(default)]
    pub status: Option<u16>,
    /// For `http_error`: whether the call was applied before failing.
    #[serde(default)]
    pub applied: bool,
    /// For Events API faults: only this app.
    #[serde(default)]
    pub app_id: Option<String>,
    /// Only calls (or event deliveries) about this conversation.
    #[serde(default)]
    pub channel: Option<String>,
    /// For `inject_reply` (required): the person who replies.
    #[serde(default)]
    pub user: Option<String>,
    /// For `inject_reply`: the reply's text (default
    /// "a reply that crossed the answer").
    #[serde(default)]
    pub text: Option<String>,
}

/// The text of an `inject_reply` reply when the fault names none.
pub const DEFAULT_INJECTED_TEXT: &str = "a reply that crossed the answer";

fn one() -> u32 {
    1
}

fn certain() -> f64 {
    1.0
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultMode {
    /// Added latency, then normal handling; applied even if the client
    /// gives up meanwhile.
    Latency,
    /// Applied, then no answer: the client times out.
    LostResponse,
    /// Applied, then the connection is dropped without an answer.
    Reset,
    /// An HTTP error status (5xx by default), applied or not.
    HttpError,
    /// Applied, then `{"ok": false, "error": "fatal_error"}`.
    FatalError,
    /// Applied, then `{"ok": false, "error": "internal_error"}`.
    InternalError,
    /// HTTP 429 with `Retry-After`, not applied.
    Ratelimited,
    /// Not applied; HTTP 200 with a JSON body that is not a Web API answer
    /// (no `ok`), as a proxy or a failing edge may send.
    Malformed,
    /// Applied without the call's `metadata`: the message is stored and
    /// shown as if none had been sent (as Slack stores a message whose
    /// metadata it did not keep), so only its text tells whose it is.
    DropMetadata,
    /// Events: deliver to every request URL of the app at once.
    Duplicate,
    /// Events: count the delivery as timed out whatever the app answered.
    HoldPastDeadline,
    /// Socket: the connection is dropped right after the envelope is sent,
    /// before any ack can arrive (the envelope is retried).
    DropMidEnvelope,
    /// Socket: the same envelope (same `envelope_id`) goes over two of the
    /// app's connections; it stays armed while the app has fewer than two.
    DuplicateEnvelope,
    /// `chat.postMessage` (or a `chat.*Stream` method, whose thread is
    /// the stream's): when the call arrives, `user` replies in the
    /// thread it targets (or top level), with all its events; then, after
    /// `latency_ms`, the post is applied (even if the client gives up).
    /// It fires only on a call that authenticates and targets a
    /// conversation where `user` can reply; otherwise it stays armed.
    InjectReply,
}

#[derive(Debug, Clone, Serialize)]
pub struct Settings {
    /// Multiplies Slack's retry delays (1 minute, 5 minutes); 0.01 makes
    /// them 0.6 s and 3 s.
    pub time_scale: f64,
    /// How long an app has to answer a delivery or an interaction
    /// (Slack: 3 s).
    pub delivery_deadline_ms: u64,
    /// Posts per second per channel before 429s (Slack: about 1).
    pub posts_per_second: f64,
    /// Posts a channel may burst above the rate before 429s.
    pub post_burst: f64,
    /// Requests per minute per app and workspace for Tier 3 read methods.
    pub tier3_per_minute: u32,
    /// Requests per minute per app and workspace for a Tier 2 method
    /// (`chat.startStream`, `chat.stopStream`; Slack: 20).
    pub tier2_per_minute: u32,
    /// Requests per minute per app and workspace for a Tier 4 method
    /// (`chat.appendStream`; Slack: 100).
    pub tier4_per_minute: u32,
    /// How long a stream stays open after `chat.startStream`, appends or
    /// not (undocumented by Slack; observed at about 300 s): later appends
    /// and stops get `message_not_in_streaming_state`.
    pub stream_lifetime_ms: u64,
    /// How long an assistant status shows without a reply (Slack: 2 min).
    pub assistant_status_timeout_ms: u64,
    /// Deliveries held back and released in reverse order, when > 1.
    pub reorder_window: usize,
    /// How long a Socket Mode URL from `apps.connections.open` can be
    /// connected to (once).
    pub socket_ticket_ttl_ms: u64,
    /// How long an interaction's `response_url` answers (Slack: 30
    /// minutes; it also takes at most 5 uses).
    pub response_url_ttl_ms: u64,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            time_scale: 1.0,
            delivery_deadline_ms: 3000,
            posts_per_second: 1.0,
            post_burst: 3.0,
            tier3_per_minute: 50,
            tier2_per_minute: 20,
            tier4_per_minute: 100,
            stream_lifetime_ms: 300_000,
            assistant_status_timeout_ms: 120_000,
            reorder_window: 0,
            socket_ticket_ttl_ms: 30_000,
            response_url_ttl_ms: 30 * 60 * 1000,
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub struct Bucket {
    pub tokens: f64,
    pub at_micros: u64,
}

pub struct World {
    pub rng: Rng,
    pub clock: TsClock,
    pub settings: Settings,
    pub teams: BTreeMap<String, Team>,
    pub users: BTreeMap<String, User>,
    pub channels: BTreeMap<String, Channel>,
    pub apps: BTreeMap<String, App>,
    /// channel → ts → message (every message is added with
    /// [`World::insert_message`], which keeps `replies` current)
    pub messages: BTreeMap<String, BTreeMap<TsKey, Message>>,
    /// channel → thread root ts → its replies' ts (deleted ones too), so
    /// that a thread is read without scanning its channel.
    pub replies: HashMap<String, HashMap<TsKey, BTreeSet<TsKey>>>,
    pub calls: Vec<CallRecord>,
    pub deliveries: Vec<DeliveryRecord>,
    pub interactions: Vec<InteractionRecord>,
    pub faults: Vec<Fault>,
    /// (team, channel) → post budget
    pub post_buckets: HashMap<(String, String), Bucket>,
    /// (app, team, method) → request times (micros) in the last minute,
    /// oldest first
    pub read_windows: HashMap<(String, String, String), VecDeque<u64>>,
    /// OAuth codes: code → (app, team)
    pub oauth_codes: HashMap<String, (String, String)>,
    pub revoked_tokens: BTreeSet<String>,
    pub call_seq: u64,
    /// `event_context` → (app, team), for `apps.event.authorizations.list`.
    pub event_contexts: HashMap<String, (String, String)>,
    /// Events waiting to be released in reverse order (reorder fault).
    pub reorder_queue: Vec<Envelope>,
    /// Streams started and not yet ended: (channel, ts).
    pub open_streams: BTreeSet<(String, TsKey)>,
    /// Assistant threads, and threads with a status: (channel, root ts).
    pub assistant: BTreeMap<(String, TsKey), ThreadState>,
    /// Agents' Messages tabs (agent view): DM → its state.
    pub agent_tabs: BTreeMap<String, AgentTab>,
    /// Socket Mode: tickets, open connections, envelopes awaiting acks,
    /// and the log of every connection.
    pub socket: crate::socket_state::SocketState,
    /// The `response_url`s issued with interactions, and every use of one.
    pub responses: ResponseState,
    /// Ephemeral messages, oldest first.
    pub ephemerals: Vec<Ephemeral>,
}

impl World {
    pub fn new(seed: u64) -> Self {
        Self {
            rng: Rng::new(seed),
            clock: TsClock::default(),
            settings: Settings::default(),
            teams: BTreeMap::new(),
            users: BTreeMap::new(),
            channels: BTreeMap::new(),
            apps: BTreeMap::new(),
            messages: BTreeMap::new(),
            replies: HashMap::new(),
            calls: Vec::new(),
            deliveries: Vec::new(),
            interactions: Vec::new(),
            faults: Vec::new(),
            post_buckets: HashMap::new(),
            read_windows: HashMap::new(),
            oauth_codes: HashMap::new(),
            revoked_tokens: BTreeSet::new(),
            call_seq: 0,
            event_contexts: HashMap::new(),
            reorder_queue: Vec::new(),
            open_streams: BTreeSet::new(),
            assistant: BTreeMap::new(),
            agent_tabs: BTreeMap::new(),
            socket: Default::default(),
            responses: Default::default(),
            ephemerals: Vec::new(),
        }
    }

    pub fn message(&self, channel: &str, ts: &str) -> Option<&Message> {
        self.messages.get(channel).and_then(|m| m.get(&ts_key(ts)))
    }

    /// Adds (or replaces, for an edit or deletion) a message and indexes
    /// it under its thread.
    pub fn insert_message(&mut self, msg: Message) {
        let key = ts_key(&msg.ts);
        if let Some(root) = msg.thread_ts.as_deref().map(ts_key)
            && root != key
        {
            self.replies
                .entry(msg.channel.clone())
                .or_default()
                .entry(root)
                .or_default()
                .insert(key);
        }
        self.messages
            .entry(msg.channel.clone())
            .or_default()
            .insert(key, msg);
    }

    /// Marks a message deleted (it stays for inspection); a stream still
    /// open on it ends as `deleted`.
    pub fn mark_deleted(&mut self, channel: &str, ts: &str) {
        let key = ts_key(ts);
        if let Some(m) = self.messages.get_mut(channel).and_then(|m| m.get_mut(&key)) {
            let now = now_micros();
            m.deleted = true;
            m.deleted_at_micros = Some(now);
            if let Some(s) = m.stream.as_mut()
                && s.ended.is_none()
            {
                s.ended = Some("deleted".into());
                s.ended_at_micros = Some(now);
            }
        }
        self.open_streams.remove(&(channel.to_owned(), key));
    }

    /// The root and its replies, oldest first, deleted ones included.
    pub fn thread_with_deleted(&self, channel: &str, root_ts: &str) -> Vec<&Message> {
        let Some(msgs) = self.messages.get(channel) else {
            return Vec::new();
        };
        let root = ts_key(root_ts);
        let mut keys: Vec<TsKey> = self
            .replies
            .get(channel)
            .and_then(|t| t.get(&root))
            .map(|r| r.iter().copied().collect())
            .unwrap_or_default();
        if msgs.contains_key(&root) {
            // Replies are younger than their root, but a `bot_post` may name
            // any `thread_ts`: keep the order by ts whatever happens.
            let at = keys.partition_point(|k| *k < root);
            keys.insert(at, root);
        }
        keys.iter().filter_map(|k| msgs.get(k)).collect()
    }

    /// Replies in a thread (not counting the root, not deleted).
    pub fn reply_count(&self, channel: &str, root_ts: &str) -> usize {
        let (Some(msgs), Some(replies)) = (
            self.messages.get(channel),
            self.replies
                .get(channel)
                .and_then(|t| t.get(&ts_key(root_ts))),
        ) else {
            return 0;
        };
        replies
            .iter()
            .filter(|k| msgs.get(k).is_some_and(|m| !m.deleted))
            .count()
    }

    /// The root and its replies, oldest first (deleted ones excluded).
    pub fn thread(&self, channel: &str, root_ts: &str) -> Vec<&Message> {
        let mut t = self.thread_with_deleted(channel, root_ts);
        t.retain(|m| !m.deleted);
        t
    }

    /// The installation of `app` that covers workspace `team_id`: its own,
    /// else an org-wide install in its enterprise.
    pub fn install_of<'a>(&self, app: &'a App, team_id: &str) -> Option<&'a Install> {
        app.installs.get(team_id).or_else(|| {
            let ent = self.teams.get(team_id)?.enterprise_id.as_ref()?;
            app.installs.get(ent).filter(|i| i.is_enterprise_install)
        })
    }

    /// Whether `install` can see workspace `team_id`.
    pub fn covers(&self, install: &Install, team_id: &str) -> bool {
        install.team_id == team_id
            || (install.is_enterprise_install
                && self
                    .teams
                    .get(team_id)
                    .and_then(|t| t.enterprise_id.as_deref())
                    == Some(install.team_id.as_str()))
    }

    /// An enterprise some workspace belongs to.
    pub fn is_enterprise(&self, id: &str) -> bool {
        self.teams
            .values()
            .any(|t| t.enterprise_id.as_deref() == Some(id))
    }

    /// The app and installation a bot token belongs to.
    pub fn by_bot_token(&self, token: &str) -> Option<(&App, &Install)> {
        self.apps.values().find_map(|a| {
            a.installs
                .values()
                .find(|i| i.bot_token == token)
                .map(|i| (a, i))
        })
    }

    /// Takes one matching fault, if any fires for this call.
    pub fn take_fault(
        &mut self,
        method: &str,
        app_id: Option<&str>,
        channel: Option<&str>,
    ) -> Option<Fault> {
        self.take_fault_if(method, app_id, channel, |_, _| true)
    }

    /// Takes the first fault that matches this call and `fits` it, if it
    /// fires (a fault that does not fit stays armed).
    pub fn take_fault_if(
        &mut self,
        method: &str,
        app_id: Option<&str>,
        channel: Option<&str>,
        fits: impl Fn(&World, &Fault) -> bool,
    ) -> Option<Fault> {
        let this: &World = self;
        let idx = this.faults.iter().position(|f| {
            f.method == method
                && f.app_id.as_deref().is_none_or(|a| Some(a) == app_id)
                && f.channel.as_deref().is_none_or(|c| Some(c) == channel)
                && fits(this, f)
        })?;
        let p = self.faults[idx].probability;
        if p < 1.0 && !self.rng.chance(p) {
            return None;
        }
        let fault = self.faults[idx].clone();
        if fault.times > 0 {
            self.faults[idx].times -= 1;
            if self.faults[idx].times == 0 {
                self.faults.remove(idx);
            }
        }
        Some(fault)
    }
}

/// Adds `channel` to what a person `looked_at`, once.
pub fn looked_at(list: &mut Vec<String>, channel: Option<&str>) {
    if let Some(c) = channel
        && !list.iter().any(|l| l == c)
    {
        list.push(c.to_owned());
    }
}

/// An agent's Messages tab (its DM with a person), for inspection.
#[derive(Debug, Clone, Default, Serialize)]
pub struct AgentTab {
    pub app_id: String,
    pub user_id: String,
    /// What the person looks at, as the last event told the app (the
    /// `context` object: `{"entities": […]}`, or `{}`).
    pub context: Value,
    /// Every channel the person looked at from the tab (a channel entity,
    /// or a message entity's channel), in the order first looked at: what a
    /// question there may have read as its viewed channel.
    pub looked_at: Vec<String>,
    /// How many times the person opened the tab.
    pub opened: u32,
    /// Set at the top of the tab (`setSuggestedPrompts` without a thread).
    pub suggested_prompts: Option<Value>,
    pub prompts_title: Option<String>,
}

/// One thread's assistant state, for inspection.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ThreadState {
    /// The app whose assistant thread this is; `None` for a channel thread
    /// that only had a status set.
    pub app_id: Option<String>,
    /// The person who opened it.
    pub user_id: Option<String>,
    /// The channel the person is looking at (`{channel_id, team_id,
    /// enterprise_id}`), as the last event told the app.
    pub context: Option<Value>,
    /// Every channel the person looked at from the thread, in the order
    /// first looked at: what a question there may have read as its viewed
    /// channel.
    pub looked_at: Vec<String>,
    /// Every status set, in order, with how it ended.
    pub statuses: Vec<StatusRecord>,
    pub suggested_prompts: Option<Value>,
    pub prompts_title: Option<String>,
    pub title: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct StatusRecord {
    /// The app that set it (each app has its own status in a thread).
    pub app_id: String,
    pub status: String,
    pub loading_messages: Vec<String>,
    pub set_at_micros: u64,
    /// How it stopped showing: `replaced`, `cleared` (an empty status),
    /// `replied` (the app posted in the thread) or `timeout`; `None` while
    /// it shows.
    pub ended: Option<String>,
    pub ended_at_micros: Option<u64>,
}

/// One event to deliver to one app.
#[derive(Debug, Clone)]
pub struct Envelope {
    pub app_id: String,
    pub event_id: String,
    pub event_type: String,
    pub body: Value,
    /// What the event is about, for the delivery log (never sent).
    pub channel: Option<String>,
    pub message_ts: Option<String>,
    pub subtype: Option<String>,
}

/// The `response_url`s issued and every request to one.
#[derive(Debug, Default)]
pub struct ResponseState {
    /// By `{n}`, the URL's id.
    pub issued: BTreeMap<String, ResponseUrl>,
    pub log: Vec<ResponseRecord>,
}

/// A `response_url` issued with an interaction.
#[derive(Debug, Clone, Serialize)]
pub struct ResponseUrl {
    /// The `{n}` of `/actions/{team}/{n}/{secret}`.
    pub id: String,
    pub url: String,
    /// The `{team}` of the URL: the workspace, or the enterprise of an
    /// org-wide install.
    pub team_id: String,
    #[serde(skip)]
    pub(crate) secret: String,
    pub app_id: String,
    pub channel: String,
    /// The message the button was on.
    pub message_ts: String,
    /// The person who clicked.
    pub user: String,
    pub issued_at_micros: u64,
    /// Requests it answered with `ok`.
    pub uses: u32,
}

/// One request to a `response_url`, answered or refused.
#[derive(Debug, Clone, Serialize)]
pub struct ResponseRecord {
    /// 1, 2, … in the order they arrived.
    pub seq: u64,
    /// The `{n}` of the URL requested.
    pub url_id: String,
    /// From the URL, when it names one issued.
    pub app_id: Option<String>,
    pub user: Option<String>,
    pub channel: Option<String>,
    pub message_ts: Option<String>,
    /// From the body, when it is a JSON object: `response_type` as applied
    /// (`ephemeral` or `in_channel`), the flags, `thread_ts` and `text`.
    pub response_type: Option<String>,
    pub replace_original: bool,
    pub delete_original: bool,
    pub thread_ts: Option<String>,
    pub text: Option<String>,
    /// `ok` or the error code answered.
    pub result: String,
    pub http_status: u16,
    /// For `ok`: which use of the URL it was (1..=5), and the `ts` of the
    /// message or ephemeral it posted (none for a replacement or a bare
    /// deletion).
    pub use_number: Option<u32>,
    pub ts: Option<String>,
    pub at_micros: u64,
}
