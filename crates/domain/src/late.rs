//! Late events. Slack can deliver an event long after it happened: it
//! replays what an app missed during an outage, and its last retry comes
//! minutes after the first attempt. How late an event is is measured when
//! threadline received it (the gateway's receipt time, kept through the
//! spool and a replay), from the event's own time: the envelope's
//! `event_time`, else the `ts` of the message it is about. Past the
//! configured age every such event is recorded, and a request is handled
//! as its installation's policy says ([`LateAction`]).

use std::time::Duration;

/// What an installation does with a request that arrived late.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LateAction {
    /// Not answered: recorded as a thread change like any message nobody
    /// asked the bot about.
    Skip,
    /// Answered, the answer saying (beside its AI label) how late the
    /// request reached the bot.
    Note,
    /// Answered as if it had arrived in time.
    Answer,
}

impl LateAction {
    pub const ALL: [Self; 3] = [Self::Skip, Self::Note, Self::Answer];

    /// An installation that never chose.
    pub const DEFAULT: Self = Self::Note;

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Skip => "skip",
            Self::Note => "note",
            Self::Answer => "answer",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.as_str() == s)
    }

    /// What a late request comes to under this policy.
    pub fn outcome(self) -> LateOutcome {
        match self {
            Self::Skip => LateOutcome::Skipped,
            Self::Note => LateOutcome::Noted,
            Self::Answer => LateOutcome::Answered,
        }
    }
}

/// What became of an event that arrived late, as recorded and counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LateOutcome {
    /// A request not answered ([`LateAction::Skip`]).
    Skipped,
    /// A request answered with a note of its lateness.
    Noted,
    /// A request answered as if in time.
    Answered,
    /// Not a request (an edit, a deletion, a message nobody asked about):
    /// applied to its thread as always, only recorded.
    Recorded,
}

impl LateOutcome {
    pub const ALL: [Self; 4] = [Self::Skipped, Self::Noted, Self::Answered, Self::Recorded];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Skipped => "skipped",
            Self::Noted => "noted",
            Self::Answered => "answered",
            Self::Recorded => "recorded",
        }
    }
}

/// A Slack `ts` (`"1595926230.009600"`) as milliseconds since the epoch.
fn ts_millis(ts: &str) -> Option<i64> {
    let (secs, frac) = ts.split_once('.').unwrap_or((ts, ""));
    let secs: i64 = secs.parse().ok()?;
    let millis: i64 = format!("{frac:0<3}").get(..3)?.parse().ok()?;
    Some(secs * 1000 + millis)
}

/// How long after it happened an event arrived: from its `event_time`
/// (seconds; 0 when Slack gave none), else the `ts` of its message, to
/// `received_at_ms`. `None` when either side is unknown (an event built
/// without them); zero when the event's time is after its receipt (the
/// clocks disagree).
pub fn age(event_time_s: i64, message_ts: &str, received_at_ms: i64) -> Option<Duration> {
    if received_at_ms <= 0 {
        return None;
    }
    let happened = if event_time_s > 0 {
        event_time_s.checked_mul(1000)?
    } else {
        ts_millis(message_ts).filter(|t| *t > 0)?
    };
    let ms = received_at_ms.saturating_sub(happened).max(0);
    Some(Duration::from_millis(ms as u64))
}

/// The age of an event that arrived `after` or later; `None` when it was
/// in time (or its age is unknown).
pub fn late_by(age: Option<Duration>, after: Duration) -> Option<Duration> {
    age.filter(|a| *a >= after)
}

/// An age as a person reads it: whole seconds, minutes, hours or days.
pub fn spoken(age: Duration) -> String {
    let s = age.as_secs();
    let (n, unit) = match s {
        0..120 => (s, "second"),
        120..7200 => (s / 60, "minute"),
        7200..172_800 => (s / 3600, "hour"),
        _ => (s / 86_400, "day"),
    };
    format!("{n} {unit}{}", if n == 1 { "" } else { "s" })
}

/// The honest note an answer to a late request carries: threadline's own
/// words, no message content.
pub fn note(age: Duration) -> String {
    format!(
        "Slack delivered this message to me {} after it was sent",
        spoken(age)
    )
}

/// The AI label of an answer, with the note of its request's lateness
/// when it has one. The label travels with the decision (a post's context
/// block, a stream's stop, an update), so every form of the answer shows
/// the note where it shows the label.
pub fn labelled(label: &str, late_by: Option<Duration>) -> String {
    match late_by {
        Some(age) => format!("{label} · {}", note(age)),
        None => label.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn age_is_from_the_events_time_else_its_messages_ts_to_its_receipt() {
        let ms = |m: u64| Some(Duration::from_millis(m));
        assert_eq!(age(1_000, "", 1_000_500), ms(500));
        // No event_time: the message's ts.
        assert_eq!(age(0, "999.250000", 1_000_000), ms(750));
        assert_eq!(age(0, "999", 1_000_000), ms(1000));
        // Unknown either side: no age; clocks that disagree: none late.
        assert_eq!(age(0, "", 1_000_000), None);
        assert_eq!(age(1_000, "", 0), None);
        assert_eq!(age(2_000, "", 1_000_000), ms(0));
    }

    #[test]
    fn late_from_the_configured_age_on() {
        let five = Duration::from_secs(300);
        assert_eq!(late_by(Some(Duration::from_secs(299)), five), None);
        assert_eq!(late_by(Some(five), five), Some(five));
        assert_eq!(late_by(None, five), None);
    }

    #[test]
    fn the_note_says_how_late_in_words_beside_the_label() {
        let s = |secs| spoken(Duration::from_secs(secs));
        assert_eq!(
            (s(1), s(90), s(120), s(900), s(7200), s(200_000)),
            (
                "1 second".into(),
                "90 seconds".into(),
                "2 minutes".into(),
                "15 minutes".into(),
                "2 hours".into(),
                "2 days".into()
            )
        );
        assert_eq!(labelled("AI", None), "AI");
        assert_eq!(
            labelled("AI", Some(Duration::from_secs(900))),
            "AI · Slack delivered this message to me 15 minutes after it was sent"
        );
        // Threadline's own words: nothing in them is markup or looks secret.
        let n = labelled("AI", Some(Duration::from_secs(86_400 * 9)));
        assert!(!n.contains(['<', '>', '_', '*', '\n']));
    }

    #[test]
    fn policies_and_outcomes_read_back() {
        for a in LateAction::ALL {
            assert_eq!(LateAction::parse(a.as_str()), Some(a));
        }
        assert_eq!(LateAction::parse("never"), None);
        assert_eq!(LateAction::DEFAULT.outcome(), LateOutcome::Noted);
    }
}
