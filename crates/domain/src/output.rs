//! What may be posted: model text escaped so that it can never become a
//! mention, ping or link label, answers that tried to use Slack's markup
//! or look like they hold a credential sent to review, Slack length limits
//! and the AI label on every answer. Pure functions, so the same rules
//! apply in inference and at human review.

pub mod markup;

use serde_json::{Value, json};

use markup::Markup;

/// Why an output needs a human before it may be posted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Risk {
    /// `@channel`, `@here`, `@everyone`, `@group` or a user-group mention.
    MassMention,
    /// A single user (`<@U…>`) or channel (`<#C…>`) mention.
    Mention,
    /// A link whose text is not its target (`<url|text>`).
    DisguisedLink,
    /// Another Slack command sequence (`<!date^…>`, an unknown `<!…>`).
    SlackCommand,
    /// Something that looks like a credential.
    SecretLike,
    /// The model proposed an action (a tool call) beyond a thread reply.
    ActionBeyondReply,
}

impl Risk {
    pub fn as_str(self) -> &'static str {
        match self {
            Risk::MassMention => "mass_mention",
            Risk::Mention => "mention",
            Risk::DisguisedLink => "disguised_link",
            Risk::SlackCommand => "slack_command",
            Risk::SecretLike => "secret_like",
            Risk::ActionBeyondReply => "action_beyond_reply",
        }
    }

    /// The review reason for a control sequence found in model text; a
    /// bare link (`<https://…>`) shows its own target and needs none.
    pub fn of_markup(m: Markup) -> Option<Risk> {
        match m {
            Markup::Broadcast => Some(Risk::MassMention),
            Markup::Mention => Some(Risk::Mention),
            Markup::LabelledLink => Some(Risk::DisguisedLink),
            Markup::Command => Some(Risk::SlackCommand),
            Markup::BareLink => None,
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

/// The body of a reply, by who wrote it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Body<'a> {
    /// What a model wrote: untrusted. Escaped, so that it shows as written
    /// and nothing in it becomes a mention, ping, date or link label; any
    /// control sequence it holds sends the reply to review.
    Model(&'a str),
    /// threadline's own text (the configured fallback): posted as written,
    /// links and formatting included; a mass mention in it still needs a
    /// reviewer.
    Own(&'a str),
}

/// Applies the output policy to an answer.
pub fn prepare(
    body: Body<'_>,
    label: &str,
    max_chars: usize,
    proposed_actions: bool,
) -> LabelledReply {
    // Slack sections hold 3,000 characters; the text field up to 40,000.
    let max = max_chars.min(2900);
    let (mut risks, body) = match body {
        Body::Model(raw) => {
            let found = markup::find(raw);
            let mut risks: Vec<Risk> = found.into_iter().filter_map(Risk::of_markup).collect();
            if looks_secret(raw) {
                risks.push(Risk::SecretLike);
            }
            (risks, markup::escape_within(raw.trim(), max))
        }
        Body::Own(own) => {
            let mut risks = Vec::new();
            if markup::find(own).contains(&Markup::Broadcast) {
                risks.push(Risk::MassMention);
            }
            if looks_secret(own) {
                risks.push(Risk::SecretLike);
            }
            (risks, limit_length(own.trim(), max))
        }
    };
    if proposed_actions {
        risks.push(Risk::ActionBeyondReply);
    }
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

/// The output policy again, on a stored reply, right before it is sent to
/// Slack: what the publisher sends is only what [`prepare`] could have let
/// through unreviewed, whoever wrote the decision row. `text` and `blocks`
/// are the stored body as [`prepare`] shapes it (the body, then the label
/// in a paragraph of its own); `own` for threadline's own text (the
/// fallback). A reason when it must not be sent; `None` when it may.
pub fn refused(text: &str, blocks: Option<&Value>, own: bool) -> Option<Risk> {
    let check = |t: &str, own: bool| -> Option<Risk> {
        let found = markup::find(t);
        let risk = if own {
            found
                .contains(&Markup::Broadcast)
                .then_some(Risk::MassMention)
        } else {
            found.into_iter().find_map(Risk::of_markup)
        };
        risk.or_else(|| looks_secret(t).then_some(Risk::SecretLike))
    };
    // The body, then the label paragraph (threadline's own words).
    let (body, label) = match text.rsplit_once("\n\n_") {
        Some((body, label)) if label.ends_with('_') => (body, Some(label)),
        _ => (text, None),
    };
    if let Some(r) = check(body, own).or_else(|| label.and_then(|l| check(l, true))) {
        return Some(r);
    }
    // Every text the blocks carry, by the body's rules; the label's own
    // context as threadline's.
    let label = label.map(|l| l.strip_suffix('_').unwrap_or(l));
    let mut texts = Vec::new();
    collect_texts(blocks.unwrap_or(&Value::Null), &mut texts);
    texts
        .into_iter()
        .find_map(|t| check(t, own || Some(t) == label))
}

fn collect_texts<'v>(v: &'v Value, out: &mut Vec<&'v str>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                match (k.as_str(), x) {
                    ("text", Value::String(t)) => out.push(t),
                    _ => collect_texts(x, out),
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|x| collect_texts(x, out)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LABEL: &str = "AI-generated — verify before relying on it";

    #[test]
    fn a_stored_reply_is_checked_again_as_prepare_would_have() {
        // What prepare lets through passes again, fallback links included.
        for (body, own) in [
            (Body::Model("Restart <the> pod & retry @ 5pm"), false),
            (
                Body::Own("See <https://status.example|the status page>."),
                true,
            ),
        ] {
            let r = prepare(body, LABEL, 3000, false);
            assert!(r.risks.is_empty());
            assert_eq!(refused(&r.text, Some(&r.blocks), own), None, "{}", r.text);
        }
        // A row written past the policy (unescaped model text) is refused,
        // in its text or in its blocks alone.
        let ok = prepare(Body::Model("fine words"), LABEL, 3000, false);
        let text = format!("<!here> look\n\n_{LABEL}_");
        assert_eq!(
            refused(&text, Some(&ok.blocks), false),
            Some(Risk::MassMention)
        );
        let mut blocks = ok.blocks.clone();
        blocks[0]["text"]["text"] = json!("<https://evil.example|your invoice>");
        assert_eq!(
            refused(&ok.text, Some(&blocks), false),
            Some(Risk::DisguisedLink)
        );
        let text = format!("the key is xoxb-1234567890-abcdefghij\n\n_{LABEL}_");
        assert_eq!(refused(&text, None, false), Some(Risk::SecretLike));
        // A fallback may link, never ping everyone.
        let text = format!("<!channel> down\n\n_{LABEL}_");
        assert_eq!(refused(&text, None, true), Some(Risk::MassMention));
    }

    #[test]
    fn every_reply_carries_the_label_in_text_and_blocks() {
        let r = prepare(Body::Model("Restart the pod."), LABEL, 3000, false);
        assert_eq!(r.text, format!("Restart the pod.\n\n_{LABEL}_"));
        assert_eq!(r.blocks[1]["type"], "context");
        assert_eq!(r.blocks[1]["elements"][0]["text"], LABEL);
        assert!(r.risks.is_empty());
    }

    fn body(r: &LabelledReply) -> &str {
        r.blocks[0]["text"]["text"].as_str().expect("body")
    }

    #[test]
    fn model_text_is_escaped_in_text_and_blocks_and_its_markup_sent_to_review() {
        let r = prepare(
            Body::Model(
                "hey <!here>, ask <@U1> in <#C2>: <https://evil.example|click> & <!date^1|x>",
            ),
            LABEL,
            3000,
            false,
        );
        let escaped = "hey &lt;!here&gt;, ask &lt;@U1&gt; in &lt;#C2&gt;: \
                       &lt;https://evil.example|click&gt; &amp; &lt;!date^1|x&gt;";
        assert_eq!(body(&r), escaped);
        assert_eq!(r.text, format!("{escaped}\n\n_{LABEL}_"));
        assert_eq!(
            r.risks,
            vec![
                Risk::MassMention,
                Risk::Mention,
                Risk::DisguisedLink,
                Risk::SlackCommand
            ]
        );
        // Forms the old filter let through.
        for s in [
            "<!x <!here>",
            "<!date^1 <!everyone>",
            "<!<!channel>>",
            "<!HERE>",
            "<!group>",
        ] {
            let r = prepare(Body::Model(s), LABEL, 3000, false);
            assert!(r.risks.contains(&Risk::MassMention), "{s}: {:?}", r.risks);
            assert!(!r.text.contains('<') && !r.text.contains('>'), "{}", r.text);
        }
    }

    #[test]
    fn a_bare_link_is_escaped_but_needs_no_review() {
        let r = prepare(
            Body::Model("see <https://example.com/docs>"),
            LABEL,
            3000,
            false,
        );
        assert!(r.risks.is_empty());
        assert_eq!(body(&r), "see &lt;https://example.com/docs&gt;");
    }

    #[test]
    fn threadlines_own_text_keeps_its_formatting_but_not_a_mass_mention() {
        let own = "Try again, or see <https://status.example|the status page>.";
        let r = prepare(Body::Own(own), LABEL, 3000, false);
        assert!(r.risks.is_empty());
        assert_eq!(body(&r), own);
        assert_eq!(
            prepare(Body::Own("<!channel> down"), LABEL, 3000, false).risks,
            vec![Risk::MassMention]
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
            prepare(
                Body::Model("token xoxb-1111-2222-33334444"),
                LABEL,
                3000,
                false
            )
            .risks,
            vec![Risk::SecretLike]
        );
    }

    #[test]
    fn long_answers_are_cut_with_a_marker_on_a_char_boundary() {
        let long = "é".repeat(5000);
        let r = prepare(Body::Model(&long), LABEL, 3000, false);
        assert!(body(&r).chars().count() <= 2900);
        assert!(body(&r).ends_with("[truncated]"));
        // Counted after escaping, and never inside an entity.
        let r = prepare(Body::Model(&"<".repeat(1000)), LABEL, 3000, false);
        assert!(body(&r).chars().count() <= 2900);
        assert!(
            body(&r)
                .trim_end_matches(" … [truncated]")
                .split("&lt;")
                .all(str::is_empty)
        );
    }

    #[test]
    fn proposed_actions_need_review() {
        assert_eq!(
            prepare(Body::Model("done"), LABEL, 3000, true).risks,
            vec![Risk::ActionBeyondReply]
        );
    }
}
