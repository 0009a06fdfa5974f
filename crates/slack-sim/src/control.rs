//! The control and inspection API under `/_sim/` (a prefix Slack never
//! uses): build a scenario, act as people, set faults and the time scale,
//! and read the ground truth tests judge by.

use std::collections::{BTreeMap, BTreeSet};

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::header::HOST;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::Sim;
use crate::delivery::Envelope;
use crate::delivery::dispatch;
use crate::events;
use crate::model::{
    App, Channel, ChannelKind, Edit, Fault, FaultMode, Install, Message, Team, TsKey, User, World,
    now_micros, now_unix, ts_key,
};

pub(crate) use crate::refusal::{Refusal, bad, not_found};

type ApiResult = Result<Json<Value>, Refusal>;

/// Starts delivering `envs` and answers with their ids (and the new
/// message's `ts`).
fn announce(sim: &Sim, ts: Option<String>, envs: Vec<crate::delivery::Envelope>) -> Json<Value> {
    let ids: Vec<Value> = envs
        .iter()
        .map(|e| json!({"event_id": e.event_id, "app_id": e.app_id, "type": e.event_type}))
        .collect();
    dispatch(sim, envs);
    let mut v = json!({"events": ids});
    if let Some(ts) = ts {
        v["ts"] = ts.into();
    }
    Json(v)
}

#[derive(Deserialize)]
pub struct ResetReq {
    #[serde(default)]
    seed: Option<u64>,
}

pub async fn reset(State(sim): State<Sim>, Json(r): Json<ResetReq>) -> ApiResult {
    let mut w = sim.lock();
    *w = World::new(r.seed.unwrap_or(sim.seed));
    Ok(Json(json!({"ok": true})))
}

#[derive(Deserialize)]
pub struct SettingsReq {
    time_scale: Option<f64>,
    delivery_deadline_ms: Option<u64>,
    posts_per_second: Option<f64>,
    post_burst: Option<f64>,
    tier3_per_minute: Option<u32>,
    tier2_per_minute: Option<u32>,
    tier4_per_minute: Option<u32>,
    stream_lifetime_ms: Option<u64>,
    assistant_status_timeout_ms: Option<u64>,
    reorder_window: Option<usize>,
    socket_ticket_ttl_ms: Option<u64>,
    response_url_ttl_ms: Option<u64>,
}

pub async fn settings(State(sim): State<Sim>, Json(r): Json<SettingsReq>) -> ApiResult {
    let mut w = sim.lock();
    let s = &mut w.settings;
    if let Some(v) = r.time_scale {
        if !(0.0..=100.0).contains(&v) {
            return Err(bad("time_scale must be within 0..=100"));
        }
        s.time_scale = v;
    }
    if let Some(v) = r.delivery_deadline_ms {
        s.delivery_deadline_ms = v.max(1);
    }
    if let Some(v) = r.posts_per_second {
        s.posts_per_second = v;
    }
    if let Some(v) = r.post_burst {
        s.post_burst = v;
    }
    if let Some(v) = r.tier3_per_minute {
        s.tier3_per_minute = v;
    }
    if let Some(v) = r.tier2_per_minute {
        s.tier2_per_minute = v;
    }
    if let Some(v) = r.tier4_per_minute {
        s.tier4_per_minute = v;
    }
    if let Some(v) = r.stream_lifetime_ms {
        s.stream_lifetime_ms = v;
    }
    if let Some(v) = r.assistant_status_timeout_ms {
        s.assistant_status_timeout_ms = v;
    }
    if let Some(v) = r.reorder_window {
        s.reorder_window = v;
    }
    if let Some(v) = r.socket_ticket_ttl_ms {
        s.socket_ticket_ttl_ms = v;
    }
    if let Some(v) = r.response_url_ttl_ms {
        s.response_url_ttl_ms = v;
    }
    Ok(Json(serde_json::to_value(&w.settings).unwrap_or_default()))
}

#[derive(Deserialize)]
pub struct TeamReq {
    id: Option<String>,
    name: String,
    enterprise_id: Option<String>,
}

pub async fn create_team(State(sim): State<Sim>, Json(r): Json<TeamReq>) -> ApiResult {
    let mut w = sim.lock();
    let id = r.id.unwrap_or_else(|| w.rng.id("T", 10));
    let domain = r
        .name
        .to_ascii_lowercase()
        .replace(|c: char| !c.is_ascii_alphanumeric(), "-");
    let team = Team {
        id: id.clone(),
        name: r.name,
        domain,
        enterprise_id: r.enterprise_id,
    };
    w.teams.insert(id, team.clone());
    Ok(Json(serde_json::to_value(team).unwrap_or_default()))
}

#[derive(Deserialize)]
pub struct UserReq {
    team_id: String,
    name: String,
    id: Option<String>,
}

pub async fn create_user(State(sim): State<Sim>, Json(r): Json<UserReq>) -> ApiResult {
    let mut w = sim.lock();
    if !w.teams.contains_key(&r.team_id) {
        return Err(not_found("team", &r.team_id));
    }
    let id = r.id.unwrap_or_else(|| w.rng.id("U", 10));
    let user = User {
        id: id.clone(),
        team_id: r.team_id,
        name: r.name,
        is_bot: false,
        bot_id: None,
        app_id: None,
    };
    w.users.insert(id, user.clone());
    Ok(Json(serde_json::to_value(user).unwrap_or_default()))
}

#[derive(Deserialize)]
pub struct BotReq {
    team_id: String,
    name: String,
}

/// A bot outside any installed app (posts `bot_message`s).
pub async fn create_bot(State(sim): State<Sim>, Json(r): Json<BotReq>) -> ApiResult {
    let mut w = sim.lock();
    if !w.teams.contains_key(&r.team_id) {
        return Err(not_found("team", &r.team_id));
    }
    let bot_id = w.rng.id("B", 10);
    let user_id = w.rng.id("U", 10);
    let user = User {
        id: user_id.clone(),
        team_id: r.team_id,
        name: r.name,
        is_bot: true,
        bot_id: Some(bot_id),
        app_id: None,
    };
    w.users.insert(user_id, user.clone());
    Ok(Json(serde_json::to_value(user).unwrap_or_default()))
}

#[derive(Deserialize)]
pub struct ChannelReq {
    team_id: String,
    name: String,
    kind: ChannelKind,
    #[serde(default)]
    is_ext_shared: bool,
    #[serde(default)]
    members: Vec<String>,
    id: Option<String>,
}

pub async fn create_channel(State(sim): State<Sim>, Json(r): Json<ChannelReq>) -> ApiResult {
    let mut w = sim.lock();
    if !w.teams.contains_key(&r.team_id) {
        return Err(not_found("team", &r.team_id));
    }
    for m in &r.members {
        if !w.users.contains_key(m) {
            return Err(not_found("user", m));
        }
    }
    if r.kind == ChannelKind::Im && r.members.len() != 2 {
        return Err(bad("an im has exactly two members"));
    }
    let id = r.id.unwrap_or_else(|| w.rng.id(r.kind.id_prefix(), 10));
    let channel = Channel {
        id: id.clone(),
        team_id: r.team_id,
        name: r.name,
        kind: r.kind,
        is_ext_shared: r.is_ext_shared,
        is_archived: false,
        members: r.members.into_iter().collect(),
        created: now_unix(),
    };
    w.channels.insert(id, channel.clone());
    Ok(Json(serde_json::to_value(channel).unwrap_or_default()))
}

#[derive(Deserialize)]
pub struct MemberReq {
    user_id: String,
}

pub async fn join_channel(
    State(sim): State<Sim>,
    Path(id): Path<String>,
    Json(r): Json<MemberReq>,
) -> ApiResult {
    let mut w = sim.lock();
    if !w.users.contains_key(&r.user_id) {
        return Err(not_found("user", &r.user_id));
    }
    let c = w
        .channels
        .get_mut(&id)
        .ok_or_else(|| not_found("channel", &id))?;
    c.members.insert(r.user_id);
    Ok(Json(serde_json::to_value(c.clone()).unwrap_or_default()))
}

pub async fn archive_channel(State(sim): State<Sim>, Path(id): Path<String>) -> ApiResult {
    let mut w = sim.lock();
    let c = w
        .channels
        .get_mut(&id)
        .ok_or_else(|| not_found("channel", &id))?;
    c.is_archived = true;
    Ok(Json(json!({"ok": true})))
}

#[derive(Deserialize)]
pub struct AppReq {
    id: Option<String>,
    name: String,
    signing_secret: Option<String>,
    #[serde(default)]
    request_urls: Vec<String>,
    interactivity_url: Option<String>,
    #[serde(default)]
    socket_mode: bool,
    #[serde(default)]
    events: Vec<String>,
    #[serde(default)]
    token_rotation: bool,
    #[serde(default)]
    non_marketplace_limits: bool,
    /// `agent_view` or `assistant_view` (the default).
    #[serde(default)]
    experience: crate::model::Experience,
}

pub async fn create_app(State(sim): State<Sim>, Json(r): Json<AppReq>) -> ApiResult {
    let mut w = sim.lock();
    let id = r.id.unwrap_or_else(|| w.rng.id("A", 10));
    let app = App {
        id: id.clone(),
        name: r.name,
        signing_secret: r.signing_secret.unwrap_or_else(|| w.rng.hex(32)),
        client_id: format!(
            "{}.{}",
            w.rng.next_u64() % 10_000_000_000,
            w.rng.next_u64() % 10_000_000_000
        ),
        client_secret: w.rng.hex(32),
        verification_token: w.rng.id("", 24),
        app_token: format!("xapp-1-{id}-{}", w.rng.hex(24)),
        request_urls: r.request_urls,
        interactivity_url: r.interactivity_url,
        socket_mode: r.socket_mode,
        events: r.events.into_iter().collect(),
        token_rotation: r.token_rotation,
        non_marketplace_limits: r.non_marketplace_limits,
        experience: r.experience,
        installs: BTreeMap::new(),
    };
    w.apps.insert(id, app.clone());
    // The control API is the one place secrets are shown: the test owns them.
    let mut v = serde_json::to_value(&app).unwrap_or_default();
    v["signing_secret"] = app.signing_secret.into();
    v["client_secret"] = app.client_secret.into();
    Ok(Json(v))
}

#[derive(Deserialize)]
pub struct InstallReq {
    /// The workspace, or an enterprise id (`E…`) for an org-wide install.
    team_id: String,
    #[serde(default)]
    scopes: Vec<String>,
    /// Channels the bot joins right away.
    #[serde(default)]
    join_channels: Vec<String>,
}

pub async fn install_app(
    State(sim): State<Sim>,
    Path(app_id): Path<String>,
    Json(r): Json<InstallReq>,
) -> ApiResult {
    let mut w = sim.lock();
    let org_wide = w.is_enterprise(&r.team_id);
    if !w.teams.contains_key(&r.team_id) && !org_wide {
        return Err(not_found("team", &r.team_id));
    }
    let app = w
        .apps
        .get(&app_id)
        .cloned()
        .ok_or_else(|| not_found("app", &app_id))?;
    let (bot_user_id, bot_id) = match app.installs.get(&r.team_id) {
        Some(i) => (i.bot_user_id.clone(), i.bot_id.clone()),
        None => (w.rng.id("U", 10), w.rng.id("B", 10)),
    };
    let (bot_token, refresh, expires) = if app.token_rotation {
        (
            format!("xoxe.xoxb-1-{}", w.rng.hex(24)),
            Some(format!("xoxe-1-{}", w.rng.hex(24))),
            Some(now_unix() + 43_200),
        )
    } else {
        (
            format!("xoxb-{}-{}", w.rng.id("", 12), w.rng.hex(24)),
            None,
            None,
        )
    };
    let install = Install {
        team_id: r.team_id.clone(),
        is_enterprise_install: org_wide,
        bot_user_id: bot_user_id.clone(),
        bot_id: bot_id.clone(),
        bot_token,
        scopes: r.scopes.into_iter().collect::<BTreeSet<_>>(),
        refresh_token: refresh,
        expires_at: expires,
    };
    w.users.insert(
        bot_user_id.clone(),
        User {
            id: bot_user_id.clone(),
            team_id: r.team_id.clone(),
            name: app.name.to_ascii_lowercase(),
            is_bot: true,
            bot_id: Some(bot_id),
            app_id: Some(app_id.clone()),
        },
    );
    for c in &r.join_channels {
        let ch = w
            .channels
            .get_mut(c)
            .ok_or_else(|| not_found("channel", c))?;
        ch.members.insert(bot_user_id.clone());
    }
    if let Some(a) = w.apps.get_mut(&app_id) {
        a.installs.insert(r.team_id, install.clone());
    }
    let mut v = serde_json::to_value(&install).unwrap_or_default();
    v["app_id"] = app_id.into();
    Ok(Json(v))
}

#[derive(Deserialize)]
pub struct TeamOnly {
    team_id: String,
}

/// What the workspace did to the app's installation.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Removal {
    /// The app was removed: `app_uninstalled`, tokens revoked.
    Uninstall,
    /// The bot token was revoked: `tokens_revoked`.
    Revoke,
}

/// Revokes the installation's bot token and tells the app, as Slack does.
fn remove(sim: &Sim, app_id: &str, team_id: &str, how: Removal) -> ApiResult {
    let env = {
        let mut w = sim.lock();
        let app = w
            .apps
            .get(app_id)
            .cloned()
            .ok_or_else(|| not_found("app", app_id))?;
        let install = app
            .installs
            .get(team_id)
            .cloned()
            .ok_or_else(|| not_found("installation", team_id))?;
        w.revoked_tokens.insert(install.bot_token.clone());
        let (event, kind) = match how {
            Removal::Uninstall => (json!({"type": "app_uninstalled"}), "app_uninstalled"),
            Removal::Revoke => (
                json!({"type": "tokens_revoked", "tokens": {"oauth": [], "bot": [install.bot_user_id]}}),
                "tokens_revoked",
            ),
        };
        let env = events::lifecycle(&mut w, &app, team_id, event, kind);
        if how == Removal::Uninstall
            && let Some(a) = w.apps.get_mut(app_id)
        {
            a.installs.remove(team_id);
        }
        env
    };
    dispatch(sim, vec![env]);
    Ok(Json(json!({"ok": true})))
}

/// The workspace removes the app: `app_uninstalled`, tokens revoked.
#[derive(Deserialize)]
pub struct RequestUrlsReq {
    request_urls: Vec<String>,
}

/// Changes where the app's events go (Event Subscriptions' request URL;
/// several for the `duplicate` fault, which delivers to all at once).
pub async fn set_request_urls(
    State(sim): State<Sim>,
    Path(app_id): Path<String>,
    Json(r): Json<RequestUrlsReq>,
) -> ApiResult {
    let mut w = sim.lock();
    let app = w
        .apps
        .get_mut(&app_id)
        .ok_or_else(|| not_found("app", &app_id))?;
    app.request_urls = r.request_urls;
    Ok(Json(json!({"ok": true, "request_urls": app.request_urls})))
}

#[derive(Deserialize)]
pub struct InteractivityReq {
    url: Option<String>,
}

/// Changes where the app's interactions go (Interactivity's request URL);
/// `null` turns interactivity off.
pub async fn set_interactivity(
    State(sim): State<Sim>,
    Path(app_id): Path<String>,
    Json(r): Json<InteractivityReq>,
) -> ApiResult {
    if let Some(u) = &r.url
        && !(u.starts_with("http://") || u.starts_with("https://"))
    {
        return Err(bad(
            "the interactivity request URL must be http:// or https://",
        ));
    }
    let mut w = sim.lock();
    let app = w
        .apps
        .get_mut(&app_id)
        .ok_or_else(|| not_found("app", &app_id))?;
    app.interactivity_url = r.url;
    Ok(Json(json!({"ok": true, "url": app.interactivity_url})))
}

pub async fn uninstall_app(
    State(sim): State<Sim>,
    Path(app_id): Path<String>,
    Json(r): Json<TeamOnly>,
) -> ApiResult {
    remove(&sim, &app_id, &r.team_id, Removal::Uninstall)
}

/// The workspace revokes the bot token: `tokens_revoked`.
pub async fn revoke_tokens(
    State(sim): State<Sim>,
    Path(app_id): Path<String>,
    Json(r): Json<TeamOnly>,
) -> ApiResult {
    remove(&sim, &app_id, &r.team_id, Removal::Revoke)
}

#[derive(Deserialize)]
pub struct PostReq {
    pub(crate) user: String,
    pub(crate) channel: String,
    pub(crate) text: String,
    pub(crate) thread_ts: Option<String>,
    #[serde(default)]
    pub(crate) reply_broadcast: bool,
    pub(crate) blocks: Option<Value>,
    /// Slack replays the message's events late, as after an outage of the
    /// app: the message was posted this many seconds ago (its `ts` and
    /// creation time say so) and its events, delivered now, carry that
    /// `event_time`.
    #[serde(default)]
    pub(crate) late_by_secs: Option<u64>,
}

/// Where a person's post goes: the author, the channel and the thread
/// root (`thread_ts` resolved to its root, as Slack does). Refuses what
/// Slack's client would not let the person do.
pub(crate) fn human_post_target(
    w: &World,
    user: &str,
    channel: &str,
    thread_ts: Option<&str>,
) -> Result<(User, Channel, Option<String>), Refusal> {
    let user = w
        .users
        .get(user)
        .cloned()
        .ok_or_else(|| not_found("user", user))?;
    let channel = w
        .channels
        .get(channel)
        .ok_or_else(|| not_found("channel", channel))?;
    if !channel.members.contains(&user.id) {
        return Err(bad("the user is not a member of the channel"));
    }
    if channel.is_archived {
        return Err(bad("the channel is archived"));
    }
    let thread_ts = match thread_ts {
        Some(t) => {
            let parent = w
                .message(&channel.id, t)
                .ok_or_else(|| not_found("message", t))?;
            Some(parent.thread_ts.clone().unwrap_or_else(|| t.to_owned()))
        }
        None => None,
    };
    Ok((user, channel.clone(), thread_ts))
}

/// A person's message, as `/_sim/act/post` and the `inject_reply` fault
/// post it: stored, with the events it causes (not yet dispatched).
pub(crate) fn human_post(w: &mut World, r: PostReq) -> Result<(String, Vec<Envelope>), Refusal> {
    let (user, channel, thread_ts) =
        human_post_target(w, &r.user, &r.channel, r.thread_ts.as_deref())?;
    let (ts, created) = match r.late_by_secs {
        Some(secs) => past_ts(w, &channel.id, thread_ts.as_deref(), secs)?,
        None => (w.clock.next_ts(), now_micros()),
    };
    let client_msg_id = format!(
        "{}-{}-{}-{}-{}",
        w.rng.hex(8),
        w.rng.hex(4),
        w.rng.hex(4),
        w.rng.hex(4),
        w.rng.hex(12)
    );
    let msg = Message {
        channel: channel.id.clone(),
        ts: ts.clone(),
        user: Some(user.id.clone()),
        bot_id: None,
        app_id: None,
        username: None,
        subtype: (thread_ts.is_some() && r.reply_broadcast).then(|| "thread_broadcast".to_owned()),
        original_text: r.text.clone(),
        text: r.text,
        thread_ts,
        blocks: r.blocks,
        attachments: None,
        metadata: None,
        edited: None,
        deleted: false,
        client_msg_id: Some(client_msg_id),
        created_at_micros: created,
        deleted_at_micros: None,
        edits: Vec::new(),
        streaming_state: None,
        stream: None,
    };
    let mut envs = events::post(w, &channel, msg);
    if r.late_by_secs.is_some() {
        // (the events of a message of then, as Slack replays them)
        let then = ts_key(&ts).0;
        for e in &mut envs {
            e.body["event_time"] = then.into();
        }
    }
    Ok((ts, envs))
}

/// A `ts` `secs` seconds ago, free in `channel` (and its creation time),
/// for a message Slack replays late; after its thread's root, as Slack's
/// would be.
fn past_ts(
    w: &World,
    channel: &str,
    thread_ts: Option<&str>,
    secs: u64,
) -> Result<(String, u64), Refusal> {
    let mut at = now_micros().saturating_sub(secs.saturating_mul(1_000_000));
    let key = |t: u64| (t / 1_000_000, t % 1_000_000);
    if thread_ts.is_some_and(|root| ts_key(root) >= key(at)) {
        return Err(bad("late_by_secs puts the reply before its thread's root"));
    }
    while w
        .messages
        .get(channel)
        .is_some_and(|m| m.contains_key(&key(at)))
    {
        at += 1;
    }
    Ok((format!("{}.{:06}", at / 1_000_000, at % 1_000_000), at))
}

#[derive(Deserialize)]
pub struct DoubleReq {
    channel: String,
    ts: String,
}

/// Slack delivers a person's one message a second time, as another
/// message: a copy with a new `ts` and the same `client_msg_id` (text,
/// author, thread and blocks as the original's), shown in the channel
/// beside it, with the events a new message causes (`message`, and
/// `app_mention` where it mentions the app). Refused for a message without
/// a `client_msg_id` (a bot's) or one deleted.
pub async fn act_double(State(sim): State<Sim>, Json(r): Json<DoubleReq>) -> ApiResult {
    let (ts, envs) = {
        let mut w = sim.lock();
        let channel = w
            .channels
            .get(&r.channel)
            .cloned()
            .ok_or_else(|| not_found("channel", &r.channel))?;
        let original = w
            .message(&r.channel, &r.ts)
            .filter(|m| !m.deleted)
            .cloned()
            .ok_or_else(|| not_found("message", &r.ts))?;
        if original.client_msg_id.is_none() || original.user.is_none() {
            return Err(bad(
                "only a person's message (with a client_msg_id) is doubled",
            ));
        }
        let ts = w.clock.next_ts();
        let copy = Message {
            ts: ts.clone(),
            text: original.original_text.clone(),
            edited: None,
            edits: Vec::new(),
            metadata: None,
            created_at_micros: now_micros(),
            deleted_at_micros: None,
            streaming_state: None,
            stream: None,
            ..original
        };
        let envs = events::post(&mut w, &channel, copy);
        (ts, envs)
    };
    Ok(announce(&sim, Some(ts), envs))
}

/// A person posts (top level, or a reply with `thread_ts`).
pub async fn act_post(State(sim): State<Sim>, Json(r): Json<PostReq>) -> ApiResult {
    let (ts, envs) = human_post(&mut sim.lock(), r)?;
    Ok(announce(&sim, Some(ts), envs))
}

#[derive(Deserialize)]
pub struct BotPostReq {
    bot_user: String,
    channel: String,
    text: String,
    thread_ts: Option<String>,
}

/// Another (non-installed) bot posts a `bot_message`.
pub async fn act_bot_post(State(sim): State<Sim>, Json(r): Json<BotPostReq>) -> ApiResult {
    let (ts, envs) = {
        let mut w = sim.lock();
        let bot = w
            .users
            .get(&r.bot_user)
            .cloned()
            .filter(|u| u.is_bot)
            .ok_or_else(|| not_found("bot", &r.bot_user))?;
        let channel = w
            .channels
            .get(&r.channel)
            .cloned()
            .ok_or_else(|| not_found("channel", &r.channel))?;
        let ts = w.clock.next_ts();
        let msg = Message {
            channel: channel.id.clone(),
            ts: ts.clone(),
            user: None,
            bot_id: bot.bot_id.clone(),
            app_id: None,
            username: Some(bot.name.clone()),
            subtype: Some("bot_message".into()),
            original_text: r.text.clone(),
            text: r.text,
            thread_ts: r.thread_ts,
            blocks: None,
            attachments: None,
            metadata: None,
            edited: None,
            deleted: false,
            client_msg_id: None,
            created_at_micros: now_micros(),
            deleted_at_micros: None,
            edits: Vec::new(),
            streaming_state: None,
            stream: None,
        };
        let envs = events::post(&mut w, &channel, msg);
        (ts, envs)
    };
    Ok(announce(&sim, Some(ts), envs))
}

#[derive(Deserialize)]
pub struct EditReq {
    user: String,
    channel: String,
    ts: String,
    text: String,
}

/// A person edits their message: `message_changed`.
pub async fn act_edit(State(sim): State<Sim>, Json(r): Json<EditReq>) -> ApiResult {
    let envs = {
        let mut w = sim.lock();
        let channel = w
            .channels
            .get(&r.channel)
            .cloned()
            .ok_or_else(|| not_found("channel", &r.channel))?;
        let before = w
            .message(&r.channel, &r.ts)
            .filter(|m| !m.deleted)
            .cloned()
            .ok_or_else(|| not_found("message", &r.ts))?;
        if before.user.as_deref() != Some(r.user.as_str()) {
            return Err(bad("only the author edits a message"));
        }
        let event_ts = w.clock.next_ts();
        let mut after = before.clone();
        after.text = r.text;
        after.edited = Some((r.user.clone(), event_ts.clone()));
        after.edits.push(Edit {
            text: after.text.clone(),
            edit_ts: event_ts.clone(),
            at_micros: now_micros(),
        });
        w.insert_message(after.clone());
        events::edited(&mut w, &channel, &before, &after, &event_ts)
    };
    Ok(announce(&sim, None, envs))
}

#[derive(Deserialize)]
pub struct DeleteReq {
    channel: String,
    ts: String,
}

/// A message is deleted: `message_deleted`.
pub async fn act_delete(State(sim): State<Sim>, Json(r): Json<DeleteReq>) -> ApiResult {
    let envs = {
        let mut w = sim.lock();
        let channel = w
            .channels
            .get(&r.channel)
            .cloned()
            .ok_or_else(|| not_found("channel", &r.channel))?;
        let before = w
            .message(&r.channel, &r.ts)
            .filter(|m| !m.deleted)
            .cloned()
            .ok_or_else(|| not_found("message", &r.ts))?;
        w.mark_deleted(&r.channel, &r.ts);
        let event_ts = w.clock.next_ts();
        events::deleted(&mut w, &channel, &before, &event_ts)
    };
    Ok(announce(&sim, None, envs))
}

#[derive(Deserialize)]
pub struct StopStreamReq {
    channel: String,
    ts: String,
}

/// The person receiving a stream presses Stop: the message is final with
/// what it has (`message_changed`), and later appends get `stopped_by_user`.
pub async fn act_stop_stream(State(sim): State<Sim>, Json(r): Json<StopStreamReq>) -> ApiResult {
    let envs = {
        let mut w = sim.lock();
        crate::streams::stop_by_user(&mut w, &r.channel, &r.ts).map_err(bad)?
    };
    Ok(announce(&sim, None, envs))
}

/// A person clicks a button on an app's message: the app gets a
/// `block_actions` payload at its interactivity request URL, once (Slack
/// does not retry interactions). Answers with the interaction's log entry
/// once the app answered, or not within the deadline.
pub async fn act_click(
    State(sim): State<Sim>,
    headers: HeaderMap,
    Json(r): Json<crate::interactivity::ClickReq>,
) -> ApiResult {
    let host = headers
        .get(HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("127.0.0.1");
    let out = {
        let mut w = sim.lock();
        crate::interactivity::prepare(&mut w, &r, host)?
    };
    let record = crate::interactivity::send(&sim, out).await;
    Ok(Json(serde_json::to_value(record).unwrap_or_default()))
}

/// Every interaction sent, in the order their outcomes were known.
pub async fn interactions(State(sim): State<Sim>) -> ApiResult {
    let w = sim.lock();
    Ok(Json(json!({"ok": true, "interactions": w.interactions})))
}

#[derive(Deserialize)]
pub struct AssistantOpenReq {
    user: String,
    app_id: String,
    context_channel: Option<String>,
}

/// A person opens the app's assistant pane: a new thread in their DM with
/// the app, and `assistant_thread_started` for the app.
pub async fn act_assistant_open(
    State(sim): State<Sim>,
    Json(r): Json<AssistantOpenReq>,
) -> ApiResult {
    let (channel, envs) = {
        let mut w = sim.lock();
        let (channel, ts, envs) =
            crate::assistant::open(&mut w, &r.user, &r.app_id, r.context_channel.as_deref())
                .map_err(bad)?;
        ((channel, ts), envs)
    };
    let mut v = announce(&sim, Some(channel.1), envs).0;
    v["channel"] = channel.0.into();
    Ok(Json(v))
}

#[derive(Deserialize)]
pub struct AssistantContextReq {
    channel: String,
    thread_ts: String,
    context_channel: String,
}

/// The person looks at another channel: `assistant_thread_context_changed`.
pub async fn act_assistant_context(
    State(sim): State<Sim>,
    Json(r): Json<AssistantContextReq>,
) -> ApiResult {
    let envs = {
        let mut w = sim.lock();
        crate::assistant::change_context(&mut w, &r.channel, &r.thread_ts, &r.context_channel)
            .map_err(bad)?
    };
    Ok(announce(&sim, None, envs))
}

#[derive(Deserialize)]
pub struct ExperienceReq {
    experience: crate::model::Experience,
}

/// Switches the app's AI messaging experience (`agent_view` or
/// `assistant_view`), as an app owner does in its settings.
pub async fn set_experience(
    State(sim): State<Sim>,
    Path(app_id): Path<String>,
    Json(r): Json<ExperienceReq>,
) -> ApiResult {
    let mut w = sim.lock();
    let app = w
        .apps
        .get_mut(&app_id)
        .ok_or_else(|| not_found("app", &app_id))?;
    app.experience = r.experience;
    Ok(Json(json!({"ok": true, "experience": app.experience})))
}

#[derive(Deserialize)]
pub struct AgentReq {
    user: String,
    app_id: String,
    /// What the person looks at, most relevant first, as Slack's entities
    /// (`{"type": "slack#/types/channel_id", "value": "C…"}`; a channel or
    /// message entity's `team_id` is filled in when left out). For
    /// `agent_open`, absent leaves the context as it was.
    entities: Option<Vec<Value>>,
    /// Shorthand for one `slack#/types/channel_id` entity.
    channel: Option<String>,
    /// `agent_context`: send the event without its `channel` (the DM), as
    /// Slack's event reference shows it.
    #[serde(default)]
    without_channel: bool,
}

impl AgentReq {
    fn entities(&self) -> Option<Vec<Value>> {
        match (&self.entities, &self.channel) {
            (Some(e), _) => Some(e.clone()),
            (None, Some(c)) => Some(vec![json!({"type": "slack#/types/channel_id", "value": c})]),
            (None, None) => None,
        }
    }
}

/// A person opens an agent's Messages tab (agent view): their DM with the
/// app (made if missing), and `app_home_opened` with `tab: "messages"`.
pub async fn act_agent_open(State(sim): State<Sim>, Json(r): Json<AgentReq>) -> ApiResult {
    let (dm, envs) = {
        let mut w = sim.lock();
        crate::agent::open(&mut w, &r.user, &r.app_id, r.entities().as_deref()).map_err(bad)?
    };
    let mut v = announce(&sim, None, envs).0;
    v["channel"] = dm.into();
    Ok(Json(v))
}

/// The person looks at something else (agent view): `app_context_changed`.
pub async fn act_agent_context(State(sim): State<Sim>, Json(r): Json<AgentReq>) -> ApiResult {
    let (dm, envs) = {
        let mut w = sim.lock();
        let entities = r.entities().unwrap_or_default();
        crate::agent::change_context(&mut w, &r.user, &r.app_id, &entities, r.without_channel)
            .map_err(bad)?
    };
    let mut v = announce(&sim, None, envs).0;
    v["channel"] = dm.into();
    Ok(Json(v))
}

#[derive(Deserialize)]
pub struct AgentTabsQuery {
    channel: Option<String>,
}

/// Every agent's Messages tab: its app and person, the context last sent,
/// how often it was opened, the prompts at its top.
pub async fn agent_tabs(State(sim): State<Sim>, Query(q): Query<AgentTabsQuery>) -> ApiResult {
    let w = sim.lock();
    let tabs: Vec<Value> = w
        .agent_tabs
        .iter()
        .filter(|(c, _)| q.channel.as_deref().is_none_or(|x| x == c.as_str()))
        .map(|(c, t)| {
            let mut v = serde_json::to_value(t).unwrap_or_default();
            v["channel"] = c.clone().into();
            v
        })
        .collect();
    Ok(Json(json!({"tabs": tabs})))
}

#[derive(Deserialize)]
pub struct AssistantThreadsQuery {
    channel: Option<String>,
}

/// Every assistant thread (and thread with a status): who opened it, its
/// context, every status with how it ended, the one showing, prompts, title.
pub async fn assistant_threads(
    State(sim): State<Sim>,
    Query(q): Query<AssistantThreadsQuery>,
) -> ApiResult {
    let mut w = sim.lock();
    crate::assistant::expire(&mut w);
    let threads: Vec<Value> = w
        .assistant
        .iter()
        .filter(|((c, _), _)| q.channel.as_deref().is_none_or(|x| x == c))
        .map(|((c, key), t)| {
            let ts = w
                .messages
                .get(c)
                .and_then(|m| m.get(key))
                .map(|m| m.ts.clone())
                .unwrap_or_default();
            let mut v = serde_json::to_value(t).unwrap_or_default();
            v["channel"] = c.clone().into();
            v["thread_ts"] = ts.into();
            v["showing"] = t
                .showing()
                .map(|s| json!({"app_id": s.app_id, "status": s.status, "loading_messages": s.loading_messages}))
                .collect::<Vec<_>>()
                .into();
            v
        })
        .collect();
    Ok(Json(json!({"threads": threads})))
}

pub async fn add_fault(State(sim): State<Sim>, Json(f): Json<Fault>) -> ApiResult {
    if !(0.0..=1.0).contains(&f.probability) {
        return Err(bad("probability must be within 0..=1"));
    }
    let mut w = sim.lock();
    if f.mode == FaultMode::InjectReply {
        check_inject_reply(&w, &f)?;
    }
    w.faults.push(f);
    Ok(Json(json!({"faults": w.faults})))
}

/// `inject_reply` needs a person who can reply where the fault may fire:
/// a member of the fault's `channel`, or of some channel when it names none.
fn check_inject_reply(w: &World, f: &Fault) -> Result<(), Refusal> {
    if !matches!(
        f.method.as_str(),
        "chat.postMessage" | "chat.startStream" | "chat.appendStream" | "chat.stopStream"
    ) {
        return Err(bad(
            "inject_reply is a fault of chat.postMessage and the chat.*Stream methods",
        ));
    }
    let user = f
        .user
        .as_deref()
        .ok_or_else(|| bad("inject_reply needs a user"))?;
    match w.users.get(user) {
        Some(u) if !u.is_bot => {}
        Some(_) => return Err(bad("inject_reply's user must be a person, not a bot")),
        None => return Err(not_found("user", user)),
    }
    let member = match f.channel.as_deref() {
        Some(c) => w
            .channels
            .get(c)
            .ok_or_else(|| not_found("channel", c))?
            .members
            .contains(user),
        None => w.channels.values().any(|c| c.members.contains(user)),
    };
    if !member {
        return Err(bad("inject_reply's user is not a member of the channel"));
    }
    Ok(())
}

pub async fn clear_faults(State(sim): State<Sim>) -> ApiResult {
    sim.lock().faults.clear();
    Ok(Json(json!({"faults": []})))
}

/// Every message of a thread, deleted ones included (flagged), oldest first.
pub async fn thread(
    State(sim): State<Sim>,
    Path((channel, ts)): Path<(String, String)>,
) -> ApiResult {
    let mut w = sim.lock();
    crate::streams::expire(&mut w);
    let msgs = w.thread_with_deleted(&channel, &ts);
    if msgs.is_empty() {
        return Err(not_found("thread", &ts));
    }
    Ok(Json(json!({"messages": msgs})))
}

/// Every message of a channel, threads and deleted ones included, oldest
/// first: what a checker that trusts only Slack reads.
pub async fn channel_messages(State(sim): State<Sim>, Path(channel): Path<String>) -> ApiResult {
    let mut w = sim.lock();
    crate::streams::expire(&mut w);
    if !w.channels.contains_key(&channel) {
        return Err(not_found("channel", &channel));
    }
    let msgs: Vec<&Message> = w
        .messages
        .get(&channel)
        .map(|m| m.values().collect())
        .unwrap_or_default();
    Ok(Json(json!({"messages": msgs})))
}

#[derive(Deserialize)]
pub struct CallsQuery {
    method: Option<String>,
    channel: Option<String>,
}

pub async fn calls(State(sim): State<Sim>, Query(q): Query<CallsQuery>) -> ApiResult {
    let w = sim.lock();
    let calls: Vec<_> = w
        .calls
        .iter()
        .filter(|c| {
            q.method.as_deref().is_none_or(|m| m == c.method)
                && q.channel
                    .as_deref()
                    .is_none_or(|ch| Some(ch) == c.channel.as_deref())
        })
        .collect();
    Ok(Json(json!({"calls": calls})))
}

#[derive(Deserialize)]
pub struct DeliveriesQuery {
    event_id: Option<String>,
    app_id: Option<String>,
    channel: Option<String>,
}

pub async fn deliveries(State(sim): State<Sim>, Query(q): Query<DeliveriesQuery>) -> ApiResult {
    let w = sim.lock();
    let d: Vec<_> = w
        .deliveries
        .iter()
        .filter(|d| {
            q.event_id.as_deref().is_none_or(|e| e == d.event_id)
                && q.app_id.as_deref().is_none_or(|a| a == d.app_id)
                && q.channel
                    .as_deref()
                    .is_none_or(|c| Some(c) == d.channel.as_deref())
        })
        .collect();
    Ok(Json(json!({"deliveries": d})))
}

#[derive(Deserialize)]
pub struct AppPostsQuery {
    app_id: String,
    channel: Option<String>,
}

/// How many messages an app posted per thread and per triggering message.
/// The trigger of a post is `metadata.event_payload.source_ts` when the app
/// says so, else the latest message by someone else before it in the thread.
pub async fn app_posts(State(sim): State<Sim>, Query(q): Query<AppPostsQuery>) -> ApiResult {
    let mut w = sim.lock();
    crate::streams::expire(&mut w);
    let mut per_thread: BTreeMap<(String, String), usize> = BTreeMap::new();
    let mut per_trigger: BTreeMap<(String, String, String), usize> = BTreeMap::new();
    for (channel, msgs) in &w.messages {
        if q.channel.as_deref().is_some_and(|c| c != channel) {
            continue;
        }
        for m in msgs.values() {
            // (an assistant thread's root is the app's, but not a post)
            if m.deleted
                || m.app_id.as_deref() != Some(q.app_id.as_str())
                || m.subtype.as_deref() == Some("assistant_app_thread")
            {
                continue;
            }
            let root = m.thread_ts.clone().unwrap_or_else(|| m.ts.clone());
            *per_thread
                .entry((channel.clone(), root.clone()))
                .or_default() += 1;
            let declared = m
                .metadata
                .as_ref()
                .and_then(|md| md.pointer("/event_payload/source_ts"))
                .and_then(Value::as_str)
                .map(str::to_owned);
            let trigger = declared.or_else(|| {
                // The thread's index, newest first from just before the post.
                let (key, root_key) = (ts_key(&m.ts), ts_key(&root));
                let by_other = |k: &TsKey| {
                    msgs.get(k)
                        .filter(|x| x.app_id.as_deref() != Some(q.app_id.as_str()))
                        .map(|_| *k)
                };
                let reply = w
                    .replies
                    .get(channel)
                    .and_then(|t| t.get(&root_key))
                    .and_then(|r| r.range(..key).rev().find_map(by_other));
                let parent = (root_key < key).then(|| by_other(&root_key)).flatten();
                reply
                    .max(parent)
                    .and_then(|k| msgs.get(&k))
                    .map(|x| x.ts.clone())
            });
            if let Some(t) = trigger {
                *per_trigger.entry((channel.clone(), root, t)).or_default() += 1;
            }
        }
    }
    Ok(Json(json!({
        "per_thread": per_thread.into_iter().map(|((c, t), n)| json!({"channel": c, "thread_ts": t, "count": n})).collect::<Vec<_>>(),
        "per_trigger": per_trigger.into_iter().map(|((c, t, s), n)| json!({"channel": c, "thread_ts": t, "trigger_ts": s, "count": n})).collect::<Vec<_>>(),
    })))
}

#[derive(Deserialize)]
pub struct AuthorizeQuery {
    client_id: String,
    #[serde(default)]
    scope: String,
    state: Option<String>,
    redirect_uri: Option<String>,
    /// The workspace that approves (the emulator has no login page), or an
    /// enterprise id (`E…`): an org admin installing the app org-wide.
    team: String,
}

/// `GET /oauth/v2/authorize`: the consent page, approved at once for `team`;
/// redirects to `redirect_uri` with a single-use `code` and the `state`.
pub async fn authorize(State(sim): State<Sim>, Query(q): Query<AuthorizeQuery>) -> Response {
    let mut w = sim.lock();
    let Some(app) = w
        .apps
        .values()
        .find(|a| a.client_id == q.client_id)
        .cloned()
    else {
        return (StatusCode::BAD_REQUEST, "invalid_client_id").into_response();
    };
    let org_wide = w.is_enterprise(&q.team);
    if !w.teams.contains_key(&q.team) && !org_wide {
        return (StatusCode::BAD_REQUEST, "unknown team").into_response();
    }
    let Some(redirect) = q
        .redirect_uri
        .clone()
        .or_else(|| app.request_urls.first().cloned())
    else {
        return (StatusCode::BAD_REQUEST, "redirect_uri is required").into_response();
    };
    let scopes: BTreeSet<String> = q
        .scope
        .split(',')
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    // Approving creates (or updates) the installation; tokens come from the code exchange.
    let (bot_user_id, bot_id) = match app.installs.get(&q.team) {
        Some(i) => (i.bot_user_id.clone(), i.bot_id.clone()),
        None => (w.rng.id("U", 10), w.rng.id("B", 10)),
    };
    w.users.insert(
        bot_user_id.clone(),
        User {
            id: bot_user_id.clone(),
            team_id: q.team.clone(),
            name: app.name.to_ascii_lowercase(),
            is_bot: true,
            bot_id: Some(bot_id.clone()),
            app_id: Some(app.id.clone()),
        },
    );
    let placeholder = format!("xoxb-pending-{}", w.rng.hex(16));
    if let Some(a) = w.apps.get_mut(&app.id) {
        let entry = a.installs.entry(q.team.clone()).or_insert(Install {
            team_id: q.team.clone(),
            is_enterprise_install: org_wide,
            bot_user_id,
            bot_id,
            bot_token: placeholder,
            scopes: BTreeSet::new(),
            refresh_token: None,
            expires_at: None,
        });
        entry.scopes = scopes;
    }
    let code = w.rng.hex(32);
    w.oauth_codes
        .insert(code.clone(), (app.id.clone(), q.team.clone()));
    let sep = if redirect.contains('?') { '&' } else { '?' };
    let mut target = format!("{redirect}{sep}code={code}");
    if let Some(s) = q.state {
        target.push_str("&state=");
        target.push_str(&serde_urlencoded::to_string([("s", s)]).unwrap_or_default()[2..]);
    }
    Redirect::to(&target).into_response()
}
