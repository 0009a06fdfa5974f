//! Ledger figures, read from the database (the source of truth), not from
//! any process's memory: one snapshot ([`threadline_store::ledger`]).

use anyhow::Context as _;
use serde_json::{Map, Value, json};
use sqlx::PgPool;

/// The spool's figures, read from the broker: deliveries acknowledged to
/// Slack while Postgres could not take them, not recorded yet. `readable`
/// is false when the broker did not answer within 3 s.
pub async fn spool(common: &threadline_runtime::config::CommonConfig) -> Value {
    let read = async {
        let nats = threadline_runtime::bus::connect(&common.nats_url, "threadline-cli")
            .await
            .ok()?;
        let js = async_nats::jetstream::new(nats);
        threadline_runtime::bus::Topology::from_config(common)
            .spool_depth(&js)
            .await
    };
    match tokio::time::timeout(std::time::Duration::from_secs(3), read).await {
        Ok(Some((n, age))) => json!({
            "readable": true,
            "deliveries_waiting": n,
            "oldest_age_seconds": age.as_secs_f64(),
        }),
        _ => json!({"readable": false, "deliveries_waiting": null, "oldest_age_seconds": null}),
    }
}

/// Late events by outcome, every outcome named.
fn late_events(rows: Vec<(String, i64)>) -> Value {
    let mut m: Map<String, Value> = threadline_domain::late::LateOutcome::ALL
        .iter()
        .map(|o| (o.as_str().to_owned(), json!(0)))
        .collect();
    for (k, v) in rows {
        m.insert(k, json!(v));
    }
    Value::Object(m)
}

/// Every figure of the ledger, as JSON.
pub async fn collect(pool: &PgPool) -> anyhow::Result<Value> {
    let l = threadline_store::ledger::snapshot(pool)
        .await
        .context("reading the ledger (is the schema migrated? run `threadline migrate`)")?;
    let to_map = |rows: Vec<(String, i64)>| -> Map<String, Value> {
        rows.into_iter().map(|(k, v)| (k, json!(v))).collect()
    };
    let rejections_total: i64 = l.rejections_by_reason.iter().map(|r| r.1).sum();
    let unparsed_pending: i64 = l.unparsed_by_reason.iter().map(|r| r.1).sum();
    let mut by_state = to_map(l.receipts_by_state);
    by_state
        .entry(threadline_domain::state::ReceiptState::Unparsed.name())
        .or_insert(json!(0));
    Ok(json!({
        "receipts_total": l.receipts,
        "receipts_by_state": by_state,
        "unparsed_pending_total": unparsed_pending,
        "unparsed_by_reason": to_map(l.unparsed_by_reason),
        "receipts_first_seen_on_retry_total": l.receipts_first_seen_on_retry,
        "duplicate_deliveries_total": l.duplicate_deliveries,
        "rejections_total": rejections_total,
        "rejections_by_reason": to_map(l.rejections_by_reason),
        "outbox_pending": l.outbox_pending,
        "outbox_published_total": l.outbox_published,
        "outbox_oldest_pending_age_seconds": l.outbox_oldest_seconds,
        "app_rate_limited_notices_total": l.app_rate_limited_notices,
        "installations_by_status": to_map(l.installations_by_status),
        "contexts_total": l.contexts,
        "contexts_truncated_total": l.contexts_truncated,
        "contexts_backfill_partial_total": l.contexts_backfill_partial,
        "decisions_by_status": to_map(l.decisions_by_status),
        "model_calls_total": l.model_calls,
        "fallbacks_total": l.fallbacks,
        "reply_intents_by_state": to_map(l.reply_intents_by_state),
        "reconciled_total": l.reconciled,
        "reconciliations_by_result": {
            "post_found": l.reconciled_post_found,
            "held_no_evidence": l.held_no_evidence,
            "held_duplicate_posts": l.held_duplicate_posts,
        },
        "ignored_by_reason": to_map(l.ignored_by_reason),
        "stale_proposals_total": l.stale,
        "reconsidered_decisions_total": l.reconsidered,
        "kill_switch_suppressions_total": l.suppressed,
        "review_outcomes": to_map(l.review_outcomes),
        // Answers a human message crossed in flight, and those whose
        // reconsideration has not run yet.
        "crossed_in_flight_total": l.crossed,
        "crossed_in_flight_awaiting_reconsideration": l.crossed_awaiting_reconsideration,
        // Posts recorded after their intent had been given up on.
        "late_posts_recorded_total": l.late_posts,
        "cancelled_by_reason": to_map(l.cancelled_by_reason),
        // A second sent intent for one event, or two posts of one intent
        // found in Slack (held as an incident).
        "duplicate_replies_total": l.duplicate_sent_intents + l.held_duplicate_posts,
        // Events Slack delivered past THREADLINE_LATE_EVENT_MS, by what
        // became of them (every outcome named, zero included).
        "late_events_by_outcome": late_events(l.late_events_by_outcome),
        // Messages repeating a person's action another message owns
        // (recorded, never answered).
        "doubled_messages_total": l.doubled_messages,
        // Requests waiting for their installation's budget or its share of
        // the model's queue, and those in that queue (DESIGN invariant 11).
        "parked_requests_total": l.budgets.parked_by_reason.iter().map(|r| r.1).sum::<i64>(),
        "parked_by_reason": to_map(l.budgets.parked_by_reason),
        "parked_by_installation": to_map(
            l.budgets
                .parked_by_installation
                .into_iter()
                .map(|(i, n)| (i.to_string(), n))
                .collect()
        ),
        "parked_oldest_age_seconds": l.budgets.oldest_parked_seconds,
        "installations_over_budget": l.budgets.over_budget_installations,
        "requests_in_model_queue": l.budgets.in_queue,
        "budget_notes_total": l.budgets.notes,
    }))
}
