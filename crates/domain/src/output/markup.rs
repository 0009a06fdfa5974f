//! Slack's control sequences in untrusted text: escaping them so that
//! nothing can become a mention, a channel ping, a date token or a link
//! label, and finding them (nested and odd forms included) so that an
//! answer that tried to use one goes to a human first.
//!
//! Slack reads `<…>` as markup (`<@U1>`, `<!here>`, `<#C1>`,
//! `<!subteam^S1>`, `<!date^…>`, `<url|label>`) and documents `&amp;`,
//! `&lt;` and `&gt;` as the way to write `&`, `<` and `>` as text.

/// Slack's escaping of text: `&` → `&amp;`, `<` → `&lt;`, `>` → `&gt;`.
/// Nothing else changes, so text without those three reads the same.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + text.len() / 8);
    for c in text.chars() {
        push_escaped(&mut out, c);
    }
    out
}

fn push_escaped(out: &mut String, c: char) {
    match c {
        '&' => out.push_str("&amp;"),
        '<' => out.push_str("&lt;"),
        '>' => out.push_str("&gt;"),
        c => out.push(c),
    }
}

fn escaped_len(c: char) -> usize {
    match c {
        '&' => 5,
        '<' | '>' => 4,
        _ => 1,
    }
}

/// [`escape`]d text cut to at most `max_chars` characters (counted after
/// escaping, as Slack counts them), never inside an entity, with an
/// explicit marker when something was cut.
pub fn escape_within(text: &str, max_chars: usize) -> String {
    let total: usize = text.chars().map(escaped_len).sum();
    if total <= max_chars {
        return escape(text);
    }
    let marker = " … [truncated]";
    let keep = max_chars.saturating_sub(marker.chars().count());
    let mut out = String::with_capacity(keep + marker.len());
    let mut used = 0;
    for c in text.chars() {
        let n = escaped_len(c);
        if used + n > keep {
            break;
        }
        used += n;
        push_escaped(&mut out, c);
    }
    out.push_str(marker);
    out
}

/// The text Slack shows for escaped text: `&amp;`, `&lt;` and `&gt;`
/// become `&`, `<` and `>`; any other `&` stays as it is.
pub fn unescape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(pos) = rest.find('&') {
        out.push_str(&rest[..pos]);
        let tail = &rest[pos..];
        let (c, len) = if tail.starts_with("&amp;") {
            ('&', 5)
        } else if tail.starts_with("&lt;") {
            ('<', 4)
        } else if tail.starts_with("&gt;") {
            ('>', 4)
        } else {
            ('&', 1)
        };
        out.push(c);
        rest = &tail[len..];
    }
    out.push_str(rest);
    out
}

/// A control sequence found in text, by what it would do in Slack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Markup {
    /// `<!here>`, `<!channel>`, `<!everyone>`, `<!group>` (any case) or a
    /// user group `<!subteam^…>`: notifies many people. A typed `@here`,
    /// `@channel` or `@everyone` counts too.
    Broadcast,
    /// `<@U…>` or `<#C…>`: names (and for a user, notifies) one person or
    /// channel.
    Mention,
    /// `<target|label>`: a link whose text is not its target.
    LabelledLink,
    /// Any other `<!…>` command, such as a `<!date^…>` token.
    Command,
    /// `<https://…>`: a link that shows its own target.
    BareLink,
}

/// Every kind of control sequence in `text` (sorted, each once).
///
/// Each `<` is read up to the next `>`, so a sequence nested in another
/// (`<!x <!here>`, `<!<!channel>>`) is found as well as the outer one;
/// names are compared without regard to case or surrounding whitespace.
pub fn find(text: &str) -> Vec<Markup> {
    let b = text.as_bytes();
    // Position of the next `>` and the next `|` at or after each byte, so
    // that the scan stays linear whatever the nesting.
    let mut next_gt = vec![usize::MAX; b.len() + 1];
    let mut next_bar = vec![usize::MAX; b.len() + 1];
    for i in (0..b.len()).rev() {
        next_gt[i] = if b[i] == b'>' { i } else { next_gt[i + 1] };
        next_bar[i] = if b[i] == b'|' { i } else { next_bar[i + 1] };
    }
    let mut found = Vec::new();
    for (i, _) in b.iter().enumerate().filter(|(_, c)| **c == b'<') {
        let end = next_gt[i + 1];
        if end == usize::MAX {
            break;
        }
        // Both ends are ASCII, so these are character boundaries.
        let inner = &text[i + 1..end];
        if let Some(m) = classify(inner, next_bar[i + 1] < end) {
            found.push(m);
        }
    }
    if typed_broadcast(text) {
        found.push(Markup::Broadcast);
    }
    found.sort_unstable();
    found.dedup();
    found
}

/// What the content of one `<…>` is.
fn classify(inner: &str, has_label: bool) -> Option<Markup> {
    let inner = inner.trim_start();
    let mut chars = inner.chars();
    match chars.next()? {
        '!' => {
            let name: String = chars
                .as_str()
                .trim_start()
                .chars()
                .take_while(|c| !matches!(c, '^' | '|' | '<' | '>') && !c.is_whitespace())
                .take(16)
                .flat_map(char::to_lowercase)
                .collect();
            Some(
                if matches!(
                    name.as_str(),
                    "here" | "channel" | "everyone" | "group" | "subteam"
                ) {
                    Markup::Broadcast
                } else {
                    Markup::Command
                },
            )
        }
        '@' | '#' => Some(Markup::Mention),
        _ if has_label => Some(Markup::LabelledLink),
        _ if looks_like_link(inner) => Some(Markup::BareLink),
        _ => None,
    }
}

fn looks_like_link(inner: &str) -> bool {
    let lower: String = inner
        .chars()
        .take(12)
        .flat_map(char::to_lowercase)
        .collect();
    [
        "http://", "https://", "mailto:", "tel:", "slack://", "ftp://",
    ]
    .iter()
    .any(|s| lower.starts_with(s))
}

/// Whether `text`, rendered as Markdown (a stream's `markdown_text`),
/// would show a link whose words hide its target: an inline link or image
/// (`[label](url)`, `![alt](url)`), a reference link (`[label][ref]`,
/// `[label][]`) or a reference definition (`[ref]: url`, which turns a
/// bare `[ref]` anywhere into a link). Slack's mrkdwn (posts) shows such
/// text as written, with the URL visible, so only the Markdown form needs
/// this. Conservative: text that merely looks like one (`a[i](x)`) counts.
pub fn markdown_link(text: &str) -> bool {
    if text.contains("](") || text.contains("][") {
        return true;
    }
    text.lines().any(|line| {
        let l = line.trim_start_matches([' ', '\t']);
        l.starts_with('[')
            && l.find("]:")
                .is_some_and(|end| end > 1 && !l[1..end].contains(']'))
    })
}

/// `@here`, `@channel` or `@everyone` typed as a word (any case).
fn typed_broadcast(text: &str) -> bool {
    let lower = text.to_lowercase();
    let b = lower.as_bytes();
    for word in ["@here", "@channel", "@everyone"] {
        let mut from = 0;
        while let Some(pos) = lower[from..].find(word) {
            let start = from + pos;
            let end = start + word.len();
            let before = start == 0 || !b[start - 1].is_ascii_alphanumeric();
            let after = end == b.len() || !(b[end].is_ascii_alphanumeric() || b[end] == b'_');
            if before && after {
                return true;
            }
            from = end;
        }
    }
    false
}

/// How a reader sees text with Slack markup, as plain words: `<@U1>` →
/// `@U1`, `<#C1|ops>` → `#ops`, `<!here>` → `@here`, `<!date^…|fallback>`
/// → `fallback`, `<url|label>` → `label (url)`, `<url>` → `url`, and the
/// three entities decoded. Nested sequences are read from the inside out.
pub fn readable(text: &str) -> String {
    let mut s = text.to_owned();
    loop {
        let next = readable_pass(&s);
        if next == s {
            break;
        }
        s = next;
    }
    unescape(&s)
}

/// Replaces every innermost `<…>` (no `<` inside) by what it shows.
fn readable_pass(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(open) = rest.find('<') {
        let after = &rest[open + 1..];
        let Some(close) = after
            .find(['<', '>'])
            .filter(|c| after.as_bytes()[*c] == b'>')
        else {
            out.push_str(&rest[..open + 1]);
            rest = after;
            continue;
        };
        out.push_str(&rest[..open]);
        let inner = &after[..close];
        let (target, label) = match inner.split_once('|') {
            Some((t, l)) => (t, Some(l)),
            None => (inner, None),
        };
        let shown = if let Some(cmd) = target.strip_prefix('!') {
            match label {
                Some(l) => l.to_owned(),
                None => format!("@{}", cmd.split('^').next().unwrap_or(cmd)),
            }
        } else if let Some(id) = target.strip_prefix('@') {
            format!("@{}", label.unwrap_or(id))
        } else if let Some(id) = target.strip_prefix('#') {
            format!("#{}", label.unwrap_or(id))
        } else {
            match label {
                Some(l) => format!("{l} ({target})"),
                None => target.to_owned(),
            }
        };
        out.push_str(&shown);
        rest = &after[close + 1..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {

    #[test]
    fn markdown_links_that_hide_their_target_are_found() {
        for text in [
            "see [the docs](https://evil.example) now",
            "![a chart](https://evil.example/x.png)",
            "[the docs][1] and more",
            "[the docs][]",
            "read [this]\n\n[this]: https://evil.example",
            "  [ref]: <https://evil.example>",
            "[a](b",
        ] {
            assert!(markdown_link(text), "{text:?}");
        }
        for text in [
            "plain words, https://example.com shown as it is",
            "an array a[1] and a list [x] of things",
            "&lt;https://example.com|label&gt;",
            "[x] done: yes",
            "",
        ] {
            assert!(!markdown_link(text), "{text:?}");
        }
    }
    use super::*;

    #[test]
    fn escaping_follows_slacks_three_entities() {
        assert_eq!(
            escape("a & b <@U1> <!here> x > y"),
            "a &amp; b &lt;@U1&gt; &lt;!here&gt; x &gt; y"
        );
        assert_eq!(escape("plain words, no markup"), "plain words, no markup");
        assert_eq!(unescape("&amp;lt; &foo; &gt;&lt;"), "&lt; &foo; ><");
    }

    #[test]
    fn cutting_never_splits_an_entity() {
        let s = escape_within(&"<".repeat(100), 30);
        assert!(s.chars().count() <= 30, "{s}");
        assert!(s.starts_with("&lt;&lt;"), "{s}");
        assert!(s.ends_with(" … [truncated]"), "{s}");
        assert_eq!(s.matches("&lt;").count(), 4, "{s}");
        assert_eq!(escape_within("a&b", 7), "a&amp;b");
    }

    #[test]
    fn nested_odd_and_cased_forms_are_found() {
        for s in [
            "<!here>",
            "<!HERE>",
            "<!Channel|channel>",
            "<!everyone>",
            "<!group>",
            "<!subteam^S123|@ops>",
            "<!x <!here>",
            "<!date^1 <!everyone>",
            "<!<!channel>>",
            "< !here >",
            "plain @here typed",
            "@Channel: look",
        ] {
            assert!(find(s).contains(&Markup::Broadcast), "{s}: {:?}", find(s));
        }
        assert_eq!(find("hi <@U123ABC> and <@W1|bo>"), vec![Markup::Mention]);
        assert_eq!(find("see <#C0123|ops>"), vec![Markup::Mention]);
        assert_eq!(
            find("<https://evil.example|click>"),
            vec![Markup::LabelledLink]
        );
        assert_eq!(
            find("<!date^1392734382^{date}|Feb 18>"),
            vec![Markup::Command]
        );
        assert_eq!(find("docs: <https://example.com>"), vec![Markup::BareLink]);
        assert_eq!(
            find("<!x <!here>"),
            vec![Markup::Broadcast, Markup::Command]
        );
    }

    #[test]
    fn ordinary_text_has_no_markup() {
        for s in [
            "if a < b and c > d then",
            "Vec<T> and Option<u8>",
            "R&D costs &lt;!here&gt; as text",
            "mail ops@channel.io or bo@hereford.example",
            "x << 2 >> 1",
            "",
        ] {
            assert!(find(s).is_empty(), "{s}: {:?}", find(s));
        }
    }

    #[test]
    fn readable_text_shows_what_a_reader_sees() {
        assert_eq!(
            readable("<@U1> why? see <#C2|ops>, <https://a.example|docs> and <https://b.example>"),
            "@U1 why? see #ops, docs (https://a.example) and https://b.example"
        );
        assert_eq!(
            readable("<!here> <!subteam^S1|@oncall> &amp; x"),
            "@here @oncall & x"
        );
        assert_eq!(readable("a < b <@U1>"), "a < b @U1");
        // Nested forms leave no sequence behind, only words.
        for s in ["<!x <!here>", "<!<!channel>>", "<https://a|<@U1>>", "a<b>c"] {
            let r = readable(s);
            assert!(
                find(&r).iter().all(|m| *m == Markup::Broadcast),
                "{s} → {r}"
            );
        }
    }
}
