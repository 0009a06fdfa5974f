//! Retention: what `threadline purge` deletes, in one transaction (rolled
//! back for a dry run, which only counts): audit records, finished
//! receipts with their contexts and rejections, the raw bodies of unparsed
//! deliveries never replayed (their receipts are closed as `failed`,
//! reason `unparsed_expired`), the stored text of idle threads and of
//! settled proposals, idle assistant-pane threads, and old budget records.

use sqlx::PgPool;
use threadline_domain::state::{Machine as _, ReceiptState};

use crate::moves;

/// Days each kind of record is kept.
#[derive(Debug, Clone, Copy)]
pub struct Retention {
    pub audit_days: i32,
    pub receipts_days: i32,
    pub threads_days: i32,
}

/// What was (or, for a dry run, would be) deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Purged {
    pub audit_records: i64,
    pub receipts: i64,
    pub contexts: i64,
    pub rejections: i64,
    /// Stored bodies of unparsed deliveries deleted.
    pub unparsed_bodies: i64,
    /// Unparsed receipts closed as `failed` (`unparsed_expired`).
    pub unparsed_expired: i64,
    pub threads: i64,
    pub thread_messages: i64,
    pub proposal_texts: i64,
    /// Assistant-pane threads (identifiers only) idle past the threads'
    /// retention.
    pub assistant_threads: i64,
    /// Records of deliveries (identifiers only): late events and doubled
    /// messages past the receipts' retention, persons' actions and the
    /// parts of double-texting bursts past the threads'.
    pub delivery_records: i64,
    /// Budget records (identifiers and counts only): model tokens per day
    /// past the audit retention (they are usage accounting, as the audit
    /// log is), and over-budget notes past the threads' retention whose
    /// thread is gone (a thread still in use keeps its note, so it is
    /// never told twice).
    pub budget_records: i64,
    /// Each person's verdict on an answer (it names the person by their
    /// Slack user id, as persons' actions do) past the threads' retention;
    /// the audit log keeps each verdict without the person.
    pub feedback_records: i64,
    /// Agent Messaging tabs (which channel a person was looking at, by id)
    /// not opened nor changed past the threads' retention; a tab opened
    /// again is recorded anew and greeted again.
    pub agent_views: i64,
}

pub async fn purge(pool: &PgPool, keep: Retention, dry_run: bool) -> sqlx::Result<Purged> {
    let mut p = Purged::default();
    let mut tx = pool.begin().await?;
    // The audit log refuses deletes except in a transaction that says it
    // purges (migration 0008).
    sqlx::query_scalar!("SELECT set_config('threadline.audit_purge', 'on', true)")
        .fetch_one(&mut *tx)
        .await?;
    p.audit_records = sqlx::query!(
        "DELETE FROM audit_log WHERE at < now() - make_interval(days => $1::int)",
        keep.audit_days
    )
    .execute(&mut *tx)
    .await?
    .rows_affected() as i64;

    let cutoff = keep.receipts_days;
    // Unparsed deliveries nobody replayed within the retention: the body
    // (message text) goes, the receipt is closed as failed and is deleted
    // like any finished receipt one retention later. A body whose receipt
    // is no longer unparsed has no use and goes too.
    let unparsed = sqlx::query!(
        r#"WITH old AS (
             SELECT receipt_id FROM unparsed_events
              WHERE received_at < now() - make_interval(days => $1::int)),
         expired AS (
             UPDATE event_receipts r
                SET state = $2, state_reason = 'unparsed_expired', updated_at = now()
               FROM old WHERE r.id = old.receipt_id AND r.state = ANY($3)
             RETURNING 1),
         bodies AS (
             DELETE FROM unparsed_events u
              WHERE u.receipt_id IN (SELECT receipt_id FROM old)
                 OR NOT EXISTS (SELECT 1 FROM event_receipts r
                                 WHERE r.id = u.receipt_id AND r.state = 'unparsed')
             RETURNING 1)
         SELECT (SELECT count(*) FROM bodies) AS "bodies!", (SELECT count(*) FROM expired) AS "expired!""#,
        cutoff,
        ReceiptState::Failed.as_str(),
        &moves(&[ReceiptState::Unparsed], ReceiptState::Failed)
    )
    .fetch_one(&mut *tx)
    .await?;
    (p.unparsed_bodies, p.unparsed_expired) = (unparsed.bodies, unparsed.expired);
    p.receipts = sqlx::query!(
        "DELETE FROM event_receipts
          WHERE state IN ('done', 'ignored', 'failed') AND updated_at < now() - make_interval(days => $1::int)",
        cutoff
    )
    .execute(&mut *tx)
    .await?
    .rows_affected() as i64;
    p.contexts = sqlx::query!(
        "DELETE FROM contexts c
          WHERE c.captured_at < now() - make_interval(days => $1::int)
            AND NOT EXISTS (SELECT 1 FROM event_receipts r WHERE r.id = c.receipt_id)",
        cutoff
    )
    .execute(&mut *tx)
    .await?
    .rows_affected() as i64;
    p.rejections = sqlx::query_scalar!(
        r#"WITH a AS (DELETE FROM rejections WHERE received_at < now() - make_interval(days => $1::int) RETURNING 1),
              b AS (DELETE FROM app_rate_limit_notices WHERE received_at < now() - make_interval(days => $1::int)
                    RETURNING 1)
         SELECT (SELECT count(*) FROM a) + (SELECT count(*) FROM b) AS "n!""#,
        cutoff
    )
    .fetch_one(&mut *tx)
    .await?;

    let threads = sqlx::query!(
        r#"WITH idle AS (
             DELETE FROM threads WHERE updated_at < now() - make_interval(days => $1::int)
             RETURNING installation_id, channel_id, root_ts),
         msgs AS (
             DELETE FROM thread_messages m USING idle i
              WHERE m.installation_id = i.installation_id AND m.channel_id = i.channel_id AND m.root_ts = i.root_ts
             RETURNING m.installation_id, m.channel_id, m.ts),
         facts AS (
             DELETE FROM message_facts f USING msgs m
              WHERE f.installation_id = m.installation_id AND f.channel_id = m.channel_id AND f.ts = m.ts
             RETURNING 1),
         gone_turns AS (
             DELETE FROM turns t USING msgs m
              WHERE t.installation_id = m.installation_id AND t.channel_id = m.channel_id AND t.ts = m.ts
             RETURNING 1)
         SELECT (SELECT count(*) FROM idle) AS "threads!", (SELECT count(*) FROM msgs) AS "messages!""#,
        keep.threads_days
    )
    .fetch_one(&mut *tx)
    .await?;
    (p.threads, p.thread_messages) = (threads.threads, threads.messages);
    p.proposal_texts = sqlx::query!(
        "UPDATE decisions SET body_text = NULL, body_blocks = NULL, stream_text = NULL, sources = '{}'
          WHERE (body_text IS NOT NULL OR stream_text IS NOT NULL) AND updated_at < now() - make_interval(days => $1::int)
            AND status NOT IN ('calling', 'proposed', 'review', 'approved')",
        keep.threads_days
    )
    .execute(&mut *tx)
    .await?
    .rows_affected() as i64;
    p.assistant_threads = sqlx::query!(
        // (a thread still in use keeps its row: its messages are younger)
        "DELETE FROM assistant_threads a
          WHERE a.updated_at < now() - make_interval(days => $1::int)
            AND NOT EXISTS (SELECT 1 FROM threads t
                             WHERE t.installation_id = a.installation_id AND t.channel_id = a.channel_id
                               AND t.root_ts = a.thread_ts)",
        keep.threads_days
    )
    .execute(&mut *tx)
    .await?
    .rows_affected() as i64;

    p.delivery_records = sqlx::query_scalar!(
        r#"WITH a AS (DELETE FROM late_events WHERE recorded_at < now() - make_interval(days => $1::int) RETURNING 1),
              b AS (DELETE FROM doubled_messages WHERE detected_at < now() - make_interval(days => $1::int)
                    RETURNING 1),
              c AS (DELETE FROM person_actions WHERE created_at < now() - make_interval(days => $2::int)
                    RETURNING 1),
              d AS (DELETE FROM double_texts WHERE decided_at < now() - make_interval(days => $2::int)
                    RETURNING 1)
         SELECT (SELECT count(*) FROM a) + (SELECT count(*) FROM b) + (SELECT count(*) FROM c)
                + (SELECT count(*) FROM d) AS "n!""#,
        cutoff,
        keep.threads_days
    )
    .fetch_one(&mut *tx)
    .await?;

    p.budget_records = sqlx::query_scalar!(
        r#"WITH a AS (DELETE FROM tenant_tokens WHERE day < (now() - make_interval(days => $1::int))::date
                    RETURNING 1),
              b AS (DELETE FROM budget_notes n
                     WHERE n.noted_at < now() - make_interval(days => $2::int)
                       AND NOT EXISTS (SELECT 1 FROM threads t
                                        WHERE t.installation_id = n.installation_id AND t.channel_id = n.channel_id
                                          AND t.root_ts = n.root_ts)
                    RETURNING 1)
         SELECT (SELECT count(*) FROM a) + (SELECT count(*) FROM b) AS "n!""#,
        keep.audit_days,
        keep.threads_days
    )
    .fetch_one(&mut *tx)
    .await?;

    p.agent_views = sqlx::query!(
        "DELETE FROM agent_views WHERE updated_at < now() - make_interval(days => $1::int)",
        keep.threads_days
    )
    .execute(&mut *tx)
    .await?
    .rows_affected() as i64;

    p.feedback_records = sqlx::query!(
        "DELETE FROM answer_feedback WHERE updated_at < now() - make_interval(days => $1::int)",
        keep.threads_days
    )
    .execute(&mut *tx)
    .await?
    .rows_affected() as i64;

    if dry_run {
        tx.rollback().await?;
    } else {
        tx.commit().await?;
    }
    Ok(p)
}
