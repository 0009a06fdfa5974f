//! Sources: the links an answer took from what it read. A link counts as a
//! source only when it appears both in the answer and in a message the
//! answer was built on (its thread's context, or the channel the person
//! looks at from the assistant pane or an agent's Messages tab): a link
//! only in the answer is never one, so no source is invented. Links are
//! read as Slack shows the text (`<url|label>` is `url`, `&amp;` is `&`),
//! kept once each, in the order the answer first names them, at most
//! [`MAX`]. A streamed answer's writing step carries them as Slack's URL
//! source elements ([`crate::thinking`]).

use serde_json::{Value, json};

use crate::output::markup;

/// Most sources one step carries. Slack documents no limit for a task's
/// `sources`; this is threadline's own bound.
pub const MAX: usize = 10;

/// Most characters of a source's shown text (its URL without the scheme).
const TEXT_CHARS: usize = 80;

/// A link an answer took from a message it read: an `http` or `https` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source(String);

impl Source {
    /// `url` as a source, if it is an `http(s)` URL with something after
    /// the scheme.
    pub fn parse(url: &str) -> Option<Source> {
        let after = scheme_len(url).map(|n| &url[n..])?;
        (!after.is_empty() && url.chars().all(url_char)).then(|| Source(url.to_owned()))
    }

    pub fn url(&self) -> &str {
        &self.0
    }

    /// The text Slack shows for it: the URL without its scheme (and a
    /// trailing `/`), cut to [`TEXT_CHARS`] characters.
    pub fn text(&self) -> String {
        let bare = &self.0[scheme_len(&self.0).unwrap_or(0)..];
        let bare = bare.strip_suffix('/').unwrap_or(bare);
        if bare.chars().count() <= TEXT_CHARS {
            return bare.to_owned();
        }
        let mut t: String = bare.chars().take(TEXT_CHARS - 1).collect();
        t.push('…');
        t
    }

    /// As Slack's URL source element (`{"type": "url", "url", "text"}`,
    /// all three required).
    pub fn element(&self) -> Value {
        json!({"type": "url", "url": self.0, "text": self.text()})
    }
}

/// The sources of `answer`: its links that also appear in one of the
/// messages it `read`, once each, in the order the answer first names
/// them, at most [`MAX`].
pub fn of<'a>(answer: &str, read: impl IntoIterator<Item = &'a str>) -> Vec<Source> {
    let known: std::collections::BTreeSet<String> = read.into_iter().flat_map(links).collect();
    links(answer)
        .into_iter()
        .filter(|l| known.contains(l))
        .filter_map(|l| Source::parse(&l))
        .take(MAX)
        .collect()
}

/// The `http(s)` links in `text` as a reader sees them (Slack's markup
/// read, its entities decoded), once each, in order. A link ends at a
/// space, a character no URL holds (a quotation mark, `<`, `>`, anything
/// outside ASCII), and loses trailing punctuation and a closing bracket
/// it does not open.
pub fn links(text: &str) -> Vec<String> {
    let shown = markup::readable(text);
    // (ASCII lowercasing keeps every byte offset)
    let lower = shown.to_ascii_lowercase();
    let mut found: Vec<String> = Vec::new();
    let mut from = 0;
    while let Some(at) = next_scheme(&lower[from..]).map(|a| from + a) {
        let tail = &shown[at..];
        let end = tail.find(|c: char| !url_char(c)).unwrap_or(tail.len());
        let url = trim_end(&tail[..end]);
        if Source::parse(url).is_some() && !found.iter().any(|f| f == url) {
            found.push(url.to_owned());
        }
        from = at + end.max(1);
    }
    found
}

/// Where the next `http://` or `https://` starts in lowercased text.
fn next_scheme(lower: &str) -> Option<usize> {
    ["https://", "http://"]
        .iter()
        .filter_map(|s| lower.find(s))
        .min()
}

fn scheme_len(url: &str) -> Option<usize> {
    let lower = url.get(..8).unwrap_or(url).to_ascii_lowercase();
    if lower.starts_with("https://") {
        Some(8)
    } else if lower.starts_with("http://") {
        Some(7)
    } else {
        None
    }
}

/// A character a link may hold as written in text.
fn url_char(c: char) -> bool {
    c.is_ascii_graphic() && !matches!(c, '<' | '>' | '"' | '|' | '`' | '{' | '}' | '\\' | '^')
}

/// A link without what text around it added: trailing punctuation and
/// emphasis marks, and a closing bracket the link does not open.
fn trim_end(url: &str) -> &str {
    let mut u = url;
    loop {
        let Some(last) = u.chars().last() else {
            return u;
        };
        let unopened = |open: char, close: char| {
            last == close && u.matches(open).count() < u.matches(close).count()
        };
        if matches!(
            last,
            '.' | ',' | ';' | ':' | '!' | '?' | '\'' | '*' | '_' | '~'
        ) || unopened('(', ')')
            || unopened('[', ']')
        {
            u = &u[..u.len() - 1];
        } else {
            return u;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_are_read_as_slack_shows_them() {
        assert_eq!(
            links(
                "see <https://ci.example.com/runs/42|run 42> and <http://a.example/x?a=1&amp;b=2>."
            ),
            [
                "https://ci.example.com/runs/42",
                "http://a.example/x?a=1&b=2"
            ]
        );
        assert_eq!(
            links("You asked: \u{201c}why does https://ci.example.com/runs/42 fail?\u{201d}"),
            ["https://ci.example.com/runs/42"]
        );
        assert_eq!(
            links("(see https://a.example/x), or https://en.wikipedia.org/wiki/Rust_(language)!"),
            [
                "https://a.example/x",
                "https://en.wikipedia.org/wiki/Rust_(language)"
            ]
        );
        assert_eq!(
            links("HTTPS://A.example/x twice: https://a.example/y https://a.example/y"),
            ["HTTPS://A.example/x", "https://a.example/y"]
        );
        assert!(links("no link, nor https:// alone, nor ftp://x.example").is_empty());
    }

    #[test]
    fn a_source_is_a_link_of_the_answer_that_a_message_read_holds() {
        let read = [
            "the run <https://ci.example.com/runs/42> failed",
            "docs at https://docs.example.com/deploys",
        ];
        let answer = "Compare https://only-in-the-answer.example/x with \
                      https://ci.example.com/runs/42, then https://docs.example.com/deploys and \
                      https://ci.example.com/runs/42 again.";
        let s: Vec<String> = of(answer, read)
            .iter()
            .map(|s| s.url().to_owned())
            .collect();
        assert_eq!(
            s,
            [
                "https://ci.example.com/runs/42",
                "https://docs.example.com/deploys"
            ],
            "in the answer's order, once, never one only the answer names"
        );
        assert!(of("nothing linked", read).is_empty());
        assert!(of(answer, []).is_empty(), "nothing read, no source");
    }

    #[test]
    fn sources_are_bounded() {
        let many: Vec<String> = (0..15).map(|i| format!("https://e.example/{i}")).collect();
        let text = many.join(" ");
        assert_eq!(of(&text, [text.as_str()]).len(), MAX);
    }

    #[test]
    fn a_source_shows_as_slacks_url_source_element() {
        let s = Source::parse("https://ci.example.com/runs/").unwrap();
        assert_eq!(
            s.element(),
            json!({"type": "url", "url": "https://ci.example.com/runs/", "text": "ci.example.com/runs"})
        );
        let long = format!("https://e.example/{}", "a".repeat(200));
        let t = Source::parse(&long).unwrap().text();
        assert_eq!(t.chars().count(), TEXT_CHARS);
        assert!(t.ends_with('…'));
        assert!(Source::parse("mailto:x@e.example").is_none());
        assert!(Source::parse("https://").is_none());
        assert!(Source::parse("https://e.example/a b").is_none());
    }
}
