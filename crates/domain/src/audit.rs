//! What may reach the audit log as a code (DESIGN invariant 9): a short
//! token, never free text that could quote a message.

/// Keeps an error or reason code to a short token of `[a-z0-9_.:-]`, so no
/// free text (which could quote a message) reaches the log.
pub fn sanitise_code(code: &str) -> String {
    let cleaned: String = code
        .chars()
        .map(|c| c.to_ascii_lowercase())
        .map(|c| {
            if c.is_ascii_alphanumeric() || "_.:-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect();
    if cleaned.is_empty() {
        "unknown".into()
    } else {
        cleaned
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_short_tokens() {
        assert_eq!(sanitise_code("channel_not_found"), "channel_not_found");
        assert_eq!(
            sanitise_code("Bad thing: <@U1> said \"hi\""),
            "bad_thing:___u1__said__hi_"
        );
        assert_eq!(sanitise_code(&"x".repeat(100)).len(), 64);
        assert_eq!(sanitise_code(""), "unknown");
    }
}
