//! Credentials kept out of messages and logs.

/// A URL with any `user:password@` removed, for messages and logs.
pub fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => format!("{}://[redacted]@{}", &url[..s], &url[at + 1..]),
        _ => url.to_owned(),
    }
}
