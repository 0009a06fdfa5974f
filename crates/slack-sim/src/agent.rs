//! The agent messaging experience (an app with `features.agent_view`):
//! the person's DM with the app is its Messages tab. Opening the tab sends
//! `app_home_opened` with `tab: "messages"`; looking at something else in
//! Slack sends `app_context_changed`, whose `context.entities` (ordered by
//! relevance) name channels, canvases, lists and messages; the app sets
//! suggested prompts at the top of the tab with
//! `assistant.threads.setSuggestedPrompts` and no `thread_ts`. Each
//! top-level message in the tab is a thread root of its own (nothing here
//! makes that so: a DM message's thread is itself, and the app answers in
//! it with `thread_ts`). Shaped after Slack's event reference
//! (`app_context_changed`, `app_home_opened`), node-slack-sdk's
//! `AppContextChangedEvent` / `AppHomeOpenedEvent` and bolt-python's agent
//! guide:
//!
//! * `app_context_changed`: `{type, channel (the DM), user, context:
//!   {entities: [{type: "slack#/types/channel_id" | "canvas_id" | "list_id",
//!   value, team_id?, enterprise_id?} | {type: "slack#/types/message_context",
//!   value: {message_ts, channel_id}, …}]}, event_ts}`; `context: {}` when
//!   the person looks at nothing Slack names;
//! * `app_home_opened`: `{type, user, channel, tab: "messages", event_ts}`,
//!   with the same `context` when the app also subscribes to
//!   `app_context_changed` (Slack's changelog, 2026-07).
//!
//! Chosen where Slack documents nothing: an app with `assistant_view`
//! cannot be opened as an agent (and the reverse), the tab's context is
//! kept per DM, and a channel or message entity without a `team_id` gets
//! its channel's workspace (and organisation).

use serde_json::{Value, json};

use crate::api::ApiError;
use crate::delivery::Envelope;
use crate::events;
use crate::model::{AgentTab, App, ChannelKind, Experience, Install, World};

/// The entities of a context as Slack sends them, the workspace of each
/// channel-like one filled in from the world when the caller left it out.
fn filled(w: &World, entities: &[Value]) -> Result<Vec<Value>, &'static str> {
    entities
        .iter()
        .map(|e| {
            let mut e = e.clone();
            if !e["type"]
                .as_str()
                .is_some_and(|t| t.starts_with("slack#/types/"))
            {
                return Err("an entity needs a slack#/types/… type");
            }
            let channel = e["value"]
                .as_str()
                .or_else(|| e["value"]["channel_id"].as_str());
            let known = channel.and_then(|c| w.channels.get(c));
            if let (Some(c), true) = (known, e.get("team_id").is_none()) {
                e["team_id"] = c.team_id.clone().into();
                if let Some(ent) = w
                    .teams
                    .get(&c.team_id)
                    .and_then(|t| t.enterprise_id.clone())
                {
                    e["enterprise_id"] = ent.into();
                }
            }
            Ok(e)
        })
        .collect()
}

/// The app, its install and the person, for an agent-view action.
fn agent_app(w: &World, user: &str, app_id: &str) -> Result<(App, Install, String), &'static str> {
    let person = w.users.get(user).cloned().ok_or("no such user")?;
    if person.is_bot {
        return Err("a bot cannot open an agent");
    }
    let app = w.apps.get(app_id).cloned().ok_or("no such app")?;
    if app.experience != Experience::AgentView {
        return Err("the app uses assistant_view: open its assistant pane instead");
    }
    let install = w
        .install_of(&app, &person.team_id)
        .cloned()
        .ok_or("the app is not installed in the person's workspace")?;
    Ok((app, install, person.team_id))
}

/// The DM of `user` with the app's bot, made if missing.
fn dm_of(w: &mut World, user: &str, team: &str, install: &Install) -> crate::model::Channel {
    if let Some(c) = w.channels.values().find(|c| {
        c.kind == ChannelKind::Im
            && c.members.contains(user)
            && c.members.contains(&install.bot_user_id)
    }) {
        return c.clone();
    }
    let mut id = w.rng.id("D", 10);
    while w.channels.contains_key(&id) {
        id = w.rng.id("D", 10);
    }
    let c = crate::model::Channel {
        id: id.clone(),
        team_id: team.to_owned(),
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

/// A person opens the app's Messages tab, looking at `entities` (`None`:
/// the context is left as it was): the app hears `app_home_opened` (with
/// the context when it subscribes to `app_context_changed`). Returns the
/// DM.
pub fn open(
    w: &mut World,
    user: &str,
    app_id: &str,
    entities: Option<&[Value]>,
) -> Result<(String, Vec<Envelope>), &'static str> {
    let (app, install, team) = agent_app(w, user, app_id)?;
    let entities = entities.map(|e| filled(w, e)).transpose()?;
    let dm = dm_of(w, user, &team, &install);
    let tab = w
        .agent_tabs
        .entry(dm.id.clone())
        .or_insert_with(|| AgentTab {
            app_id: app.id.clone(),
            user_id: user.to_owned(),
            context: json!({}),
            ..AgentTab::default()
        });
    tab.opened += 1;
    if let Some(e) = entities {
        note_looked_at(tab, &e);
        tab.context = context(e);
    }
    let context = tab.context.clone();
    let mut event = json!({"type": "app_home_opened", "user": user, "channel": dm.id,
                           "tab": "messages", "event_ts": w.clock.next_ts()});
    if app.events.contains("app_context_changed") && context.get("entities").is_some() {
        event["context"] = context;
    }
    let envs = if app.events.contains("app_home_opened") {
        vec![events::for_app(w, &app, &dm, event, "app_home_opened")]
    } else {
        Vec::new()
    };
    Ok((dm.id, envs))
}

/// The channels of `entities` (a channel's id, a message's channel) join
/// what the person looked at from the tab.
fn note_looked_at(tab: &mut AgentTab, entities: &[Value]) {
    for e in entities {
        let channel = e["value"]
            .as_str()
            .filter(|_| e["type"] == "slack#/types/channel_id")
            .or_else(|| e["value"]["channel_id"].as_str());
        crate::model::looked_at(&mut tab.looked_at, channel);
    }
}

/// The `context` object of an event.
fn context(entities: Vec<Value>) -> Value {
    if entities.is_empty() {
        json!({})
    } else {
        json!({"entities": entities})
    }
}

/// The person looks at `entities` (most relevant first; none: at nothing
/// Slack names): the app hears `app_context_changed` (without its
/// `channel` when `without_channel`, as Slack's event reference shows it).
/// Returns the DM.
pub fn change_context(
    w: &mut World,
    user: &str,
    app_id: &str,
    entities: &[Value],
    without_channel: bool,
) -> Result<(String, Vec<Envelope>), &'static str> {
    let (app, install, team) = agent_app(w, user, app_id)?;
    let entities = filled(w, entities)?;
    let dm = dm_of(w, user, &team, &install);
    let tab = w
        .agent_tabs
        .entry(dm.id.clone())
        .or_insert_with(|| AgentTab {
            app_id: app.id.clone(),
            user_id: user.to_owned(),
            ..AgentTab::default()
        });
    note_looked_at(tab, &entities);
    tab.context = context(entities);
    let mut event = json!({"type": "app_context_changed", "channel": dm.id, "user": user,
                           "context": tab.context.clone(), "event_ts": w.clock.next_ts()});
    if without_channel {
        event.as_object_mut().map(|o| o.remove("channel"));
    }
    let envs = if app.events.contains("app_context_changed") {
        vec![events::for_app(w, &app, &dm, event, "app_context_changed")]
    } else {
        Vec::new()
    };
    Ok((dm.id, envs))
}

/// `assistant.threads.setSuggestedPrompts` without a `thread_ts`: the
/// prompts at the top of an agent's Messages tab (`channel_id`, the DM).
/// `channel_not_found` for a DM the bot is not in; `invalid_arguments` for
/// an app without `agent_view` (it has no Messages tab to set them on).
pub fn set_tab_prompts(
    w: &mut World,
    app: &App,
    install: &Install,
    channel_id: &str,
    prompts: Value,
    title: Option<String>,
) -> Result<Value, ApiError> {
    let dm = w
        .channels
        .get(channel_id)
        .filter(|c| c.kind == ChannelKind::Im && c.members.contains(&install.bot_user_id))
        .filter(|c| w.covers(install, &c.team_id))
        .cloned()
        .ok_or(ApiError::new("channel_not_found"))?;
    if app.experience != Experience::AgentView {
        return Err(ApiError::new("invalid_thread_ts"));
    }
    let user = dm
        .members
        .iter()
        .find(|m| **m != install.bot_user_id)
        .cloned()
        .unwrap_or_default();
    let tab = w.agent_tabs.entry(dm.id).or_insert_with(|| AgentTab {
        app_id: app.id.clone(),
        user_id: user,
        context: json!({}),
        ..AgentTab::default()
    });
    tab.suggested_prompts = Some(prompts);
    tab.prompts_title = title;
    Ok(json!({}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tab_keeps_every_channel_looked_at_once() {
        let mut tab = AgentTab::default();
        note_looked_at(
            &mut tab,
            &[
                json!({"type": "slack#/types/channel_id", "value": "C1"}),
                json!({"type": "slack#/types/canvas_id", "value": "F1"}),
                json!({"type": "slack#/types/message_context",
                       "value": {"message_ts": "1.1", "channel_id": "C2"}}),
            ],
        );
        note_looked_at(
            &mut tab,
            &[json!({"type": "slack#/types/channel_id", "value": "C1"})],
        );
        assert_eq!(tab.looked_at, ["C1", "C2"]);
    }
}
