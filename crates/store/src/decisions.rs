//! Decisions: what the model (or the fallback) answered for one event at
//! one thread version, and what a publisher may post. The row is the truth
//! of a post: the bus message only names it.

use prost::Message as _;
use sqlx::{PgConnection, PgExecutor};
use threadline_proto::v1::{ProposalReady, SCHEMA_VERSION};
use uuid::Uuid;

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
