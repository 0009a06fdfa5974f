//! Decisions: what the model (or the fallback) answered for one event at
//! one thread version, and what a publisher may post. The row is the truth
//! of a post: the bus message only names it. A decision is claimed before
//! the model call with a lease (so one replica calls the model for a
//! binding), then settled by compare-and-set; no lock is held while the
//! model runs.

use prost::Message as _;
use sqlx::{PgConnection, PgExecutor, PgPool};
use threadline_domain::state::{DecisionStatus, Machine as _};
use threadline_proto::v1::{ProposalReady, SCHEMA_VERSION};
use uuid::Uuid;

use crate::moves;

/// A decision as publishing it needs it.
#[derive(Debug, Clone)]
pub struct Decision {
    pub id: Uuid,
    pub receipt_id: Uuid,
    pub installation_id: Uuid,
    pub event_id: String,
    pub channel_id: String,
    pub root_ts: String,
    pub source_ts: String,
    pub thread_version: i64,
    pub action_kind: String,
    pub status: String,
    pub review_reasons: Vec<String>,
    pub fallback: bool,
    pub model_config_id: Option<String>,
    pub output_hash: Option<String>,
    pub body_text: Option<String>,
    pub body_blocks: Option<serde_json::Value>,
}

pub async fn load(conn: impl PgExecutor<'_>, id: Uuid) -> sqlx::Result<Option<Decision>> {
    sqlx::query_as!(
        Decision,
        "SELECT id, receipt_id, installation_id, event_id, channel_id, root_ts, source_ts, thread_version,
                action_kind, status, review_reasons, fallback, model_config_id, output_hash, body_text,
                body_blocks
           FROM decisions WHERE id = $1",
        id
    )
    .fetch_optional(conn)
    .await
}

/// The bus message naming a decision; every field comes from the row, never
/// from model output. The publisher posts what the row holds; the text
/// still travels for a publisher of the previous release during a rolling
/// upgrade (in the outbox only until the relay publishes it, like an
/// event's payload).
pub fn proposal(d: &Decision) -> ProposalReady {
    ProposalReady {
        schema_version: SCHEMA_VERSION,
        decision_id: d.id.to_string(),
        receipt_id: d.receipt_id.to_string(),
        installation_id: d.installation_id.to_string(),
        event_id: d.event_id.clone(),
        channel_id: d.channel_id.clone(),
        root_ts: d.root_ts.clone(),
        source_ts: d.source_ts.clone(),
        thread_version: d.thread_version,
        action_kind: d.action_kind.clone(),
        needs_review: !d.review_reasons.is_empty(),
        fallback: d.fallback,
        text: d.body_text.clone().unwrap_or_default(),
        blocks_json: d
            .body_blocks
            .as_ref()
            .map(|b| b.to_string())
            .unwrap_or_default(),
        body_hash: d.output_hash.clone().unwrap_or_default(),
        review_reasons: d.review_reasons.clone(),
        model_config_id: d.model_config_id.clone().unwrap_or_default(),
    }
}

/// The message id of a decision's proposal: `prop:<decision>`, or
/// `prop:<decision>:<tag>` when it is handed over again on purpose (an
/// approval, an operator's re-post), so that the stream's duplicate window
/// drops a repeat of the same hand-over but not a new one.
pub fn proposal_msg_id(id: Uuid, tag: Option<&str>) -> String {
    match tag {
        Some(t) => format!("prop:{id}:{t}"),
        None => format!("prop:{id}"),
    }
}

/// Queues the decision's proposal in the outbox inside the caller's
/// transaction: the state change that asks for the post (an approval, an
/// operator's re-post) and the request to post commit together, and a
/// relay publishes it.
pub async fn enqueue_proposal(
    conn: &mut PgConnection,
    d: &Decision,
    tag: &str,
) -> sqlx::Result<()> {
    crate::outbox::enqueue(
        conn,
        d.installation_id,
        d.receipt_id,
        threadline_domain::topic::Topic::Proposals,
        &proposal_msg_id(d.id, Some(tag)),
        proposal(d).encode_to_vec(),
    )
    .await
}

pub enum Claim {
    /// This worker calls the model for the decision.
    Mine(Uuid),
    /// Another worker holds the lease; try again after it may have expired.
    Busy,
    /// Already settled with this status.
    Settled(Uuid, DecisionStatus),
}

/// What a decision is bound to: the event and the thread version its
/// context read, and what that context held.
pub struct Binding<'a> {
    pub receipt: Uuid,
    pub installation: Uuid,
    pub event_id: &'a str,
    pub channel: &'a str,
    pub root_ts: &'a str,
    pub source_ts: &'a str,
    pub version: i64,
    /// The Slack ts of every message of the context.
    pub context_ts: Vec<String>,
    /// The oldest reply a truncated context kept (None: not truncated).
    pub context_floor_ts: Option<String>,
    /// The channel's pseudonym for the audit log, when this process holds
    /// the audit key.
    pub channel_ref: Option<String>,
}

impl<'a> Binding<'a> {
    pub fn of(
        ctx: &'a threadline_proto::v1::ContextReady,
        receipt: Uuid,
        installation: Uuid,
        channel_ref: Option<String>,
    ) -> Self {
        let context_ts: Vec<String> = ctx.messages.iter().map(|m| m.ts.clone()).collect();
        let context_floor_ts = ctx.truncated.then(|| {
            ctx.messages
                .iter()
                .filter(|m| m.ts != ctx.root_ts)
                .map(|m| m.ts.clone())
                .min_by(|a, b| ts_order(a, b))
                .unwrap_or_else(|| ctx.source_ts.clone())
        });
        Self {
            receipt,
            installation,
            event_id: &ctx.event_id,
            channel: &ctx.channel_id,
            root_ts: &ctx.root_ts,
            source_ts: &ctx.source_ts,
            version: ctx.thread_version,
            context_ts,
            context_floor_ts,
            channel_ref,
        }
    }
}

/// Slack timestamps in time order (`secs.micros`).
fn ts_order(a: &str, b: &str) -> std::cmp::Ordering {
    let key = |t: &str| {
        let (s, f) = t.split_once('.').unwrap_or((t, "0"));
        (s.parse::<u64>().unwrap_or(0), f.parse::<u64>().unwrap_or(0))
    };
    key(a).cmp(&key(b))
}

/// Claims the decision of a binding for a model call: a new one, or one
/// whose holder's lease ran out (it crashed), or one held by an earlier
/// delivery of this very message (that delivery gave up).
pub async fn claim(
    pool: &PgPool,
    b: &Binding<'_>,
    lease_secs: f64,
    message_seq: Option<u64>,
) -> sqlx::Result<Claim> {
    let (receipt, installation, event_id, channel, root_ts, source_ts, version) = (
        b.receipt,
        b.installation,
        b.event_id,
        b.channel,
        b.root_ts,
        b.source_ts,
        b.version,
    );
    let seq = message_seq.and_then(|s| i64::try_from(s).ok());
    let id = Uuid::now_v7();
    let inserted = sqlx::query_scalar!(
        "INSERT INTO decisions (id, receipt_id, installation_id, event_id, channel_id, root_ts, source_ts, thread_version,
                                status, lease_until, lease_message_seq, context_ts, context_floor_ts, channel_ref)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'calling', now() + make_interval(secs => $9), $11, $12, $13,
                 -- the pseudonym the context-builder wrote for this event when
                 -- this process holds no audit key
                 coalesce($10, (SELECT a.channel_ref FROM audit_log a
                                 WHERE a.installation_id = $3 AND a.event_id = $4 AND a.channel_ref IS NOT NULL
                                 LIMIT 1)))
         ON CONFLICT ON CONSTRAINT decisions_binding DO NOTHING
         RETURNING id",
        id,
        receipt,
        installation,
        event_id,
        channel,
        root_ts,
        source_ts,
        version,
        lease_secs,
        b.channel_ref.as_deref(),
        seq,
        &b.context_ts,
        b.context_floor_ts.as_deref(),
    )
    .fetch_optional(pool)
    .await?;
    if let Some(id) = inserted {
        return Ok(Claim::Mine(id));
    }
    // Taken over once the holder's lease has run out (it crashed), or by a
    // redelivery of the very message whose earlier delivery holds it (that
    // delivery gave up: JetStream does not redeliver a message in hand).
    let taken = sqlx::query_scalar!(
        "UPDATE decisions SET lease_until = now() + make_interval(secs => $3), lease_message_seq = $4,
                              updated_at = now()
          WHERE receipt_id = $1 AND thread_version = $2 AND status = 'calling'
            AND (lease_until < now() OR lease_message_seq = $4)
         RETURNING id",
        receipt,
        version,
        lease_secs,
        seq,
    )
    .fetch_optional(pool)
    .await?;
    if let Some(id) = taken {
        return Ok(Claim::Mine(id));
    }
    let row = sqlx::query!(
        "SELECT id, status FROM decisions WHERE receipt_id = $1 AND thread_version = $2",
        receipt,
        version,
    )
    .fetch_one(pool)
    .await?;
    let (id, status) = (row.id, row.status);
    let status = DecisionStatus::parse(&status).map_err(|e| sqlx::Error::Decode(Box::new(e)))?;
    Ok(if status == DecisionStatus::Calling {
        Claim::Busy
    } else {
        Claim::Settled(id, status)
    })
}

pub struct Settled<'a> {
    pub status: DecisionStatus,
    pub reason: Option<&'a str>,
    pub action_kind: &'a str,
    pub review_reasons: Vec<String>,
    pub model_config_id: &'a str,
    pub provider: &'a str,
    pub fallback: bool,
    pub prompt_tokens: Option<i32>,
    pub completion_tokens: Option<i32>,
    pub output_hash: Option<&'a str>,
    pub body_text: Option<&'a str>,
    pub body_blocks: Option<&'a serde_json::Value>,
}

/// `calling → proposed | review | suppressed | cancelled`, compare-and-set:
/// only a decision still being called is settled, and only by a move the
/// machine allows from there. Returns the row as settled (none when the
/// lease was lost and another worker settled it).
pub async fn settle(pool: &PgPool, id: Uuid, s: &Settled<'_>) -> sqlx::Result<Option<Decision>> {
    // (`calling → calling` is a lease takeover, not a settle.)
    let from: Vec<String> = if s.status == DecisionStatus::Calling {
        Vec::new()
    } else {
        moves(&[DecisionStatus::Calling], s.status)
    };
    sqlx::query_as!(
        Decision,
        "UPDATE decisions
            SET status = $2, status_reason = $3, action_kind = $4, review_reasons = $5, model_config_id = $6,
                provider = $7, fallback = $8, prompt_tokens = $9, completion_tokens = $10, output_hash = $11,
                body_text = $12, body_blocks = $13, lease_until = NULL, updated_at = now()
          WHERE id = $1 AND status = ANY($14)
         RETURNING id, receipt_id, installation_id, event_id, channel_id, root_ts, source_ts, thread_version,
                   action_kind, status, review_reasons, fallback, model_config_id, output_hash, body_text,
                   body_blocks",
        id,
        s.status.as_str(),
        s.reason,
        s.action_kind,
        &s.review_reasons,
        s.model_config_id,
        s.provider,
        s.fallback,
        s.prompt_tokens,
        s.completion_tokens,
        s.output_hash,
        s.body_text,
        s.body_blocks,
        &from,
    )
    .fetch_optional(pool)
    .await
}

/// An intent held for an operator keeps its decision: a newer proposal of
/// the event (`decision`, not the one the intent names) is cancelled.
pub async fn cancel_for_held_intent(
    pool: &PgPool,
    decision: Uuid,
    intent: Uuid,
) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE decisions SET status = $3, status_reason = 'intent_held', updated_at = now()
          WHERE id = $1 AND status = ANY($4)
            AND id <> (SELECT decision_id FROM reply_intents WHERE id = $2)",
        decision,
        intent,
        DecisionStatus::Cancelled.as_str(),
        &moves(
            &[DecisionStatus::Proposed, DecisionStatus::Approved],
            DecisionStatus::Cancelled
        )
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Human review so far: decisions waiting for review, and reviewed ones
/// approved and rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReviewCounts {
    pub waiting: i64,
    pub approved: i64,
    pub rejected: i64,
}

pub async fn review_counts(pool: &PgPool) -> sqlx::Result<ReviewCounts> {
    sqlx::query_as!(
        ReviewCounts,
        r#"SELECT (SELECT count(*) FROM decisions WHERE status = 'review') AS "waiting!",
                  count(*) FILTER (WHERE status <> 'rejected') AS "approved!",
                  count(*) FILTER (WHERE status = 'rejected') AS "rejected!"
             FROM decisions WHERE reviewed_by IS NOT NULL"#
    )
    .fetch_one(pool)
    .await
}

/// A decision waiting for a reviewer, as listed (no text).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Waiting {
    pub id: Uuid,
    pub installation_id: Uuid,
    pub event_id: String,
    pub channel_id: String,
    pub thread_version: i64,
    pub action_kind: String,
    pub review_reasons: Vec<String>,
}

/// Decisions waiting for review, oldest first.
pub async fn waiting_for_review(pool: &PgPool) -> sqlx::Result<Vec<Waiting>> {
    sqlx::query_as!(
        Waiting,
        "SELECT id, installation_id, event_id, channel_id, thread_version, action_kind, review_reasons
           FROM decisions WHERE status = 'review' ORDER BY created_at"
    )
    .fetch_all(pool)
    .await
}

/// The decision's status, locked for the caller's transaction (a reviewer
/// deciding on it).
pub async fn lock_status(
    conn: &mut PgConnection,
    id: Uuid,
) -> sqlx::Result<Option<DecisionStatus>> {
    let status = sqlx::query_scalar!("SELECT status FROM decisions WHERE id = $1 FOR UPDATE", id)
        .fetch_optional(conn)
        .await?;
    status
        .map(|s| DecisionStatus::parse(&s).map_err(|e| sqlx::Error::Decode(Box::new(e))))
        .transpose()
}

/// A reviewer's verdict: `review → approved` or `review → rejected`, with
/// who decided. False when the decision was not waiting for review.
pub async fn review(
    conn: impl PgExecutor<'_>,
    id: Uuid,
    verdict: DecisionStatus,
    by: &str,
) -> sqlx::Result<bool> {
    // A reviewer approves or rejects; the discards are the services'.
    if !matches!(verdict, DecisionStatus::Approved | DecisionStatus::Rejected)
        || !DecisionStatus::Review.can_become(verdict)
    {
        return Ok(false);
    }
    let r = sqlx::query!(
        "UPDATE decisions SET status = $3, reviewed_by = $2, reviewed_at = now(), updated_at = now()
          WHERE id = $1 AND status = ANY($4)",
        id,
        by,
        verdict.as_str(),
        &moves(&[DecisionStatus::Review], verdict)
    )
    .execute(conn)
    .await?;
    Ok(r.rows_affected() == 1)
}
