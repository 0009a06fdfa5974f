//! The assistant pane: a person's thread with the app in their DM, recorded
//! from `assistant_thread_started` and kept current by
//! `assistant_thread_context_changed` (identifiers only), and the greeting
//! (suggested prompts, a title) the publisher shows when it opens.

use prost::Message as _;
use sqlx::PgPool;
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
                  context_team_id = coalesce(EXCLUDED.context_team_id, a.context_team_id),
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

/// Whether `(channel, thread_ts)` is an assistant thread of the
/// installation, and whether its greeting was shown.
pub async fn thread(
    pool: &PgPool,
    installation: Uuid,
    channel: &str,
    thread_ts: &str,
) -> sqlx::Result<Option<bool>> {
    sqlx::query_scalar!(
        "SELECT greeted FROM assistant_threads
          WHERE installation_id = $1 AND channel_id = $2 AND thread_ts = $3",
        installation,
        channel,
        thread_ts
    )
    .fetch_optional(pool)
    .await
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

/// What a decision in an assistant thread came to, for its progress.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub status: String,
    /// Its reply was posted (Slack clears the progress itself then).
    pub replied: bool,
    /// Its reply will not be posted by itself: the intent is held for an
    /// operator or failed for good.
    pub stopped: bool,
    /// Another decision of the thread is being answered (its progress is
    /// the one showing).
    pub others_calling: bool,
}

pub async fn outcome(pool: &PgPool, decision: Uuid) -> sqlx::Result<Option<Outcome>> {
    let r = sqlx::query!(
        r#"SELECT d.status,
                  EXISTS (SELECT 1 FROM reply_intents i
                           WHERE i.installation_id = d.installation_id AND i.event_id = d.event_id
                             AND i.state IN ('sent', 'streaming', 'interrupted')) AS "replied!",
                  EXISTS (SELECT 1 FROM reply_intents i
                           WHERE i.installation_id = d.installation_id AND i.event_id = d.event_id
                             AND i.state IN ('held', 'failed_permanent')) AS "stopped!",
                  EXISTS (SELECT 1 FROM decisions o
                           WHERE o.installation_id = d.installation_id AND o.channel_id = d.channel_id
                             AND o.root_ts = d.root_ts AND o.status = 'calling' AND o.id <> d.id
                             AND o.lease_until > now()) AS "others_calling!"
             FROM decisions d
            WHERE d.id = $1
              AND EXISTS (SELECT 1 FROM assistant_threads a
                           WHERE a.installation_id = d.installation_id AND a.channel_id = d.channel_id
                             AND a.thread_ts = d.root_ts)"#,
        decision
    )
    .fetch_optional(pool)
    .await?;
    Ok(r.map(|r| Outcome {
        status: r.status,
        replied: r.replied,
        stopped: r.stopped,
        others_calling: r.others_calling,
    }))
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

/// The context channel of an assistant thread, when one is recorded (its
/// readability is decided by the caller, under the policy as it is now).
pub async fn context_channel(
    pool: &PgPool,
    installation: Uuid,
    channel: &str,
    thread_ts: &str,
) -> sqlx::Result<Option<String>> {
    Ok(sqlx::query_scalar!(
        "SELECT context_channel_id FROM assistant_threads
          WHERE installation_id = $1 AND channel_id = $2 AND thread_ts = $3",
        installation,
        channel,
        thread_ts
    )
    .fetch_optional(pool)
    .await?
    .flatten())
}
