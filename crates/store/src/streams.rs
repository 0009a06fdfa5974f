//! Streamed answers: the text inference releases while the model runs, and
//! the reply intent of a stream (`sending → streaming → sent`, or `→
//! ending → interrupted` once Slack confirmed its early stop; migrations
//! 0020 and 0025). The claim, the budgets, the record of the finished
//! answer and reconciliation are the ones every post uses
//! ([`crate::intents`]).

use sqlx::PgPool;
use threadline_domain::kill_switch::feature_of;
use threadline_domain::state::{DecisionStatus, IntentState, Machine as _};
use uuid::Uuid;

use threadline_domain::reply::Ending;
use threadline_domain::sources::Source;

use crate::intents::{Claimed, Proposal};
use crate::moves;

/// Stores the answer's text released so far (escaped, a prefix of the
/// final body) while the decision is still being called; false when it is
/// not any more (another holder settled it): the model call may stop.
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

/// Whether the decision is still being called (nobody settled nor discarded
/// it): a streamed answer held back from release looks by this whether its
/// model call is still wanted.
pub async fn calling(pool: &PgPool, decision: Uuid) -> sqlx::Result<bool> {
    sqlx::query_scalar!(
        r#"SELECT EXISTS (SELECT 1 FROM decisions WHERE id = $1 AND status = $2) AS "calling!""#,
        decision,
        DecisionStatus::Calling.as_str()
    )
    .fetch_one(pool)
    .await
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
        "UPDATE reply_intents SET streamed = true, stream_attempt = attempts, stream_started_at = now(),
                updated_at = now()
          WHERE id = $1 AND attempts = $2 AND state = $3",
        c.id,
        c.attempt,
        IntentState::Sending.as_str(),
    )
    .execute(pool)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// What a stream of an intent whose outcome is unknown may look like in
/// Slack (its current attempt is the one that streamed, or tried to; a
/// later attempt's is a post's, reconciled like any post).
#[derive(Debug, Clone, PartialEq)]
pub enum StreamEvidence {
    /// Its stream's ts is known (recorded when Slack started it, or when
    /// reconciliation found it).
    Known(String),
    /// Its start's outcome is unknown: sent at this time (unix seconds).
    Start { sent_at: f64 },
}

pub async fn stream_evidence(pool: &PgPool, intent: Uuid) -> sqlx::Result<Option<StreamEvidence>> {
    let r = sqlx::query!(
        r#"SELECT stream_ts, extract(epoch FROM stream_started_at)::float8 AS "sent_at?",
                  (streamed AND stream_attempt = attempts) AS "current!"
             FROM reply_intents WHERE id = $1"#,
        intent
    )
    .fetch_optional(pool)
    .await?;
    Ok(r.filter(|r| r.current)
        .and_then(|r| match (r.stream_ts, r.sent_at) {
            (Some(ts), _) => Some(StreamEvidence::Known(ts)),
            (None, Some(sent_at)) => Some(StreamEvidence::Start { sent_at }),
            (None, None) => None,
        }))
}

/// When the stream starts of the thread's other intents whose outcome is
/// not known yet were sent (unix seconds): a stream made around then may
/// be theirs.
pub async fn rival_starts(
    pool: &PgPool,
    installation: Uuid,
    channel: &str,
    root_ts: &str,
    intent: Uuid,
) -> sqlx::Result<Vec<f64>> {
    sqlx::query_scalar!(
        r#"SELECT extract(epoch FROM stream_started_at)::float8 AS "sent_at!" FROM reply_intents
            WHERE installation_id = $1 AND channel_id = $2 AND root_ts = $3 AND id <> $4
              AND streamed AND stream_attempt = attempts AND stream_ts IS NULL
              AND stream_started_at IS NOT NULL AND state = ANY($5)"#,
        installation,
        channel,
        root_ts,
        intent,
        &[
            IntentState::Sending.as_str(),
            IntentState::Unknown.as_str(),
            IntentState::Reconciling.as_str(),
        ] as &[&str],
    )
    .fetch_all(pool)
    .await
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

/// Slack shows the intent's stream ended without the answer (our stop
/// with its closing line landed, it was ended unclaimed, it expired or was
/// deleted, or no stream shows anything of an unknown start): `unknown |
/// reconciling | ending → interrupted`, with why (and its ts when seen).
pub async fn ended_in_slack(
    pool: &PgPool,
    intent: Uuid,
    ts: Option<&str>,
    reason: &str,
) -> sqlx::Result<bool> {
    let r = sqlx::query!(
        "UPDATE reply_intents SET state = $2, stream_ts = coalesce($3, stream_ts),
                interrupted_reason = coalesce(end_reason, $5), end_reason = NULL,
                unknown_since = NULL, reconcile_reads = 0, updated_at = now()
          WHERE id = $1 AND state = ANY($4) AND streamed",
        intent,
        IntentState::Interrupted.as_str(),
        ts,
        &moves(
            &[
                IntentState::Unknown,
                IntentState::Reconciling,
                IntentState::Ending
            ],
            IntentState::Interrupted
        ),
        reason,
    )
    .execute(pool)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// Reconciliation found the intent's stream still open (its known one, or
/// the one its unknown start made, `ts`): it must be ended, `→ ending`.
pub async fn found_open(pool: &PgPool, intent: Uuid, ts: &str) -> sqlx::Result<bool> {
    let r = sqlx::query!(
        "UPDATE reply_intents SET state = $2, stream_ts = $3, end_reason = coalesce(end_reason, $4),
                next_attempt_at = now(), unknown_since = NULL, reconcile_reads = 0, updated_at = now()
          WHERE id = $1 AND state = ANY($5) AND streamed",
        intent,
        IntentState::Ending.as_str(),
        ts,
        Ending::Interrupted.reason(),
        &moves(
            &[IntentState::Unknown, IntentState::Reconciling],
            IntentState::Ending
        ),
    )
    .execute(pool)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// A stream of the intent's unknown start, stopped by the person, is its
/// stream (recorded before it is recorded as the answer).
pub async fn adopt(pool: &PgPool, intent: Uuid, ts: &str) -> sqlx::Result<bool> {
    let r = sqlx::query!(
        "UPDATE reply_intents SET stream_ts = $2, updated_at = now()
          WHERE id = $1 AND streamed AND stream_ts IS NULL",
        intent,
        ts,
    )
    .execute(pool)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// Slack started the stream: `sending → streaming`, with its ts, unless
/// another attempt took the intent over meanwhile. From now on it may show
/// some of the answer (whoever ends it without knowing closes it after a
/// blank line; its own publisher knows).
pub async fn started(pool: &PgPool, c: &Claimed, stream_ts: &str) -> sqlx::Result<bool> {
    let r = sqlx::query!(
        "UPDATE reply_intents SET state = $3, stream_ts = $4, stream_shown = true, error_code = NULL,
                updated_at = now()
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
    pub decision_status: DecisionStatus,
    /// Released so far while the model runs.
    pub released: Option<String>,
    /// The settled answer's body (escaped, without the label).
    pub body: Option<String>,
    /// The AI label the stream ends with.
    pub label: Option<String>,
    /// The settled answer's hash (its reconciliation evidence).
    pub output_hash: Option<String>,
    /// The links the settled answer took from what it read, shown on the
    /// writing step of the stop.
    pub sources: Vec<Source>,
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
    tick_as(pool, p, c.id, Some(c.attempt), IntentState::Streaming).await
}

/// [`tick`] for whoever holds the intent in `state` (`attempt`: its
/// attempt, when the holder is one): the checks an expired stream's update
/// goes through, held by a reconciliation (`reconciling`) or a stop
/// (`ending`). `mine`: the intent is still in `state`.
pub async fn tick_as(
    pool: &PgPool,
    p: &Proposal<'_>,
    intent: Uuid,
    attempt: Option<i32>,
    state: IntentState,
) -> sqlx::Result<Tick> {
    let r = sqlx::query!(
        r#"WITH fresh AS (
            UPDATE reply_intents SET updated_at = now()
             WHERE id = $6 AND ($7::int4 IS NULL OR attempts = $7) AND state = $8
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
                d.output_hash, d.review_reasons, d.sources
           FROM decisions d WHERE d.id = $5"#,
        p.installation,
        p.channel,
        p.root_ts,
        p.source_ts,
        p.decision,
        intent,
        attempt,
        state.as_str(),
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
        decision_status: DecisionStatus::parse(&r.status)
            .map_err(|e| sqlx::Error::Decode(format!("decisions.status: {e}").into()))?,
        released: r.stream_text,
        body: r.body,
        label: r.label,
        output_hash: r.output_hash,
        sources: r.sources.iter().filter_map(|u| Source::parse(u)).collect(),
        review_reasons: r.review_reasons,
        pending: r.pending,
    })
}

/// Slack confirmed the stream's stop with its closing line: `streaming |
/// ending → interrupted`, with why. Any attempt's stream (a stream whose
/// publisher died is ended by another).
pub async fn interrupted(pool: &PgPool, intent: Uuid, ending: Ending) -> sqlx::Result<bool> {
    let r = sqlx::query!(
        "UPDATE reply_intents SET state = $2, interrupted_reason = $3, end_reason = NULL, updated_at = now()
          WHERE id = $1 AND state = ANY($4)",
        intent,
        IntentState::Interrupted.as_str(),
        ending.reason(),
        &moves(
            &[IntentState::Streaming, IntentState::Ending],
            IntentState::Interrupted
        ),
    )
    .execute(pool)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// The intent's stream must stop before the whole answer (`ending`, with
/// why; the first reason given stays): `streaming | unknown | reconciling
/// | ending → ending`, due again after `due_in` seconds (Slack's
/// Retry-After after a refused stop). Whoever finds it due stops it.
pub async fn to_ending(
    pool: &PgPool,
    intent: Uuid,
    ending: Ending,
    due_in: f64,
) -> sqlx::Result<bool> {
    let r = sqlx::query!(
        "UPDATE reply_intents SET state = $2, end_reason = coalesce(end_reason, $3),
                next_attempt_at = now() + make_interval(secs => $4), updated_at = now()
          WHERE id = $1 AND state = ANY($5) AND stream_ts IS NOT NULL",
        intent,
        IntentState::Ending.as_str(),
        ending.reason(),
        due_in,
        &moves(
            &[
                IntentState::Streaming,
                IntentState::Unknown,
                IntentState::Reconciling,
                IntentState::Ending
            ],
            IntentState::Ending
        ),
    )
    .execute(pool)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// A stream to stop: the intent, where its stream is, why, and what to
/// close it with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToEnd {
    pub intent: Uuid,
    pub installation: Uuid,
    pub channel: String,
    pub root_ts: String,
    pub stream_ts: String,
    pub ending: Ending,
    /// It shows some of the answer (the closing line follows a blank line).
    pub shown: bool,
    /// The AI label its answer carries.
    pub label: Option<String>,
}

struct ToEndRow {
    intent: Uuid,
    installation: Uuid,
    channel: String,
    root_ts: String,
    stream_ts: Option<String>,
    end_reason: Option<String>,
    shown: bool,
    label: Option<String>,
}

impl ToEndRow {
    fn into_to_end(self) -> Option<ToEnd> {
        Some(ToEnd {
            intent: self.intent,
            installation: self.installation,
            channel: self.channel,
            root_ts: self.root_ts,
            stream_ts: self.stream_ts?,
            ending: Ending::of_reason(self.end_reason.as_deref().unwrap_or_default()),
            shown: self.shown,
            label: self.label,
        })
    }
}

/// Streams due to be stopped (`ending` and due), at most `limit`, each
/// leased for `lease` seconds so that replicas share them (rows another
/// sweeper holds are skipped).
pub async fn due_endings(pool: &PgPool, lease: f64, limit: i64) -> sqlx::Result<Vec<ToEnd>> {
    let rows = sqlx::query_as!(
        ToEndRow,
        r#"WITH due AS (
            SELECT id FROM reply_intents
             WHERE state = $1 AND next_attempt_at <= now()
             ORDER BY next_attempt_at LIMIT $3
               FOR UPDATE SKIP LOCKED)
         UPDATE reply_intents r SET next_attempt_at = now() + make_interval(secs => $2)
           FROM due WHERE r.id = due.id
         RETURNING r.id AS intent, r.installation_id AS installation, r.channel_id AS channel, r.root_ts,
                   r.stream_ts, r.end_reason, r.stream_shown AS shown,
                   (SELECT coalesce(d.body_blocks -> 1 -> 'elements' -> 0 ->> 'text', d.stream_label)
                      FROM decisions d WHERE d.id = r.decision_id) AS "label?""#,
        IntentState::Ending.as_str(),
        lease,
        limit,
    )
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().filter_map(ToEndRow::into_to_end).collect())
}

/// The intent's stream to stop, if it is `ending` and due now (leased for
/// `lease` seconds, as [`due_endings`] leases).
pub async fn due_ending(pool: &PgPool, intent: Uuid, lease: f64) -> sqlx::Result<Option<ToEnd>> {
    let row = sqlx::query_as!(
        ToEndRow,
        r#"UPDATE reply_intents r SET next_attempt_at = now() + make_interval(secs => $3)
            WHERE r.id = $1 AND r.state = $2 AND r.next_attempt_at <= now()
         RETURNING r.id AS intent, r.installation_id AS installation, r.channel_id AS channel, r.root_ts,
                   r.stream_ts, r.end_reason, r.stream_shown AS shown,
                   (SELECT coalesce(d.body_blocks -> 1 -> 'elements' -> 0 ->> 'text', d.stream_label)
                      FROM decisions d WHERE d.id = r.decision_id) AS "label?""#,
        intent,
        IntentState::Ending.as_str(),
        lease,
    )
    .fetch_optional(pool)
    .await?;
    Ok(row.and_then(ToEndRow::into_to_end))
}

/// A stream whose end its publisher could not see (a stop whose answer
/// was lost, a stream another publisher or Slack had ended), or an expired
/// stream's update whose outcome is not known: `streaming | reconciling →
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
        &moves(
            &[IntentState::Streaming, IntentState::Reconciling],
            IntentState::Unknown
        ),
    )
    .execute(pool)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// Takes over a stream whose publisher stopped driving it (no step for
/// `stale` seconds): it must end (`streaming → ending`, due now), so that
/// its old publisher, should it wake, finds it no longer its own
/// (`streaming`) and another sweeper finds it taken. False: it is driven
/// again, or another took it.
pub async fn take_orphan(pool: &PgPool, intent: Uuid, stale: f64) -> sqlx::Result<bool> {
    let r = sqlx::query!(
        "UPDATE reply_intents SET state = $3, end_reason = coalesce(end_reason, $4),
                next_attempt_at = now(), updated_at = now()
          WHERE id = $1 AND state = $2 AND updated_at < now() - make_interval(secs => $5)",
        intent,
        IntentState::Streaming.as_str(),
        IntentState::Ending.as_str(),
        Ending::Interrupted.reason(),
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
