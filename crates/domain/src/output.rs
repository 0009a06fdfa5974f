//! What may be posted: secret detection, mass-mention neutralisation,
//! Slack length limits and the AI label on every answer. Pure functions, so
//! the same rules apply in inference and at human review.

use serde_json::{Value, json};

/// Why an output needs a human before it may be posted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Risk {
    /// `@channel`, `@here`, `@everyone` or a user-group mention.
    MassMention,
    /// Something that looks like a credential.
    SecretLike,
    /// The model proposed an action (a tool call) beyond a thread reply.
    ActionBeyondReply,
}

impl Risk {
    pub fn as_str(self) -> &'static str {
        match self {
            Risk::MassMention => "mass_mention",
            Risk::SecretLike => "secret_like",
            Risk::ActionBeyondReply => "action_beyond_reply",
        }
    }
}

/// Prefixes of credentials that must never leave through a reply or enter a
/// prompt: Slack tokens, OpenAI-style keys, GitHub tokens, AWS key ids.
const SECRET_PREFIXES: &[(&str, usize)] = &[
    ("xoxb-", 8),
    ("xoxp-", 8),
    ("xoxa-", 8),
    ("xoxr-", 8),
    ("xoxs-", 8),
    ("xoxe.", 8),
    ("xoxe-", 8),
    ("xapp-", 8),
    ("sk-", 20),
    ("ghp_", 20),
    ("github_pat_", 20),
    ("AKIA", 16),
];

fn token_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')
}

/// Byte ranges of secret-looking substrings.
fn secret_spans(text: &str) -> Vec<(usize, usize)> {
    let mut spans = Vec::new();
    for (prefix, min_tail) in SECRET_PREFIXES {
        let mut from = 0;
        while let Some(pos) = text[from..].find(prefix) {
            let start = from + pos;
            let boundary = text[..start]
                .chars()
                .next_back()
                .is_none_or(|c| !token_char(c));
            let tail: String = text[start + prefix.len()..]
                .chars()
                .take_while(|c| token_char(*c))
                .collect();
            // Sentence punctuation after a token is not part of it.
            let tail_len = tail.trim_end_matches(['.', '-']).len();
            let end = start + prefix.len() + tail_len;
            if boundary && tail_len >= *min_tail {
                spans.push((start, end));
            }
            from = end.max(start + prefix.len());
        }
    }
    if let Some(start) = text.find("-----BEGIN ")
        && text[start..].contains("PRIVATE KEY-----")
    {
        let end = text[start..]
            .find("-----END ")
            .map(|e| start + e)
            .unwrap_or(text.len());
        spans.push((start, end));
    }
    spans.sort_unstable();
    spans
}

pub fn looks_secret(text: &str) -> bool {
    !secret_spans(text).is_empty()
}

/// Replaces secret-looking substrings with `[redacted]` (for prompts).
pub fn redact_secrets(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    for (s, e) in secret_spans(text) {
        if s < at {
            continue;
        }
        out.push_str(&text[at..s]);
        out.push_str("[redacted]");
        at = e;
    }
    out.push_str(&text[at..]);
    out
}

/// Rewrites Slack mass mentions (`<!here>`, `<!channel>`, `<!everyone>`,
/// `<!subteam^…>`) so they notify nobody; reports whether there were any.
pub fn neutralise_mass_mentions(text: &str) -> (String, bool) {
    let mut out = String::with_capacity(text.len());
    let mut found = false;
    let mut rest = text;
    while let Some(pos) = rest.find("<!") {
        out.push_str(&rest[..pos]);
        let after = &rest[pos + 2..];
        match after.find('>') {
            Some(end) => {
                let inner = &after[..end];
                let name = inner.split('|').next().unwrap_or("");
                let word = name.split('^').next().unwrap_or("");
                if matches!(word, "here" | "channel" | "everyone" | "subteam") {
                    found = true;
                    // Plain text that reads the same and pings nobody.
                    out.push_str(&format!("@\u{2060}{word}"));
                } else {
                    out.push_str(&rest[pos..pos + 2 + end + 1]);
                }
                rest = &after[end + 1..];
            }
            None => {
                out.push_str(&rest[pos..]);
                rest = "";
            }
        }
    }
    out.push_str(rest);
    // Typed "@here" does not notify through the API, but is flagged too.
    for word in ["@here", "@channel", "@everyone"] {
        if out.contains(word) {
            found = true;
        }
    }
    (out, found)
}

/// Cuts `text` to at most `max_chars` characters, on a character boundary,
/// with an explicit marker.
pub fn limit_length(text: &str, max_chars: usize) -> String {
    if text.chars().count() <= max_chars {
        return text.to_owned();
    }
    let marker = " … [truncated]";
    let keep = max_chars.saturating_sub(marker.chars().count());
    let mut s: String = text.chars().take(keep).collect();
    s.push_str(marker);
    s
}

/// A reply ready for Slack: `text` (the notification and fallback text,
/// label included) and `blocks` (body section plus the label as a context
/// block).
#[derive(Debug, Clone, PartialEq)]
pub struct LabelledReply {
    pub text: String,
    pub blocks: Value,
    /// Reasons it must go to a human first (empty: may be posted).
    pub risks: Vec<Risk>,
}

/// Applies the output policy to a model's answer.
pub fn prepare(body: &str, label: &str, max_chars: usize, proposed_actions: bool) -> LabelledReply {
    let mut risks = Vec::new();
    let (neutral, mass) = neutralise_mass_mentions(body);
    if mass {
        risks.push(Risk::MassMention);
    }
    if looks_secret(&neutral) {
        risks.push(Risk::SecretLike);
    }
    if proposed_actions {
        risks.push(Risk::ActionBeyondReply);
    }
    // Slack sections hold 3,000 characters; the text field up to 40,000.
    let body = limit_length(neutral.trim(), max_chars.min(2900));
    let text = format!("{body}\n\n_{label}_");
    let blocks = json!([
        {"type": "section", "text": {"type": "mrkdwn", "text": body}},
        {"type": "context", "elements": [{"type": "mrkdwn", "text": label}]}
    ]);
    risks.sort_unstable();
    risks.dedup();
    LabelledReply {
        text,
        blocks,
        risks,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LABEL: &str = "AI-generated — verify before relying on it";

    #[test]
    fn every_reply_carries_the_label_in_text_and_blocks() {
        let r = prepare("Restart the pod.", LABEL, 3000, false);
        assert!(r.text.ends_with(&format!("_{LABEL}_")));
        assert_eq!(r.blocks[1]["type"], "context");
        assert_eq!(r.blocks[1]["elements"][0]["text"], LABEL);
        assert!(r.risks.is_empty());
    }

    #[test]
    fn mass_mentions_are_neutralised_and_flagged() {
        let (t, found) = neutralise_mass_mentions(
            "hey <!here> and <!channel|channel> and <!subteam^S1|@ops> but <@U1>",
        );
        assert!(found);
        assert!(!t.contains("<!"), "{t}");
        assert!(t.contains("<@U1>"));
        assert_eq!(
            prepare("ping <!everyone>", LABEL, 3000, false).risks,
            vec![Risk::MassMention]
        );
        assert_eq!(
            neutralise_mass_mentions("<!date^1|x> fine"),
            ("<!date^1|x> fine".to_owned(), false)
        );
    }

    #[test]
    fn secrets_are_detected_and_redacted() {
        for s in [
            "xoxb-1234-5678-abcdefgh",
            "sk-abcdefghijklmnopqrstuvwx",
            "AKIAABCDEFGHIJKLMNOP",
            "ghp_abcdefghijklmnopqrstuvwxyz",
        ] {
            let text = format!("the key is {s}.");
            assert!(looks_secret(&text), "{s}");
            assert_eq!(redact_secrets(&text), "the key is [redacted].");
        }
        assert!(looks_secret(
            "-----BEGIN RSA PRIVATE KEY-----\nabc\n-----END RSA PRIVATE KEY-----"
        ));
        for fine in [
            "ask-me later",
            "xoxb-",
            "risk-assessment document",
            "desk-booking",
        ] {
            assert!(!looks_secret(fine), "{fine}");
        }
        assert_eq!(
            prepare("token xoxb-1111-2222-33334444", LABEL, 3000, false).risks,
            vec![Risk::SecretLike]
        );
    }

    #[test]
    fn long_answers_are_cut_with_a_marker_on_a_char_boundary() {
        let long = "é".repeat(5000);
        let r = prepare(&long, LABEL, 3000, false);
        let body = r.blocks[0]["text"]["text"].as_str().expect("body");
        assert!(body.chars().count() <= 2900);
        assert!(body.ends_with("[truncated]"));
    }

    #[test]
    fn proposed_actions_need_review() {
        assert_eq!(
            prepare("done", LABEL, 3000, true).risks,
            vec![Risk::ActionBeyondReply]
        );
    }
}
