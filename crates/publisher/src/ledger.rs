//! Ledger gauges sampled from Postgres (the source of truth shared by every
//! replica): reply intents by state, the oldest unsettled outcome, the
//! oldest open stream and unprocessed event, and the review queue and its
//! outcomes.

use std::time::Duration;

use sqlx::PgPool;
use threadline_domain::state::{DecisionStatus, IntentState, Machine as _};
use threadline_runtime::shutdown::CancellationToken;

const EVERY: Duration = Duration::from_secs(15);

/// Samples once, then every 15 s until `shutdown`.
pub fn spawn(pool: PgPool, shutdown: CancellationToken) {
    tokio::spawn(async move {
        loop {
            if let Err(e) = sample(&pool).await {
                tracing::debug!(error = %e, "ledger sample failed");
            }
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep(EVERY) => {}
            }
        }
    });
}

pub async fn sample(pool: &PgPool) -> sqlx::Result<()> {
    let (by_state, oldest) = threadline_store::intents::ledger(pool).await?;
    // Every state, so a gauge drops back to zero.
    for state in IntentState::ALL.iter().map(|s| s.as_str()) {
        let n = by_state
            .iter()
            .find(|(s, _)| s == state)
            .map_or(0, |(_, n)| *n);
        metrics::gauge!("threadline_reply_intents", "state" => state).set(n as f64);
    }
    // Unsettled: unknown, being reconciled, held, and `sending` for longer
    // than a post can take (its worker is gone or frozen).
    metrics::gauge!("threadline_unknown_outcome_oldest_seconds").set(oldest);
    // A stream open past Slack's lifetime was left open; answers wait for
    // an event of their thread that is not processed.
    let waits = threadline_store::intents::waits(pool).await?;
    metrics::gauge!("threadline_stream_open_oldest_seconds").set(waits.stream_open);
    metrics::gauge!("threadline_event_unprocessed_oldest_seconds").set(waits.event_unprocessed);
    let threadline_store::decisions::ReviewCounts {
        waiting,
        approved,
        rejected,
    } = threadline_store::decisions::review_counts(pool).await?;
    metrics::gauge!("threadline_decisions_awaiting_review").set(waiting as f64);
    metrics::counter!("threadline_review_outcomes_total", "outcome" => DecisionStatus::Approved.name())
        .absolute(approved as u64);
    metrics::counter!("threadline_review_outcomes_total", "outcome" => DecisionStatus::Rejected.name())
        .absolute(rejected as u64);
    Ok(())
}
