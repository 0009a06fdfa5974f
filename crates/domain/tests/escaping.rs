//! Properties of the escaping of model text, over arbitrary strings and
//! over strings built from Slack's markup and its entities.

use proptest::prelude::*;
use threadline_domain::output::markup::{self, Markup};
use threadline_domain::output::{Body, Risk, prepare};

const LABEL: &str = "AI-generated — verify before relying on it";

/// Pieces that exercise the escaping: control sequences in odd forms,
/// entities written out, stray brackets and ampersands.
fn piece() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "[<>&!@#|^;a-zA-Z:/. ]{0,24}",
        prop::sample::select(vec![
            "<!here>",
            "<!HERE>",
            "<!channel|channel>",
            "<!everyone>",
            "<!group>",
            "<!subteam^S1|@ops>",
            "<!date^1392734382^{date}|Feb 18>",
            "<!x <!here>",
            "<!<!channel>>",
            "<@U0123>",
            "<#C0123|ops>",
            "<https://evil.example|click>",
            "<https://example.com>",
            "&amp;",
            "&lt;",
            "&gt;",
            "&amp;lt;",
            "&",
            "<",
            ">",
            "&#60;",
        ])
        .prop_map(str::to_owned),
    ]
}

fn text() -> impl Strategy<Value = String> {
    prop::collection::vec(piece(), 0..8).prop_map(|v| v.concat())
}

/// Every `&` in `s` starts one of the three entities.
fn only_entities(s: &str) -> bool {
    s.match_indices('&').all(|(i, _)| {
        let t = &s[i..];
        t.starts_with("&amp;") || t.starts_with("&lt;") || t.starts_with("&gt;")
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn escaped_text_holds_no_bracket_and_no_bare_ampersand(s in text()) {
        let e = markup::escape(&s);
        prop_assert!(!e.contains('<') && !e.contains('>'), "{e}");
        prop_assert!(only_entities(&e), "{e}");
        prop_assert!(markup::find(&e).iter().all(|m| *m == Markup::Broadcast), "{e}");
    }

    #[test]
    fn unescaping_gives_back_the_input(s in text()) {
        prop_assert_eq!(markup::unescape(&markup::escape(&s)), s);
    }

    #[test]
    fn escaping_is_idempotent_where_it_should_be(s in text()) {
        let e = markup::escape(&s);
        // What Slack shows, escaped again, is the same text: stable.
        prop_assert_eq!(markup::escape(&markup::unescape(&e)), e.clone());
        // Text with none of the three characters is left as it is.
        if !s.contains(['&', '<', '>']) {
            prop_assert_eq!(e, s);
        }
    }

    #[test]
    fn a_cut_never_splits_an_entity(s in text(), max in 20usize..200) {
        let e = markup::escape_within(&s, max);
        prop_assert!(e.chars().count() <= max, "{e}");
        prop_assert!(!e.contains('<') && !e.contains('>'), "{e}");
        prop_assert!(only_entities(&e), "{e}");
        let shown = markup::unescape(e.trim_end_matches(" … [truncated]"));
        prop_assert!(s.starts_with(&shown), "{s:?} → {e:?}");
    }

    #[test]
    fn a_prepared_model_answer_carries_no_markup_of_its_own(s in text()) {
        let r = prepare(Body::Model(&s), LABEL, 2900, false);
        let body = r.blocks[0]["text"]["text"].as_str().unwrap_or_default().to_owned();
        for field in [&r.text, &body] {
            prop_assert!(!field.contains('<') && !field.contains('>'), "{field}");
            prop_assert!(only_entities(field), "{field}");
        }
        // Anything Slack would have acted on (other than a bare link) was
        // reported for review.
        let acted_on = markup::find(&s).iter().any(|m| *m != Markup::BareLink);
        let reported = r.risks.iter().any(|r| *r != Risk::SecretLike);
        prop_assert_eq!(acted_on, reported);
    }
}
