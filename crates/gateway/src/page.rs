//! The HTML pages the gateway renders (the install flow's) and the headers
//! every answer carries: text is escaped, pages may load nothing but their
//! own style sheet, and nothing may frame them or be sniffed into HTML.

use std::sync::LazyLock;

use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use sha2::{Digest, Sha256};

/// The pages' only style, allowed by its hash (no inline styles).
const STYLE: &str = "body{font-family:sans-serif;max-width:40em;margin:4em auto}";

/// For pages: their style element and nothing else.
static PAGE_CSP: LazyLock<String> = LazyLock::new(|| {
    format!(
        "default-src 'none'; style-src 'sha256-{}'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
        base64(&Sha256::digest(STYLE.as_bytes()))
    )
});

/// For every other answer (JSON, text, redirects): nothing at all.
const NOTHING_CSP: &str = "default-src 'none'; frame-ancestors 'none'";

/// `text` safe inside HTML text and quoted attribute values.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#x27;"),
            c => out.push(c),
        }
    }
    out
}

/// A page with a heading and one paragraph, both plain text (escaped here).
/// The install flow's pages are per person and may follow a URL holding an
/// OAuth code: not cached, no referrer.
pub fn page(status: StatusCode, title: &str, text: &str) -> Response {
    let (title, text) = (escape(title), escape(text));
    let html = format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>{title}</title><style>{STYLE}</style></head>\
         <body><h1>{title}</h1><p>{text}</p></body></html>"
    );
    let mut resp = (status, Html(html)).into_response();
    let h = resp.headers_mut();
    if let Ok(csp) = HeaderValue::from_str(&PAGE_CSP) {
        h.insert(header::CONTENT_SECURITY_POLICY, csp);
    }
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    resp
}

/// What every answer carries: `nosniff`, no framing, and a policy that
/// allows nothing unless the answer set its own.
pub fn secure_headers(headers: &mut HeaderMap) {
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    if !headers.contains_key(header::CONTENT_SECURITY_POLICY) {
        headers.insert(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(NOTHING_CSP),
        );
    }
}

/// Standard base64 with padding (for CSP hash sources).
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markup_in_text_is_escaped() {
        assert_eq!(
            escape("<script>alert(1)</script>&\"'"),
            "&lt;script&gt;alert(1)&lt;/script&gt;&amp;&quot;&#x27;"
        );
        assert_eq!(escape("Acme Ops"), "Acme Ops");
    }

    #[test]
    fn base64_matches_rfc_4648_vectors() {
        for (plain, encoded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(plain.as_bytes()), encoded);
        }
    }

    #[tokio::test]
    async fn a_page_allows_its_own_style_only() {
        let resp = page(StatusCode::OK, "<b>", "x & y");
        let csp = resp.headers()[header::CONTENT_SECURITY_POLICY]
            .to_str()
            .expect("csp")
            .to_owned();
        assert!(
            csp.starts_with("default-src 'none'; style-src 'sha256-"),
            "{csp}"
        );
        assert!(!csp.contains("unsafe"), "{csp}");
        let body = axum::body::to_bytes(resp.into_body(), 1 << 16)
            .await
            .expect("body");
        let body = String::from_utf8(body.to_vec()).expect("utf-8");
        assert!(body.contains("<title>&lt;b&gt;</title>") && body.contains("x &amp; y"));
        // The hash in the policy is the hash of the style the page holds.
        let style = body
            .split("<style>")
            .nth(1)
            .and_then(|s| s.split("</style>").next())
            .expect("a style element");
        assert!(csp.contains(&format!(
            "'sha256-{}'",
            base64(&Sha256::digest(style.as_bytes()))
        )));
    }
}
