//! The sweeper settles reply intents that no delivery is driving any more
//! (their proposal was dead-lettered or lost with a worker): a `sending`
//! intent past the stale time becomes unknown, and an intent waiting to be
//! reconciled or re-tried long past its due time gets its proposal handed
//! to a publisher again. It also reads the thread again, on a widening
//! schedule, for intents held because no evidence of their post was found,
//! so that a post which lands after its intent was given up on is recorded
//! (and a later re-post refused), never forgotten. A stream whose
//! publisher stopped driving it is ended with its closing line. An answer
//! waiting for review whose thread moved on is discarded as the publisher
//! would discard it at approval, and its review request says so. Every replica sweeps;
//! rows are taken with `SKIP LOCKED`, so none is swept twice at once.

use std::sync::Arc;

use secrecy::ExposeSecret as _;
use threadline_runtime::shutdown::CancellationToken;
use uuid::Uuid;

use crate::handler::Handler;
use crate::intents::{self, PostRecord};
use crate::proposals;
use crate::reconcile;

pub use crate::config::Sweep;

/// Seconds until a held intent's thread is read again after its `n`th late
/// check, `first` being the wait before the first one: 30 s, 2 min,
/// 10 min, 1 h, 6 h, 1 day, 2 days, 4 days by default; none after that.
pub(crate) fn next_check(n: i32, first: f64) -> Option<f64> {
    const TIMES: [f64; 8] = [1.0, 4.0, 20.0, 120.0, 720.0, 2880.0, 5760.0, 11520.0];
    TIMES.get(n.max(0) as usize).map(|t| t * first)
}

pub fn spawn(handler: Arc<Handler>, sweep: Sweep, shutdown: CancellationToken) {
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep(sweep.every) => {}
            }
            if let Err(e) = round(&handler, sweep).await {
                tracing::warn!(
                    error = format!("{e:#}"),
                    "sweep round failed; next round soon"
                );
            }
        }
    });
}

/// One round: undriven intents, then held intents due for a late check.
pub async fn round(h: &Handler, sweep: Sweep) -> anyhow::Result<()> {
    let idle = sweep.idle.as_secs_f64();
    // Take undriven intents (a `sending` one past the stale time becomes
    // unknown on the way), then hand their proposals back.
    // Streams whose publisher died are ended with their closing line (the
    // whole answer is then posted by its proposal).
    if let Err(e) = h.sweep_streams().await {
        tracing::warn!(
            error = format!("{e:#}"),
            "sweeping streams failed; next round"
        );
    }
    // Assistant-pane progress that no answer is behind any more.
    if let Err(e) = h.sweep_progress().await {
        tracing::warn!(
            error = format!("{e:#}"),
            "sweeping assistant progress failed; next round"
        );
    }
    // Answers waiting for review whose thread moved on are discarded (the
    // thread reconsidered) and their requests say so, without a click.
    if let Err(e) = h.sweep_reviews().await {
        tracing::warn!(
            error = format!("{e:#}"),
            "sweeping answers waiting for review failed; next round"
        );
    }
    let undriven = intents::take_undriven(&h.pool, h.sending_stale, idle).await?;
    for intents::Undriven {
        intent,
        decision,
        was,
    } in undriven
    {
        let Some(d) = proposals::load(&h.pool, decision).await? else {
            continue;
        };
        metrics::counter!("threadline_sweeper_resumed_total", "state" => was.clone()).increment(1);
        tracing::warn!(
            alert = "undriven_intent",
            intent_id = %intent,
            state = %was,
            "no delivery was driving this reply intent; its proposal goes back to a publisher"
        );
        let tag = format!("sweep:{}", Uuid::now_v7());
        proposals::republish(&h.js, &h.topology, &d, &tag).await?;
    }
    // (each kind on its own: a failure of one does not skip the other)
    let replies = late_checks(h).await;
    review_late_checks(h).await?;
    replies
}

/// Reads the review channel again for review requests held without
/// evidence of their post, each on its own (a failure leaves it due again
/// once its lease is over).
async fn review_late_checks(h: &Handler) -> anyhow::Result<()> {
    let due = threadline_store::review::take_late_checks(&h.pool, 10, REVIEW_CHECK_LEASE).await?;
    for d in due {
        let decision = d.decision;
        if let Err(e) = h.review_late_check(d).await {
            tracing::warn!(error = format!("{e:#}"), decision_id = %decision, "late check of a held review request failed; it is due again later");
        }
    }
    Ok(())
}

/// How long a held review request's late check is leased to one sweeper
/// (ten of them, each up to 20 reads of the channel).
const REVIEW_CHECK_LEASE: f64 = 300.0;

/// Reads the thread again for intents held without evidence of their post.
/// Rows are taken with a short lease (their next check moved a minute on),
/// and each is handled on its own: a failure leaves it due again soon,
/// never forgotten.
async fn late_checks(h: &Handler) -> anyhow::Result<()> {
    // Taken with a lease that grows with the checks made, so a row that
    // keeps failing is retried less and less often and then left held.
    let due = intents::take_late_checks(&h.pool).await?;
    for d in due {
        let intent = d.intent;
        if let Err(e) = late_check(h, d).await {
            tracing::warn!(error = format!("{e:#}"), intent_id = %intent, "late check of a held reply failed; it is due again later");
        }
    }
    Ok(())
}

async fn late_check(h: &Handler, due: intents::LateCheck) -> anyhow::Result<()> {
    let intents::LateCheck {
        intent,
        installation: inst,
        decision,
        channel,
        root_ts: root,
        checks,
    } = due;
    let Some(bot) = h.bot(inst).await? else {
        // No token to read with (uninstalled, revoked): nothing more to learn.
        intents::schedule_late_check(&h.pool, intent, None).await?;
        return Ok(());
    };
    // (a late check records posts; a stream an unknown start left is the
    // operator's, as the held intent is)
    let o = reconcile::Owned::load(
        &h.pool,
        intent,
        reconcile::Thread {
            installation: inst,
            channel: &channel,
            root_ts: &root,
        },
        &bot.bot_id,
        h.sending_stale,
        true,
    )
    .await?;
    let seen = reconcile::read(&h.web, bot.token.expose_secret(), &o).await;
    if let Some((ts, seen)) = seen
        .as_ref()
        .ok()
        .and_then(|s| s.read.post().map(|t| (t, s)))
    {
        let posted =
            intents::decision_for_post(&h.pool, intent, seen.hashes.get(ts), decision).await?;
        let r = intents::record_post(&h.pool, intent, posted, ts, true).await?;
        if r.outcome == PostRecord::Late {
            metrics::counter!("threadline_reconciliations_total", "result" => "late_post_found")
                .increment(1);
            tracing::warn!(
                alert = "late_post_found",
                intent_id = %intent,
                "a post held for lack of evidence was found in Slack later; recorded as sent"
            );
        }
        return Ok(());
    }
    if let Err(e) = &seen {
        tracing::warn!(error = %e, "late check of a held reply could not read Slack");
    }
    // Read again on the widening schedule (none after about a week).
    intents::schedule_late_check(
        &h.pool,
        intent,
        next_check(checks, h.evidence.late_check_secs),
    )
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_intents_are_read_again_less_and_less_often_for_a_week() {
        assert_eq!(next_check(0, 30.0), Some(30.0));
        assert!(next_check(3, 30.0) > next_check(2, 30.0));
        let total: f64 = (0..8).filter_map(|n| next_check(n, 30.0)).sum();
        assert!(total > 6.0 * 24.0 * 3600.0 && total < 8.0 * 24.0 * 3600.0);
        assert_eq!(next_check(8, 30.0), None);
    }
}
