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

/// Slack's type and subtype names are short snake_case words; anything
/// else is malformed rather than "other".
pub(crate) fn check_name(field: &'static str, s: &str) -> Result<(), EventError> {
    let ok = !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'.');
    if ok {
        Ok(())
    } else {
        Err(EventError::BadName { field })
    }
}

impl MessageSubtype {
    fn parse(s: Option<&str>) -> Result<Self, EventError> {
        Ok(match s {
            None => Self::Plain,
            Some("bot_message") => Self::BotMessage,
            Some("message_changed") => Self::MessageChanged,
            Some("message_deleted") => Self::MessageDeleted,
            Some("thread_broadcast") => Self::ThreadBroadcast,
            Some("file_share") => Self::FileShare,
            Some(other) => {
                check_name("subtype", other)?;
                Self::Other(other.to_owned())
            }
        })
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
    #[error("`event.{field}` is not a Slack type name")]
    BadName { field: &'static str },
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

/// `event_ts`, which nothing routes on (routing uses `ts`), read leniently:
/// a well-formed timestamp is kept; Slack's own `app_mention` example writes
/// it without the dot (`"1515449522000016"`), which is normalised when it
/// can only mean microseconds (15 to 17 digits: 1973 to the year 5138);
/// anything else is dropped rather than failing the event.
fn event_ts(event: &Value) -> Option<Ts> {
    let s = event.get("event_ts")?.as_str()?;
    if let Ok(ts) = Ts::parse(s) {
        return Some(ts);
    }
    let micros = (15..=17).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_digit());
    if !micros {
        return None;
    }
    let (secs, frac) = s.split_at(s.len() - 6);
    Ts::parse(format!("{secs}.{frac}")).ok()
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
            "message" => EventKind::Message(MessageSubtype::parse(str_field(event, "subtype")?)?),
            "app_uninstalled" => EventKind::AppUninstalled,
            "tokens_revoked" => EventKind::TokensRevoked,
            other => {
                check_name("type", other)?;
                EventKind::Other(other.to_owned())
            }
        };
        // Event types threadline does not handle carry other shapes under the
        // same names (`channel_created` has a `channel` object, `team_join` a
        // `user` object): keep such events, with the ids that do parse.
        if let EventKind::Other(_) = kind {
            let lenient =
                |field: &'static str| str_field(event, field).ok().flatten().map(str::to_owned);
            return Ok(Self {
                channel: lenient("channel").and_then(|s| ChannelId::parse(s).ok()),
                user: lenient("user").and_then(|s| UserId::parse(s).ok()),
                bot_id: lenient("bot_id").and_then(|s| BotId::parse(s).ok()),
                ts: lenient("ts").and_then(|s| Ts::parse(s).ok()),
                thread_ts: lenient("thread_ts").and_then(|s| Ts::parse(s).ok()),
                event_ts: event_ts(event),
                kind,
            });
        }
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
            event_ts: event_ts(event),
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
    fn other_event_types_with_object_fields_are_kept() {
        let e = EventRef::parse(
            &json!({"type": "channel_created", "channel": {"id": "C1", "name": "x"}}),
        )
        .expect("kept");
        assert_eq!(e.kind, EventKind::Other("channel_created".into()));
        assert_eq!(e.channel, None);
        let e =
            EventRef::parse(&json!({"type": "team_join", "user": {"id": "U1"}, "event_ts": "1.2"}))
                .expect("kept");
        assert_eq!(e.event_ts.as_ref().map(Ts::as_str), Some("1.2"));
    }

    #[test]
    fn type_names_must_look_like_slacks() {
        for bad in ["", "Message", "a b", "x\u{0}", &"a".repeat(65)] {
            assert!(
                matches!(
                    EventRef::parse(&json!({"type": bad})),
                    Err(EventError::BadName { .. })
                ),
                "{bad:?}"
            );
            assert!(
                matches!(
                    EventRef::parse(&json!({"type": "message", "subtype": bad})),
                    Err(EventError::BadName { .. }) | Err(EventError::NotAString { .. })
                ),
                "{bad:?}"
            );
        }
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
    fn event_ts_without_a_dot_is_normalised_or_dropped_never_an_error() {
        // Slack's documented `app_mention` example.
        let e = EventRef::parse(&json!({"type": "app_mention", "ts": "1515449522.000016",
                                        "channel": "C1", "event_ts": "1515449522000016"}))
        .expect("parses");
        assert_eq!(
            e.event_ts.as_ref().map(Ts::as_str),
            Some("1515449522.000016")
        );
        assert_eq!(e.ts.as_ref().map(Ts::as_str), Some("1515449522.000016"));
        // Ambiguous or malformed: dropped, and the event still parses on `ts`.
        for odd in [
            json!("1515449522"),
            json!("x"),
            json!(""),
            json!(15),
            json!("1.2.3"),
            json!("123456789012345678"),
        ] {
            let e = EventRef::parse(&json!({"type": "message", "ts": "5.1", "event_ts": odd}))
                .expect("parses");
            assert_eq!(e.event_ts, None, "{odd}");
            assert_eq!(e.root().map(Ts::as_str), Some("5.1"));
        }
        let e = EventRef::parse(&json!({"type": "team_join", "event_ts": "1515449522000016"}))
            .expect("kept");
        assert_eq!(
            e.event_ts.as_ref().map(Ts::as_str),
            Some("1515449522.000016")
        );
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
