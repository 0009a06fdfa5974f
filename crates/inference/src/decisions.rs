//! The decision row per (event, thread version). Claimed before the model
//! call with a lease (so one replica calls the model for a binding), then
//! settled by compare-and-set. No lock is held while the model runs.

use sqlx::PgPool;
use threadline_domain::state::{DecisionStatus, Machine as _};
use uuid::Uuid;

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
}

impl<'a> Binding<'a> {
    pub fn of(
        ctx: &'a threadline_proto::v1::ContextReady,
        receipt: Uuid,
        installation: Uuid,
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
    let inserted: Option<Uuid> = sqlx::query_scalar(
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
    )
    .bind(id)
    .bind(receipt)
    .bind(installation)
    .bind(event_id)
    .bind(channel)
    .bind(root_ts)
    .bind(source_ts)
    .bind(version)
    .bind(lease_secs)
    .bind(threadline_runtime::audit::channel_ref(installation, channel))
    .bind(seq)
    .bind(&b.context_ts)
    .bind(&b.context_floor_ts)
    .fetch_optional(pool)
    .await?;
    if let Some(id) = inserted {
        return Ok(Claim::Mine(id));
    }
    // Taken over once the holder's lease has run out (it crashed), or by a
    // redelivery of the very message whose earlier delivery holds it (that
    // delivery gave up: JetStream does not redeliver a message in hand).
    let taken: Option<Uuid> = sqlx::query_scalar(
        "UPDATE decisions SET lease_until = now() + make_interval(secs => $3), lease_message_seq = $4,
                              updated_at = now()
          WHERE receipt_id = $1 AND thread_version = $2 AND status = 'calling'
            AND (lease_until < now() OR lease_message_seq = $4)
         RETURNING id",
    )
    .bind(receipt)
    .bind(version)
    .bind(lease_secs)
    .bind(seq)
    .fetch_optional(pool)
    .await?;
    if let Some(id) = taken {
        return Ok(Claim::Mine(id));
    }
    let (id, status): (Uuid, String) = sqlx::query_as(
        "SELECT id, status FROM decisions WHERE receipt_id = $1 AND thread_version = $2",
    )
    .bind(receipt)
    .bind(version)
    .fetch_one(pool)
    .await?;
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
/// machine allows from there.
pub async fn settle(pool: &PgPool, id: Uuid, s: &Settled<'_>) -> sqlx::Result<bool> {
    let from: Vec<&str> = [DecisionStatus::Calling]
        .into_iter()
        .filter(|c| *c != s.status && c.can_become(s.status))
        .map(DecisionStatus::as_str)
        .collect();
    let r = sqlx::query(
        "UPDATE decisions
            SET status = $2, status_reason = $3, action_kind = $4, review_reasons = $5, model_config_id = $6,
                provider = $7, fallback = $8, prompt_tokens = $9, completion_tokens = $10, output_hash = $11,
                body_text = $12, body_blocks = $13, lease_until = NULL, updated_at = now()
          WHERE id = $1 AND status = ANY($14)",
    )
    .bind(id)
    .bind(s.status.as_str())
    .bind(s.reason)
    .bind(s.action_kind)
    .bind(&s.review_reasons)
    .bind(s.model_config_id)
    .bind(s.provider)
    .bind(s.fallback)
    .bind(s.prompt_tokens)
    .bind(s.completion_tokens)
    .bind(s.output_hash)
    .bind(s.body_text)
    .bind(s.body_blocks)
    .bind(&from)
    .execute(pool)
    .await?;
    Ok(r.rows_affected() == 1)
}
