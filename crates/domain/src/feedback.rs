//! Feedback on answers: the buttons every answer carries (Slack's
//! `context_actions` block holding a `feedback_buttons` element) and what a
//! click on them is. Slack toggles the buttons in the client and reports
//! every click as a `block_actions` interaction (the element's `action_id`,
//! the clicked button's `value`, `type: feedback_buttons`); a deselect is
//! never reported, so a person's latest click is their verdict.
//!
//! Each button's value names its verdict and the decision whose answer
//! carries it (`positive:<decision id>`), so a click on an answer that has
//! since been superseded still counts for that answer's decision.

use serde_json::{Value, json};

use crate::envelope::InstallationKey;
use crate::ids::{ChannelId, Ts, UserId};

/// The `action_id` of the feedback buttons (the element's; Slack reports
/// it for either button).
pub const FEEDBACK_ACTION: &str = "threadline_feedback";

/// The `block_id` prefix of the feedback block (the decision id follows,
/// so the id is unique per message, as Slack asks).
const BLOCK_PREFIX: &str = "threadline_feedback_";

/// A person's verdict on an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verdict {
    Positive,
    Negative,
}

impl Verdict {
    pub const ALL: [Verdict; 2] = [Verdict::Positive, Verdict::Negative];

    /// As the store keeps it, metrics label it and the export prints it.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Positive => "positive",
            Verdict::Negative => "negative",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|v| v.as_str() == s)
    }

    /// The button's value: the verdict and the decision.
    pub fn value(self, decision: &str) -> String {
        format!("{}:{decision}", self.as_str())
    }

    /// The verdict and the decision a button's value names.
    pub fn of_value(value: &str) -> Option<(Verdict, &str)> {
        let (v, decision) = value.split_once(':')?;
        let verdict = Self::parse(v)?;
        (!decision.is_empty()).then_some((verdict, decision))
    }
}

/// The feedback block of decision `decision`'s answer: threadline's own
/// words, no model text.
pub fn block(decision: &str) -> Value {
    let button = |verdict: Verdict, emoji: &str, label: &str| {
        json!({
            "text": {"type": "plain_text", "text": emoji, "emoji": true},
            "accessibility_label": label,
            "value": verdict.value(decision),
        })
    };
    json!({
        "type": "context_actions",
        "block_id": format!("{BLOCK_PREFIX}{decision}"),
        "elements": [{
            "type": "feedback_buttons",
            "action_id": FEEDBACK_ACTION,
            "positive_button": button(Verdict::Positive, "👍", "This answer was helpful"),
            "negative_button": button(Verdict::Negative, "👎", "This answer was not helpful"),
        }]
    })
}

/// Whether `blocks` hold feedback buttons (a test's and a check's view).
pub fn carries_buttons(blocks: &Value) -> bool {
    blocks.as_array().is_some_and(|b| {
        b.iter().any(|b| {
            b["type"] == "context_actions"
                && b["elements"]
                    .as_array()
                    .is_some_and(|e| e.iter().any(|e| e["type"] == "feedback_buttons"))
        })
    })
}

/// A click on an answer's feedback buttons.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Click {
    pub key: InstallationKey,
    pub user: UserId,
    pub channel: ChannelId,
    pub message_ts: Ts,
    pub verdict: Verdict,
    /// The decision the answer is of (from the button's value, unparsed).
    pub decision: String,
    /// When Slack says the click happened (`action_ts`): a later click of
    /// the same person wins, whatever order the clicks arrive in.
    pub action_ts: Option<Ts>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buttons_value_names_its_verdict_and_decision() {
        for v in Verdict::ALL {
            assert_eq!(Verdict::of_value(&v.value("0191-d")), Some((v, "0191-d")));
            assert_eq!(Verdict::parse(v.as_str()), Some(v));
        }
        assert_eq!(Verdict::of_value("positive:"), None);
        assert_eq!(Verdict::of_value("good-feedback"), None);
        assert_eq!(Verdict::of_value("meh:0191-d"), None);
    }

    #[test]
    fn the_block_is_slacks_context_actions_with_feedback_buttons() {
        let b = block("0191-d");
        assert_eq!(b["type"], "context_actions");
        assert_eq!(b["block_id"], "threadline_feedback_0191-d");
        let e = &b["elements"][0];
        assert_eq!(e["type"], "feedback_buttons");
        assert_eq!(e["action_id"], FEEDBACK_ACTION);
        assert_eq!(e["positive_button"]["value"], "positive:0191-d");
        assert_eq!(e["negative_button"]["value"], "negative:0191-d");
        for side in ["positive_button", "negative_button"] {
            assert_eq!(e[side]["text"]["type"], "plain_text");
            let label = e[side]["accessibility_label"].as_str().unwrap();
            assert!(label.chars().count() <= 75, "Slack's limit");
        }
        assert!(carries_buttons(&json!([{"type": "context"}, b])));
        assert!(!carries_buttons(&json!([{"type": "context"}])));
    }
}
