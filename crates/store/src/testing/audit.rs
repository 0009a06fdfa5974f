//! Test fixtures and reads for the `audit` family (see `crate::audit`).

/// The reason of one audit record of decision `decision` with `outcome`, whichever; none when there is no such record.
pub async fn decision_outcome_reason(
    pool: &sqlx::PgPool,
    decision: uuid::Uuid,
    outcome: &str,
) -> sqlx::Result<Option<Option<String>>> {
    sqlx::query_scalar!(
        "SELECT reason FROM audit_log WHERE decision_id = $1 AND outcome = $2",
        decision,
        outcome
    )
    .fetch_optional(pool)
    .await
}

/// A review's audit record: its outcome, its reviewer, and whether it names the decision asked about.
#[derive(Debug, Clone)]
pub struct ReviewRecord {
    pub outcome: String,
    pub reviewer: Option<String>,
    pub names_decision: bool,
}

/// Every review record, oldest first, each saying whether it names `decision` (every one must name one).
pub async fn review_records(
    pool: &sqlx::PgPool,
    decision: uuid::Uuid,
) -> sqlx::Result<Vec<ReviewRecord>> {
    sqlx::query_as!(
        ReviewRecord,
        r#"SELECT outcome, reviewer, decision_id = $1 AS "names_decision!" FROM audit_log WHERE stage = 'review' ORDER BY id"#,
        decision
    )
    .fetch_all(pool)
    .await
}

/// One step of an event's audit trail.
#[derive(Debug, Clone)]
pub struct TrailRecord {
    pub stage: String,
    pub outcome: String,
    pub channel_ref: Option<String>,
    pub delivery_status: Option<String>,
    pub event_type: Option<String>,
    pub retry_count: Option<i32>,
    /// Whether the record says when its step began (`began_at`), and that
    /// was no later than the record.
    pub began_before: Option<bool>,
}

/// The audit records of event `event_id`, oldest first.
pub async fn trail_of_event(pool: &sqlx::PgPool, event_id: &str) -> sqlx::Result<Vec<TrailRecord>> {
    sqlx::query_as!(
        TrailRecord,
        "SELECT stage, outcome, channel_ref, delivery_status, event_type, retry_count, began_at <= at AS began_before
           FROM audit_log WHERE event_id = $1 ORDER BY id",
        event_id
    )
    .fetch_all(pool)
    .await
}

/// The model configuration id and output hash on event `event_id`'s `proposed` decision record.
pub async fn proposed_config_and_hash(
    pool: &sqlx::PgPool,
    event_id: &str,
) -> sqlx::Result<(Option<String>, Option<String>)> {
    sqlx::query!(
        "SELECT model_config_id, output_hash FROM audit_log
          WHERE event_id = $1 AND stage = 'decision' AND outcome = 'proposed'",
        event_id
    )
    .fetch_one(pool)
    .await
    .map(|r| (r.model_config_id, r.output_hash))
}

/// Whether event `event_id`'s timeline was received, acked, processed and sent in that order (every time must be set).
pub async fn timeline_in_order(pool: &sqlx::PgPool, event_id: &str) -> sqlx::Result<bool> {
    sqlx::query_scalar!(
        r#"SELECT received_at <= acked_at AND acked_at <= processed_at AND processed_at <= sent_at AS "in_order!"
             FROM audit_timeline WHERE event_id = $1"#,
        event_id
    )
    .fetch_one(pool)
    .await
}

/// Every audit record as text, one a line.
pub async fn dump(pool: &sqlx::PgPool) -> sqlx::Result<String> {
    sqlx::query_scalar!(
        r#"SELECT coalesce(string_agg(a::text, E'\n'), '') AS "dump!" FROM audit_log a"#
    )
    .fetch_one(pool)
    .await
}

/// A way to change the audit log after the fact, each of which the schema refuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rewrite {
    /// `UPDATE audit_log SET outcome = 'changed'`
    Update,
    /// `DELETE FROM audit_log`
    Delete,
    /// `TRUNCATE audit_log`
    Truncate,
}

/// Tries to change every audit record in the way `how`.
pub async fn rewrite(pool: &sqlx::PgPool, how: Rewrite) -> sqlx::Result<()> {
    match how {
        Rewrite::Update => sqlx::query!("UPDATE audit_log SET outcome = 'changed'")
            .execute(pool)
            .await
            .map(drop),
        Rewrite::Delete => sqlx::query!("DELETE FROM audit_log")
            .execute(pool)
            .await
            .map(drop),
        Rewrite::Truncate => sqlx::query!("TRUNCATE audit_log")
            .execute(pool)
            .await
            .map(drop),
    }
}

/// An `intake` record with outcome `accepted`, made `ago` before now.
pub async fn insert_intake_accepted_ago(
    pool: &sqlx::PgPool,
    ago: std::time::Duration,
) -> sqlx::Result<()> {
    let ago = sqlx::postgres::types::PgInterval::try_from(ago).map_err(sqlx::Error::Encode)?;
    sqlx::query!(
        "INSERT INTO audit_log (at, stage, outcome) VALUES (now() - $1::interval, 'intake', 'accepted')",
        ago
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// How many rows the tables retention purges hold.
#[derive(Debug, Clone)]
pub struct Retained {
    pub audit_records: i64,
    pub receipts: i64,
    pub threads: i64,
    pub thread_messages: i64,
}

/// How many audit records, receipts, threads and thread messages there are.
pub async fn retained(pool: &sqlx::PgPool) -> sqlx::Result<Retained> {
    sqlx::query_as!(
        Retained,
        r#"SELECT (SELECT count(*) FROM audit_log) AS "audit_records!", (SELECT count(*) FROM event_receipts) AS "receipts!",
                  (SELECT count(*) FROM threads) AS "threads!", (SELECT count(*) FROM thread_messages) AS "thread_messages!""#
    )
    .fetch_one(pool)
    .await
}

/// How many audit rows record `outcome` at `stage` by `reviewer`.
pub async fn count_audit_entries(
    pool: &sqlx::PgPool,
    stage: &str,
    outcome: &str,
    reviewer: &str,
) -> sqlx::Result<i64> {
    sqlx::query_scalar!(
        r#"SELECT count(*) AS "n!" FROM audit_log WHERE stage = $1 AND outcome = $2 AND reviewer = $3"#,
        stage,
        outcome,
        reviewer
    )
    .fetch_one(pool)
    .await
}

/// The reasons of the audit rows that record `outcome` at `stage`, in
/// order.
pub async fn audit_reasons(
    pool: &sqlx::PgPool,
    stage: &str,
    outcome: &str,
) -> sqlx::Result<Vec<Option<String>>> {
    sqlx::query_scalar!(
        "SELECT reason FROM audit_log WHERE stage = $1 AND outcome = $2 ORDER BY id",
        stage,
        outcome
    )
    .fetch_all(pool)
    .await
}

/// Every `feedback` record, oldest first: the decision it names and its
/// outcome (the verdict), and whether it carries anything beside
/// identifiers, codes and the thread version (it must not).
pub async fn feedback_records(
    pool: &sqlx::PgPool,
) -> sqlx::Result<Vec<(Option<uuid::Uuid>, String, bool)>> {
    let rows = sqlx::query!(
        r#"SELECT decision_id, outcome,
                  (reviewer IS NOT NULL OR output_hash IS NOT NULL OR error_code IS NOT NULL) AS "extra!"
             FROM audit_log WHERE stage = 'feedback' ORDER BY id"#
    )
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| (r.decision_id, r.outcome, r.extra))
        .collect())
}

/// What the audit log writes as the event type `t` (`audit_event_type`).
pub async fn audit_event_type(pool: &sqlx::PgPool, t: &str) -> sqlx::Result<String> {
    sqlx::query_scalar!(r#"SELECT audit_event_type($1) AS "t!""#, t)
        .fetch_one(pool)
        .await
}
