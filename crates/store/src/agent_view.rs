//! The agent messaging experience: a person's Messages tab (their DM with
//! the app), recorded from `app_home_opened` and kept current by
//! `app_context_changed` (what they look at, identifiers only), the
//! greeting the publisher shows when it opens, and each question's own
//! thread recorded as an assistant thread, so that its progress and the
//! viewed context go through the assistant pane's mechanism.

use prost::Message as _;
use sqlx::PgPool;
use threadline_proto::v1::{AgentGreeting, ProposalReady, SCHEMA_VERSION, proposal_ready};
use uuid::Uuid;

/// A Messages tab as an event names it.
#[derive(Debug, Clone)]
pub struct Tab<'a> {
    pub installation: Uuid,
    /// The DM (`D…`).
    pub channel: &'a str,
    pub user: &'a str,
    /// What the person looks at: `None` keeps what was recorded (the
    /// event said nothing of it); `Some((channel, team))` replaces it,
    /// `Some((None, None))` clears it.
    pub context: Option<(Option<&'a str>, Option<&'a str>)>,
    /// Slack's `event_ts` of the event (`None`: it gave none): a context
    /// older than the one recorded is not recorded.
    pub at: Option<&'a str>,
}

/// The greeting's message id: one per DM.
pub fn greeting_msg_id(installation: Uuid, channel: &str) -> String {
    format!("agent:{installation}:{channel}")
}

/// Records the tab (or its new context) and, when `greet` and it was not
/// greeted yet, queues the publisher's greeting through the outbox in the
/// same transaction. True when the tab was new.
pub async fn record(
    pool: &PgPool,
    t: &Tab<'_>,
    receipt: Uuid,
    event_id: &str,
    greet: bool,
) -> sqlx::Result<bool> {
    let mut tx = pool.begin().await?;
    let (keep, channel, team) = match t.context {
        None => (true, None, None),
        Some((c, team)) => (false, c, team),
    };
    let r = sqlx::query!(
        r#"INSERT INTO agent_views AS v (installation_id, channel_id, user_id, context_channel_id, context_team_id,
                                         context_ts)
           VALUES ($1, $2, $3, $4, $5, CASE WHEN $6 THEN NULL ELSE $7::text::numeric END)
           ON CONFLICT (installation_id, channel_id) DO UPDATE
              SET context_channel_id = CASE WHEN $6 OR $7::text::numeric < v.context_ts THEN v.context_channel_id
                                            ELSE EXCLUDED.context_channel_id END,
                  context_team_id = CASE WHEN $6 OR $7::text::numeric < v.context_ts THEN v.context_team_id
                                         ELSE EXCLUDED.context_team_id END,
                  context_ts = CASE WHEN $6 OR $7::text::numeric < v.context_ts THEN v.context_ts
                                    ELSE coalesce($7::text::numeric, v.context_ts) END,
                  updated_at = now()
           RETURNING (xmax = 0) AS "new!", greeted"#,
        t.installation,
        t.channel,
        t.user,
        channel,
        team,
        keep,
        t.at,
    )
    .fetch_one(&mut *tx)
    .await?;
    if greet && !r.greeted {
        let msg = ProposalReady {
            schema_version: SCHEMA_VERSION,
            receipt_id: receipt.to_string(),
            installation_id: t.installation.to_string(),
            event_id: event_id.to_owned(),
            channel_id: t.channel.to_owned(),
            work: Some(proposal_ready::Work::AgentGreeting(AgentGreeting {})),
            ..Default::default()
        };
        crate::outbox::enqueue(
            &mut tx,
            t.installation,
            receipt,
            threadline_domain::topic::Topic::Proposals,
            &greeting_msg_id(t.installation, t.channel),
            msg.encode_to_vec(),
        )
        .await?;
    }
    tx.commit().await?;
    Ok(r.new)
}

/// A Messages tab as the greeting needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct View {
    /// Its suggested prompts were set.
    pub greeted: bool,
}

/// The Messages tab (its DM) recorded for `user` of the installation, the
/// latest if several: where an `app_context_changed` that names no DM
/// belongs.
pub async fn tab_of(pool: &PgPool, installation: Uuid, user: &str) -> sqlx::Result<Option<String>> {
    sqlx::query_scalar!(
        "SELECT channel_id FROM agent_views WHERE installation_id = $1 AND user_id = $2
          ORDER BY updated_at DESC LIMIT 1",
        installation,
        user
    )
    .fetch_optional(pool)
    .await
}

/// Whether `channel` is an agent's Messages tab of the installation.
pub async fn view(pool: &PgPool, installation: Uuid, channel: &str) -> sqlx::Result<Option<View>> {
    sqlx::query_as!(
        View,
        "SELECT greeted FROM agent_views WHERE installation_id = $1 AND channel_id = $2",
        installation,
        channel
    )
    .fetch_optional(pool)
    .await
}

/// The greeting was shown.
pub async fn greeted(pool: &PgPool, installation: Uuid, channel: &str) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE agent_views SET greeted = true, updated_at = now()
          WHERE installation_id = $1 AND channel_id = $2",
        installation,
        channel
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// How long after it reached threadline an event of a person's Messages
/// tab can hold their questions back ([`tab_event_pending`]).
pub const TAB_WAIT_LIMIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Whether an event of the person's Messages tab in DM `channel` that
/// happened by the message `ts` (the tab opened, what they look at
/// changed) is still being handled: a question asked there waits for it,
/// so that it is answered with what the person looked at when they asked
/// (events of one DM are handled concurrently). Only events threadline
/// already received count (one Slack delivers after the question does
/// not), by Slack's event time in whole seconds (a change later in the
/// question's second counts too), and only those received within
/// [`TAB_WAIT_LIMIT`]: one that keeps failing holds no question back for
/// longer.
pub async fn tab_event_pending(
    pool: &PgPool,
    installation: Uuid,
    channel: &str,
    ts: &str,
) -> sqlx::Result<bool> {
    sqlx::query_scalar!(
        r#"SELECT EXISTS (
             SELECT 1 FROM event_receipts
              WHERE installation_id = $1 AND state IN ('accepted', 'processing')
                AND (event_type IN ('app_home_opened', 'app_context_changed') AND channel_id = $2
                     -- (a change Slack sent naming no DM is the person's
                     -- tab's, found by its user when it is handled: any such
                     -- change of the installation counts)
                     OR event_type = 'app_context_changed' AND channel_id IS NULL)
                AND event_time <= to_timestamp($3::text::float8)
                AND received_at > now() - make_interval(secs => $4)) AS "pending!""#,
        installation,
        channel,
        ts,
        TAB_WAIT_LIMIT.as_secs_f64()
    )
    .fetch_one(pool)
    .await
}

/// A question in an agent's Messages tab: its thread (`root`, the
/// question's own `ts` or the thread it was asked in) is recorded as an
/// assistant thread, with the tab's viewed context as it is now, already
/// greeted and titled (the tab has no thread to greet or name), so the
/// pane's progress and viewed-context rules apply to it. Nothing when
/// `channel` is not a Messages tab. True when it is one.
pub async fn question_thread(
    pool: &PgPool,
    installation: Uuid,
    channel: &str,
    root: &str,
) -> sqlx::Result<bool> {
    let r = sqlx::query!(
        "INSERT INTO assistant_threads AS a
               (installation_id, channel_id, thread_ts, user_id, context_channel_id, context_team_id,
                greeted, titled)
         SELECT v.installation_id, v.channel_id, $3, v.user_id, v.context_channel_id, v.context_team_id,
                true, true
           FROM agent_views v
          WHERE v.installation_id = $1 AND v.channel_id = $2
         ON CONFLICT (installation_id, channel_id, thread_ts) DO UPDATE
            SET context_channel_id = EXCLUDED.context_channel_id,
                context_team_id = EXCLUDED.context_team_id,
                -- (decided again by this question)
                context_readable = a.context_readable
                    AND EXCLUDED.context_channel_id IS NOT DISTINCT FROM a.context_channel_id,
                updated_at = now()",
        installation,
        channel,
        root
    )
    .execute(pool)
    .await?;
    Ok(r.rows_affected() == 1)
}
