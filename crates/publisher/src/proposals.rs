//! The decision row is the truth of what may be posted: the publisher posts
//! the text, blocks, channel and thread the row holds (a bus message only
//! names the decision), and hands a decision's proposal to a publisher again
//! when no delivery is driving it (the sweeper; an operator's re-post or an
//! approval goes through the outbox, [`threadline_store::decisions::enqueue_proposal`]).

use async_nats::jetstream;
use prost::Message as _;
use threadline_runtime::bus::{Topic, Topology};
pub use threadline_store::decisions::{Decision, ForPost, load, load_for_post};
use threadline_store::decisions::{proposal, proposal_msg_id};

/// Publishes the decision's proposal again (`Nats-Msg-Id:
/// prop:<decision>:<tag>`, so the stream's duplicate window keeps a
/// re-publish with the same tag from being handled twice).
pub async fn republish(
    js: &jetstream::Context,
    topology: &Topology,
    d: &Decision,
    tag: &str,
) -> anyhow::Result<()> {
    threadline_runtime::bus::publish(
        js,
        topology,
        Topic::Proposals,
        &proposal_msg_id(d.id, Some(tag)),
        proposal(d).encode_to_vec(),
    )
    .await
}
