//! Which failures of the crates above the infrastructure are transient, for
//! the worker's retry rules (`threadline_runtime::transient`, DESIGN
//! invariant 11): Slack's Web API (as `threadline_slack::WebError` tells
//! itself), a token refresh that did not go through, a sealed secret that
//! does not open. Services classify a handler's error with [`disposition`]
//! (or [`is_transient`]), which add these to the infrastructure's rules.

use threadline_runtime::transient::Fault;
use threadline_runtime::worker::Disposition;
use threadline_slack::WebError;

use crate::secrets::SecretError;
use crate::tokens::RefreshUnavailable;

/// The [`threadline_runtime::transient::Classify`] of this crate's errors
/// and Slack's.
pub fn classify(cause: &(dyn std::error::Error + 'static)) -> Option<Fault> {
    if let Some(w) = cause.downcast_ref::<WebError>() {
        return Some(Fault {
            transient: w.is_transient(),
            code: w.code(),
        });
    }
    if cause.downcast_ref::<RefreshUnavailable>().is_some() {
        // Slack did not grant the refresh, nor refuse it: the work that
        // needs the token waits and retries.
        return Some(Fault {
            transient: true,
            code: "token_refresh_unavailable".into(),
        });
    }
    match cause.downcast_ref::<SecretError>() {
        // A key id this process does not hold: during a rollout another
        // pod may already seal with a key this one gets only when it is
        // replaced (docs/operations.md, key rotation). Retried, bounded
        // ([`disposition`]).
        Some(SecretError::UnknownKey(_)) => Some(Fault {
            transient: true,
            code: UNKNOWN_KEY.into(),
        }),
        Some(_) => Some(Fault {
            transient: false,
            code: "sealed_secret".into(),
        }),
        None => None,
    }
}

/// The code of a sealed secret whose key id this process does not hold.
const UNKNOWN_KEY: &str = "sealed_secret_unknown_key";

/// How a handler's error is retried: `Transient` (an outage), `Retry` (a
/// sealed secret under a key id this process does not hold yet: retried
/// with backoff for about ten minutes, then dead-lettered), or `Fail` with
/// its code.
pub fn disposition(e: &anyhow::Error) -> Disposition {
    let unknown_key = e.chain().any(|c| {
        matches!(
            c.downcast_ref::<SecretError>(),
            Some(SecretError::UnknownKey(_))
        )
    });
    if unknown_key {
        return Disposition::Retry(UNKNOWN_KEY.into());
    }
    Disposition::of_error(e, classify)
}

/// Whether anything in `e`'s chain of causes is a transient failure.
pub fn is_transient(e: &anyhow::Error) -> bool {
    threadline_runtime::transient::is_transient(e, classify)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slack_outages_are_transient_and_its_refusals_are_not() {
        assert!(is_transient(&anyhow::Error::new(WebError::Http(503))));
        assert!(!is_transient(&anyhow::Error::new(WebError::Http(400))));
        assert!(!is_transient(&anyhow::Error::new(WebError::Api {
            code: "channel_not_found".into()
        })));
        assert!(is_transient(&anyhow::Error::new(WebError::Transport(
            "timeout".into()
        ))));
        assert!(is_transient(&anyhow::Error::new(WebError::Http(429))));
        assert!(is_transient(&anyhow::Error::new(RefreshUnavailable(
            "unknown_error".into()
        ))));
        // The infrastructure's rules still apply beside these.
        assert!(is_transient(&anyhow::Error::new(sqlx::Error::PoolTimedOut)));
        assert!(!is_transient(&anyhow::anyhow!("a logic error")));
    }

    #[test]
    fn codes_name_the_kind_never_the_data() {
        let slack = anyhow::Error::new(WebError::Api {
            code: "channel_not_found".into(),
        })
        .context("conversations.info");
        assert!(
            matches!(disposition(&slack), Disposition::Fail(c) if c == "slack_channel_not_found")
        );
        let sealed = anyhow::Error::new(SecretError::Decrypt).context("opening the token");
        assert!(matches!(disposition(&sealed), Disposition::Fail(c) if c == "sealed_secret"));
        // A key id not held yet (key skew between the pods of a rollout):
        // retried, bounded, and the code names no key id.
        let skew =
            anyhow::Error::new(SecretError::UnknownKey("k2".into())).context("opening the token");
        assert!(
            matches!(disposition(&skew), Disposition::Retry(c) if c == "sealed_secret_unknown_key")
        );
        assert!(is_transient(&skew));
        assert!(matches!(
            disposition(&anyhow::Error::new(WebError::Http(502))),
            Disposition::Transient
        ));
    }
}
