//! The decision row is the truth of what may be posted: the publisher posts
//! the text, blocks, channel and thread the row holds (a bus message only
//! names the decision), and hands a decision's proposal to a publisher again
//! when no delivery is driving it (the sweeper, an operator's re-post or
//! approval through the outbox).

use async_nats::jetstream::{self, message::PublishMessage};
use bytes::Bytes;
use prost::Message as _;
use sqlx::{PgConnection, PgPool};
use threadline_proto::v1::{ProposalReady, SCHEMA_VERSION};
use threadline_runtime::bus::{Topic, Topology};
use uuid::Uuid;

/// A decision as the publisher needs it.
#[derive(Debug, Clone, sqlx::FromRow)]
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

pub async fn load(pool: &PgPool, id: Uuid) -> sqlx::Result<Option<Decision>> {
    sqlx::query_as(
        "SELECT id, receipt_id, installation_id, event_id, channel_id, root_ts, source_ts, thread_version, action_kind,
                status, review_reasons, fallback, model_config_id, output_hash, body_text, body_blocks
           FROM decisions WHERE id = $1",
    )
    .bind(id)
    .fetch_optional(pool)
    .await
}

/// The bus message naming a decision; every field comes from the row. The
/// publisher posts what the row holds; the text still travels for a
/// publisher of the previous release during a rolling upgrade (in the
/// outbox only until the relay publishes it, like an event's payload).
pub fn message(d: &Decision) -> ProposalReady {
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

/// Publishes the decision's proposal again (`Nats-Msg-Id:
/// prop:<decision>:<tag>`, so the stream's duplicate window keeps a
/// re-publish with the same tag from being handled twice).
pub async fn republish(
    js: &jetstream::Context,
    topology: &Topology,
    d: &Decision,
    tag: &str,
) -> anyhow::Result<()> {
    let mut headers = async_nats::HeaderMap::new();
    threadline_runtime::telemetry::inject_current(&mut headers);
    let publish = PublishMessage::build()
        .payload(Bytes::from(message(d).encode_to_vec()))
        .headers(headers)
        .message_id(format!("prop:{}:{tag}", d.id));
    js.send_publish(topology.subject(Topic::Proposals), publish)
        .await?
        .await?;
    Ok(())
}

/// Queues the decision's proposal in the outbox inside the caller's
/// transaction: the state change that asks for the post (an approval, an
/// operator's re-post) and the request to post commit together, and the
/// gateway's relay publishes it (`Nats-Msg-Id: prop:<decision>:<tag>`).
pub async fn enqueue(conn: &mut PgConnection, d: &Decision, tag: &str) -> sqlx::Result<()> {
    threadline_runtime::outbox::enqueue(
        conn,
        d.installation_id,
        d.receipt_id,
        Topic::Proposals,
        &format!("prop:{}:{tag}", d.id),
        message(d).encode_to_vec(),
    )
    .await
}
