//! A person's actions (`person_actions`) and the messages that repeat one
//! (`doubled_messages`): Slack has delivered one message as two `message`
//! events with different `ts` and the same `client_msg_id`. The first of
//! its messages the thread store applies owns the action; another is a
//! *doubled* message, recorded here (identifiers only) and never applied
//! to a thread, so it neither asks for an answer nor makes the thread look
//! changed. An `app_mention` and its `message` twin carry one `ts` and own
//! the action together (their turn decides which of them answers).

use sqlx::PgConnection;
use uuid::Uuid;

/// Claims the action `client_msg_id` of `channel` for the message `ts`;
/// returns the `ts` of the message that owns it (`ts` itself when it is
/// the first, a twin of the first or a redelivery). One statement: a claim
/// that meets another's (committed, or committing: it waits for it) reads
/// the owner from the row it conflicted with (a no-op update, which an
/// insert that lost could not see in its own snapshot).
pub async fn claim(
    conn: &mut PgConnection,
    inst: Uuid,
    channel: &str,
    client_msg_id: &str,
    ts: &str,
) -> sqlx::Result<String> {
    sqlx::query_scalar!(
        "INSERT INTO person_actions (installation_id, channel_id, client_msg_id, ts) VALUES ($1, $2, $3, $4)
         ON CONFLICT (installation_id, channel_id, client_msg_id) DO UPDATE SET ts = person_actions.ts
         RETURNING ts",
        inst,
        channel,
        client_msg_id,
        ts
    )
    .fetch_one(conn)
    .await
}

/// Records the message `ts` as repeating the action of `kept_ts`,
/// delivered by `receipt`; true the first time (a twin or a redelivery
/// finds it recorded).
pub async fn record_doubled(
    conn: &mut PgConnection,
    inst: Uuid,
    channel: &str,
    ts: &str,
    kept_ts: &str,
    receipt: Uuid,
) -> sqlx::Result<bool> {
    let r = sqlx::query!(
        "INSERT INTO doubled_messages (installation_id, channel_id, ts, kept_ts, receipt_id)
         VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
        inst,
        channel,
        ts,
        kept_ts,
        receipt
    )
    .execute(conn)
    .await?;
    Ok(r.rows_affected() == 1)
}
