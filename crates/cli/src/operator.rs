//! Who an operator command records as its actor: an operator id, never a
//! name with spaces or an email address (the audit log holds no personal
//! data beyond a pseudonymous handle).

/// Parses `--by` (default `$USER`): 1–64 of letters, digits and `._:-`.
pub fn operator_id(raw: &str) -> Result<String, String> {
    let ok = !raw.is_empty()
        && raw.len() <= 64
        && raw
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._:-".contains(c));
    if ok && raw.starts_with("slack:") {
        // (what a click in Slack records: an operator cannot pose as one)
        Err(format!(
            "{raw:?} is not an operator id: `slack:` names a reviewer who clicked in Slack"
        ))
    } else if ok {
        Ok(raw.to_owned())
    } else {
        Err(format!(
            "{raw:?} is not an operator id: use 1-64 letters, digits or . _ : - (a handle, not an email or a full name)"
        ))
    }
}

/// `$USER` as an operator id, with anything else replaced by `_`.
pub fn current_user() -> String {
    let user = std::env::var("USER").unwrap_or_else(|_| "operator".into());
    let cleaned: String = user
        .chars()
        .take(64)
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._:-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    if cleaned.is_empty() {
        "operator".into()
    } else {
        cleaned
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_pass_and_personal_data_does_not() {
        assert_eq!(operator_id("oncall-7").as_deref(), Ok("oncall-7"));
        assert_eq!(operator_id("sre:alice.b").as_deref(), Ok("sre:alice.b"));
        for bad in ["", "alice@example.com", "Alice Smith", &"x".repeat(65)] {
            assert!(operator_id(bad).is_err(), "{bad:?} accepted");
        }
    }
}
