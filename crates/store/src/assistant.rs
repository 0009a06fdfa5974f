//! The assistant pane: a person's thread with the app in their DM, recorded
//! from `assistant_thread_started` and kept current by
//! `assistant_thread_context_changed` (identifiers only), and the greeting
//! (suggested prompts, a title) the publisher shows when it opens.

use prost::Message as _;
use sqlx::PgPool;
use threadline_domain::thinking::Stage;
use threadline_proto::v1::{ProposalReady, SCHEMA_VERSION};
use uuid::Uuid;

/// An assistant thread as an event names it.
#[derive(Debug, Clone)]
pub struct Thread<'a> {
    pub installation: Uuid,
    /// The DM (`D…`) and the thread's root.
    pub channel: &'a str,
    pub thread_ts: &'a str,
    pub user: &'a str,
    /// The channel the person is looking at, if any.
    pub context_channel: Option<&'a str>,
    pub context_team: Option<&'a str>,
}

/// The greeting's message id: one per thread.
pub fn greeting_msg_id(t: &Thread<'_>) -> String {
    format!("pane:{}:{}:{}", t.installation, t.channel, t.thread_ts)
}

/// Records the thread (or its new context) and, when `greet`, queues the
/// publisher's greeting through the outbox in the same transaction. True
/// when the thread was new.
pub async fn record(
    pool: &PgPool,
    t: &Thread<'_>,
    receipt: Uuid,
    event_id: &str,
    greet: bool,
) -> sqlx::Result<bool> {
    let mut tx = pool.begin().await?;
    let new = sqlx::query_scalar!(
        r#"INSERT INTO assistant_threads AS a
               (installation_id, channel_id, thread_ts, user_id, context_channel_id, context_team_id)
           VALUES ($1, $2, $3, $4, $5, $6)
           ON CONFLICT (installation_id, channel_id, thread_ts) DO UPDATE
              SET context_channel_id = coalesce(EXCLUDED.context_channel_id, a.context_channel_id),
                  -- (the team goes with the channel it was given with)
                  context_team_id = CASE WHEN EXCLUDED.context_channel_id IS NULL THEN a.context_team_id
                                         ELSE EXCLUDED.context_team_id END,
                  -- (decided again by the next question)
                  context_readable = a.context_readable
                      AND EXCLUDED.context_channel_id IS NOT DISTINCT FROM a.context_channel_id,
                  updated_at = now()
           RETURNING (xmax = 0) AS "new!""#,
        t.installation,
        t.channel,
        t.thread_ts,
        t.user,
        t.context_channel,
        t.context_team,
    )
    .fetch_one(&mut *tx)
    .await?;
    if greet {
        let msg = ProposalReady {
            schema_version: SCHEMA_VERSION,
            receipt_id: receipt.to_string(),
            installation_id: t.installation.to_string(),
            event_id: event_id.to_owned(),
            channel_id: t.channel.to_owned(),
            root_ts: t.thread_ts.to_owned(),
            assistant: "greet".to_owned(),
            work: Some(threadline_proto::v1::proposal_ready::Work::PaneGreeting(
                threadline_proto::v1::PaneGreeting {},
            )),
            ..Default::default()
        };
        crate::outbox::enqueue(
            &mut tx,
            t.installation,
            receipt,
            threadline_domain::topic::Topic::Proposals,
            &greeting_msg_id(t),
            msg.encode_to_vec(),
        )
        .await?;
    }
    tx.commit().await?;
    Ok(new)
}

/// An assistant thread as the pane's greeting and title need it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PaneThread {
    /// The suggested prompts and the opening title were shown.
    pub greeted: bool,
    /// Its title was set from its first question.
    pub titled: bool,
}

/// Whether `(channel, thread_ts)` is an assistant thread of the
/// installation, and what of it was shown.
pub async fn thread(
    pool: &PgPool,
    installation: Uuid,
    channel: &str,
    thread_ts: &str,
) -> sqlx::Result<Option<PaneThread>> {
    sqlx::query_as!(
        PaneThread,
        "SELECT greeted, titled FROM assistant_threads
          WHERE installation_id = $1 AND channel_id = $2 AND thread_ts = $3",
        installation,
        channel,
        thread_ts
    )
    .fetch_optional(pool)
    .await
}

/// Takes the setting of the thread's title from its first question: true
/// for the one caller that does it (the first question's), false once
/// taken.
pub async fn take_title(
    pool: &PgPool,
    installation: Uuid,
    channel: &str,
    thread_ts: &str,
) -> sqlx::Result<bool> {
    let r = sqlx::query!(
        "UPDATE assistant_threads SET titled = true, updated_at = now()
          WHERE installation_id = $1 AND channel_id = $2 AND thread_ts = $3 AND NOT titled",
        installation,
        channel,
        thread_ts
    )
    .execute(pool)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// The greeting was shown.
pub async fn greeted(
    pool: &PgPool,
    installation: Uuid,
    channel: &str,
    thread_ts: &str,
) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE assistant_threads SET greeted = true, updated_at = now()
          WHERE installation_id = $1 AND channel_id = $2 AND thread_ts = $3",
        installation,
        channel,
        thread_ts
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// What an assistant thread's status shows: a question at a stage. `id`
/// names the decision, or at [`Stage::Read`] (before any decision exists)
/// the request's receipt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target {
    pub id: Uuid,
    pub stage: Stage,
}

/// The progress of an assistant thread: what it should show and what the
/// publisher last set.
#[derive(Debug, Clone, PartialEq)]
pub struct Progress {
    /// The question the thread should show at its stage: one whose
    /// context is being built ([`Stage::Read`]: marked by [`reading`],
    /// within Slack's two minutes, while the request has no decision but
    /// discarded ones older than the mark: a context built again for a
    /// request already decided at that version makes no new decision),
    /// else the
    /// newest decision being answered: its model call holds a live lease
    /// ([`Stage::Write`]), or its answer waits to be posted, offered to the
    /// publisher in the last two minutes ([`Stage::Check`]), and no reply
    /// of its event is on its way or in Slack (a post or a stream clears
    /// the status in Slack), held or failed for good.
    pub live: Option<Target>,
    /// What was last set showing.
    pub shown: Option<Target>,
    /// Seconds since it was set.
    pub shown_for: f64,
    /// The record's generation (see [`set_shown`]).
    pub generation: i64,
    /// Slack surely got what the record says (false after a call Slack did
    /// not take now, see [`not_taken`]).
    pub confirmed: bool,
}

/// The thread's [`Progress`] (`None`: not an assistant thread).
pub async fn progress(
    pool: &PgPool,
    installation: Uuid,
    channel: &str,
    thread_ts: &str,
) -> sqlx::Result<Option<Progress>> {
    let r = sqlx::query!(
        r#"SELECT a.status_decision, a.status_stage, a.status_gen, a.status_confirmed,
                  coalesce(extract(epoch FROM now() - a.status_set_at)::float8, 0) AS "shown_for!",
                  CASE WHEN a.reading_at > now() - interval '2 minutes'
                            AND NOT EXISTS (SELECT 1 FROM decisions r
                                             WHERE r.receipt_id = a.reading_receipt
                                               AND (r.created_at >= a.reading_at
                                                    OR r.status NOT IN ('stale', 'superseded', 'cancelled',
                                                                        'suppressed')))
                       THEN a.reading_receipt END AS reading,
                  d.id AS "decision?", d.status AS "decision_status?"
             FROM assistant_threads a
             LEFT JOIN LATERAL (
                  SELECT d.id, d.status FROM decisions d
                   WHERE d.installation_id = a.installation_id AND d.channel_id = a.channel_id
                     AND d.root_ts = a.thread_ts
                     AND ((d.status = 'calling' AND d.lease_until > now())
                          OR (d.status IN ('proposed', 'approved') AND d.updated_at > now() - interval '2 minutes'))
                     AND NOT EXISTS (SELECT 1 FROM reply_intents i
                                      WHERE i.installation_id = d.installation_id AND i.event_id = d.event_id
                                        AND i.state IN ('sending', 'streaming', 'sent', 'interrupted', 'unknown',
                                                        'reconciling', 'held', 'failed_permanent'))
                   ORDER BY d.created_at DESC LIMIT 1) d ON true
            WHERE a.installation_id = $1 AND a.channel_id = $2 AND a.thread_ts = $3"#,
        installation,
        channel,
        thread_ts
    )
    .fetch_optional(pool)
    .await?;
    Ok(r.map(|r| {
        let answering = r.decision.map(|id| Target {
            id,
            stage: match r.decision_status.as_deref() {
                Some("calling") => Stage::Write,
                _ => Stage::Check,
            },
        });
        let reading = r.reading.map(|id| Target {
            id,
            stage: Stage::Read,
        });
        let shown = r.status_decision.map(|id| Target {
            id,
            // (a record of before the stages showed the model's call)
            stage: r
                .status_stage
                .as_deref()
                .and_then(Stage::parse)
                .unwrap_or(Stage::Write),
        });
        Progress {
            live: reading.or(answering),
            shown,
            shown_for: r.shown_for,
            generation: r.status_gen,
            confirmed: r.status_confirmed,
        }
    }))
}

/// Records the progress now showing in the thread (`None`: none), if the
/// record is still at `generation`: false when another publisher changed
/// it meanwhile (its call and this one's may have reached Slack in either
/// order). Progress that shows is looked at again by the sweeper `settle`
/// seconds on.
pub async fn set_shown(
    pool: &PgPool,
    installation: Uuid,
    channel: &str,
    thread_ts: &str,
    generation: i64,
    shown: Option<Target>,
    settle: f64,
) -> sqlx::Result<bool> {
    let r = sqlx::query!(
        "UPDATE assistant_threads
            SET status_decision = $5, status_stage = $7, status_gen = status_gen + 1, status_confirmed = true,
                status_set_at = CASE WHEN $5::uuid IS NULL THEN NULL ELSE clock_timestamp() END,
                status_due_at = CASE WHEN $5::uuid IS NULL THEN NULL
                                     ELSE clock_timestamp() + make_interval(secs => $6) END
          WHERE installation_id = $1 AND channel_id = $2 AND thread_ts = $3 AND status_gen = $4",
        installation,
        channel,
        thread_ts,
        generation,
        shown.map(|t| t.id),
        settle,
        shown.map(|t| t.stage.name()),
    )
    .execute(pool)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// A `setStatus` call toward `shown` (`None`: a clear) that Slack did not
/// take now, and may still apply: recorded, if the record is still at
/// `generation`, as possibly showing (a set), or as still showing what it
/// showed (a clear), and looked at again `after` seconds on. False when
/// another publisher changed the record meanwhile.
pub async fn not_taken(
    pool: &PgPool,
    installation: Uuid,
    channel: &str,
    thread_ts: &str,
    generation: i64,
    shown: Option<Target>,
    after: f64,
) -> sqlx::Result<bool> {
    let r = sqlx::query!(
        "UPDATE assistant_threads
            SET status_decision = coalesce($5, status_decision),
                status_stage = CASE WHEN $5::uuid IS NULL THEN status_stage ELSE $7 END,
                status_gen = status_gen + 1, status_confirmed = false,
                status_set_at = CASE WHEN $5::uuid IS NULL THEN status_set_at ELSE clock_timestamp() END,
                status_due_at = CASE WHEN coalesce($5, status_decision) IS NULL THEN NULL
                                     ELSE clock_timestamp() + make_interval(secs => $6) END
          WHERE installation_id = $1 AND channel_id = $2 AND thread_ts = $3 AND status_gen = $4",
        installation,
        channel,
        thread_ts,
        generation,
        shown.map(|t| t.id),
        after,
        shown.map(|t| t.stage.name()),
    )
    .execute(pool)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// The message id of a reading mark's progress announcement: one per
/// build (a question's context may be built again at a newer version).
pub fn reading_msg_id(receipt: Uuid) -> String {
    format!("pane-read:{receipt}:{}", Uuid::now_v7())
}

/// The context of request `receipt`'s question in assistant thread
/// `(channel, thread_ts)` is being built now: marked (the thread shows it
/// as read until a decision for the request is created), and the
/// publisher asked, through the outbox in the same transaction, to bring
/// the thread's status to it. False (nothing done) when the thread is no
/// assistant thread.
pub async fn reading(
    pool: &PgPool,
    installation: Uuid,
    channel: &str,
    thread_ts: &str,
    receipt: Uuid,
    event_id: &str,
) -> sqlx::Result<bool> {
    let mut tx = pool.begin().await?;
    let marked = sqlx::query!(
        "UPDATE assistant_threads SET reading_receipt = $4, reading_at = now()
          WHERE installation_id = $1 AND channel_id = $2 AND thread_ts = $3",
        installation,
        channel,
        thread_ts,
        receipt
    )
    .execute(&mut *tx)
    .await?
    .rows_affected()
        == 1;
    if !marked {
        return Ok(false);
    }
    let msg = ProposalReady {
        schema_version: SCHEMA_VERSION,
        receipt_id: receipt.to_string(),
        installation_id: installation.to_string(),
        event_id: event_id.to_owned(),
        channel_id: channel.to_owned(),
        root_ts: thread_ts.to_owned(),
        // (no decision yet)
        work: Some(threadline_proto::v1::proposal_ready::Work::PaneStatus(
            threadline_proto::v1::PaneStatus::default(),
        )),
        ..Default::default()
    };
    crate::outbox::enqueue(
        &mut tx,
        installation,
        receipt,
        threadline_domain::topic::Topic::Proposals,
        &reading_msg_id(receipt),
        msg.encode_to_vec(),
    )
    .await?;
    tx.commit().await?;
    Ok(true)
}

/// The context of request `receipt`'s question came to nothing (its
/// question was deleted): the thread no longer shows it as read (the
/// sweeper clears what Slack still shows).
pub async fn not_reading(
    pool: &PgPool,
    installation: Uuid,
    channel: &str,
    thread_ts: &str,
    receipt: Uuid,
) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE assistant_threads SET reading_receipt = NULL, reading_at = NULL
          WHERE installation_id = $1 AND channel_id = $2 AND thread_ts = $3 AND reading_receipt = $4",
        installation,
        channel,
        thread_ts,
        receipt
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// The thread's record may not say what Slack shows (a publisher gave up
/// after its record kept losing): it is looked at again `after` seconds on,
/// calling Slack whatever the record says, and any record in flight loses.
pub async fn look_again(
    pool: &PgPool,
    installation: Uuid,
    channel: &str,
    thread_ts: &str,
    after: f64,
) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE assistant_threads
            SET status_confirmed = false, status_gen = status_gen + 1,
                status_due_at = clock_timestamp() + make_interval(secs => $4)
          WHERE installation_id = $1 AND channel_id = $2 AND thread_ts = $3",
        installation,
        channel,
        thread_ts,
        after
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// An assistant thread whose progress should be looked at again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Showing {
    pub installation: Uuid,
    pub channel: String,
    pub thread_ts: String,
}

/// Takes up to `limit` threads whose progress is due to be looked at again
/// (the longest due first), moving each on by `lease` seconds so that no
/// other sweeper takes it meanwhile (`SKIP LOCKED`: replicas share them).
pub async fn take_due(pool: &PgPool, limit: i64, lease: f64) -> sqlx::Result<Vec<Showing>> {
    sqlx::query_as!(
        Showing,
        r#"UPDATE assistant_threads a
              SET status_due_at = now() + make_interval(secs => $2)
             FROM (SELECT installation_id, channel_id, thread_ts FROM assistant_threads
                    WHERE status_due_at <= now()
                    ORDER BY status_due_at
                    LIMIT $1
                      FOR UPDATE SKIP LOCKED) due
            WHERE a.installation_id = due.installation_id AND a.channel_id = due.channel_id
              AND a.thread_ts = due.thread_ts
        RETURNING a.installation_id AS installation, a.channel_id AS channel, a.thread_ts"#,
        limit,
        lease
    )
    .fetch_all(pool)
    .await
}

/// Whether `channel` is on the installation's allow-list.
pub async fn channel_allowed(
    pool: &PgPool,
    installation: Uuid,
    channel: &str,
) -> sqlx::Result<bool> {
    Ok(sqlx::query_scalar!(
        "SELECT allowed FROM channel_policies WHERE installation_id = $1 AND channel_id = $2",
        installation,
        channel
    )
    .fetch_optional(pool)
    .await?
    .unwrap_or(false))
}

/// Records whether the thread's context channel may be read (the channel
/// policy would answer there).
pub async fn set_context_readable(
    pool: &PgPool,
    installation: Uuid,
    channel: &str,
    thread_ts: &str,
    readable: bool,
) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE assistant_threads SET context_readable = $4, updated_at = now()
          WHERE installation_id = $1 AND channel_id = $2 AND thread_ts = $3",
        installation,
        channel,
        thread_ts,
        readable
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// The context channel of an assistant thread, when one is recorded in the
/// installation's own workspace (a workspace install's token reads nothing
/// of another workspace's channels, so one the person views there is not
/// read; an org-wide install spans its organisation's workspaces). Its
/// readability under the policy as it is now is decided by the caller.
pub async fn context_channel(
    pool: &PgPool,
    installation: Uuid,
    channel: &str,
    thread_ts: &str,
) -> sqlx::Result<Option<String>> {
    Ok(sqlx::query_scalar!(
        "SELECT a.context_channel_id FROM assistant_threads a
           JOIN installations i ON i.id = a.installation_id
          WHERE a.installation_id = $1 AND a.channel_id = $2 AND a.thread_ts = $3
            AND (a.context_team_id IS NULL OR i.is_enterprise_install OR a.context_team_id = i.team_id)",
        installation,
        channel,
        thread_ts
    )
    .fetch_optional(pool)
    .await?
    .flatten())
}
