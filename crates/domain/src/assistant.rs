//! The assistant pane's events: `assistant_thread_started` (a person opened
//! the app's assistant: a thread in their DM with the app) and
//! `assistant_thread_context_changed` (they are looking at another
//! channel). Both carry `event.assistant_thread`.

use serde_json::Value;

use crate::ids::{ChannelId, TeamId, Ts, UserId};

pub const STARTED: &str = "assistant_thread_started";
pub const CONTEXT_CHANGED: &str = "assistant_thread_context_changed";

/// An assistant thread as its event names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AssistantThread {
    pub user: UserId,
    /// The DM with the app.
    pub channel: ChannelId,
    /// The thread's root.
    pub thread_ts: Ts,
    /// The channel the person is looking at, if Slack says.
    pub context_channel: Option<ChannelId>,
    pub context_team: Option<TeamId>,
}

/// Reads `event.assistant_thread`; `None` when a field is missing or is
/// not a Slack id (the event is then malformed).
pub fn parse(event: &Value) -> Option<AssistantThread> {
    let t = event.get("assistant_thread")?;
    let s = |p: &str| {
        t.pointer(p)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
    };
    let channel = ChannelId::parse(s("/channel_id")?).ok()?;
    if !channel.is_dm() {
        // The pane is a DM; anything else is not an assistant thread.
        return None;
    }
    Some(AssistantThread {
        user: UserId::parse(s("/user_id")?).ok()?,
        channel,
        thread_ts: Ts::parse(s("/thread_ts")?).ok()?,
        context_channel: match s("/context/channel_id") {
            Some(c) => Some(ChannelId::parse(c).ok()?),
            None => None,
        },
        context_team: match s("/context/team_id") {
            Some(c) => Some(TeamId::parse(c).ok()?),
            None => None,
        },
    })
}

/// Longest title [`title_of`] gives (characters).
pub const TITLE_CHARS: usize = 60;

/// A pane thread's title from its first question: its first line with
/// something left once Slack's markup is turned into what it shows (a
/// link's label, else its address; a channel as `#name`; a person or a
/// special mention dropped), spaces collapsed, cut at a word within
/// [`TITLE_CHARS`] with "…". `None` when nothing is left.
pub fn title_of(text: &str) -> Option<String> {
    let words = text.lines().map(shown_words).find(|w| !w.is_empty())?;
    let whole = words.join(" ");
    if whole.chars().count() <= TITLE_CHARS {
        return Some(whole);
    }
    let mut title = String::new();
    for w in &words {
        let next = title.chars().count() + usize::from(!title.is_empty()) + w.chars().count();
        if next > TITLE_CHARS - 1 {
            break;
        }
        if !title.is_empty() {
            title.push(' ');
        }
        title.push_str(w);
    }
    if title.is_empty() {
        // (one word longer than a title)
        title = words[0].chars().take(TITLE_CHARS - 1).collect();
    }
    title.push('…');
    Some(title)
}

/// The words of one line of a Slack message as Slack shows them.
fn shown_words(line: &str) -> Vec<String> {
    let mut plain = String::new();
    let mut rest = line;
    while let Some(open) = rest.find('<') {
        plain.push_str(&rest[..open]);
        let Some(close) = rest[open..].find('>') else {
            plain.push_str(&rest[open..]);
            rest = "";
            break;
        };
        let inner = &rest[open + 1..open + close];
        let (target, label) = match inner.split_once('|') {
            Some((t, l)) => (t, Some(l).filter(|l| !l.is_empty())),
            None => (inner, None),
        };
        match (target.chars().next(), label) {
            // (a person or a special mention: its name is not in the text)
            (Some('@' | '!'), _) | (Some('#'), None) => {}
            (Some('#'), Some(name)) => {
                plain.push('#');
                plain.push_str(name);
            }
            _ => plain.push_str(label.unwrap_or(target)),
        }
        rest = &rest[open + close + 1..];
    }
    plain.push_str(rest);
    plain
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&")
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

/// Whether the channel a person is looking at may be read as context of
/// their question: only where the channel policy would answer (allow-listed;
/// else, unless the installation answers only in allow-listed channels, not
/// a Slack Connect channel unless those are allowed, and a channel known to
/// be public, or a private one where private channels are allowed). A
/// channel whose kind is not known is not read.
pub fn context_readable(
    allow_listed: bool,
    allowlist_only: bool,
    private_allowed: bool,
    shared_allowed: bool,
    private: Option<bool>,
    ext_shared: Option<bool>,
) -> bool {
    if allow_listed {
        return true;
    }
    if allowlist_only {
        return false;
    }
    if !shared_allowed && ext_shared != Some(false) {
        return false;
    }
    match private {
        Some(false) => true,
        Some(true) => private_allowed,
        None => false,
    }
}

#[cfg(test)]
mod title_tests {
    use super::*;

    #[test]
    fn a_title_is_the_question_as_slack_shows_it_cut_at_a_word() {
        assert_eq!(
            title_of("why did the deploy fail?\nstack trace below").as_deref(),
            Some("why did the deploy fail?")
        );
        assert_eq!(
            title_of("<@U0BOT> see <https://ex.com/x|the runbook> in <#C01|ops>, <!here>")
                .as_deref(),
            Some("see the runbook in #ops,")
        );
        assert_eq!(
            title_of("a &lt;b&gt; &amp; <https://ex.com>").as_deref(),
            Some("a <b> & https://ex.com")
        );
        let long = "word ".repeat(30);
        let t = title_of(&long).expect("a title");
        assert!(t.chars().count() <= TITLE_CHARS && t.ends_with('…'), "{t}");
        assert!(!t.contains("  "));
        let one = "x".repeat(200);
        assert_eq!(
            title_of(&one).expect("a title").chars().count(),
            TITLE_CHARS
        );
        assert_eq!(title_of("   \n <@U0BOT> "), None);
        // A first line of only a mention: the next one names it.
        assert_eq!(
            title_of("<@U0BOT>\nwhy is the queue stuck?").as_deref(),
            Some("why is the queue stuck?")
        );
        // Empty labels show the channel's nothing and the link's address.
        assert_eq!(
            title_of("in <#C01|> see <https://ex.com/a|>").as_deref(),
            Some("in see https://ex.com/a")
        );
        // Exactly the limit is kept whole.
        let sixty = format!("{} end", "a".repeat(TITLE_CHARS - 4));
        assert_eq!(title_of(&sixty).as_deref(), Some(sixty.as_str()));
        assert_eq!(
            title_of("unclosed <https://ex.com").as_deref(),
            Some("unclosed <https://ex.com")
        );
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_context_channel_is_read_only_where_the_policy_would_answer() {
        let r = |listed, only, private_ok, private| {
            super::context_readable(listed, only, private_ok, false, private, Some(false))
        };
        assert!(r(false, false, false, Some(false)), "a public channel");
        assert!(!r(false, false, false, Some(true)), "a private one, denied");
        assert!(r(false, false, true, Some(true)), "a private one, allowed");
        assert!(!r(false, false, true, None), "kind unknown");
        assert!(!r(false, true, true, Some(false)), "not on the allow-list");
        assert!(r(true, true, false, Some(true)), "allow-listed by name");
        use super::context_readable as full;
        assert!(
            !full(false, false, false, false, Some(false), Some(true)),
            "Slack Connect, denied"
        );
        assert!(
            !full(false, false, false, false, Some(false), None),
            "Slack Connect unknown"
        );
        assert!(
            full(false, false, false, true, Some(false), Some(true)),
            "Slack Connect, allowed"
        );
        assert!(
            full(true, false, false, false, Some(true), Some(true)),
            "allow-listed by name"
        );
    }

    use super::*;
    use serde_json::json;

    #[test]
    fn an_assistant_thread_is_read_from_its_event() {
        // The shape Slack documents (and bolt-python's tests send).
        let e = json!({"type": "assistant_thread_started", "assistant_thread": {
            "user_id": "U0ANA", "context": {"channel_id": "C0OPS", "team_id": "T0ACME", "enterprise_id": "E0ORG"},
            "channel_id": "D0PANE", "thread_ts": "1729999327.187299"}, "event_ts": "1729999327.187350"});
        let t = parse(&e).expect("a thread");
        assert_eq!(t.user.as_str(), "U0ANA");
        assert_eq!(t.channel.as_str(), "D0PANE");
        assert_eq!(t.thread_ts.as_str(), "1729999327.187299");
        assert_eq!(
            t.context_channel.as_ref().map(|c| c.as_str()),
            Some("C0OPS")
        );
        assert_eq!(t.context_team.as_ref().map(|c| c.as_str()), Some("T0ACME"));
        let mut bare = e.clone();
        bare["assistant_thread"]["context"] = json!({});
        assert_eq!(parse(&bare).expect("a thread").context_channel, None);
        let mut not_dm = e.clone();
        not_dm["assistant_thread"]["channel_id"] = json!("C0OPS");
        assert_eq!(parse(&not_dm), None, "the pane is a DM");
        let mut bad = e;
        bad["assistant_thread"]["thread_ts"] = json!("now");
        assert_eq!(parse(&bad), None);
    }
}
