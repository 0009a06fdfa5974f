//! Kill switch features: what a `feature` switch can name and which
//! feature governs an action. The switches themselves are
//! `threadline_store::kill_switches`.

/// The feature name of plain thread replies.
pub const FEATURE_REPLIES: &str = "replies";
/// The feature name of actions beyond a reply (a model's tool calls, posted
/// only after human review).
pub const FEATURE_TOOLS: &str = "tools";
/// Every feature a `feature` switch can name; each is consulted where its
/// work is done (inference before the model call and after it, the
/// publisher inside the claim and right before the post).
pub const FEATURES: [&str; 2] = [FEATURE_REPLIES, FEATURE_TOOLS];

/// The feature that governs an action kind (`thread_reply`, `tool:…`).
pub fn feature_of(action_kind: &str) -> &'static str {
    if action_kind.starts_with("tool:") {
        FEATURE_TOOLS
    } else {
        FEATURE_REPLIES
    }
}

/// A feature name an operator typed, checked against [`FEATURES`].
pub fn parse_feature(name: &str) -> Result<&'static str, String> {
    let name = name.trim();
    FEATURES.into_iter().find(|f| *f == name).ok_or_else(|| {
        format!(
            "unknown feature {name:?}: a feature switch governs one of {}",
            FEATURES.join(", ")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn features_are_known_names_and_action_kinds_map_to_them() {
        assert_eq!(parse_feature(" replies "), Ok(FEATURE_REPLIES));
        assert_eq!(parse_feature("tools"), Ok(FEATURE_TOOLS));
        let err = parse_feature("reply").expect_err("a typo is refused");
        assert!(err.contains("replies, tools"), "{err}");
        assert_eq!(feature_of("thread_reply"), FEATURE_REPLIES);
        assert_eq!(feature_of("tool:create_ticket"), FEATURE_TOOLS);
    }
}
