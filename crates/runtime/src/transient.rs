//! Which failures are transient: a dependency that is down, overloaded or
//! restarting (Postgres, NATS, Slack's 5xx and transport errors). Work that
//! failed for such a reason is retried with backoff for as long as the
//! outage lasts and never dead-lettered (DESIGN invariant 11); anything else
//! is a defect or a poison message and is retried a bounded number of times.

use threadline_slack::WebError;

/// Whether anything in `e`'s chain of causes is a transient failure.
pub fn is_transient(e: &anyhow::Error) -> bool {
    e.chain().any(cause_is_transient)
}

fn cause_is_transient(cause: &(dyn std::error::Error + 'static)) -> bool {
    if let Some(e) = cause.downcast_ref::<sqlx::Error>() {
        return sql_is_transient(e);
    }
    if let Some(e) = cause.downcast_ref::<WebError>() {
        return web_is_transient(e);
    }
    if cause
        .downcast_ref::<crate::tokens::RefreshUnavailable>()
        .is_some()
    {
        return true;
    }
    if let Some(e) = cause.downcast_ref::<crate::batch_error::BatchError>() {
        // A failed batch's own cause is its source, looked at next.
        return matches!(e, crate::batch_error::BatchError::Closed);
    }
    if cause
        .downcast_ref::<async_nats::jetstream::context::PublishError>()
        .is_some()
        || cause
            .downcast_ref::<async_nats::jetstream::context::RequestError>()
            .is_some()
        || cause
            .downcast_ref::<async_nats::jetstream::context::GetStreamError>()
            .is_some()
    {
        // The broker is down, restarting, or did not answer in time.
        return true;
    }
    cause.downcast_ref::<std::io::Error>().is_some()
        || cause
            .downcast_ref::<tokio::time::error::Elapsed>()
            .is_some()
}

/// Connection, pool, resource and concurrency failures are transient;
/// constraint, syntax and data errors are not.
pub fn sql_is_transient(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Protocol(_) => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|c| sqlstate_is_transient(&c)),
        _ => false,
    }
}

/// SQLSTATEs that mean "try again later": connection exceptions (08),
/// insufficient resources (53), operator intervention such as a shutdown
/// or a terminated backend (57), system errors (58), serialization
/// failures and deadlocks, a database not accepting connections (55000),
/// a lock not available (55P03) and a read-only standby after a failover.
pub fn sqlstate_is_transient(code: &str) -> bool {
    matches!(&code.get(..2).unwrap_or(""), &("08" | "53" | "57" | "58"))
        || matches!(code, "40001" | "40P01" | "55000" | "55P03" | "25006")
}

/// Slack could not be reached or failed on its side.
pub fn web_is_transient(e: &WebError) -> bool {
    match e {
        WebError::Transport(_) | WebError::Decode | WebError::RateLimited { .. } => true,
        WebError::Http(status) => *status >= 500 || *status == 408 || *status == 429,
        WebError::Api { code } => matches!(
            code.as_str(),
            "internal_error"
                | "fatal_error"
                | "service_unavailable"
                | "request_timeout"
                | "ratelimited"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outages_are_transient_and_defects_are_not() {
        let io = anyhow::Error::new(sqlx::Error::Io(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "refused",
        )))
        .context("opening the event");
        assert!(is_transient(&io));
        assert!(is_transient(&anyhow::Error::new(sqlx::Error::PoolTimedOut)));
        assert!(!is_transient(&anyhow::Error::new(sqlx::Error::RowNotFound)));
        assert!(!is_transient(&anyhow::anyhow!("a logic error")));
        assert!(is_transient(&anyhow::Error::new(WebError::Http(503))));
        assert!(!is_transient(&anyhow::Error::new(WebError::Http(400))));
        assert!(!is_transient(&anyhow::Error::new(WebError::Api {
            code: "channel_not_found".into()
        })));
        assert!(is_transient(&anyhow::Error::new(WebError::Transport(
            "timeout".into()
        ))));
        assert!(is_transient(&anyhow::Error::new(WebError::Http(429))));
        assert!(is_transient(&anyhow::Error::new(
            crate::tokens::RefreshUnavailable("unknown_error".into())
        )));
    }

    #[test]
    fn sqlstates() {
        for code in [
            "08006", "08001", "57P01", "57P03", "53300", "40001", "40P01", "55000",
        ] {
            assert!(sqlstate_is_transient(code), "{code}");
        }
        for code in ["23505", "42601", "22P02", "42P01"] {
            assert!(!sqlstate_is_transient(code), "{code}");
        }
    }
}
