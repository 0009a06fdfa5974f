//! Slack's agent messaging experience (`features.agent_view`): the
//! person's DM with the app is its Messages tab. `app_home_opened` with
//! `tab == "messages"` says the person opened it (where the assistant pane
//! had `assistant_thread_started`), and `app_context_changed` says what they
//! are looking at now: `context.entities`, ordered by relevance, each a
//! channel, a canvas, a list or a message (`slack#/types/…`). Both events
//! name the DM (`channel`) and the person (`user`); `app_home_opened`
//! carries the same optional `context`. Shapes from Slack's event reference
//! and node-slack-sdk's `AppContextChangedEvent` / `AppHomeOpenedEvent`.

use serde_json::Value;

use crate::ids::{ChannelId, TeamId, UserId};

pub const HOME_OPENED: &str = "app_home_opened";
pub const CONTEXT_CHANGED: &str = "app_context_changed";
/// The tab of `app_home_opened` that is the agent's DM.
pub const MESSAGES_TAB: &str = "messages";

/// One entity of a context, as far as threadline uses it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entity {
    /// `slack#/types/channel_id`: a channel (or a DM) the person views.
    Channel {
        channel: ChannelId,
        team: Option<TeamId>,
    },
    /// `slack#/types/message_context`: a message, named by its channel
    /// (its `ts` is not kept).
    Message {
        channel: ChannelId,
        team: Option<TeamId>,
    },
    /// `slack#/types/canvas_id`.
    Canvas,
    /// `slack#/types/list_id`.
    List,
    /// Any other type, or one whose value is not what Slack documents.
    Other,
}

impl Entity {
    /// A metric label for the entity's kind.
    pub fn kind(&self) -> &'static str {
        match self {
            Entity::Channel { .. } => "channel",
            Entity::Message { .. } => "message",
            Entity::Canvas => "canvas",
            Entity::List => "list",
            Entity::Other => "other",
        }
    }
}

/// What the person looks at: the channel threadline may read as the viewed
/// context (the most relevant channel-like entity that is not another DM),
/// and why each other entity is not used (its kind, or `dm`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Viewed {
    pub channel: Option<ChannelId>,
    pub team: Option<TeamId>,
    /// The kind of the entity the channel came from (`channel`, `message`).
    pub from: Option<&'static str>,
    /// The entities not used, by reason (an entity's kind, or `dm`, or
    /// `less_relevant` for a channel-like one after the chosen one).
    pub ignored: Vec<&'static str>,
}

/// The viewed context of an ordered list of entities.
pub fn viewed(entities: &[Entity]) -> Viewed {
    let mut v = Viewed::default();
    for e in entities {
        match e {
            Entity::Channel { channel, team } | Entity::Message { channel, team } => {
                if channel.is_dm() {
                    v.ignored.push("dm");
                } else if v.channel.is_some() {
                    v.ignored.push("less_relevant");
                } else {
                    v.channel = Some(channel.clone());
                    v.team = team.clone();
                    v.from = Some(e.kind());
                }
            }
            other => v.ignored.push(other.kind()),
        }
    }
    v
}

/// An agent-view event: the DM (the Messages tab), the person, and what
/// they look at (`None`: the event carried no context at all, so what was
/// recorded before stands; `Some(empty)`: they look at nothing Slack names).
/// An `app_context_changed` may name no DM (Slack's event reference shows
/// one with only its context): `channel` is then `None`, and the person's
/// tab is the one recorded for them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentEvent {
    pub user: UserId,
    pub channel: Option<ChannelId>,
    pub context: Option<Vec<Entity>>,
    /// Slack's `event_ts` (`None`: absent or not a timestamp), which orders
    /// the person's context changes.
    pub at: Option<String>,
}

/// What an agent-view event is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// `app_home_opened` on the Messages tab: greet.
    Opened(AgentEvent),
    /// `app_context_changed`: the viewed context.
    ContextChanged(AgentEvent),
    /// `app_home_opened` on another tab (the Home tab): not the agent's.
    OtherTab,
    /// `app_context_changed` that names no person: whose tab it is cannot
    /// be told.
    Unaddressed,
}

/// Reads an `app_home_opened` or `app_context_changed` event; `None` when
/// it is neither, or a field is missing or not a Slack id (malformed), or
/// its channel is not a DM (the Messages tab is the DM with the app).
pub fn parse(event: &Value) -> Option<Kind> {
    let s = |k: &str| {
        event
            .get(k)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
    };
    let kind = s("type")?;
    if kind == HOME_OPENED && s("tab") != Some(MESSAGES_TAB) {
        return Some(Kind::OtherTab);
    }
    let channel = match s("channel") {
        Some(c) => {
            let c = ChannelId::parse(c).ok()?;
            if !c.is_dm() {
                return None;
            }
            Some(c)
        }
        None if kind == CONTEXT_CHANGED => None,
        None => return None,
    };
    let user = match s("user") {
        Some(u) => UserId::parse(u).ok()?,
        None if kind == CONTEXT_CHANGED => return Some(Kind::Unaddressed),
        None => return None,
    };
    let context = match event.get("context") {
        None | Some(Value::Null) if kind == HOME_OPENED => None,
        // (Slack sends `"context": {}` when the person looks at nothing)
        None | Some(Value::Null) => Some(Vec::new()),
        Some(c) => Some(entities(c)),
    };
    let at = s("event_ts")
        .filter(|t| {
            let (secs, frac) = t.split_once('.').unwrap_or((t, "0"));
            !secs.is_empty()
                && secs.len() <= 12
                && frac.len() <= 9
                && secs.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit())
        })
        .map(str::to_owned);
    let e = AgentEvent {
        user,
        channel,
        context,
        at,
    };
    match kind {
        HOME_OPENED => Some(Kind::Opened(e)),
        CONTEXT_CHANGED => Some(Kind::ContextChanged(e)),
        _ => None,
    }
}

/// The entities of a `context` object (the `app_context` of a `message.im`
/// has the same shape), in Slack's order.
pub fn entities(context: &Value) -> Vec<Entity> {
    context
        .get("entities")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(entity)
        .collect()
}

fn entity(e: &Value) -> Entity {
    let team = e
        .get("team_id")
        .and_then(Value::as_str)
        .and_then(|t| TeamId::parse(t).ok());
    let channel = |v: Option<&Value>| {
        v.and_then(Value::as_str)
            .and_then(|c| ChannelId::parse(c).ok())
    };
    match e.get("type").and_then(Value::as_str) {
        Some("slack#/types/channel_id") => match channel(e.get("value")) {
            Some(channel) => Entity::Channel { channel, team },
            None => Entity::Other,
        },
        Some("slack#/types/message_context") => match channel(e.pointer("/value/channel_id")) {
            Some(channel) => Entity::Message { channel, team },
            None => Entity::Other,
        },
        Some("slack#/types/canvas_id") => Entity::Canvas,
        Some("slack#/types/list_id") => Entity::List,
        _ => Entity::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_app_context_changed_event_is_read_as_slack_documents_it() {
        // node-slack-sdk's AppContextChangedEvent, all four entity types.
        let e = json!({"type": "app_context_changed", "channel": "D0123456789", "user": "U0123456789",
            "context": {"entities": [
                {"type": "slack#/types/canvas_id", "value": "F0123456789"},
                {"type": "slack#/types/message_context",
                 "value": {"message_ts": "1234567890.123456", "channel_id": "C0OPS"},
                 "team_id": "T0ACME", "enterprise_id": "E0ORG"},
                {"type": "slack#/types/channel_id", "value": "C0OTHER", "team_id": "T0ACME"},
                {"type": "slack#/types/list_id", "value": "F0123456780"},
                {"type": "slack#/types/user_id", "value": "U1"}]},
            "event_ts": "1234567890.123456"});
        let Some(Kind::ContextChanged(a)) = parse(&e) else {
            panic!("a context change")
        };
        assert_eq!(a.channel.as_ref().map(|c| c.as_str()), Some("D0123456789"));
        assert_eq!(a.user.as_str(), "U0123456789");
        let v = viewed(a.context.as_deref().expect("a context"));
        assert_eq!(v.channel.as_ref().map(|c| c.as_str()), Some("C0OPS"));
        assert_eq!(v.team.as_ref().map(|t| t.as_str()), Some("T0ACME"));
        assert_eq!(v.from, Some("message"));
        assert_eq!(v.ignored, ["canvas", "less_relevant", "list", "other"]);
    }

    #[test]
    fn an_empty_context_views_nothing_and_a_dm_is_never_viewed() {
        let e =
            json!({"type": "app_context_changed", "channel": "D01", "user": "U01", "context": {}});
        let Some(Kind::ContextChanged(a)) = parse(&e) else {
            panic!("a context change")
        };
        assert_eq!(a.context, Some(Vec::new()));
        assert_eq!(viewed(&[]), Viewed::default());
        let dm = entities(&json!({"entities": [
            {"type": "slack#/types/channel_id", "value": "D0OTHER"},
            {"type": "slack#/types/channel_id", "value": "C0OPS"}]}));
        let v = viewed(&dm);
        assert_eq!(v.channel.as_ref().map(|c| c.as_str()), Some("C0OPS"));
        assert_eq!(v.ignored, ["dm"]);
    }

    #[test]
    fn app_home_opened_is_the_agents_only_on_the_messages_tab() {
        let opened = json!({"type": "app_home_opened", "user": "U01", "channel": "D01",
                            "tab": "messages", "event_ts": "1.2"});
        let Some(Kind::Opened(a)) = parse(&opened) else {
            panic!("opened")
        };
        assert_eq!(a.context, None, "no context: what was recorded stands");
        let mut with = opened.clone();
        with["context"] =
            json!({"entities": [{"type": "slack#/types/channel_id", "value": "C0OPS"}]});
        let Some(Kind::Opened(a)) = parse(&with) else {
            panic!("opened")
        };
        assert_eq!(viewed(&a.context.unwrap()).from, Some("channel"));
        let mut home = opened.clone();
        home["tab"] = json!("home");
        assert_eq!(parse(&home), Some(Kind::OtherTab));
        let mut not_dm = opened.clone();
        not_dm["channel"] = json!("C0OPS");
        assert_eq!(parse(&not_dm), None);
        let mut no_user = opened;
        no_user["user"] = json!("");
        assert_eq!(parse(&no_user), None);
    }

    #[test]
    fn a_context_change_without_a_dm_or_a_person_is_read_as_slack_documents_it() {
        // Slack's event reference: only the type and the context.
        let bare = json!({"type": "app_context_changed", "context": {"entities": [
            {"type": "slack#/types/channel_id", "value": "C01234ABDCE", "team_id": "T0ABCDE6543"}]}});
        assert_eq!(parse(&bare), Some(Kind::Unaddressed));
        // With the person but no DM: their recorded tab is meant.
        let mut with_user = bare.clone();
        with_user["user"] = json!("U0123456789");
        let Some(Kind::ContextChanged(a)) = parse(&with_user) else {
            panic!("a context change")
        };
        assert_eq!(a.channel, None);
        assert_eq!(a.user.as_str(), "U0123456789");
        assert_eq!(
            viewed(a.context.as_deref().expect("a context"))
                .channel
                .map(|c| c.as_str().to_owned()),
            Some("C01234ABDCE".to_owned())
        );
        // The Messages tab's opening always names its DM.
        let opened = json!({"type": "app_home_opened", "tab": "messages", "user": "U0123456789"});
        assert_eq!(parse(&opened), None);
    }
}
