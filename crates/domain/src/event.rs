//! The inner `event` of an Events API callback, reduced to the identifiers
//! threadline routes and deduplicates on. The full JSON travels on the bus
//! unchanged; this view never holds message text.

use serde_json::Value;

use crate::ids::{BotId, ChannelId, IdError, Ts, UserId};

/// `event.type`, with unknown types kept rather than rejected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventKind {
    AppMention,
    Message(MessageSubtype),
    AppUninstalled,
    TokensRevoked,
    Other(String),
}

/// `event.subtype` of a `message` event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MessageSubtype {
    /// A plain message from a user (no `subtype`).
    Plain,
    BotMessage,
    MessageChanged,
    MessageDeleted,
    ThreadBroadcast,
    FileShare,
    Other(String),
}

impl MessageSubtype {
    fn parse(s: Option<&str>) -> Self {
        match s {
            None => Self::Plain,
            Some("bot_message") => Self::BotMessage,
            Some("message_changed") => Self::MessageChanged,
            Some("message_deleted") => Self::MessageDeleted,
            Some("thread_broadcast") => Self::ThreadBroadcast,
            Some("file_share") => Self::FileShare,
            Some(other) => Self::Other(other.to_owned()),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Self::Plain => None,
            Self::BotMessage => Some("bot_message"),
            Self::MessageChanged => Some("message_changed"),
            Self::MessageDeleted => Some("message_deleted"),
            Self::ThreadBroadcast => Some("thread_broadcast"),
            Self::FileShare => Some("file_share"),
            Self::Other(s) => Some(s),
        }
    }
}

impl EventKind {
    pub fn type_str(&self) -> &str {
        match self {
            Self::AppMention => "app_mention",
            Self::Message(_) => "message",
            Self::AppUninstalled => "app_uninstalled",
            Self::TokensRevoked => "tokens_revoked",
            Self::Other(s) => s,
        }
    }

    pub fn subtype_str(&self) -> Option<&str> {
        match self {
            Self::Message(sub) => sub.as_str(),
            _ => None,
        }
    }
}

/// Identifiers of one event. `ts` is the message the event is about: the new
/// message, the edited message (`message.ts`, or `previous_message.ts` where
/// Slack omits it) or the deleted one (`deleted_ts`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventRef {
    pub kind: EventKind,
    pub channel: Option<ChannelId>,
    pub user: Option<UserId>,
    pub bot_id: Option<BotId>,
    pub ts: Option<Ts>,
    pub thread_ts: Option<Ts>,
    pub event_ts: Option<Ts>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EventError {
    #[error("`event` is not a JSON object")]
    NotAnObject,
    #[error("`event.type` is missing or not a string")]
    MissingType,
    #[error("`event.{field}`: {source}")]
    BadField {
        field: &'static str,
        #[source]
        source: IdError,
    },
    #[error("`event.{field}` is not a string")]
    NotAString { field: &'static str },
}

fn str_field<'a>(obj: &'a Value, field: &'static str) -> Result<Option<&'a str>, EventError> {
    match obj.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(EventError::NotAString { field }),
    }
}

fn parsed<T>(
    obj: &Value,
    field: &'static str,
    parse: impl Fn(String) -> Result<T, IdError>,
) -> Result<Option<T>, EventError> {
    str_field(obj, field)?
        .map(|s| parse(s.to_owned()).map_err(|source| EventError::BadField { field, source }))
        .transpose()
}

impl EventRef {
    pub fn parse(event: &Value) -> Result<Self, EventError> {
        if !event.is_object() {
            return Err(EventError::NotAnObject);
        }
        let kind = match str_field(event, "type")
            .map_err(|_| EventError::MissingType)?
            .ok_or(EventError::MissingType)?
        {
            "app_mention" => EventKind::AppMention,
            "message" => EventKind::Message(MessageSubtype::parse(str_field(event, "subtype")?)),
            "app_uninstalled" => EventKind::AppUninstalled,
            "tokens_revoked" => EventKind::TokensRevoked,
            other => EventKind::Other(other.to_owned()),
        };
        let null = Value::Null;
        let inner = event.get("message").unwrap_or(&null);
        let previous = event.get("previous_message").unwrap_or(&null);
        let (ts, thread_ts, user, bot_id) = match &kind {
            EventKind::Message(MessageSubtype::MessageChanged) => (
                parsed(inner, "ts", Ts::parse)?.or(parsed(previous, "ts", Ts::parse)?),
                parsed(inner, "thread_ts", Ts::parse)?.or(parsed(
                    previous,
                    "thread_ts",
                    Ts::parse,
                )?),
                parsed(inner, "user", UserId::parse)?,
                parsed(inner, "bot_id", BotId::parse)?,
            ),
            EventKind::Message(MessageSubtype::MessageDeleted) => (
                parsed(event, "deleted_ts", Ts::parse)?.or(parsed(previous, "ts", Ts::parse)?),
                parsed(previous, "thread_ts", Ts::parse)?,
                parsed(previous, "user", UserId::parse)?,
                parsed(previous, "bot_id", BotId::parse)?,
            ),
            _ => (
                parsed(event, "ts", Ts::parse)?,
                parsed(event, "thread_ts", Ts::parse)?,
                parsed(event, "user", UserId::parse)?,
                parsed(event, "bot_id", BotId::parse)?,
            ),
        };
        Ok(Self {
            kind,
            channel: parsed(event, "channel", ChannelId::parse)?,
            user,
            bot_id,
            ts,
            thread_ts,
            event_ts: parsed(event, "event_ts", Ts::parse)?,
        })
    }

    /// The thread this event belongs to: `thread_ts`, or the message's own
    /// `ts` for a top-level message.
    pub fn root(&self) -> Option<&Ts> {
        self.thread_ts.as_ref().or(self.ts.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn unknown_types_and_subtypes_are_kept() {
        let e = EventRef::parse(&json!({"type": "reaction_added", "user": "U1"})).expect("parses");
        assert_eq!(e.kind, EventKind::Other("reaction_added".into()));
        let e =
            EventRef::parse(&json!({"type": "message", "subtype": "channel_join", "ts": "1.2"}))
                .expect("parses");
        assert_eq!(
            e.kind,
            EventKind::Message(MessageSubtype::Other("channel_join".into()))
        );
        assert_eq!(e.kind.subtype_str(), Some("channel_join"));
    }

    #[test]
    fn root_is_thread_ts_or_own_ts() {
        let top =
            EventRef::parse(&json!({"type": "message", "ts": "5.1", "channel": "C1"})).expect("ok");
        assert_eq!(top.root().map(Ts::as_str), Some("5.1"));
        let reply = EventRef::parse(&json!({"type": "message", "ts": "6.1", "thread_ts": "5.1"}))
            .expect("ok");
        assert_eq!(reply.root().map(Ts::as_str), Some("5.1"));
    }

    #[test]
    fn malformed_fields_are_errors_not_panics() {
        assert_eq!(EventRef::parse(&json!("x")), Err(EventError::NotAnObject));
        assert_eq!(EventRef::parse(&json!({})), Err(EventError::MissingType));
        assert_eq!(
            EventRef::parse(&json!({"type": 3})),
            Err(EventError::MissingType)
        );
        assert!(matches!(
            EventRef::parse(&json!({"type": "message", "ts": "yesterday"})),
            Err(EventError::BadField { field: "ts", .. })
        ));
        assert!(matches!(
            EventRef::parse(&json!({"type": "message", "channel": 12})),
            Err(EventError::NotAString { field: "channel" })
        ));
    }
}
