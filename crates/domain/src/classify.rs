//! Classifying an accepted event before any model work, from trusted
//! identifiers only: `bot_id`, `app_id`, user ids, event and subtype names,
//! mention markup and rich-text user elements. Never from text prefixes.
//!
//! The result says two things: what the event does to the thread store
//! (`effect`), and whether it asks the bot for a reply (`outcome`). A
//! message can change the thread without triggering (a reply the bot was not
//! asked about) and be ignored as input while still being recorded (our own
//! reply landing).

use serde_json::Value;

/// Who the installation's bot is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BotIdentity {
    pub app_id: String,
    pub bot_id: String,
    pub bot_user_id: String,
}

/// When a message (that is not a mention) asks for a reply.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ChannelMode {
    /// Only mentions trigger (the default).
    #[default]
    MentionsOnly,
    /// A message containing one of these words (case-insensitive, whole word).
    Keywords(Vec<String>),
    /// Every human message in the channel.
    EveryMessage,
}

/// The installation's policy as it applies to one event's channel.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TriggerPolicy {
    /// Direct messages to the bot may trigger.
    pub dms_allowed: bool,
    /// Mode of this channel (from the channel allow-list).
    pub channel_mode: ChannelMode,
    /// Bots whose messages are treated as input (by `bot_id`).
    pub approved_bots: Vec<String>,
    /// Private channels (and multi-person DMs) may trigger.
    pub private_allowed: bool,
    /// Slack Connect channels (`is_ext_shared_channel`) may trigger.
    pub shared_allowed: bool,
    /// This channel is on the installation's allow-list: it may trigger
    /// even when it is private or a Slack Connect channel.
    pub channel_allowed: bool,
    /// The installation answers only in allow-listed channels (DMs are
    /// governed by `dms_allowed` alone).
    pub allowlist_only: bool,
}

/// Why a message asks for a reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TriggerSource {
    Mention,
    DirectMessage,
    Keyword,
    EveryMessage,
}

impl TriggerSource {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Mention => "mention",
            Self::DirectMessage => "direct_message",
            Self::Keyword => "keyword",
            Self::EveryMessage => "every_message",
        }
    }
}

/// Why an event is not a request to the bot. Stored on the receipt and used
/// as a metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IgnoreReason {
    /// The installation's own bot (our reply landing, or our edit).
    OwnBot,
    /// Another bot or a `bot_message` that is not approved.
    UnapprovedBot,
    /// An approved bot's message: recorded as context, never a trigger.
    BotNotTrigger,
    /// No text and nothing else handled.
    NoUsableText,
    /// A human message the bot was not asked about.
    NotAddressed,
    /// A direct message while DMs are not allowed.
    DmNotAllowed,
    /// An edit that did not change the text (e.g. a link unfurl).
    EditWithoutTextChange,
    /// A content change (edit or deletion) of the thread.
    StateChange,
    /// A subtype or event type threadline does not act on.
    UnhandledType,
    /// A private channel while private channels are not allowed.
    PrivateChannelDenied,
    /// A Slack Connect channel while shared channels are not allowed.
    SharedChannelDenied,
    /// Whether the channel is private could not be established (an
    /// `app_mention` carries no `channel_type`, and private channels have
    /// `C…` ids too): denied while private channels are not allowed.
    ChannelKindUnknown,
    /// The installation answers only in allow-listed channels, and this
    /// one is not on the list.
    ChannelNotAllowed,
    /// A request Slack delivered later than the installation still answers
    /// (its late-event policy skips it; see [`crate::late`]): recorded as a
    /// thread change, never answered.
    Late,
}

impl IgnoreReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::OwnBot => "own_bot",
            Self::UnapprovedBot => "unapproved_bot",
            Self::BotNotTrigger => "bot_not_trigger",
            Self::NoUsableText => "no_usable_text",
            Self::NotAddressed => "not_addressed",
            Self::DmNotAllowed => "dm_not_allowed",
            Self::EditWithoutTextChange => "edit_without_text_change",
            Self::StateChange => "state_change",
            Self::UnhandledType => "unhandled_type",
            Self::PrivateChannelDenied => "private_channel_denied",
            Self::SharedChannelDenied => "shared_channel_denied",
            Self::ChannelKindUnknown => "channel_kind_unknown",
            Self::ChannelNotAllowed => "channel_not_allowed",
            Self::Late => "late_event",
        }
    }
}

/// Who wrote a message, from the bot's point of view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Speaker {
    Human,
    /// This installation's bot.
    Assistant,
    /// Another bot.
    Bot,
}

impl Speaker {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Human => "user",
            Self::Assistant => "assistant",
            Self::Bot => "bot",
        }
    }
}

/// One message as the thread store keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageFacts {
    pub ts: String,
    /// Root of the thread (`thread_ts`, or `ts` for a top-level message).
    pub root_ts: String,
    pub speaker: Speaker,
    pub user_id: Option<String>,
    pub bot_id: Option<String>,
    pub text: String,
    /// Slack's time of the change that gave the message this text, which
    /// orders its changes whatever order they arrive in (the newest wins):
    /// a `message_changed` event's own `event_ts` (microseconds, one per
    /// change, so two edits within a second stay apart), or, for a message
    /// read from the Web API, its `edited.ts` (whole seconds); `None` for
    /// text never edited.
    pub changed_ts: Option<String>,
    /// The id the person's client gave the action that made the message
    /// (`client_msg_id`): every delivery of one action carries it, also
    /// when Slack made two messages of it (two `ts`). `None` for bots'
    /// messages and messages read without it.
    pub client_msg_id: Option<String>,
}

/// What an event does to the thread store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// A message came into being (new message, reply, our own post).
    Upsert(MessageFacts),
    /// A message's text changed.
    Edit(MessageFacts),
    /// A message was deleted (`ts` of the deleted message).
    Delete { ts: String, root_ts: String },
    /// Nothing to record.
    None,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Trigger(TriggerSource),
    Ignore(IgnoreReason),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Classification {
    pub effect: Effect,
    pub outcome: Outcome,
}

fn s<'a>(v: &'a Value, k: &str) -> Option<&'a str> {
    v.get(k).and_then(Value::as_str).filter(|s| !s.is_empty())
}

/// Whether the message mentions `user_id`: Slack's `<@U…>` markup (also
/// `<@U…|name>`) or a rich-text `user` element.
pub fn mentions(message: &Value, user_id: &str) -> bool {
    let text = s(message, "text").unwrap_or("");
    let markup = format!("<@{user_id}>");
    let named = format!("<@{user_id}|");
    if text.contains(&markup) || text.contains(&named) {
        return true;
    }
    fn walk(v: &Value, user_id: &str) -> bool {
        match v {
            Value::Object(o) => {
                (o.get("type").and_then(Value::as_str) == Some("user")
                    && o.get("user_id").and_then(Value::as_str) == Some(user_id))
                    || o.values().any(|x| walk(x, user_id))
            }
            Value::Array(a) => a.iter().any(|x| walk(x, user_id)),
            _ => false,
        }
    }
    message.get("blocks").is_some_and(|b| walk(b, user_id))
}

fn has_keyword(text: &str, keywords: &[String]) -> bool {
    let words: Vec<String> = text
        .split(|c: char| !c.is_alphanumeric() && c != '_' && c != '-')
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect();
    keywords
        .iter()
        .any(|k| words.iter().any(|w| *w == k.to_lowercase()))
}

fn speaker(message: &Value, me: &BotIdentity) -> Speaker {
    let bot_id = s(message, "bot_id");
    let app_id = s(message, "app_id").or_else(|| {
        message
            .pointer("/bot_profile/app_id")
            .and_then(Value::as_str)
    });
    let user = s(message, "user");
    if bot_id == Some(me.bot_id.as_str())
        || app_id == Some(me.app_id.as_str())
        || user == Some(me.bot_user_id.as_str())
    {
        Speaker::Assistant
    } else if bot_id.is_some() || s(message, "subtype") == Some("bot_message") {
        Speaker::Bot
    } else {
        Speaker::Human
    }
}

fn facts(message: &Value, fallback_ts: Option<&str>, me: &BotIdentity) -> Option<MessageFacts> {
    let ts = s(message, "ts").or(fallback_ts)?.to_owned();
    let root_ts = s(message, "thread_ts")
        .map(str::to_owned)
        .unwrap_or_else(|| ts.clone());
    Some(MessageFacts {
        speaker: speaker(message, me),
        user_id: s(message, "user").map(str::to_owned),
        bot_id: s(message, "bot_id").map(str::to_owned),
        text: s(message, "text").unwrap_or("").to_owned(),
        changed_ts: message
            .pointer("/edited/ts")
            .and_then(Value::as_str)
            .map(str::to_owned),
        client_msg_id: s(message, "client_msg_id").map(str::to_owned),
        ts,
        root_ts,
    })
}

/// The thread-store view of one message as the Web API returns it
/// (`conversations.replies`), for backfills.
pub fn message_facts(message: &Value, me: &BotIdentity) -> Option<MessageFacts> {
    facts(message, None, me)
}

/// Whether a message read from Slack is the tombstone Slack keeps in place
/// of a thread's root deleted while it had replies (a deleted message, not
/// USLACKBOT saying "This message was deleted.").
pub fn is_tombstone(message: &Value) -> bool {
    s(message, "subtype") == Some("tombstone")
}

/// Text, or something else a reply could be about (files, blocks).
fn usable(message: &Value) -> bool {
    s(message, "text").is_some_and(|t| !t.trim().is_empty())
        || message
            .get("files")
            .and_then(Value::as_array)
            .is_some_and(|f| !f.is_empty())
}

/// Classifies the inner `event` of a callback.
pub fn classify(event: &Value, me: &BotIdentity, policy: &TriggerPolicy) -> Classification {
    let ignore = |effect, reason| Classification {
        effect,
        outcome: Outcome::Ignore(reason),
    };
    let event_type = s(event, "type").unwrap_or("");
    let subtype = s(event, "subtype");
    match (event_type, subtype) {
        ("app_mention", _)
        | ("message", None | Some("thread_broadcast" | "file_share" | "bot_message")) => {}
        ("message", Some("message_changed")) => {
            let null = Value::Null;
            let msg = event.get("message").unwrap_or(&null);
            let prev = event.get("previous_message").unwrap_or(&null);
            // A thread's root deleted while it has replies: Slack keeps a
            // tombstone in its place ("This message was deleted.", by
            // USLACKBOT) and says so as a change of the message. A
            // deletion like any other.
            if is_tombstone(msg) {
                let Some(ts) = s(msg, "ts").or_else(|| s(prev, "ts")) else {
                    return ignore(Effect::None, IgnoreReason::UnhandledType);
                };
                let root_ts = s(msg, "thread_ts")
                    .or_else(|| s(prev, "thread_ts"))
                    .unwrap_or(ts)
                    .to_owned();
                return ignore(
                    Effect::Delete {
                        ts: ts.to_owned(),
                        root_ts,
                    },
                    IgnoreReason::StateChange,
                );
            }
            let Some(mut f) = facts(msg, s(prev, "ts"), me) else {
                return ignore(Effect::None, IgnoreReason::UnhandledType);
            };
            if f.root_ts == f.ts
                && let Some(root) = s(prev, "thread_ts")
            {
                f.root_ts = root.to_owned();
            }
            // The change itself is ordered by the event's own time: the
            // inner `edited.ts` has whole seconds only, so two edits within
            // a second would tie (and one of them be taken for the other).
            if let Some(at) = s(event, "event_ts").or(s(event, "ts")) {
                f.changed_ts = Some(at.to_owned());
            }
            if s(msg, "text") == s(prev, "text") {
                return ignore(Effect::None, IgnoreReason::EditWithoutTextChange);
            }
            let reason = if f.speaker == Speaker::Assistant {
                IgnoreReason::OwnBot
            } else {
                IgnoreReason::StateChange
            };
            return ignore(Effect::Edit(f), reason);
        }
        ("message", Some("message_deleted")) => {
            let null = Value::Null;
            let prev = event.get("previous_message").unwrap_or(&null);
            let Some(ts) = s(event, "deleted_ts").or_else(|| s(prev, "ts")) else {
                return ignore(Effect::None, IgnoreReason::UnhandledType);
            };
            let root_ts = s(prev, "thread_ts").unwrap_or(ts).to_owned();
            return ignore(
                Effect::Delete {
                    ts: ts.to_owned(),
                    root_ts,
                },
                IgnoreReason::StateChange,
            );
        }
        _ => return ignore(Effect::None, IgnoreReason::UnhandledType),
    }

    let Some(f) = facts(event, None, me) else {
        return ignore(Effect::None, IgnoreReason::UnhandledType);
    };
    match f.speaker {
        Speaker::Assistant => return ignore(Effect::Upsert(f), IgnoreReason::OwnBot),
        Speaker::Bot => {
            let approved = f
                .bot_id
                .as_ref()
                .is_some_and(|b| policy.approved_bots.contains(b));
            // An approved bot's words are context for later answers; they
            // never start an answer themselves (no bot-to-bot loops).
            let reason = if approved {
                IgnoreReason::BotNotTrigger
            } else {
                IgnoreReason::UnapprovedBot
            };
            let effect = if approved {
                Effect::Upsert(f)
            } else {
                Effect::None
            };
            return ignore(effect, reason);
        }
        Speaker::Human => {}
    }
    if !usable(event) {
        return ignore(Effect::Upsert(f), IgnoreReason::NoUsableText);
    }
    let is_dm = s(event, "channel_type") == Some("im")
        || s(event, "channel").is_some_and(crate::ids::is_dm);
    // Denied DMs stay denied when the message also @-mentions the bot.
    if is_dm && !policy.dms_allowed {
        return ignore(Effect::Upsert(f), IgnoreReason::DmNotAllowed);
    }
    let trigger = if event_type == "app_mention" || mentions(event, &me.bot_user_id) {
        Some(TriggerSource::Mention)
    } else if is_dm {
        Some(TriggerSource::DirectMessage)
    } else {
        match &policy.channel_mode {
            ChannelMode::EveryMessage => Some(TriggerSource::EveryMessage),
            ChannelMode::Keywords(k) if has_keyword(&f.text, k) => Some(TriggerSource::Keyword),
            _ => None,
        }
    };
    match trigger {
        Some(t) => Classification {
            effect: Effect::Upsert(f),
            outcome: Outcome::Trigger(t),
        },
        None => ignore(Effect::Upsert(f), IgnoreReason::NotAddressed),
    }
}

/// Where the event happened, as far as the envelope says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ChannelFacts {
    /// The envelope's `is_ext_shared_channel`.
    pub ext_shared: bool,
    /// A private channel or multi-person DM: `channel_type` `group`/`mpim`,
    /// or a `G…` channel id. `None` when the event cannot tell: an
    /// `app_mention` has no `channel_type`, and Slack gives new private
    /// channels `C…` ids, so a `C…` id alone proves nothing.
    pub private: Option<bool>,
    /// A direct message (`channel_type` `im`, or a `D…` channel id).
    pub dm: bool,
}

impl ChannelFacts {
    pub fn of(event: &Value, ext_shared: bool) -> Self {
        let private = match s(event, "channel_type") {
            Some(t) => Some(t == "group" || t == "mpim"),
            None => match s(event, "channel").and_then(|c| c.chars().next()) {
                Some('G') => Some(true),
                Some('D') => Some(false),
                _ => None,
            },
        };
        let dm = s(event, "channel_type") == Some("im")
            || s(event, "channel").is_some_and(crate::ids::is_dm);
        Self {
            ext_shared,
            private,
            dm,
        }
    }

    /// The kind must be looked up before a trigger can pass the policy.
    pub fn needs_lookup(&self, policy: &TriggerPolicy) -> bool {
        self.private.is_none()
            && !self.dm
            && !policy.private_allowed
            && !policy.channel_allowed
            && !policy.allowlist_only
    }
}

/// The channel policy on top of a classification: a trigger in a denied
/// kind of channel is still recorded as a thread change, but never answered.
pub fn apply_channel_policy(
    c: Classification,
    facts: ChannelFacts,
    policy: &TriggerPolicy,
) -> Classification {
    let deny = if policy.channel_allowed {
        // Allow-listed by name: private and Slack Connect included.
        None
    } else if facts.ext_shared && !policy.shared_allowed {
        Some(IgnoreReason::SharedChannelDenied)
    } else if facts.dm {
        // Whether DMs may trigger was decided by `dms_allowed`.
        None
    } else if policy.allowlist_only {
        Some(IgnoreReason::ChannelNotAllowed)
    } else if policy.private_allowed {
        None
    } else {
        match facts.private {
            Some(true) => Some(IgnoreReason::PrivateChannelDenied),
            Some(false) => None,
            None => Some(IgnoreReason::ChannelKindUnknown),
        }
    };
    match (c.outcome, deny) {
        (Outcome::Trigger(_), Some(reason)) => Classification {
            effect: c.effect,
            outcome: Outcome::Ignore(reason),
        },
        _ => c,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::path::PathBuf;

    fn fixture_event(name: &str) -> Value {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/slack/events")
            .join(name);
        let v: Value =
            serde_json::from_slice(&std::fs::read(&path).expect("fixture")).expect("json");
        v.get("event").cloned().unwrap_or(v)
    }

    fn me() -> BotIdentity {
        // The bot of the bolt-python fixtures: user W111 / UB111 variants are set per test.
        BotIdentity {
            app_id: "A111".into(),
            bot_id: "BZYBOTHED".into(),
            bot_user_id: "W111".into(),
        }
    }

    fn policy() -> TriggerPolicy {
        TriggerPolicy::default()
    }

    #[test]
    fn app_mention_triggers() {
        let c = classify(
            &fixture_event("app_mention.bolt-python.json"),
            &me(),
            &policy(),
        );
        assert_eq!(c.outcome, Outcome::Trigger(TriggerSource::Mention));
        let Effect::Upsert(f) = c.effect else {
            panic!("stores the message")
        };
        assert_eq!(
            (f.ts.as_str(), f.root_ts.as_str(), f.speaker),
            ("1595926230.009600", "1595926230.009600", Speaker::Human)
        );
    }

    #[test]
    fn mention_in_a_thread_keeps_the_thread_root() {
        // The SDK fixture carries identifiers only; give it the mention text.
        let mut e = fixture_event("app_mention_in_thread.event-only.bolt-python.json");
        e["text"] = json!("<@W111> and this thread?");
        let c = classify(&e, &me(), &policy());
        assert_eq!(c.outcome, Outcome::Trigger(TriggerSource::Mention));
        let Effect::Upsert(f) = c.effect else {
            panic!("stores")
        };
        assert_ne!(f.ts, f.root_ts);
    }

    #[test]
    fn a_message_event_with_the_mention_also_classifies_as_a_mention() {
        // app_mention and message.channels for one message: both say
        // "mention"; the thread store lets exactly one claim the turn.
        let me = BotIdentity {
            bot_user_id: "W222".into(),
            ..me()
        };
        let c = classify(
            &fixture_event("message_org_install_authorizations.bolt-python.json"),
            &me,
            &policy(),
        );
        assert_eq!(c.outcome, Outcome::Trigger(TriggerSource::Mention));
        let block_only = json!({"type": "message", "text": "hey", "user": "U1", "ts": "1.1", "channel": "C1",
            "blocks": [{"type": "rich_text", "elements": [{"type": "rich_text_section", "elements": [{"type": "user", "user_id": "W222"}]}]}]});
        assert_eq!(
            classify(&block_only, &me, &policy()).outcome,
            Outcome::Trigger(TriggerSource::Mention)
        );
    }

    #[test]
    fn a_plain_channel_message_is_recorded_not_answered() {
        let me = BotIdentity {
            bot_user_id: "UNOBODY".into(),
            ..me()
        };
        let c = classify(
            &fixture_event("message_channel.bolt-python.json"),
            &me,
            &policy(),
        );
        assert_eq!(c.outcome, Outcome::Ignore(IgnoreReason::NotAddressed));
        assert!(matches!(c.effect, Effect::Upsert(_)));
    }

    #[test]
    fn our_own_messages_are_never_input_but_are_recorded() {
        // bot_message from our bot_id (the bolt "ignore self" case).
        let c = classify(
            &fixture_event("message_bot_message_self_via_auth_test.bolt-python.json"),
            &me(),
            &policy(),
        );
        assert_eq!(c.outcome, Outcome::Ignore(IgnoreReason::OwnBot));
        assert!(matches!(
            c.effect,
            Effect::Upsert(MessageFacts {
                speaker: Speaker::Assistant,
                ..
            })
        ));
        // Our post fed back as a modern message with bot_profile.app_id,
        // even when it mentions us.
        let mut echo = fixture_event("message_bot_profile_bot_user.bolt-python.json");
        echo["text"] = json!("<@W111> replying to myself");
        let me2 = BotIdentity {
            app_id: "A222".into(),
            bot_id: "B999".into(),
            bot_user_id: "UB111".into(),
        };
        assert_eq!(
            classify(&echo, &me2, &policy()).outcome,
            Outcome::Ignore(IgnoreReason::OwnBot)
        );
        // Our edit of our own message.
        let me3 = BotIdentity {
            app_id: "AXXXXXXXXXX".into(),
            bot_id: "BXXXXXXXXXX".into(),
            bot_user_id: "UOTHER".into(),
        };
        let c = classify(
            &fixture_event("message_changed_by_bot.slack-morphism.json"),
            &me3,
            &policy(),
        );
        assert_eq!(c.outcome, Outcome::Ignore(IgnoreReason::OwnBot));
        assert!(matches!(c.effect, Effect::Edit(_)));
    }

    #[test]
    fn other_bots_are_ignored_unless_approved_and_never_trigger() {
        let e = fixture_event("message_bot_message_other_app.bolt-python.json");
        let c = classify(&e, &me(), &policy());
        assert_eq!(
            c,
            Classification {
                effect: Effect::None,
                outcome: Outcome::Ignore(IgnoreReason::UnapprovedBot)
            }
        );
        let approving = TriggerPolicy {
            approved_bots: vec!["B_DIFFERENT_ONE".into()],
            channel_mode: ChannelMode::EveryMessage,
            ..policy()
        };
        let c = classify(&e, &me(), &approving);
        assert_eq!(c.outcome, Outcome::Ignore(IgnoreReason::BotNotTrigger));
        assert!(matches!(
            c.effect,
            Effect::Upsert(MessageFacts {
                speaker: Speaker::Bot,
                ..
            })
        ));
        let classic = fixture_event("message_bot_message.bolt-python.json");
        assert_eq!(
            classify(&classic, &me(), &policy()).outcome,
            Outcome::Ignore(IgnoreReason::UnapprovedBot)
        );
        let other_app = fixture_event("message_bot_profile_bot_user.bolt-python.json");
        assert_eq!(
            classify(&other_app, &me(), &policy()).outcome,
            Outcome::Ignore(IgnoreReason::UnapprovedBot)
        );
    }

    #[test]
    fn edits_are_state_changes_and_unchanged_text_changes_nothing() {
        let c = classify(
            &fixture_event("message_changed.bolt-python.json"),
            &me(),
            &policy(),
        );
        assert_eq!(c.outcome, Outcome::Ignore(IgnoreReason::StateChange));
        let Effect::Edit(f) = c.effect else {
            panic!("an edit")
        };
        // The inner message has no ts (a Slack quirk): previous_message's.
        // The change is ordered by the event's own time, not by the inner
        // `edited.ts`, which has whole seconds only.
        assert_eq!(
            (f.ts.as_str(), f.text.as_str(), f.changed_ts.as_deref()),
            (
                "1665102338.901939",
                "updated message",
                Some("1665102362.013600")
            )
        );
        let mut unfurl = fixture_event("message_changed.slack-morphism.json");
        unfurl["message"]["text"] = unfurl["previous_message"]["text"].clone();
        let c = classify(&unfurl, &me(), &policy());
        assert_eq!(
            c,
            Classification {
                effect: Effect::None,
                outcome: Outcome::Ignore(IgnoreReason::EditWithoutTextChange)
            }
        );
    }

    #[test]
    fn two_edits_within_a_second_are_ordered_by_their_events() {
        // Slack's `edited.ts` has whole seconds: two edits made within one
        // second carry the same one. Their events' own times tell them apart.
        let edit = |text: &str, event_ts: &str| {
            let mut e = fixture_event("message_changed.bolt-python.json");
            e["message"]["text"] = text.into();
            e["event_ts"] = event_ts.into();
            e["ts"] = event_ts.into();
            match classify(&e, &me(), &policy()).effect {
                Effect::Edit(f) => f,
                other => panic!("an edit: {other:?}"),
            }
        };
        let first = edit("first", "1665102362.013600");
        let second = edit("second", "1665102362.513600");
        assert_eq!(
            first.changed_ts.as_deref(),
            Some("1665102362.013600"),
            "the first edit's own time"
        );
        assert_eq!(second.changed_ts.as_deref(), Some("1665102362.513600"));
        assert_eq!(
            (first.ts.as_str(), first.root_ts.as_str()),
            (second.ts.as_str(), second.root_ts.as_str()),
            "both change one message"
        );
    }

    #[test]
    fn deletions_are_state_changes_of_the_deleted_message() {
        let c = classify(
            &fixture_event("message_deleted.bolt-python.json"),
            &me(),
            &policy(),
        );
        assert_eq!(
            c,
            Classification {
                effect: Effect::Delete {
                    ts: "1665368619.804829".into(),
                    root_ts: "1665368619.804829".into()
                },
                outcome: Outcome::Ignore(IgnoreReason::StateChange)
            }
        );
    }

    #[test]
    fn a_thread_root_deleted_with_replies_is_a_deletion_though_slack_says_changed() {
        // Slack's shape: the root becomes a tombstone, announced as a
        // change of the message (reported by Slack app developers; not in
        // Slack's own fixtures).
        let mut e = fixture_event("message_changed.bolt-python.json");
        let ts = e["previous_message"]["ts"].as_str().expect("ts").to_owned();
        e["message"] = json!({
            "type": "message", "subtype": "tombstone", "text": "This message was deleted.",
            "user": "USLACKBOT", "hidden": true, "ts": ts, "thread_ts": ts,
            "parent_user_id": "USLACKBOT", "reply_count": 2, "reply_users_count": 1,
            "latest_reply": "1715823386.583979", "reply_users": ["U04CBLNSVH6"],
            "is_locked": false, "subscribed": false
        });
        let c = classify(&e, &me(), &policy());
        assert_eq!(
            c,
            Classification {
                effect: Effect::Delete {
                    ts: ts.clone(),
                    root_ts: ts
                },
                outcome: Outcome::Ignore(IgnoreReason::StateChange)
            }
        );
    }

    #[test]
    fn thread_broadcast_and_file_share_are_messages() {
        let me = BotIdentity {
            bot_user_id: "UNOBODY".into(),
            ..me()
        };
        let c = classify(
            &fixture_event("thread_broadcast.bolt-python.json"),
            &me,
            &policy(),
        );
        assert_eq!(c.outcome, Outcome::Ignore(IgnoreReason::NotAddressed));
        let Effect::Upsert(f) = c.effect else {
            panic!("stored")
        };
        assert_eq!(f.root_ts, "1633663824.000500");
        let mut files_only = fixture_event("file_share.bolt-python.json");
        files_only["text"] = json!("");
        files_only["files"] = json!([{"id": "F1"}]);
        let every = TriggerPolicy {
            channel_mode: ChannelMode::EveryMessage,
            ..policy()
        };
        assert_eq!(
            classify(&files_only, &me, &every).outcome,
            Outcome::Trigger(TriggerSource::EveryMessage)
        );
    }

    #[test]
    fn private_and_shared_channels_are_denied_until_allowed() {
        let mention = fixture_event("app_mention.bolt-python.json");
        let c = classify(&mention, &me(), &policy());
        assert_eq!(c.outcome, Outcome::Trigger(TriggerSource::Mention));
        let shared = ChannelFacts {
            private: Some(false),
            ..ChannelFacts::of(&mention, true)
        };
        let denied = apply_channel_policy(c.clone(), shared, &policy());
        assert_eq!(
            denied.outcome,
            Outcome::Ignore(IgnoreReason::SharedChannelDenied)
        );
        assert!(matches!(denied.effect, Effect::Upsert(_)), "still recorded");
        let allowed = TriggerPolicy {
            shared_allowed: true,
            ..policy()
        };
        assert_eq!(
            apply_channel_policy(c.clone(), shared, &allowed).outcome,
            c.outcome
        );
        // channel_type "group" (the slack-morphism fixture) is private.
        let private =
            ChannelFacts::of(&fixture_event("message_changed.slack-morphism.json"), false);
        assert_eq!(private.private, Some(true));
        assert_eq!(
            apply_channel_policy(c.clone(), private, &policy()).outcome,
            Outcome::Ignore(IgnoreReason::PrivateChannelDenied)
        );
        let g = ChannelFacts::of(&json!({"type": "app_mention", "channel": "G123"}), false);
        assert_eq!(g.private, Some(true));
        // An app_mention has no channel_type and private channels get C ids
        // too: the kind is unknown, and unknown is denied until looked up.
        let unknown = ChannelFacts::of(&mention, false);
        assert_eq!(unknown.private, None);
        assert!(unknown.needs_lookup(&policy()));
        assert_eq!(
            apply_channel_policy(c.clone(), unknown, &policy()).outcome,
            Outcome::Ignore(IgnoreReason::ChannelKindUnknown)
        );
        let private_ok = TriggerPolicy {
            private_allowed: true,
            ..policy()
        };
        assert!(!unknown.needs_lookup(&private_ok));
        assert_eq!(
            apply_channel_policy(c.clone(), unknown, &private_ok).outcome,
            c.outcome
        );
        let public = ChannelFacts {
            private: Some(false),
            ..unknown
        };
        assert_eq!(
            apply_channel_policy(c.clone(), public, &policy()).outcome,
            c.outcome
        );
        assert_eq!(
            ChannelFacts::of(&fixture_event("message_channel.bolt-python.json"), false).private,
            Some(false),
            "a message event says channel_type"
        );
        // The allow-list: a listed channel may trigger even when private,
        // Slack Connect or of unknown kind; with "allow-listed channels
        // only", every other channel is denied (DMs follow dms_allowed).
        let listed = TriggerPolicy {
            channel_allowed: true,
            ..policy()
        };
        assert!(!unknown.needs_lookup(&listed));
        for facts in [private, shared, unknown] {
            assert_eq!(
                apply_channel_policy(c.clone(), facts, &listed).outcome,
                c.outcome
            );
        }
        let only_listed = TriggerPolicy {
            allowlist_only: true,
            ..policy()
        };
        assert!(!unknown.needs_lookup(&only_listed));
        for facts in [public, unknown, private] {
            assert_eq!(
                apply_channel_policy(c.clone(), facts, &only_listed).outcome,
                Outcome::Ignore(IgnoreReason::ChannelNotAllowed)
            );
        }
        let dm = ChannelFacts::of(
            &json!({"type": "message", "channel": "D123", "channel_type": "im"}),
            false,
        );
        assert!(dm.dm && !dm.needs_lookup(&policy()));
        assert_eq!(
            apply_channel_policy(c.clone(), dm, &only_listed).outcome,
            c.outcome,
            "a DM is not a channel of the allow-list"
        );
        assert_eq!(
            apply_channel_policy(
                c.clone(),
                ChannelFacts {
                    ext_shared: true,
                    ..dm
                },
                &policy()
            )
            .outcome,
            Outcome::Ignore(IgnoreReason::SharedChannelDenied),
            "a Slack Connect DM is still denied until shared channels are allowed"
        );
        // Ignores stay ignores.
        let plain = classify(
            &fixture_event("message_bot_message.bolt-python.json"),
            &me(),
            &policy(),
        );
        assert_eq!(
            apply_channel_policy(plain.clone(), shared, &policy()),
            plain
        );
    }

    #[test]
    fn empty_messages_dms_keywords_and_unhandled_types() {
        let empty =
            json!({"type": "message", "text": "  ", "user": "U1", "ts": "1.1", "channel": "C1"});
        assert_eq!(
            classify(&empty, &me(), &policy()).outcome,
            Outcome::Ignore(IgnoreReason::NoUsableText)
        );
        let dm = json!({"type": "message", "text": "help", "user": "U1", "ts": "1.1", "channel": "D1", "channel_type": "im"});
        assert_eq!(
            classify(&dm, &me(), &policy()).outcome,
            Outcome::Ignore(IgnoreReason::DmNotAllowed)
        );
        // Mentioning the bot in a DM does not get round the DM denial.
        let dm_mention = json!({"type": "message", "text": format!("<@{}> help", me().bot_user_id),
                                "user": "U1", "ts": "1.2", "channel": "D1", "channel_type": "im"});
        assert_eq!(
            classify(&dm_mention, &me(), &policy()).outcome,
            Outcome::Ignore(IgnoreReason::DmNotAllowed)
        );
        let dm_app_mention = json!({"type": "app_mention", "text": format!("<@{}> help", me().bot_user_id),
                                    "user": "U1", "ts": "1.3", "channel": "D1"});
        assert_eq!(
            classify(&dm_app_mention, &me(), &policy()).outcome,
            Outcome::Ignore(IgnoreReason::DmNotAllowed)
        );
        let dms = TriggerPolicy {
            dms_allowed: true,
            ..policy()
        };
        assert_eq!(
            classify(&dm, &me(), &dms).outcome,
            Outcome::Trigger(TriggerSource::DirectMessage)
        );
        assert_eq!(
            classify(&dm_mention, &me(), &dms).outcome,
            Outcome::Trigger(TriggerSource::Mention)
        );
        let kw = TriggerPolicy {
            channel_mode: ChannelMode::Keywords(vec!["Incident".into()]),
            ..policy()
        };
        let hit = json!({"type": "message", "text": "new incident: db down", "user": "U1", "ts": "1.1", "channel": "C1"});
        let miss = json!({"type": "message", "text": "incidental", "user": "U1", "ts": "1.1", "channel": "C1"});
        assert_eq!(
            classify(&hit, &me(), &kw).outcome,
            Outcome::Trigger(TriggerSource::Keyword)
        );
        assert_eq!(
            classify(&miss, &me(), &kw).outcome,
            Outcome::Ignore(IgnoreReason::NotAddressed)
        );
        // A "prefix" in text is not an identity: "@bot" typed as plain text does nothing.
        let fake = json!({"type": "message", "text": "@W111 please", "user": "U1", "ts": "1.1", "channel": "C1"});
        assert_eq!(
            classify(&fake, &me(), &policy()).outcome,
            Outcome::Ignore(IgnoreReason::NotAddressed)
        );
        for e in [
            fixture_event("app_uninstalled.bolt-python.json"),
            json!({"type": "message", "subtype": "channel_join", "ts": "1.1"}),
        ] {
            assert_eq!(
                classify(&e, &me(), &policy()).outcome,
                Outcome::Ignore(IgnoreReason::UnhandledType)
            );
        }
    }
}
