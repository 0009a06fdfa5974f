//! Test fixtures and reads for the `decisions` family (see `crate::decisions`).

/// A proposed decision as a test writes it.
#[derive(Debug, Clone)]
pub struct ProposedDecision<'a> {
    pub id: uuid::Uuid,
    pub receipt_id: uuid::Uuid,
    pub installation_id: uuid::Uuid,
    pub event_id: &'a str,
    pub channel_id: &'a str,
    pub root_ts: &'a str,
    pub source_ts: &'a str,
    pub thread_version: i64,
    pub body_text: &'a str,
    pub output_hash: &'a str,
}

/// Inserts a `proposed` decision.
pub async fn insert_proposed_decision(
    pool: &sqlx::PgPool,
    d: &ProposedDecision<'_>,
) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO decisions (id, receipt_id, installation_id, event_id, channel_id, root_ts, source_ts, thread_version,
                                status, body_text, output_hash)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'proposed', $9, $10)",
        d.id,
        d.receipt_id,
        d.installation_id,
        d.event_id,
        d.channel_id,
        d.root_ts,
        d.source_ts,
        d.thread_version,
        d.body_text,
        d.output_hash
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// A decision's status and the reason for it.
pub async fn decision_status(
    pool: &sqlx::PgPool,
    id: uuid::Uuid,
) -> sqlx::Result<(String, Option<String>)> {
    let r = sqlx::query!(
        "SELECT status, status_reason FROM decisions WHERE id = $1",
        id
    )
    .fetch_one(pool)
    .await?;
    Ok((r.status, r.status_reason))
}

/// Sets a decision's status, leaving its reason as it is.
pub async fn set_decision_status(
    pool: &sqlx::PgPool,
    id: uuid::Uuid,
    status: &str,
) -> sqlx::Result<()> {
    sqlx::query!("UPDATE decisions SET status = $2 WHERE id = $1", id, status)
        .execute(pool)
        .await?;
    Ok(())
}

/// Sets a decision's status and the reason for it.
pub async fn set_decision_status_and_reason(
    pool: &sqlx::PgPool,
    id: uuid::Uuid,
    status: &str,
    reason: Option<&str>,
) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE decisions SET status = $2, status_reason = $3 WHERE id = $1",
        id,
        status,
        reason
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Sends a decision to review for `reasons`.
pub async fn send_decision_to_review(
    pool: &sqlx::PgPool,
    id: uuid::Uuid,
    reasons: &[String],
) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE decisions SET status = 'review', review_reasons = $2 WHERE id = $1",
        id,
        reasons
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Approves a decision as `reviewer` (nothing else recorded).
pub async fn approve_decision(
    pool: &sqlx::PgPool,
    id: uuid::Uuid,
    reviewer: &str,
) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE decisions SET status = 'approved', reviewed_by = $2 WHERE id = $1",
        id,
        reviewer
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Makes a decision the action `action_kind`, reviewed for `reasons` and approved by `reviewer`.
pub async fn approve_decision_as_action(
    pool: &sqlx::PgPool,
    id: uuid::Uuid,
    action_kind: &str,
    reasons: &[String],
    reviewer: &str,
) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE decisions SET status = 'approved', action_kind = $2, review_reasons = $3, reviewed_by = $4
          WHERE id = $1",
        id,
        action_kind,
        reasons,
        reviewer
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Inserts `id`, a `proposed` copy of decision `from` (same receipt, text and hash) at `thread_version`.
pub async fn copy_decision_at_version(
    pool: &sqlx::PgPool,
    id: uuid::Uuid,
    from: uuid::Uuid,
    thread_version: i64,
) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO decisions (id, receipt_id, installation_id, event_id, channel_id, root_ts, source_ts, thread_version,
                                status, body_text, output_hash)
         SELECT $1, receipt_id, installation_id, event_id, channel_id, root_ts, source_ts, $3, 'proposed', body_text,
                output_hash
           FROM decisions WHERE id = $2",
        id,
        from,
        thread_version
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Another decision for the event (installation, channel, thread, source) of decision `of`.
#[derive(Debug, Clone)]
pub struct DecisionForEvent<'a> {
    pub id: uuid::Uuid,
    pub of: uuid::Uuid,
    pub receipt_id: uuid::Uuid,
    pub thread_version: i64,
    pub status: &'a str,
    pub action_kind: &'a str,
    pub review_reasons: &'a [String],
    pub reviewed_by: Option<&'a str>,
    pub body_text: &'a str,
    pub output_hash: &'a str,
}

/// Inserts another decision for the event of decision `d.of`.
pub async fn insert_decision_for_event_of(
    pool: &sqlx::PgPool,
    d: &DecisionForEvent<'_>,
) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO decisions (id, receipt_id, installation_id, event_id, channel_id, root_ts, source_ts, thread_version,
                                status, action_kind, review_reasons, reviewed_by, body_text, output_hash)
         SELECT $1, $3, installation_id, event_id, channel_id, root_ts, source_ts, $4, $5, $6, $7, $8, $9, $10
           FROM decisions WHERE id = $2",
        d.id,
        d.of,
        d.receipt_id,
        d.thread_version,
        d.status,
        d.action_kind,
        d.review_reasons,
        d.reviewed_by,
        d.body_text,
        d.output_hash
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Sets the messages (their ts) a decision's answer read.
pub async fn set_decision_context(
    pool: &sqlx::PgPool,
    id: uuid::Uuid,
    context_ts: &[String],
) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE decisions SET context_ts = $2 WHERE id = $1",
        id,
        context_ts
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Sets a decision's output hash.
pub async fn set_decision_output_hash(
    pool: &sqlx::PgPool,
    id: uuid::Uuid,
    hash: &str,
) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE decisions SET output_hash = $2 WHERE id = $1",
        id,
        hash
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// What inference decided for a receipt: status, its reason, review reasons, fallback and action.
#[derive(Debug, Clone)]
pub struct Decided {
    pub status: String,
    pub status_reason: Option<String>,
    pub review_reasons: Vec<String>,
    pub fallback: bool,
    pub action_kind: String,
}

/// What was decided for `receipt` (its one decision).
pub async fn decided_for_receipt(
    pool: &sqlx::PgPool,
    receipt: uuid::Uuid,
) -> sqlx::Result<Decided> {
    sqlx::query_as!(
        Decided,
        "SELECT status, status_reason, review_reasons, fallback, action_kind FROM decisions WHERE receipt_id = $1",
        receipt
    )
    .fetch_one(pool)
    .await
}

/// Which model answered the decision for `receipt`: its provider's name,
/// whether the answer was the fallback, and the completion tokens the
/// provider reported.
pub async fn answered_by(
    pool: &sqlx::PgPool,
    receipt: uuid::Uuid,
) -> sqlx::Result<(Option<String>, bool, Option<i32>)> {
    let r = sqlx::query!(
        "SELECT provider, fallback, completion_tokens FROM decisions WHERE receipt_id = $1",
        receipt
    )
    .fetch_one(pool)
    .await?;
    Ok((r.provider, r.fallback, r.completion_tokens))
}

/// The answer stored with the decision for `receipt`: its text and its Block Kit blocks.
pub async fn decision_body(
    pool: &sqlx::PgPool,
    receipt: uuid::Uuid,
) -> sqlx::Result<(Option<String>, Option<serde_json::Value>)> {
    let r = sqlx::query!(
        "SELECT body_text, body_blocks FROM decisions WHERE receipt_id = $1",
        receipt
    )
    .fetch_one(pool)
    .await?;
    Ok((r.body_text, r.body_blocks))
}

/// How many decisions exist for `receipt`.
pub async fn count_decisions_for_receipt(
    pool: &sqlx::PgPool,
    receipt: uuid::Uuid,
) -> sqlx::Result<i64> {
    sqlx::query_scalar!(
        r#"SELECT count(*) AS "n!" FROM decisions WHERE receipt_id = $1"#,
        receipt
    )
    .fetch_one(pool)
    .await
}

/// A decision waiting for review (`secret_like`) in channel C1, thread 1.1 at version 3, with `body_text`.
pub async fn insert_in_review(
    pool: &sqlx::PgPool,
    id: uuid::Uuid,
    receipt_id: uuid::Uuid,
    installation_id: uuid::Uuid,
    event_id: &str,
    body_text: &str,
) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO decisions (id, receipt_id, installation_id, event_id, channel_id, root_ts, source_ts, thread_version,
                                status, review_reasons, body_text, output_hash)
         VALUES ($1, $2, $3, $4, 'C1', '1.1', '1.2', 3, 'review', '{secret_like}', $5, 'h')",
        id,
        receipt_id,
        installation_id,
        event_id,
        body_text
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Every decision's status and reviewer, by event id.
pub async fn statuses_and_reviewers(
    pool: &sqlx::PgPool,
) -> sqlx::Result<Vec<(String, Option<String>)>> {
    let rows = sqlx::query!("SELECT status, reviewed_by FROM decisions ORDER BY event_id")
        .fetch_all(pool)
        .await?;
    Ok(rows
        .into_iter()
        .map(|r| (r.status, r.reviewed_by))
        .collect())
}

/// How many contexts were captured and how many decisions (model calls) were made.
pub async fn count_contexts_and_decisions(pool: &sqlx::PgPool) -> sqlx::Result<(i64, i64)> {
    sqlx::query!(
        r#"SELECT (SELECT count(*) FROM contexts) AS "contexts!", (SELECT count(*) FROM decisions) AS "decisions!""#
    )
    .fetch_one(pool)
    .await
    .map(|r| (r.contexts, r.decisions))
}

/// How many decisions there are (one per model call).
pub async fn count_rows(pool: &sqlx::PgPool) -> sqlx::Result<i64> {
    sqlx::query_scalar!(r#"SELECT count(*) AS "n!" FROM decisions"#)
        .fetch_one(pool)
        .await
}

/// How many decisions have `status`.
pub async fn count_with_status(pool: &sqlx::PgPool, status: &str) -> sqlx::Result<i64> {
    sqlx::query_scalar!(
        r#"SELECT count(*) AS "n!" FROM decisions WHERE status = $1"#,
        status
    )
    .fetch_one(pool)
    .await
}

/// How many decisions are `calling` the model, and the duplicate deliveries of all receipts.
pub async fn calling_and_duplicates(pool: &sqlx::PgPool) -> sqlx::Result<(i64, i64)> {
    sqlx::query!(
        r#"SELECT (SELECT count(*) FROM decisions WHERE status = 'calling') AS "calling!",
                  (SELECT coalesce(sum(duplicate_deliveries), 0)::bigint FROM event_receipts) AS "duplicates!""#
    )
    .fetch_one(pool)
    .await
    .map(|r| (r.calling, r.duplicates))
}

/// The first decision's status and its reason.
pub async fn first_status_and_reason(
    pool: &sqlx::PgPool,
) -> sqlx::Result<(String, Option<String>)> {
    sqlx::query!("SELECT status, status_reason FROM decisions")
        .fetch_one(pool)
        .await
        .map(|r| (r.status, r.status_reason))
}

/// The status of a decision (the only one, in a test that makes one).
pub async fn any_decision_status(pool: &sqlx::PgPool) -> sqlx::Result<String> {
    sqlx::query_scalar!("SELECT status FROM decisions")
        .fetch_one(pool)
        .await
}

/// The id of a decision with the status `status`, if any.
pub async fn decision_id_with_status(
    pool: &sqlx::PgPool,
    status: &str,
) -> sqlx::Result<Option<uuid::Uuid>> {
    sqlx::query_scalar!("SELECT id FROM decisions WHERE status = $1", status)
        .fetch_optional(pool)
        .await
}

/// The review reasons of the decision `id`.
pub async fn review_reasons(pool: &sqlx::PgPool, id: uuid::Uuid) -> sqlx::Result<Vec<String>> {
    sqlx::query_scalar!("SELECT review_reasons FROM decisions WHERE id = $1", id)
        .fetch_one(pool)
        .await
}

/// The status of the decision on the message `source_ts`, and whether its turn is answered.
pub async fn status_and_turn_answered(
    pool: &sqlx::PgPool,
    source_ts: &str,
) -> sqlx::Result<(String, bool)> {
    let r = sqlx::query!(
        r#"SELECT d.status, t.answered_at IS NOT NULL AS "answered!" FROM decisions d
             JOIN turns t ON t.installation_id = d.installation_id AND t.channel_id = d.channel_id AND t.ts = d.source_ts
            WHERE d.source_ts = $1"#,
        source_ts
    )
    .fetch_one(pool)
    .await?;
    Ok((r.status, r.answered))
}

/// A decision as [`insert_decision_with_status`] writes it (on its thread's root message).
#[derive(Debug, Clone)]
pub struct DecisionRow<'a> {
    pub id: uuid::Uuid,
    pub receipt_id: uuid::Uuid,
    pub installation_id: uuid::Uuid,
    pub event_id: &'a str,
    pub channel_id: &'a str,
    /// Both the thread's root and the message decided on.
    pub ts: &'a str,
    pub thread_version: i64,
    pub status: &'a str,
    pub status_reason: Option<&'a str>,
}

/// Inserts a decision with the status and reason given, bypassing the claim.
pub async fn insert_decision_with_status(
    pool: &sqlx::PgPool,
    d: &DecisionRow<'_>,
) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO decisions (id, receipt_id, installation_id, event_id, channel_id, root_ts, source_ts, thread_version,
                                status, status_reason)
         VALUES ($1, $2, $3, $4, $5, $6, $6, $7, $8, $9)",
        d.id,
        d.receipt_id,
        d.installation_id,
        d.event_id,
        d.channel_id,
        d.ts,
        d.thread_version,
        d.status,
        d.status_reason
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Decision statuses of the thread `root_ts`, oldest first.
pub async fn decision_statuses_of_thread(
    pool: &sqlx::PgPool,
    root_ts: &str,
) -> sqlx::Result<Vec<String>> {
    sqlx::query_scalar!(
        "SELECT status FROM decisions WHERE root_ts = $1 ORDER BY created_at",
        root_ts
    )
    .fetch_all(pool)
    .await
}

/// How many decisions of the thread `root_ts` have the status `status`.
pub async fn count_thread_decisions_with_status(
    pool: &sqlx::PgPool,
    root_ts: &str,
    status: &str,
) -> sqlx::Result<i64> {
    sqlx::query_scalar!(
        r#"SELECT count(*) AS "n!" FROM decisions WHERE root_ts = $1 AND status = $2"#,
        root_ts,
        status
    )
    .fetch_one(pool)
    .await
}

/// How many decisions the thread `root_ts` has.
pub async fn count_thread_decisions(pool: &sqlx::PgPool, root_ts: &str) -> sqlx::Result<i64> {
    sqlx::query_scalar!(
        r#"SELECT count(*) AS "n!" FROM decisions WHERE root_ts = $1"#,
        root_ts
    )
    .fetch_one(pool)
    .await
}

/// How many decisions were made on the message `source_ts`.
pub async fn count_decisions_of_message(pool: &sqlx::PgPool, source_ts: &str) -> sqlx::Result<i64> {
    sqlx::query_scalar!(
        r#"SELECT count(*) AS "n!" FROM decisions WHERE source_ts = $1"#,
        source_ts
    )
    .fetch_one(pool)
    .await
}

/// How many thread versions the decisions of the thread `root_ts` were made at.
pub async fn count_thread_versions(pool: &sqlx::PgPool, root_ts: &str) -> sqlx::Result<i64> {
    sqlx::query_scalar!(
        r#"SELECT count(DISTINCT thread_version) AS "n!" FROM decisions WHERE root_ts = $1"#,
        root_ts
    )
    .fetch_one(pool)
    .await
}

/// The thread `root_ts`'s open work (decisions not final, intents not settled, receipts not finished) and its decisions in all.
pub async fn thread_open_work(pool: &sqlx::PgPool, root_ts: &str) -> sqlx::Result<(i64, i64)> {
    let r = sqlx::query!(
        r#"SELECT (SELECT count(*) FROM decisions WHERE root_ts = $1 AND status IN ('calling', 'proposed', 'approved'))
                + (SELECT count(*) FROM reply_intents WHERE root_ts = $1 AND state IN ('pending', 'sending', 'unknown', 'reconciling', 'failed_retryable'))
                + (SELECT count(*) FROM event_receipts WHERE (message_ts = $1 OR thread_ts = $1) AND state IN ('accepted', 'processing')) AS "open!",
                  (SELECT count(*) FROM decisions WHERE root_ts = $1) AS "decisions!""#,
        root_ts
    )
    .fetch_one(pool)
    .await?;
    Ok((r.open, r.decisions))
}

/// Why the question `ts` in `channel_id` has no reply, as an operator sees it: its reply held or failed with a code, its latest decision discarded with a reason, or its event ignored or failed.
pub async fn question_outcome_reason(
    pool: &sqlx::PgPool,
    channel_id: &str,
    ts: &str,
) -> sqlx::Result<Option<String>> {
    sqlx::query_scalar!(
        r#"SELECT reason AS "reason!" FROM (
              SELECT 'reply ' || i.state || ':' || i.error_code AS reason, 0 AS rank
                FROM reply_intents i JOIN decisions d ON d.id = i.decision_id
               WHERE d.channel_id = $1 AND d.source_ts = $2
                 AND i.state IN ('held', 'failed_permanent') AND i.error_code IS NOT NULL
              UNION ALL
              SELECT 'decision ' || l.status || ':' || coalesce(l.status_reason, '-'), 1
                FROM (SELECT status, status_reason FROM decisions
                       WHERE channel_id = $1 AND source_ts = $2
                       ORDER BY created_at DESC LIMIT 1) l
               WHERE l.status IN ('suppressed', 'cancelled', 'rejected', 'review')
              UNION ALL
              SELECT 'event ' || r.state || ':' || coalesce(r.state_reason, '-'), 2
                FROM event_receipts r
               WHERE r.channel_id = $1 AND r.message_ts = $2 AND r.state IN ('ignored', 'failed', 'unparsed')
                 AND r.state_reason IS DISTINCT FROM 'duplicate_turn'
                 -- the question's message itself, not an edit or deletion of it
                 AND coalesce(r.event_subtype, '') NOT IN ('message_changed', 'message_deleted')) x
           ORDER BY rank LIMIT 1"#,
        channel_id,
        ts
    )
    .fetch_optional(pool)
    .await
}

/// A decision or reply intent stuck in a state that is neither final nor explained.
#[derive(Debug, Clone)]
pub struct StuckWork {
    /// `decision <id>` or `reply intent <id> (<code>, attempts <n>, decision <id>)`.
    pub what: String,
    pub state: String,
    pub root_ts: String,
}

/// Decisions not final (unless waiting on an intent held with a code) and reply intents not settled (or held or failed without a code).
pub async fn stuck_work(pool: &sqlx::PgPool) -> sqlx::Result<Vec<StuckWork>> {
    sqlx::query_as!(
        StuckWork,
        r#"SELECT 'decision ' || d.id AS "what!", d.status AS "state!", d.root_ts AS "root_ts!" FROM decisions d
            WHERE d.status IN ('calling', 'proposed', 'approved')
              -- waiting on an intent held for an operator is a visible reason
              AND NOT EXISTS (SELECT 1 FROM reply_intents i
                               WHERE i.installation_id = d.installation_id AND i.event_id = d.event_id
                                 AND i.state = 'held' AND i.error_code IS NOT NULL)
           UNION ALL
           SELECT 'reply intent ' || id || ' (' || coalesce(error_code, '-') || ', attempts ' || attempts
                  || ', decision ' || decision_id || ')', state, root_ts FROM reply_intents
            WHERE state IN ('pending', 'sending', 'unknown', 'reconciling', 'failed_retryable')
               OR (state IN ('held', 'failed_permanent') AND error_code IS NULL)"#
    )
    .fetch_all(pool)
    .await
}

/// Who reviewed a decision (`None`: nobody yet).
pub async fn reviewed_by(pool: &sqlx::PgPool, id: uuid::Uuid) -> sqlx::Result<Option<String>> {
    sqlx::query_scalar!("SELECT reviewed_by FROM decisions WHERE id = $1", id)
        .fetch_one(pool)
        .await
}

/// What threadline recorded of decision `id`'s review request, as one
/// line: the decision's status and reason, the request's state, attempt,
/// ts, error and the outcome it was last shown (for a soak's report).
pub async fn review_request_record(pool: &sqlx::PgPool, id: uuid::Uuid) -> sqlx::Result<String> {
    let r = sqlx::query!(
        r#"SELECT d.status, d.status_reason, r.state AS "state?", r.attempt AS "attempt?",
                  r.ts, r.error_code, r.shown
             FROM decisions d LEFT JOIN review_messages r ON r.decision_id = d.id
            WHERE d.id = $1"#,
        id
    )
    .fetch_optional(pool)
    .await?;
    Ok(match r {
        None => "no such decision".to_owned(),
        Some(r) => format!(
            "decision {} ({}); request {} attempt {} ts {} error {} shown {}",
            r.status,
            r.status_reason.unwrap_or_default(),
            r.state.unwrap_or_else(|| "none".into()),
            r.attempt.unwrap_or(0),
            r.ts.unwrap_or_else(|| "none".into()),
            r.error_code.unwrap_or_else(|| "none".into()),
            r.shown.unwrap_or_else(|| "none".into()),
        ),
    })
}
