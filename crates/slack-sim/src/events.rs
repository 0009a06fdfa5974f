//! The Events API payloads Slack sends when something happens in a channel,
//! shaped like Slack's own examples (see tests/fixtures/slack/events).

use serde_json::{Value, json};

use crate::delivery::Envelope;
use crate::model::{App, Channel, ChannelKind, Message, World, now_unix};

/// Which apps see an event in `channel`: installed in its workspace, with
/// their bot in the channel.
fn watchers(w: &World, channel: &Channel) -> Vec<App> {
    w.apps
        .values()
        .filter(|a| {
            w.install_of(a, &channel.team_id)
                .is_some_and(|i| channel.members.contains(&i.bot_user_id))
        })
        .cloned()
        .collect()
}

fn envelope(
    w: &mut World,
    app: &App,
    channel: &Channel,
    event: Value,
    event_type: &str,
) -> Envelope {
    let team = w.teams.get(&channel.team_id).cloned();
    let enterprise = team.as_ref().and_then(|t| t.enterprise_id.clone());
    let install = w.install_of(app, &channel.team_id).cloned();
    let (bot_user, org_wide) = install
        .map(|i| (i.bot_user_id, i.is_enterprise_install))
        .unwrap_or_default();
    let event_id = w.rng.id("Ev", 10);
    let context = format!("4-{}", w.rng.hex(40));
    w.event_contexts
        .insert(context.clone(), (app.id.clone(), channel.team_id.clone()));
    let mut body = json!({
        "token": app.verification_token,
        "team_id": channel.team_id,
        "api_app_id": app.id,
        "event": event,
        "type": "event_callback",
        "event_id": event_id,
        "event_time": now_unix(),
        "authorizations": [{
            "enterprise_id": enterprise,
            // An org-wide install is authorised for the enterprise, not a
            // workspace (the bolt-python org-install fixture).
            "team_id": if org_wide { Value::Null } else { channel.team_id.clone().into() },
            "user_id": bot_user,
            "is_bot": true,
            "is_enterprise_install": org_wide
        }],
        "is_ext_shared_channel": channel.is_ext_shared,
        "event_context": context,
    });
    if let Some(e) = enterprise {
        body["enterprise_id"] = e.into();
    }
    let about = About::of(&body["event"]);
    Envelope {
        app_id: app.id.clone(),
        event_id,
        event_type: event_type.to_owned(),
        body,
        channel: about.channel,
        message_ts: about.message_ts,
        subtype: about.subtype,
    }
}

/// An event for one app about `channel` (the assistant pane's events).
pub fn for_app(
    w: &mut World,
    app: &App,
    channel: &Channel,
    event: Value,
    event_type: &str,
) -> Envelope {
    envelope(w, app, channel, event, event_type)
}

/// What an event is about, for the delivery log.
struct About {
    channel: Option<String>,
    message_ts: Option<String>,
    subtype: Option<String>,
}

impl About {
    fn of(event: &Value) -> Self {
        let text = |v: &Value| v.as_str().filter(|s| !s.is_empty()).map(str::to_owned);
        let subtype = text(&event["subtype"]);
        let is_message = matches!(event["type"].as_str(), Some("message" | "app_mention"));
        let message_ts = match subtype.as_deref() {
            _ if !is_message => None,
            Some("message_changed") => text(&event["message"]["ts"]),
            Some("message_deleted") => text(&event["deleted_ts"]),
            _ => text(&event["ts"]),
        };
        Self {
            // (the assistant pane's events name their DM inside)
            channel: text(&event["channel"])
                .or_else(|| text(&event["assistant_thread"]["channel_id"])),
            message_ts,
            subtype,
        }
    }
}

/// The `message` event body for a message as it is now.
fn message_event(w: &World, channel: &Channel, m: &Message) -> Value {
    let mut e = json!({"type": "message", "text": m.text, "ts": m.ts, "channel": channel.id,
                       "event_ts": m.ts, "channel_type": channel.kind.channel_type()});
    let o = e.as_object_mut().expect("object");
    if let Some(u) = &m.user {
        o.insert("user".into(), u.clone().into());
        o.insert("team".into(), channel.team_id.clone().into());
    }
    if let Some(s) = &m.subtype {
        o.insert("subtype".into(), s.clone().into());
    }
    if let Some(c) = &m.client_msg_id {
        o.insert("client_msg_id".into(), c.clone().into());
    }
    if let Some(b) = &m.blocks {
        o.insert("blocks".into(), b.clone());
    }
    if let Some(a) = &m.attachments {
        o.insert("attachments".into(), a.clone());
    }
    if let Some(b) = &m.bot_id {
        o.insert("bot_id".into(), b.clone().into());
        if let Some(a) = &m.app_id {
            o.insert("app_id".into(), a.clone().into());
            let name = w.apps.get(a).map(|a| a.name.clone()).unwrap_or_default();
            o.insert(
                "bot_profile".into(),
                json!({"id": b, "deleted": false, "name": name, "updated": now_unix(), "app_id": a,
                       "icons": {}, "team_id": channel.team_id}),
            );
        }
    }
    if let Some(n) = &m.username {
        o.insert("username".into(), n.clone().into());
    }
    if let Some(s) = &m.streaming_state {
        o.insert("streaming_state".into(), s.clone().into());
    }
    // (a `message_changed` event's message and previous message carry it)
    if let Some(e) = m.edited_json() {
        o.insert("edited".into(), e);
    }
    if let Some(t) = &m.thread_ts {
        o.insert("thread_ts".into(), t.clone().into());
        if t != &m.ts
            && let Some(p) = w.message(&channel.id, t).and_then(|p| p.user.clone())
        {
            o.insert("parent_user_id".into(), p.into());
        }
    }
    e
}

/// Events for a new message: `app_mention` to each app whose bot is
/// mentioned and subscribed, and `message` to each app subscribed to the
/// channel kind's `message.*` — both for one mention when both are
/// subscribed, as Slack does.
pub fn new_message(w: &mut World, channel: &Channel, m: &Message) -> Vec<Envelope> {
    let mut out = Vec::new();
    for app in watchers(w, channel) {
        let Some(bot_user) = w
            .install_of(&app, &channel.team_id)
            .map(|i| i.bot_user_id.clone())
        else {
            continue;
        };
        let mentioned = m.text.contains(&format!("<@{bot_user}>"));
        let human = m.bot_id.is_none() && m.subtype.is_none();
        if mentioned && human && app.events.contains("app_mention") {
            let mut e = message_event(w, channel, m);
            let o = e.as_object_mut().expect("object");
            o.insert("type".into(), "app_mention".into());
            o.remove("channel_type");
            out.push(envelope(w, &app, channel, e, "app_mention"));
        }
        if app.events.contains(channel.kind.message_subscription()) {
            let mut e = message_event(w, channel, m);
            if m.subtype.as_deref() == Some("thread_broadcast")
                && let Some(root) = m
                    .thread_ts
                    .as_deref()
                    .and_then(|t| w.message(&channel.id, t))
            {
                let count = w.reply_count(&channel.id, &root.ts);
                e["root"] = root.to_api(None, count, false);
            }
            out.push(envelope(w, &app, channel, e, "message"));
        }
    }
    out
}

/// Stores a new message in its channel and returns the events it causes.
pub fn post(w: &mut World, channel: &Channel, msg: Message) -> Vec<Envelope> {
    w.insert_message(msg.clone());
    new_message(w, channel, &msg)
}

/// `message_changed`: the edited message and what it was before.
pub fn edited(
    w: &mut World,
    channel: &Channel,
    before: &Message,
    after: &Message,
    event_ts: &str,
) -> Vec<Envelope> {
    let mut out = Vec::new();
    for app in watchers(w, channel) {
        if !app.events.contains(channel.kind.message_subscription()) {
            continue;
        }
        let inner = {
            let mut e = message_event(w, channel, after);
            let o = e.as_object_mut().expect("object");
            for k in ["channel", "event_ts", "channel_type"] {
                o.remove(k);
            }
            e
        };
        let prev = {
            let mut e = message_event(w, channel, before);
            let o = e.as_object_mut().expect("object");
            for k in ["channel", "event_ts", "channel_type"] {
                o.remove(k);
            }
            e
        };
        let e = json!({"type": "message", "subtype": "message_changed", "message": inner,
                       "previous_message": prev, "channel": channel.id, "hidden": true,
                       "ts": event_ts, "event_ts": event_ts, "channel_type": channel.kind.channel_type()});
        out.push(envelope(w, &app, channel, e, "message"));
    }
    out
}

/// `message_deleted`: the deleted message's `ts` in `deleted_ts`.
pub fn deleted(
    w: &mut World,
    channel: &Channel,
    before: &Message,
    event_ts: &str,
) -> Vec<Envelope> {
    let mut out = Vec::new();
    for app in watchers(w, channel) {
        if !app.events.contains(channel.kind.message_subscription()) {
            continue;
        }
        let prev = {
            let mut e = message_event(w, channel, before);
            let o = e.as_object_mut().expect("object");
            for k in ["channel", "event_ts", "channel_type"] {
                o.remove(k);
            }
            e
        };
        // A thread's root with replies stays as a tombstone, announced
        // as a change of the message.
        let root = before.thread_ts.as_deref().is_none_or(|t| t == before.ts);
        let replies = if root {
            w.reply_count(&channel.id, &before.ts)
        } else {
            0
        };
        let e = if replies > 0 {
            json!({"type": "message", "subtype": "message_changed", "message": before.tombstone(replies),
                   "previous_message": prev, "channel": channel.id, "hidden": true,
                   "event_ts": event_ts, "ts": event_ts, "channel_type": channel.kind.channel_type()})
        } else {
            json!({"type": "message", "subtype": "message_deleted", "previous_message": prev,
                   "channel": channel.id, "hidden": true, "deleted_ts": before.ts,
                   "event_ts": event_ts, "ts": event_ts, "channel_type": channel.kind.channel_type()})
        };
        out.push(envelope(w, &app, channel, e, "message"));
    }
    out
}

/// Lifecycle events for one app: `app_uninstalled`, `tokens_revoked`.
pub fn lifecycle(
    w: &mut World,
    app: &App,
    team_id: &str,
    event: Value,
    event_type: &str,
) -> Envelope {
    let channel = Channel {
        id: String::new(),
        team_id: team_id.to_owned(),
        name: String::new(),
        kind: ChannelKind::Public,
        is_ext_shared: false,
        is_archived: false,
        members: Default::default(),
        created: 0,
    };
    let mut env = envelope(w, app, &channel, event, event_type);
    if let Some(o) = env.body.as_object_mut() {
        o.remove("authorizations");
        o.remove("is_ext_shared_channel");
        o.remove("event_context");
    }
    env
}
