//! Writing to the outbox: a bus message committed in the same transaction
//! as the state change that calls for it, published by the gateway's relay
//! (which wakes on the insert) with its `Nats-Msg-Id`, so the message is
//! neither lost if the process dies after the commit nor sent for a change
//! that rolled back.

use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::bus::Topic;

/// The channel on which relays are woken.
pub const WAKE_CHANNEL: &str = "threadline_outbox";

/// Wakes every relay listening: for a writer whose session does not
/// notify on insert ([`crate::db::pool_waking_after_commit`]), after its
/// commit. A transaction of its own that writes nothing, so it takes
/// NOTIFY's lock without waiting for a flush; a wake-up lost (the process
/// died first) is made good by the relays' sweep.
pub async fn wake(pool: &PgPool) -> sqlx::Result<()> {
    sqlx::query("SELECT pg_notify($1, '')")
        .bind(WAKE_CHANNEL)
        .execute(pool)
        .await?;
    Ok(())
}

/// Queues `payload` for `topic` with the message id `msg_id`.
pub async fn enqueue(
    conn: &mut PgConnection,
    installation: Uuid,
    receipt: Uuid,
    topic: Topic,
    msg_id: &str,
    payload: Vec<u8>,
) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO outbox (installation_id, receipt_id, topic, msg_id, payload) VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(installation)
    .bind(receipt)
    .bind(topic.as_str())
    .bind(msg_id)
    .bind(payload)
    .execute(conn)
    .await?;
    Ok(())
}

/// The `Reconsider` message for a thread whose answer a human message
/// crossed in flight (one per crossed answer and crossing message:
/// `recon:crossed:<intent>:<crossing ts>`).
pub fn crossed_reconsider(
    installation: Uuid,
    channel: &str,
    root_ts: &str,
    receipt: Uuid,
) -> threadline_proto::v1::Reconsider {
    threadline_proto::v1::Reconsider {
        schema_version: threadline_proto::v1::SCHEMA_VERSION,
        installation_id: installation.to_string(),
        channel_id: channel.to_owned(),
        root_ts: root_ts.to_owned(),
        stale_version: 0,
        receipt_id: receipt.to_string(),
        reason: "crossed_in_flight".to_owned(),
    }
}

/// Counts an answer crossed in flight (`threadline_crossed_in_flight_total`,
/// by the service that saw it) with an alert line.
pub fn crossed_in_flight(messages: usize, by: &'static str) {
    metrics::counter!("threadline_crossed_in_flight_total", "detected_by" => by).increment(1);
    tracing::warn!(
        alert = "crossed_in_flight",
        crossing_messages = messages,
        detected_by = by,
        "a human message reached the thread while its answer was in flight; the thread is reconsidered"
    );
}
