//! Which failures are transient: a dependency that is down, overloaded or
//! restarting (Postgres, NATS, Slack's 5xx and transport errors). Work that
//! failed for such a reason is retried with backoff for as long as the
//! outage lasts and never dead-lettered (DESIGN invariant 11); anything else
//! is a defect or a poison message and is retried a bounded number of times.
//!
//! This crate knows the infrastructure's errors (sqlx, NATS, I/O, timeouts,
//! the statement batcher). Errors of the crates above it (Slack's Web API, a
//! token refresh, a sealed secret) are told by a [`Classify`] function their
//! owner gives: `threadline_tenancy::fault::classify`, which services pass
//! (or call through its `disposition` and `is_transient`).

/// What an error this crate does not know says about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    /// A dependency unavailable: retried for as long as it lasts.
    pub transient: bool,
    /// A short code naming the kind of failure, never its data.
    pub code: String,
}

/// Classifies one cause of an error chain, or `None` when it does not know
/// it.
pub type Classify = fn(&(dyn std::error::Error + 'static)) -> Option<Fault>;

/// A [`Classify`] that knows nothing beyond the infrastructure.
pub fn infrastructure_only(_: &(dyn std::error::Error + 'static)) -> Option<Fault> {
    None
}

/// Whether anything in `e`'s chain of causes is a transient failure, by
/// this crate's rules and `more`'s.
pub fn is_transient(e: &anyhow::Error, more: Classify) -> bool {
    e.chain()
        .any(|cause| more(cause).map_or_else(|| cause_is_transient(cause), |f| f.transient))
}

fn cause_is_transient(cause: &(dyn std::error::Error + 'static)) -> bool {
    if let Some(e) = cause.downcast_ref::<sqlx::Error>() {
        return sql_is_transient(e);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("an outside failure")]
    struct Outside(bool);

    fn outside(cause: &(dyn std::error::Error + 'static)) -> Option<Fault> {
        cause.downcast_ref::<Outside>().map(|o| Fault {
            transient: o.0,
            code: "outside".into(),
        })
    }

    #[test]
    fn outages_are_transient_and_defects_are_not() {
        let io = anyhow::Error::new(sqlx::Error::Io(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "refused",
        )))
        .context("opening the event");
        assert!(is_transient(&io, infrastructure_only));
        assert!(is_transient(
            &anyhow::Error::new(sqlx::Error::PoolTimedOut),
            infrastructure_only
        ));
        assert!(!is_transient(
            &anyhow::Error::new(sqlx::Error::RowNotFound),
            infrastructure_only
        ));
        assert!(!is_transient(
            &anyhow::anyhow!("a logic error"),
            infrastructure_only
        ));
    }

    #[test]
    fn errors_from_above_are_told_by_their_classifier() {
        let down = anyhow::Error::new(Outside(true)).context("calling out");
        assert!(!is_transient(&down, infrastructure_only));
        assert!(is_transient(&down, outside));
        assert!(!is_transient(&anyhow::Error::new(Outside(false)), outside));
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
