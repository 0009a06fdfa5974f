//! Ledger figures, read from the database (the source of truth), not from
//! any process's memory.

use anyhow::Context as _;
use serde_json::{Map, Value, json};
use sqlx::PgPool;

/// Every figure from one snapshot of the ledger, so that figures read
/// together agree (a relay's commit between two reads would otherwise show
/// rows both pending and published).
pub async fn collect(pool: &PgPool) -> anyhow::Result<Value> {
    let mut tx = pool
        .begin_with("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        .await
        .context("reading the ledger")?;
    let tx = &mut *tx;
    let (receipts, duplicates): (i64, i64) = sqlx::query_as(
        "SELECT count(*), coalesce(sum(duplicate_deliveries), 0)::bigint FROM event_receipts",
    )
    .fetch_one(&mut *tx)
    .await
    .context("reading receipts (is the schema migrated? run `threadline migrate`)")?;
    let (pending, oldest): (i64, Option<f64>) = sqlx::query_as(
        "SELECT count(*), extract(epoch FROM now() - min(created_at))::float8 FROM outbox",
    )
    .fetch_one(&mut *tx)
    .await?;
    let published: i64 =
        sqlx::query_scalar("SELECT coalesce(sum(published_total), 0)::bigint FROM outbox_ledger")
            .fetch_one(&mut *tx)
            .await?;
    let by_reason: Vec<(String, i64)> =
        sqlx::query_as("SELECT reason, count(*) FROM rejections GROUP BY reason ORDER BY reason")
            .fetch_all(&mut *tx)
            .await?;
    let by_state: Vec<(String, i64)> =
        sqlx::query_as("SELECT state, count(*) FROM event_receipts GROUP BY state ORDER BY state")
            .fetch_all(&mut *tx)
            .await?;
    // Deliveries held because they did not parse (invariant 10), by reason
    // code: what `threadline events unparsed` lists and `events replay` takes.
    let unparsed = grouped_unparsed(tx).await?;
    let retried: i64 =
        sqlx::query_scalar("SELECT count(*) FROM event_receipts WHERE retry_num > 0")
            .fetch_one(&mut *tx)
            .await?;
    let rate_limited: i64 = sqlx::query_scalar("SELECT count(*) FROM app_rate_limit_notices")
        .fetch_one(&mut *tx)
        .await?;
    let installs: Vec<(String, i64)> = sqlx::query_as(
        "SELECT status, count(*) FROM installations GROUP BY status ORDER BY status",
    )
    .fetch_all(&mut *tx)
    .await?;
    let decisions = grouped(
        &mut *tx,
        "SELECT status, count(*) FROM decisions GROUP BY status ORDER BY status",
    )
    .await?;
    let intents = grouped(
        &mut *tx,
        "SELECT state, count(*) FROM reply_intents GROUP BY state ORDER BY state",
    )
    .await?;
    let (contexts, truncated, partial): (i64, i64, i64) = sqlx::query_as(
        "SELECT count(*), count(*) FILTER (WHERE truncated), count(*) FILTER (WHERE backfill_partial) FROM contexts",
    )
    .fetch_one(&mut *tx)
    .await?;
    let (model_calls, fallbacks): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE provider IS NOT NULL AND provider NOT IN ('none', 'fallback')),
                count(*) FILTER (WHERE fallback) FROM decisions",
    )
    .fetch_one(&mut *tx)
    .await?;
    let (reconciled, duplicate_replies): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE reconciled),
                -- more than one sent intent for one source event would be a duplicate reply
                coalesce((SELECT sum(n - 1) FROM (SELECT count(*) AS n FROM reply_intents WHERE state = 'sent'
                                                   GROUP BY installation_id, event_id HAVING count(*) > 1) d), 0)::bigint
           FROM reply_intents",
    )
    .fetch_one(&mut *tx)
    .await?;
    let ignored = grouped(
        &mut *tx,
        "SELECT coalesce(state_reason, 'unknown'), count(*) FROM event_receipts
          WHERE state = 'ignored' GROUP BY 1 ORDER BY 1",
    )
    .await?;
    let reviews = grouped(
        &mut *tx,
        "SELECT outcome, count(*) FROM audit_log WHERE stage = 'review' GROUP BY 1 ORDER BY 1",
    )
    .await?;
    let (stale, suppressed, reconsidered): (i64, i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE status = 'stale'),
                count(*) FILTER (WHERE status = 'suppressed'),
                -- decisions beyond an event's first: a new version of its thread was decided again
                count(*) - count(DISTINCT (installation_id, event_id))
           FROM decisions",
    )
    .fetch_one(&mut *tx)
    .await?;
    let (found, held_no_evidence, duplicate_incidents): (i64, i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE reconciled AND state = 'sent'),
                count(*) FILTER (WHERE state = 'held' AND error_code = 'no_evidence_of_post'),
                count(*) FILTER (WHERE error_code = 'duplicate_posts_found')
           FROM reply_intents",
    )
    .fetch_one(&mut *tx)
    .await?;
    let (crossed, crossed_waiting, late_posts): (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(DISTINCT intent_id) FROM crossed_answers),
                (SELECT count(DISTINCT intent_id) FROM crossed_answers WHERE reconsidered_at IS NULL),
                (SELECT count(*) FROM reply_intents WHERE late_recorded_at IS NOT NULL)",
    )
    .fetch_one(&mut *tx)
    .await?;
    let cancelled = grouped(
        &mut *tx,
        "SELECT coalesce(status_reason, 'unknown'), count(*) FROM decisions
          WHERE status = 'cancelled' GROUP BY 1 ORDER BY 1",
    )
    .await?;
    let to_map = |rows: Vec<(String, i64)>| -> Map<String, Value> {
        rows.into_iter().map(|(k, v)| (k, json!(v))).collect()
    };
    let rejections_total: i64 = by_reason.iter().map(|r| r.1).sum();
    let unparsed_pending: i64 = unparsed.iter().map(|r| r.1).sum();
    let mut by_state = to_map(by_state);
    by_state.entry("unparsed").or_insert(json!(0));
    Ok(json!({
        "receipts_total": receipts,
        "receipts_by_state": by_state,
        "unparsed_pending_total": unparsed_pending,
        "unparsed_by_reason": to_map(unparsed),
        "receipts_first_seen_on_retry_total": retried,
        "duplicate_deliveries_total": duplicates,
        "rejections_total": rejections_total,
        "rejections_by_reason": to_map(by_reason),
        "outbox_pending": pending,
        "outbox_published_total": published,
        "outbox_oldest_pending_age_seconds": oldest.unwrap_or(0.0),
        "app_rate_limited_notices_total": rate_limited,
        "installations_by_status": to_map(installs),
        "contexts_total": contexts,
        "contexts_truncated_total": truncated,
        "contexts_backfill_partial_total": partial,
        "decisions_by_status": to_map(decisions),
        "model_calls_total": model_calls,
        "fallbacks_total": fallbacks,
        "reply_intents_by_state": to_map(intents),
        "reconciled_total": reconciled,
        "reconciliations_by_result": {
            "post_found": found,
            "held_no_evidence": held_no_evidence,
            "held_duplicate_posts": duplicate_incidents,
        },
        "ignored_by_reason": to_map(ignored),
        "stale_proposals_total": stale,
        "reconsidered_decisions_total": reconsidered,
        "kill_switch_suppressions_total": suppressed,
        "review_outcomes": to_map(reviews),
        // Answers a human message crossed in flight, and those whose
        // reconsideration has not run yet.
        "crossed_in_flight_total": crossed,
        "crossed_in_flight_awaiting_reconsideration": crossed_waiting,
        // Posts recorded after their intent had been given up on.
        "late_posts_recorded_total": late_posts,
        "cancelled_by_reason": to_map(cancelled),
        // A second sent intent for one event, or two posts of one intent
        // found in Slack (held as an incident).
        "duplicate_replies_total": duplicate_replies + duplicate_incidents,
    }))
}

/// Unparsed receipts by reason code (the part of `parse_error` before its
/// first colon).
/// `(name, count)` rows of a grouping query.
async fn grouped(
    tx: &mut sqlx::PgConnection,
    sql: &'static str,
) -> sqlx::Result<Vec<(String, i64)>> {
    sqlx::query_as(sql).fetch_all(tx).await
}

async fn grouped_unparsed(tx: &mut sqlx::PgConnection) -> sqlx::Result<Vec<(String, i64)>> {
    sqlx::query_as(
        "SELECT coalesce(nullif(split_part(parse_error, ':', 1), ''), 'unknown'), count(*)
           FROM event_receipts WHERE state = 'unparsed' GROUP BY 1 ORDER BY 1",
    )
    .fetch_all(&mut *tx)
    .await
}
