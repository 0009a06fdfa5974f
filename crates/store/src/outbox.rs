//! The outbox: bus messages committed with the state change that calls for
//! them, and what relays do with them.
//!
//! A relay **claims** due rows by leasing them (their `next_attempt_at`
//! moves a lease ahead), in a statement of its own that commits at once:
//! no transaction or row lock is held while the messages are published, so
//! a slow broker never pins a connection or blocks other relays' claims.
//! After the PubAcks it **settles** the round in one statement: the rows
//! published are deleted, counted in `outbox_ledger` and given their intake
//! audit record; the rows that failed wait out a backoff. A relay that dies
//! between the two leaves its rows leased; once the lease ends another
//! claims them and publishes them again under the same `Nats-Msg-Id`, which
//! the stream's duplicate window drops.

use std::time::Duration;

use sqlx::{PgConnection, PgExecutor, PgPool};
use threadline_domain::topic::Topic;
use time::OffsetDateTime;
use uuid::Uuid;

/// The channel on which relays are woken.
pub const WAKE_CHANNEL: &str = "threadline_outbox";

/// Queues `payload` for `topic` with the message id `msg_id`, inside the
/// caller's transaction: the message is committed with the state change
/// that calls for it, so it is neither lost if the process dies after the
/// commit nor sent for a change that rolled back.
pub async fn enqueue(
    conn: &mut PgConnection,
    installation: Uuid,
    receipt: Uuid,
    topic: Topic,
    msg_id: &str,
    payload: Vec<u8>,
) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO outbox (installation_id, receipt_id, topic, msg_id, payload) VALUES ($1, $2, $3, $4, $5)",
        installation,
        receipt,
        topic.as_str(),
        msg_id,
        payload,
    )
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

/// Wakes every relay listening: for a writer whose session does not
/// notify on insert (the gateway's intake, see migration 0018), after its
/// commit. A transaction of its own that writes nothing, so it takes
/// NOTIFY's lock without waiting for a flush; a wake-up lost (the process
/// died first) is made good by the relays' sweep.
pub async fn wake(pool: &PgPool) -> sqlx::Result<()> {
    sqlx::query!("SELECT pg_notify($1, '')", WAKE_CHANNEL)
        .execute(pool)
        .await?;
    Ok(())
}

/// Whether this connection's role may consume the outbox (read, lease and
/// delete its rows): the relay's (`threadline_relay`, migration 0031) or
/// the owner's. The public gateway's role may only add to it.
pub async fn may_relay(pool: &PgPool) -> sqlx::Result<bool> {
    sqlx::query_scalar!(
        // (each privilege on its own: a list asks whether any is held)
        r#"SELECT has_table_privilege('outbox', 'SELECT') AND has_table_privilege('outbox', 'UPDATE')
              AND has_table_privilege('outbox', 'DELETE')
              AND has_table_privilege('outbox_ledger', 'SELECT')
              AND has_table_privilege('outbox_ledger', 'INSERT')
              AND has_table_privilege('outbox_ledger', 'UPDATE') AS "may!""#
    )
    .fetch_one(pool)
    .await
}

/// Makes a connection's outbox inserts wake the relay only after their
/// transaction commits (a pool's `after_connect` for the writers of rows
/// whose relay must not look before the commit).
pub async fn wake_after_commit(conn: &mut sqlx::PgConnection) -> sqlx::Result<()> {
    sqlx::query_scalar!(
        r#"SELECT set_config('threadline.outbox_wake', 'after_commit', false) AS "set!""#
    )
    .fetch_one(conn)
    .await?;
    Ok(())
}

/// A row claimed by a relay, leased to it until its lease ends.
#[derive(Debug, Clone)]
pub struct Claimed {
    pub id: i64,
    pub topic: String,
    pub msg_id: String,
    pub payload: Vec<u8>,
    pub traceparent: Option<String>,
    pub tracestate: Option<String>,
    pub created_at: OffsetDateTime,
    pub receipt_id: Uuid,
    pub installation_id: Uuid,
    /// The channel of the row's receipt (for its audit record).
    pub channel_id: Option<String>,
}

/// Leases up to `batch` due rows for `lease`, oldest first; rows another
/// relay holds (leased, or locked by a claim in progress) are skipped.
pub async fn claim(
    conn: impl PgExecutor<'_>,
    batch: i64,
    lease: Duration,
) -> sqlx::Result<Vec<Claimed>> {
    let mut rows = sqlx::query_as!(
        Claimed,
        r#"WITH due AS (
               SELECT id FROM outbox
                WHERE next_attempt_at <= now()
                ORDER BY id
                LIMIT $1
                  FOR UPDATE SKIP LOCKED)
           UPDATE outbox o
              SET next_attempt_at = now() + make_interval(secs => $2)
             FROM due
            WHERE o.id = due.id
        RETURNING o.id, o.topic, o.msg_id, o.payload, o.traceparent, o.tracestate, o.created_at,
                  o.receipt_id, o.installation_id,
                  (SELECT r.channel_id FROM event_receipts r WHERE r.id = o.receipt_id) AS "channel_id?""#,
        batch,
        lease.as_secs_f64(),
    )
    .fetch_all(conn)
    .await?;
    // RETURNING keeps no order: publish in the order the rows were written.
    rows.sort_unstable_by_key(|r| r.id);
    Ok(rows)
}

/// A claimed row whose message the stream acknowledged.
#[derive(Debug, Clone)]
pub struct Published {
    pub id: i64,
    pub topic: String,
    pub receipt_id: Uuid,
    /// The pseudonymous channel reference for the audit record, if any.
    pub channel_ref: Option<String>,
}

/// A claimed row whose publish failed, and a short, content-free reason.
#[derive(Debug, Clone)]
pub struct Failed {
    pub id: i64,
    pub error: String,
}

/// Settles a round in one statement (one commit): the published rows are
/// deleted and counted per topic in `outbox_ledger`, each event row gets
/// its receipt's intake audit record, and each failed row waits 2^attempts
/// seconds (at most five minutes) before its next try, so that it cannot
/// hold up the rows behind it. Returns how many rows were deleted: a row
/// settled already (its lease ran out and another relay took it) is not
/// counted twice.
pub async fn settle(
    conn: impl PgExecutor<'_>,
    published: &[Published],
    failed: &[Failed],
) -> sqlx::Result<u64> {
    let ids: Vec<i64> = published.iter().map(|p| p.id).collect();
    let receipts: Vec<Uuid> = published.iter().map(|p| p.receipt_id).collect();
    // An empty reference stands for none (the array cannot hold NULLs here).
    let refs: Vec<String> = published
        .iter()
        .map(|p| p.channel_ref.clone().unwrap_or_default())
        .collect();
    let failed_ids: Vec<i64> = failed.iter().map(|f| f.id).collect();
    let errors: Vec<String> = failed.iter().map(|f| f.error.clone()).collect();
    let deleted = sqlx::query_scalar!(
        r#"WITH done AS (
               DELETE FROM outbox WHERE id = ANY($1::bigint[])
            RETURNING receipt_id, created_at, topic),
           ledger AS (
               INSERT INTO outbox_ledger (topic, published_total, last_published_at)
               SELECT topic, count(*), now() FROM done GROUP BY topic
               ON CONFLICT (topic) DO UPDATE
                  SET published_total = outbox_ledger.published_total + EXCLUDED.published_total,
                      last_published_at = EXCLUDED.last_published_at),
           retry AS (
               UPDATE outbox o
                  SET attempts = o.attempts + 1, last_error = f.err,
                      next_attempt_at = now() + make_interval(secs => least(power(2, o.attempts), 300))
                 FROM UNNEST($4::bigint[], $5::text[]) AS f(id, err)
                WHERE o.id = f.id),
           audit AS (
               -- only an event's own row is its intake; other rows (an
               -- approval, a re-post, a reconsideration) name its receipt
               -- but are no intake
               INSERT INTO audit_log (stage, outcome, installation_id, event_id, receipt_id, channel_ref,
                                      event_type, received_at, acked_at, retry_count)
               SELECT 'intake', 'accepted', r.installation_id, r.event_id, r.id, nullif(c.ref, ''),
                      audit_event_type(r.event_type), r.received_at, d.created_at, r.retry_num
                 FROM done d
                 JOIN event_receipts r ON r.id = d.receipt_id
                 LEFT JOIN UNNEST($2::uuid[], $3::text[]) AS c(receipt, ref) ON c.receipt = d.receipt_id
                WHERE d.topic = 'events')
           SELECT count(*) AS "deleted!" FROM done"#,
        &ids,
        &receipts,
        &refs,
        &failed_ids,
        &errors,
    )
    .fetch_one(conn)
    .await?;
    Ok(deleted as u64)
}

/// How many rows wait, and the age in seconds of the oldest.
#[derive(Debug, Clone, Copy)]
pub struct Backlog {
    pub pending: i64,
    pub oldest_seconds: f64,
}

pub async fn backlog(conn: impl PgExecutor<'_>) -> sqlx::Result<Backlog> {
    let r = sqlx::query!(
        r#"SELECT count(*) AS "pending!",
                  extract(epoch FROM now() - min(created_at))::float8 AS oldest
             FROM outbox"#
    )
    .fetch_one(conn)
    .await?;
    Ok(Backlog {
        pending: r.pending,
        oldest_seconds: r.oldest.unwrap_or(0.0),
    })
}
