//! The assistant pane: a person opens the app's assistant (a thread in
//! their DM with the app, whose root has subtype `assistant_app_thread`)
//! and the app hears `assistant_thread_started`; when they look at another
//! channel it hears `assistant_thread_context_changed`. The app shows
//! progress with `assistant.threads.setStatus`, offers prompts with
//! `setSuggestedPrompts` and names the thread with `setTitle`. Shaped after
//! Slack's method and event reference and the SDKs (bolt-python's
//! assistant tests, node-slack-sdk's types):
//!
//! * `setStatus` (`channel_id`, `thread_ts`, `status`, `loading_messages`
//!   up to 10) takes `chat:write` or `assistant:write`; an empty `status`
//!   clears it; the status also clears when the app replies in the thread
//!   and after two minutes without a reply;
//! * `setSuggestedPrompts` (`prompts`: `[{title, message}]`, `title`) and
//!   `setTitle` (`title`) take `assistant:write` and need an assistant
//!   thread; `setSuggestedPrompts` without `thread_ts` sets the prompts at
//!   the top of an agent's Messages tab instead ([`crate::agent`]);
//! * `channel_not_found` for a conversation the bot cannot see (or no
//!   `channel_id`), `invalid_thread_ts` for a thread that is not there (no
//!   `thread_ts`, a reply's ts rather than its root's, or, for prompts and
//!   titles, not the app's assistant thread), checked in that order, then
//!   `invalid_arguments` for a missing or malformed `status`, `prompts`,
//!   `title` or `loading_messages`.
//!
//! Chosen where Slack documents nothing: `setStatus` works in any thread
//! the bot can see (Slack accepts `chat:write` for it since 2026-03), and
//! each app has its own status in a thread; at most 4 suggested prompts; a
//! title is kept for inspection without the root's hidden
//! `message_changed`; the thread's root has empty text, sends no event of
//! its own and is not counted as a post; each method has a Tier 4 budget
//! of its own (Slack: "special" for `setStatus`, Tier 3 or 4 for the
//! others).

use serde_json::{Value, json};

use crate::api::{ApiError, Params};
use crate::delivery::Envelope;
use crate::events;
use crate::model::{App, ChannelKind, Install, Message, TsKey, World, now_micros, ts_key};

/// Most `loading_messages` a status may rotate through.
const MAX_LOADING_MESSAGES: usize = 10;

/// Most suggested prompts at once.
const MAX_PROMPTS: usize = 4;

pub use crate::model::{StatusRecord, ThreadState};

impl ThreadState {
    /// The statuses showing now, one per app at most.
    pub fn showing(&self) -> impl Iterator<Item = &StatusRecord> {
        self.statuses.iter().filter(|s| s.ended.is_none())
    }

    /// Ends `app`'s status, if one shows.
    fn end_status(&mut self, app: &str, how: &str, at: u64) {
        for s in &mut self.statuses {
            if s.app_id == app && s.ended.is_none() {
                s.ended = Some(how.to_owned());
                s.ended_at_micros = Some(at);
            }
        }
    }
}

/// Ends statuses that have shown for `assistant_status_timeout_ms` (Slack:
/// two minutes) without a reply.
pub fn expire(w: &mut World) {
    let now = now_micros();
    let timeout = w.settings.assistant_status_timeout_ms.saturating_mul(1000);
    for t in w.assistant.values_mut() {
        for s in &mut t.statuses {
            if s.ended.is_none() && now.saturating_sub(s.set_at_micros) >= timeout {
                s.ended = Some("timeout".into());
                s.ended_at_micros = Some(s.set_at_micros + timeout);
            }
        }
    }
}

/// `app` posted in `thread_ts` (a root) of `channel`: its status there
/// stops showing.
pub fn replied(w: &mut World, app: &str, channel: &str, thread_ts: Option<&str>) {
    let Some(root) = thread_ts else { return };
    if let Some(t) = w.assistant.get_mut(&(channel.to_owned(), ts_key(root))) {
        t.end_status(app, "replied", now_micros());
    }
}

/// The conversation (`channel_id`) and thread (`thread_ts`) a call names,
/// where the bot can see them.
fn thread_of(
    w: &World,
    install: &Install,
    p: &Params,
) -> Result<(crate::model::Channel, String, TsKey), ApiError> {
    let id = p
        .str("channel_id")
        .ok_or(ApiError::new("channel_not_found"))?;
    let channel = w
        .channels
        .get(&id)
        .filter(|c| w.covers(install, &c.team_id))
        .filter(|c| c.kind == ChannelKind::Public || c.members.contains(&install.bot_user_id))
        .cloned()
        .ok_or(ApiError::new("channel_not_found"))?;
    let ts = p
        .str("thread_ts")
        .ok_or(ApiError::new("invalid_thread_ts"))?;
    let root = w
        .message(&channel.id, &ts)
        .filter(|m| !m.deleted && m.thread_ts.as_deref().is_none_or(|t| t == m.ts))
        .ok_or(ApiError::new("invalid_thread_ts"))?;
    let key = ts_key(&root.ts);
    Ok((channel, ts, key))
}

/// The assistant thread of `app` a call names.
fn own_assistant_thread(
    w: &World,
    app: &App,
    install: &Install,
    p: &Params,
) -> Result<(String, TsKey), ApiError> {
    let (channel, _, key) = thread_of(w, install, p)?;
    match w.assistant.get(&(channel.id.clone(), key)) {
        Some(t) if t.app_id.as_deref() == Some(app.id.as_str()) => Ok((channel.id, key)),
        _ => Err(ApiError::new("invalid_thread_ts")),
    }
}

fn need_any_scope(install: &Install, scopes: &[&str]) -> Result<(), ApiError> {
    if scopes.iter().any(|s| install.scopes.contains(*s)) {
        return Ok(());
    }
    let mut e = ApiError::new("missing_scope");
    e.extra.insert("needed".into(), scopes.join(",").into());
    e.extra.insert(
        "provided".into(),
        install
            .scopes
            .iter()
            .cloned()
            .collect::<Vec<_>>()
            .join(",")
            .into(),
    );
    Err(e)
}

/// `assistant.threads.setStatus`.
pub fn set_status(
    w: &mut World,
    app: &App,
    install: &Install,
    p: &Params,
) -> Result<Value, ApiError> {
    need_any_scope(install, &["chat:write", "assistant:write"])?;
    let (channel, _, key) = thread_of(w, install, p)?;
    // `status` is required, as text; an empty one clears.
    if !p.is_text("status") {
        return Err(ApiError::new("invalid_arguments"));
    }
    let status = p.str("status").unwrap_or_default();
    let loading = match p.json("loading_messages", "invalid_arguments")? {
        None => Vec::new(),
        Some(Value::Array(a)) if a.len() <= MAX_LOADING_MESSAGES => a
            .iter()
            .map(|m| m.as_str().map(str::to_owned))
            .collect::<Option<Vec<_>>>()
            .ok_or(ApiError::new("invalid_arguments"))?,
        Some(_) => return Err(ApiError::new("invalid_arguments")),
    };
    crate::api::tier_budget(
        w,
        app,
        install,
        "assistant.threads.setStatus",
        w.settings.tier4_per_minute,
    )?;
    let now = now_micros();
    let t = w.assistant.entry((channel.id, key)).or_default();
    if status.is_empty() {
        t.end_status(&app.id, "cleared", now);
    } else {
        t.end_status(&app.id, "replaced", now);
        t.statuses.push(StatusRecord {
            app_id: app.id.clone(),
            status,
            loading_messages: loading,
            set_at_micros: now,
            ended: None,
            ended_at_micros: None,
        });
    }
    Ok(json!({}))
}

/// `assistant.threads.setSuggestedPrompts`.
pub fn set_suggested_prompts(
    w: &mut World,
    app: &App,
    install: &Install,
    p: &Params,
) -> Result<Value, ApiError> {
    need_any_scope(install, &["assistant:write"])?;
    // (without a thread: the top of an agent's Messages tab)
    let tab = match p.str("thread_ts") {
        None => Some(
            p.str("channel_id")
                .ok_or(ApiError::new("channel_not_found"))?,
        ),
        Some(_) => None,
    };
    let at = match tab {
        None => Some(own_assistant_thread(w, app, install, p)?),
        Some(_) => None,
    };
    let prompts = match p.json("prompts", "invalid_arguments")? {
        Some(Value::Array(a))
            if !a.is_empty()
                && a.len() <= MAX_PROMPTS
                && a.iter()
                    .all(|x| x["title"].is_string() && x["message"].is_string()) =>
        {
            Value::Array(a)
        }
        _ => return Err(ApiError::new("invalid_arguments")),
    };
    crate::api::tier_budget(
        w,
        app,
        install,
        "assistant.threads.setSuggestedPrompts",
        w.settings.tier4_per_minute,
    )?;
    let title = p.str("title");
    let Some(at) = at else {
        let dm = tab.expect("a tab when no thread");
        return crate::agent::set_tab_prompts(w, app, install, &dm, prompts, title);
    };
    let t = w.assistant.get_mut(&at).expect("an assistant thread");
    t.suggested_prompts = Some(prompts);
    t.prompts_title = title;
    Ok(json!({}))
}

/// `assistant.threads.setTitle`.
pub fn set_title(
    w: &mut World,
    app: &App,
    install: &Install,
    p: &Params,
) -> Result<Value, ApiError> {
    need_any_scope(install, &["assistant:write"])?;
    let at = own_assistant_thread(w, app, install, p)?;
    let title = p.str("title").ok_or(ApiError::new("invalid_arguments"))?;
    crate::api::tier_budget(
        w,
        app,
        install,
        "assistant.threads.setTitle",
        w.settings.tier4_per_minute,
    )?;
    w.assistant.get_mut(&at).expect("an assistant thread").title = Some(title);
    Ok(json!({}))
}

/// The `assistant_thread` object of the events.
fn assistant_thread(t: &ThreadState, channel: &str, thread_ts: &str) -> Value {
    json!({"user_id": t.user_id, "context": t.context.clone().unwrap_or_else(|| json!({})),
           "channel_id": channel, "thread_ts": thread_ts})
}

/// The context object for the channel a person looks at.
fn context_of(w: &World, channel: Option<&str>) -> Result<Option<Value>, &'static str> {
    let Some(id) = channel else { return Ok(None) };
    let c = w.channels.get(id).ok_or("no such context channel")?;
    let enterprise = w
        .teams
        .get(&c.team_id)
        .and_then(|t| t.enterprise_id.clone());
    Ok(Some(
        json!({"channel_id": c.id, "team_id": c.team_id, "enterprise_id": enterprise}),
    ))
}

/// A person opens the app's assistant: their DM with the app (made if
/// missing) gets a new thread, and the app hears `assistant_thread_started`
/// if it subscribes to it. Returns the DM and the thread's `ts`.
pub fn open(
    w: &mut World,
    user: &str,
    app_id: &str,
    context_channel: Option<&str>,
) -> Result<(String, String, Vec<Envelope>), &'static str> {
    let person = w.users.get(user).cloned().ok_or("no such user")?;
    if person.is_bot {
        return Err("a bot cannot open the assistant");
    }
    let app = w.apps.get(app_id).cloned().ok_or("no such app")?;
    if app.experience == crate::model::Experience::AgentView {
        return Err("the app uses agent_view: open its Messages tab instead");
    }
    let install = w
        .install_of(&app, &person.team_id)
        .cloned()
        .ok_or("the app is not installed in the person's workspace")?;
    let context = context_of(w, context_channel)?;
    let dm = w
        .channels
        .values()
        .find(|c| {
            c.kind == ChannelKind::Im
                && c.members.contains(user)
                && c.members.contains(&install.bot_user_id)
        })
        .cloned();
    let dm = match dm {
        Some(c) => c,
        None => {
            let mut id = w.rng.id("D", 10);
            while w.channels.contains_key(&id) {
                id = w.rng.id("D", 10);
            }
            let c = crate::model::Channel {
                id: id.clone(),
                team_id: person.team_id.clone(),
                name: String::new(),
                kind: ChannelKind::Im,
                is_ext_shared: false,
                is_archived: false,
                members: [user.to_owned(), install.bot_user_id.clone()]
                    .into_iter()
                    .collect(),
                created: crate::model::now_unix(),
            };
            w.channels.insert(id, c.clone());
            c
        }
    };
    let ts = w.clock.next_ts();
    let now = now_micros();
    w.insert_message(Message {
        channel: dm.id.clone(),
        ts: ts.clone(),
        user: Some(install.bot_user_id.clone()),
        bot_id: Some(install.bot_id.clone()),
        app_id: Some(app.id.clone()),
        username: None,
        subtype: Some("assistant_app_thread".into()),
        original_text: String::new(),
        text: String::new(),
        thread_ts: None,
        blocks: None,
        attachments: None,
        metadata: None,
        edited: None,
        deleted: false,
        client_msg_id: None,
        created_at_micros: now,
        deleted_at_micros: None,
        edits: Vec::new(),
        streaming_state: None,
        stream: None,
    });
    let mut state = ThreadState {
        app_id: Some(app.id.clone()),
        user_id: Some(user.to_owned()),
        context,
        ..ThreadState::default()
    };
    crate::model::looked_at(&mut state.looked_at, context_channel);
    let event = json!({"type": "assistant_thread_started",
                       "assistant_thread": assistant_thread(&state, &dm.id, &ts),
                       "event_ts": w.clock.next_ts()});
    w.assistant.insert((dm.id.clone(), ts_key(&ts)), state);
    let envs = if app.events.contains("assistant_thread_started") {
        vec![events::for_app(
            w,
            &app,
            &dm,
            event,
            "assistant_thread_started",
        )]
    } else {
        Vec::new()
    };
    Ok((dm.id, ts, envs))
}

/// The person looks at another channel while the assistant thread is
/// open: the app hears `assistant_thread_context_changed`.
pub fn change_context(
    w: &mut World,
    channel: &str,
    thread_ts: &str,
    context_channel: &str,
) -> Result<Vec<Envelope>, &'static str> {
    let context = context_of(w, Some(context_channel))?;
    let key = (channel.to_owned(), ts_key(thread_ts));
    let app_id = w
        .assistant
        .get(&key)
        .ok_or("no such assistant thread")?
        .app_id
        .clone()
        .ok_or("not an assistant thread")?;
    let app = w.apps.get(&app_id).cloned().ok_or("no such app")?;
    let dm = w.channels.get(channel).cloned().ok_or("no such channel")?;
    if w.install_of(&app, &dm.team_id).is_none() {
        return Err("the app is no longer installed");
    }
    let t = w.assistant.get_mut(&key).expect("checked above");
    t.context = context;
    crate::model::looked_at(&mut t.looked_at, Some(context_channel));
    let t = t.clone();
    let event = json!({"type": "assistant_thread_context_changed",
                       "assistant_thread": assistant_thread(&t, channel, thread_ts),
                       "event_ts": w.clock.next_ts()});
    Ok(if app.events.contains("assistant_thread_context_changed") {
        vec![events::for_app(
            w,
            &app,
            &dm,
            event,
            "assistant_thread_context_changed",
        )]
    } else {
        Vec::new()
    })
}
