//! Streamed answers: the text inference releases while the model runs, and
//! the reply intent of a stream (`sending → streaming → sent |
//! interrupted`, migration 0020). The claim, the budgets and the record of
//! the finished answer are the ones every post uses ([`crate::intents`]).

use sqlx::PgPool;
use threadline_domain::kill_switch::feature_of;
use threadline_domain::state::{DecisionStatus, IntentState, Machine as _};
use uuid::Uuid;

use crate::intents::{Claimed, Proposal};
use crate::moves;

/// Stores the answer's text released so far (escaped, a prefix of the
/// final body) while the decision is still being called; false when it is
/// not any more (settled, or ended by the publisher because the thread
/// moved on): the model call may stop.
pub async fn release_text(
    pool: &PgPool,
    decision: Uuid,
    text: &str,
    label: &str,
) -> sqlx::Result<bool> {
    let r = sqlx::query!(
        "UPDATE decisions SET stream_text = $2, stream_label = $4 WHERE id = $1 AND status = $3",
        decision,
        text,
        DecisionStatus::Calling.as_str(),
        label,
    )
    .execute(pool)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// Whether answers may be streamed in `channel`: its setting, else the
/// installation's, else yes.
pub async fn allowed(pool: &PgPool, installation: Uuid, channel: &str) -> sqlx::Result<bool> {
    sqlx::query_scalar!(
        r#"SELECT coalesce((SELECT c.streaming_allowed FROM channel_policies c
                             WHERE c.installation_id = $1 AND c.channel_id = $2),
                           (SELECT p.streaming_allowed FROM installation_policies p
                             WHERE p.installation_id = $1),
                           true) AS "allowed!""#,
        installation,
        channel,
    )
    .fetch_one(pool)
    .await
}

/// Who a stream is for: Slack asks for the recipient of a stream in a
/// channel (the person who asked, and their team).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recipient {
    pub user: Option<String>,
    pub team: Option<String>,
}

pub async fn recipient(
    pool: &PgPool,
    installation: Uuid,
    channel: &str,
    source_ts: &str,
) -> sqlx::Result<Recipient> {
    let r = sqlx::query!(
        r#"SELECT (SELECT m.user_id FROM thread_messages m
                    WHERE m.installation_id = $1 AND m.channel_id = $2 AND m.ts = $3) AS "user?",
                  (SELECT i.team_id FROM installations i WHERE i.id = $1) AS "team?""#,
        installation,
        channel,
        source_ts,
    )
    .fetch_one(pool)
    .await?;
    Ok(Recipient {
        user: r.user,
        team: r.team,
    })
}

/// The start is about to be sent: the intent is marked as streamed (never
/// streamed again; an unknown outcome is looked for as a stream).
pub async fn starting(pool: &PgPool, c: &Claimed) -> sqlx::Result<bool> {
    let r = sqlx::query!(
        "UPDATE reply_intents SET streamed = true, stream_attempt = attempts, updated_at = now()
          WHERE id = $1 AND attempts = $2 AND state = $3",
        c.id,
        c.attempt,
        IntentState::Sending.as_str(),
    )
    .execute(pool)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// Whether the intent's current attempt is the one that started, or tried
/// to start, a stream (then its unknown outcome is looked for as a
/// stream; a later attempt's is a post's).
pub async fn streamed(pool: &PgPool, intent: Uuid) -> sqlx::Result<bool> {
    Ok(sqlx::query_scalar!(
        r#"SELECT (streamed AND stream_attempt = attempts) AS "current!" FROM reply_intents WHERE id = $1"#,
        intent
    )
    .fetch_optional(pool)
    .await?
    .unwrap_or(false))
}

/// The AI label of the decision an intent names (its settled blocks', else
/// the one inference wrote with the stream's first words).
pub async fn label_of(pool: &PgPool, intent: Uuid) -> sqlx::Result<Option<String>> {
    Ok(sqlx::query_scalar!(
        r#"SELECT coalesce(d.body_blocks -> 1 -> 'elements' -> 0 ->> 'text', d.stream_label) AS "label?"
             FROM reply_intents r JOIN decisions d ON d.id = r.decision_id WHERE r.id = $1"#,
        intent
    )
    .fetch_optional(pool)
    .await?
    .flatten())
}

/// A stream reconciliation found in Slack as the stream `ts`: one an
/// unknown start created (then ended by the caller, never continued), or
/// one already ended with its closing line: `unknown | reconciling →
/// interrupted`, with why.
pub async fn found_ended(
    pool: &PgPool,
    intent: Uuid,
    ts: &str,
    reason: &str,
) -> sqlx::Result<bool> {
    let r = sqlx::query!(
        "UPDATE reply_intents SET state = $2, stream_ts = $3, interrupted_reason = $5,
                unknown_since = NULL, reconcile_reads = 0, updated_at = now()
          WHERE id = $1 AND state = ANY($4) AND streamed AND stream_attempt = attempts",
        intent,
        IntentState::Interrupted.as_str(),
        ts,
        &moves(
            &[IntentState::Unknown, IntentState::Reconciling],
            IntentState::Interrupted
        ),
        reason,
    )
    .execute(pool)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// Slack started the stream: `sending → streaming`, with its ts, unless
/// another attempt took the intent over meanwhile.
pub async fn started(pool: &PgPool, c: &Claimed, stream_ts: &str) -> sqlx::Result<bool> {
    let r = sqlx::query!(
        "UPDATE reply_intents SET state = $3, stream_ts = $4, error_code = NULL, updated_at = now()
          WHERE id = $1 AND attempts = $2 AND state = ANY($5)",
        c.id,
        c.attempt,
        IntentState::Streaming.as_str(),
        stream_ts,
        &moves(&[IntentState::Sending], IntentState::Streaming),
    )
    .execute(pool)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// What the publisher streaming an answer sees at each step.
#[derive(Debug, Clone, PartialEq)]
pub struct Tick {
    /// The intent is still this attempt's stream (its age refreshed).
    pub mine: bool,
    pub version: Option<i64>,
    pub source_deleted: bool,
    pub switch: Option<String>,
    pub installation_active: bool,
    pub decision_status: String,
    /// Released so far while the model runs.
    pub released: Option<String>,
    /// The settled answer's body (escaped, without the label).
    pub body: Option<String>,
    /// The AI label the stream ends with.
    pub label: Option<String>,
    /// The settled answer's hash (its reconciliation evidence).
    pub output_hash: Option<String>,
    pub review_reasons: Vec<String>,
    /// Something in the thread accepted and not processed yet (it may
    /// change the thread): the answer does not finish before it is.
    pub pending: bool,
}

/// One statement per step of a stream: keeps the stream's intent fresh (a
/// stream whose publisher died is seen by its age) and reads what decides
/// whether it goes on: the thread's version, the source, kill switches,
/// the installation, and the decision with its text.
pub async fn tick(pool: &PgPool, p: &Proposal<'_>, c: &Claimed) -> sqlx::Result<Tick> {
    let r = sqlx::query!(
        r#"WITH fresh AS (
            UPDATE reply_intents SET updated_at = now()
             WHERE id = $6 AND attempts = $7 AND state = $8
            RETURNING id)
         SELECT EXISTS (SELECT 1 FROM fresh) AS "mine!",
                (SELECT version FROM threads WHERE installation_id = $1 AND channel_id = $2 AND root_ts = $3)
                    AS "version?",
                (SELECT coalesce(bool_or(deleted), false) FROM thread_messages
                  WHERE installation_id = $1 AND channel_id = $2 AND ts = $4) AS "deleted!",
                (SELECT e.switch FROM engaged_switch($1::text, $9) e) AS "switch?",
                (SELECT p.age FROM pending_receipt_age($1, $2, $3, $10, $4) p) IS NOT NULL AS "pending!",
                coalesce((SELECT i.status = 'active' FROM installations i WHERE i.id = $1), false) AS "active!",
                d.status, d.stream_text, d.body_blocks -> 0 -> 'text' ->> 'text' AS "body?",
                coalesce(d.body_blocks -> 1 -> 'elements' -> 0 ->> 'text', d.stream_label) AS "label?",
                d.output_hash, d.review_reasons
           FROM decisions d WHERE d.id = $5"#,
        p.installation,
        p.channel,
        p.root_ts,
        p.source_ts,
        p.decision,
        c.id,
        c.attempt,
        IntentState::Streaming.as_str(),
        feature_of(p.action_kind),
        p.receipt,
    )
    .fetch_one(pool)
    .await?;
    Ok(Tick {
        mine: r.mine,
        version: r.version,
        source_deleted: r.deleted,
        switch: r.switch,
        installation_active: r.active,
        decision_status: r.status,
        released: r.stream_text,
        body: r.body,
        label: r.label,
        output_hash: r.output_hash,
        review_reasons: r.review_reasons,
        pending: r.pending,
    })
}

/// The stream was ended early with a closing line: `streaming →
/// interrupted`, with why. Any attempt's stream (a stream whose publisher
/// died is ended by another).
pub async fn interrupted(pool: &PgPool, intent: Uuid, reason: &str) -> sqlx::Result<bool> {
    let r = sqlx::query!(
        "UPDATE reply_intents SET state = $2, interrupted_reason = $3, updated_at = now()
          WHERE id = $1 AND state = ANY($4)",
        intent,
        IntentState::Interrupted.as_str(),
        reason,
        &moves(&[IntentState::Streaming], IntentState::Interrupted),
    )
    .execute(pool)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// A stream whose end its publisher could not see (a stop whose answer
/// was lost, a stream another publisher or Slack had ended): `streaming →
/// unknown`, reconciled from what Slack shows (its metadata says whether
/// it stopped with the whole answer or with a closing line).
pub async fn to_unknown(pool: &PgPool, intent: Uuid, code: &str) -> sqlx::Result<bool> {
    let r = sqlx::query!(
        "UPDATE reply_intents SET state = $2, error_code = $3, unknown_since = now(), ever_unknown = true,
                updated_at = now()
          WHERE id = $1 AND state = ANY($4)",
        intent,
        IntentState::Unknown.as_str(),
        code,
        &moves(&[IntentState::Streaming], IntentState::Unknown),
    )
    .execute(pool)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// Takes over a stream whose publisher stopped driving it (no step for
/// `stale` seconds): a new attempt, so that its old publisher, should it
/// wake, finds the stream no longer its own. False: it is driven again, or
/// another took it.
pub async fn take_orphan(pool: &PgPool, intent: Uuid, stale: f64) -> sqlx::Result<bool> {
    let r = sqlx::query!(
        "UPDATE reply_intents SET attempts = attempts + 1, updated_at = now()
          WHERE id = $1 AND state = $2 AND updated_at < now() - make_interval(secs => $3)",
        intent,
        IntentState::Streaming.as_str(),
        stale,
    )
    .execute(pool)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// A stream whose publisher stopped driving it: `streaming` for longer
/// than `stale` seconds without a step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Orphan {
    pub intent: Uuid,
    pub installation: Uuid,
    pub channel: String,
    pub stream_ts: String,
    pub decision: Uuid,
    /// The AI label its answer carries.
    pub label: Option<String>,
}

/// The event's stream intent if its publisher stopped driving it.
pub async fn orphan_of(
    pool: &PgPool,
    installation: Uuid,
    event_id: &str,
    action_kind: &str,
    stale: f64,
) -> sqlx::Result<Option<Orphan>> {
    sqlx::query_as!(
        Orphan,
        r#"SELECT r.id AS intent, r.installation_id AS installation, r.channel_id AS channel,
                  r.stream_ts AS "stream_ts!", r.decision_id AS decision,
                  (SELECT coalesce(d.body_blocks -> 1 -> 'elements' -> 0 ->> 'text', d.stream_label)
                     FROM decisions d WHERE d.id = r.decision_id) AS "label?"
             FROM reply_intents r
            WHERE r.installation_id = $1 AND r.event_id = $2 AND r.action_kind = $3 AND r.state = $4
              AND r.stream_ts IS NOT NULL AND r.updated_at < now() - make_interval(secs => $5)"#,
        installation,
        event_id,
        action_kind,
        IntentState::Streaming.as_str(),
        stale,
    )
    .fetch_optional(pool)
    .await
}

/// Every stream whose publisher stopped driving it (the sweeper's list).
pub async fn orphans(pool: &PgPool, stale: f64, limit: i64) -> sqlx::Result<Vec<Orphan>> {
    sqlx::query_as!(
        Orphan,
        r#"SELECT r.id AS intent, r.installation_id AS installation, r.channel_id AS channel,
                  r.stream_ts AS "stream_ts!", r.decision_id AS decision,
                  (SELECT coalesce(d.body_blocks -> 1 -> 'elements' -> 0 ->> 'text', d.stream_label)
                     FROM decisions d WHERE d.id = r.decision_id) AS "label?"
             FROM reply_intents r
            WHERE r.state = $1 AND r.stream_ts IS NOT NULL
              AND r.updated_at < now() - make_interval(secs => $2)
            ORDER BY r.updated_at LIMIT $3"#,
        IntentState::Streaming.as_str(),
        stale,
        limit,
    )
    .fetch_all(pool)
    .await
}
