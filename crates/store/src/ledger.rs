//! The ledger: every figure `threadline stats` reports, read from one
//! snapshot (REPEATABLE READ, read only), so that figures read together
//! agree (a relay's commit between two reads would otherwise show rows
//! both pending and published).

use sqlx::PgPool;

/// `(name, count)` rows, by name.
pub type Counts = Vec<(String, i64)>;

#[derive(Debug, Clone, Default)]
pub struct Ledger {
    pub receipts: i64,
    pub duplicate_deliveries: i64,
    pub receipts_by_state: Counts,
    /// Unparsed receipts by reason code (the part of `parse_error` before
    /// its first colon).
    pub unparsed_by_reason: Counts,
    pub receipts_first_seen_on_retry: i64,
    pub rejections_by_reason: Counts,
    pub outbox_pending: i64,
    pub outbox_oldest_seconds: f64,
    pub outbox_published: i64,
    pub app_rate_limited_notices: i64,
    pub installations_by_status: Counts,
    pub contexts: i64,
    pub contexts_truncated: i64,
    pub contexts_backfill_partial: i64,
    pub decisions_by_status: Counts,
    pub model_calls: i64,
    pub fallbacks: i64,
    pub reply_intents_by_state: Counts,
    pub reconciled: i64,
    /// More than one sent intent for one source event.
    pub duplicate_sent_intents: i64,
    pub ignored_by_reason: Counts,
    pub review_outcomes: Counts,
    pub stale: i64,
    pub suppressed: i64,
    /// Decisions beyond an event's first: a new version of its thread was
    /// decided again.
    pub reconsidered: i64,
    pub reconciled_post_found: i64,
    pub held_no_evidence: i64,
    pub held_duplicate_posts: i64,
    pub crossed: i64,
    pub crossed_awaiting_reconsideration: i64,
    pub late_posts: i64,
    pub cancelled_by_reason: Counts,
    /// Events Slack delivered late, by what became of them.
    pub late_events_by_outcome: Counts,
    /// Messages repeating a person's action another message owns.
    pub doubled_messages: i64,
    /// Parked and admitted requests, the installations over budget.
    pub budgets: crate::budgets::Sample,
}

/// A grouping statement whose columns are `key` and `n`.
macro_rules! grouped {
    ($conn:expr, $sql:literal) => {
        sqlx::query!($sql)
            .fetch_all(&mut *$conn)
            .await?
            .into_iter()
            .map(|r| (r.key, r.n))
            .collect::<Counts>()
    };
}

pub async fn snapshot(pool: &PgPool) -> sqlx::Result<Ledger> {
    let mut tx = pool
        .begin_with("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        .await?;
    let tx = &mut *tx;
    let mut l = Ledger::default();
    let r = sqlx::query!(
        r#"SELECT count(*) AS "n!", coalesce(sum(duplicate_deliveries), 0)::bigint AS "duplicates!"
             FROM event_receipts"#
    )
    .fetch_one(&mut *tx)
    .await?;
    (l.receipts, l.duplicate_deliveries) = (r.n, r.duplicates);
    let r = sqlx::query!(
        r#"SELECT count(*) AS "n!", extract(epoch FROM now() - min(created_at))::float8 AS oldest FROM outbox"#
    )
    .fetch_one(&mut *tx)
    .await?;
    (l.outbox_pending, l.outbox_oldest_seconds) = (r.n, r.oldest.unwrap_or(0.0));
    l.outbox_published = sqlx::query_scalar!(
        r#"SELECT coalesce(sum(published_total), 0)::bigint AS "n!" FROM outbox_ledger"#
    )
    .fetch_one(&mut *tx)
    .await?;
    l.rejections_by_reason = grouped!(
        tx,
        r#"SELECT reason AS "key!", count(*) AS "n!" FROM rejections GROUP BY reason ORDER BY reason"#
    );
    l.receipts_by_state = grouped!(
        tx,
        r#"SELECT state AS "key!", count(*) AS "n!" FROM event_receipts GROUP BY state ORDER BY state"#
    );
    l.unparsed_by_reason = grouped!(
        tx,
        r#"SELECT coalesce(nullif(split_part(parse_error, ':', 1), ''), 'unknown') AS "key!", count(*) AS "n!"
             FROM event_receipts WHERE state = 'unparsed' GROUP BY 1 ORDER BY 1"#
    );
    l.receipts_first_seen_on_retry =
        sqlx::query_scalar!(r#"SELECT count(*) AS "n!" FROM event_receipts WHERE retry_num > 0"#)
            .fetch_one(&mut *tx)
            .await?;
    l.app_rate_limited_notices =
        sqlx::query_scalar!(r#"SELECT count(*) AS "n!" FROM app_rate_limit_notices"#)
            .fetch_one(&mut *tx)
            .await?;
    l.installations_by_status = grouped!(
        tx,
        r#"SELECT status AS "key!", count(*) AS "n!" FROM installations GROUP BY status ORDER BY status"#
    );
    l.decisions_by_status = grouped!(
        tx,
        r#"SELECT status AS "key!", count(*) AS "n!" FROM decisions GROUP BY status ORDER BY status"#
    );
    l.reply_intents_by_state = grouped!(
        tx,
        r#"SELECT state AS "key!", count(*) AS "n!" FROM reply_intents GROUP BY state ORDER BY state"#
    );
    let r = sqlx::query!(
        r#"SELECT count(*) AS "n!", count(*) FILTER (WHERE truncated) AS "truncated!",
                  count(*) FILTER (WHERE backfill_partial) AS "partial!"
             FROM contexts"#
    )
    .fetch_one(&mut *tx)
    .await?;
    (
        l.contexts,
        l.contexts_truncated,
        l.contexts_backfill_partial,
    ) = (r.n, r.truncated, r.partial);
    let r = sqlx::query!(
        r#"SELECT count(*) FILTER (WHERE provider IS NOT NULL AND provider NOT IN ('none', 'fallback')) AS "calls!",
                  count(*) FILTER (WHERE fallback) AS "fallbacks!"
             FROM decisions"#
    )
    .fetch_one(&mut *tx)
    .await?;
    (l.model_calls, l.fallbacks) = (r.calls, r.fallbacks);
    let r = sqlx::query!(
        r#"SELECT count(*) FILTER (WHERE reconciled) AS "reconciled!",
                  -- more than one sent intent for one source event would be a duplicate reply
                  coalesce((SELECT sum(n - 1) FROM (SELECT count(*) AS n FROM reply_intents WHERE state = 'sent'
                                                     GROUP BY installation_id, event_id HAVING count(*) > 1) d),
                           0)::bigint AS "duplicates!"
             FROM reply_intents"#
    )
    .fetch_one(&mut *tx)
    .await?;
    (l.reconciled, l.duplicate_sent_intents) = (r.reconciled, r.duplicates);
    l.ignored_by_reason = grouped!(
        tx,
        r#"SELECT coalesce(state_reason, 'unknown') AS "key!", count(*) AS "n!" FROM event_receipts
            WHERE state = 'ignored' GROUP BY 1 ORDER BY 1"#
    );
    l.review_outcomes = grouped!(
        tx,
        r#"SELECT outcome AS "key!", count(*) AS "n!" FROM audit_log WHERE stage = 'review' GROUP BY 1 ORDER BY 1"#
    );
    let r = sqlx::query!(
        r#"SELECT count(*) FILTER (WHERE status = 'stale') AS "stale!",
                  count(*) FILTER (WHERE status = 'suppressed') AS "suppressed!",
                  count(*) - count(DISTINCT (installation_id, event_id)) AS "reconsidered!"
             FROM decisions"#
    )
    .fetch_one(&mut *tx)
    .await?;
    (l.stale, l.suppressed, l.reconsidered) = (r.stale, r.suppressed, r.reconsidered);
    let r = sqlx::query!(
        r#"SELECT count(*) FILTER (WHERE reconciled AND state = 'sent') AS "found!",
                  count(*) FILTER (WHERE state = 'held' AND error_code = 'no_evidence_of_post') AS "held!",
                  count(*) FILTER (WHERE error_code = 'duplicate_posts_found') AS "duplicates!"
             FROM reply_intents"#
    )
    .fetch_one(&mut *tx)
    .await?;
    (
        l.reconciled_post_found,
        l.held_no_evidence,
        l.held_duplicate_posts,
    ) = (r.found, r.held, r.duplicates);
    let r = sqlx::query!(
        r#"SELECT (SELECT count(DISTINCT intent_id) FROM crossed_answers) AS "crossed!",
                  (SELECT count(DISTINCT intent_id) FROM crossed_answers WHERE reconsidered_at IS NULL)
                      AS "waiting!",
                  (SELECT count(*) FROM reply_intents WHERE late_recorded_at IS NOT NULL) AS "late!""#
    )
    .fetch_one(&mut *tx)
    .await?;
    (l.crossed, l.crossed_awaiting_reconsideration, l.late_posts) = (r.crossed, r.waiting, r.late);
    l.cancelled_by_reason = grouped!(
        tx,
        r#"SELECT coalesce(status_reason, 'unknown') AS "key!", count(*) AS "n!" FROM decisions
            WHERE status = 'cancelled' GROUP BY 1 ORDER BY 1"#
    );
    l.late_events_by_outcome = grouped!(
        tx,
        r#"SELECT outcome AS "key!", count(*) AS "n!" FROM late_events GROUP BY 1 ORDER BY 1"#
    );
    l.doubled_messages = sqlx::query_scalar!(r#"SELECT count(*) AS "n!" FROM doubled_messages"#)
        .fetch_one(&mut *tx)
        .await?;
    l.budgets = crate::budgets::sample(&mut *tx, 20).await?;
    Ok(l)
}
