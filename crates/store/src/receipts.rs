//! Event receipts: one per Slack event (`(api_app_id, event_id)`), written
//! by the gateway's intake with the event's outbox row, and the replay of
//! the `unparsed` ones — deliveries that were signed and carried an
//! identity but did not parse, held with their raw body (invariant 10).
//!
//! A replay re-parses the stored body with this version's parser. When it
//! parses and its installation is active, the receipt becomes a normal
//! `accepted` receipt with its outbox row — built by the same code as the
//! gateway's intake ([`build`]) — and the body is deleted, all in one
//! transaction. Otherwise the receipt is left as it was, with the reason.

use prost::Message as _;
use sqlx::PgPool;
use threadline_domain::{Envelope, EnvelopeError, EventCallback};
use threadline_proto::v1::{EventAccepted, SCHEMA_VERSION};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::installations::Resolved;
use crate::moves;
use threadline_domain::state::{Machine as _, ReceiptState};

/// Everything the receipt and outbox rows need. Identifiers only, except
/// `payload` (the bus message, with message text), which `Debug` leaves out
/// and the relay deletes once published, and an unparsed delivery's body.
#[derive(Clone)]
pub struct NewReceipt {
    pub id: Uuid,
    /// `None` only for an unparsed delivery of an unknown installation.
    pub installation_id: Option<Uuid>,
    pub api_app_id: String,
    pub event_id: String,
    pub team_id: Option<String>,
    pub enterprise_id: Option<String>,
    pub event_type: String,
    pub event_subtype: Option<String>,
    pub channel_id: Option<String>,
    pub message_ts: Option<String>,
    pub thread_ts: Option<String>,
    /// Seconds since the epoch; `None` only for an unparsed delivery.
    pub event_time: Option<i64>,
    pub retry_num: i32,
    pub retry_reason: Option<String>,
    pub msg_id: String,
    pub payload: Vec<u8>,
    pub traceparent: Option<String>,
    pub tracestate: Option<String>,
    /// Set for a delivery that did not parse: the receipt is stored as
    /// `unparsed`, with its body and no outbox row.
    pub unparsed: Option<Unparsed>,
    /// Set for our own new reply ([`settle_own_reply`]): settled at intake,
    /// with no outbox row.
    pub own_reply: Option<OwnReply>,
}

/// A signed delivery with an identity that the parser refused.
#[derive(Clone)]
pub struct Unparsed {
    /// Content-free: a reason code and the parser's message (field names only).
    pub parse_error: String,
    /// The raw body, kept for replay (holds message text).
    pub body: Vec<u8>,
}

impl std::fmt::Debug for NewReceipt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NewReceipt")
            .field("id", &self.id)
            .field("installation_id", &self.installation_id)
            .field("api_app_id", &self.api_app_id)
            .field("event_id", &self.event_id)
            .field("event_type", &self.event_type)
            .field("retry_num", &self.retry_num)
            .field("payload_len", &self.payload.len())
            .field(
                "parse_error",
                &self.unparsed.as_ref().map(|u| u.parse_error.as_str()),
            )
            .field("own_reply", &self.own_reply.is_some())
            .finish_non_exhaustive()
    }
}

/// Our own new reply, as the thread store keeps it: the publisher already
/// recorded the post, so nothing downstream has work in it. Intake writes
/// its fact and message (later answers read it) in the receipt's own
/// statement, with the thread's version as it is (a new thread's row at
/// 0, as the context-builder's `keep_reply` does), and ends its receipt
/// `ignored` (`own_bot`) with one audit record. Holds message text.
#[derive(Clone)]
pub struct OwnReply {
    pub channel: String,
    pub facts: threadline_domain::classify::MessageFacts,
    /// The channel's audit pseudonym under the gateway's key.
    pub channel_ref: String,
}

/// The reason an own reply's receipt ends with (the context-builder's
/// `IgnoreReason::OwnBot`).
pub const OWN_REPLY: &str = "own_bot";

/// Marks `r` as our own new reply when its event is one (`me` is the
/// installation's bot): a new message of ours, classified as the
/// context-builder would. Edits and deletions of our messages, and
/// anything else, take the full path; so does our reply where
/// `channel_ref` gives no pseudonym (a gateway without the audit key: its
/// record would name no channel, where the relay's and the
/// context-builder's do).
pub fn settle_own_reply(
    r: &mut NewReceipt,
    cb: &EventCallback,
    me: &threadline_domain::classify::BotIdentity,
    channel_ref: impl FnOnce(&str) -> Option<String>,
) {
    use threadline_domain::classify::{self, Effect, IgnoreReason, Outcome, Speaker};
    let (Some(channel), Some(_)) = (r.channel_id.as_deref(), r.installation_id) else {
        return;
    };
    let c = classify::classify(&cb.event_json, me, &classify::TriggerPolicy::default());
    if let (Outcome::Ignore(IgnoreReason::OwnBot), Effect::Upsert(f)) = (c.outcome, c.effect)
        && f.speaker == Speaker::Assistant
        && let Some(pseudonym) = channel_ref(channel)
    {
        r.own_reply = Some(OwnReply {
            channel: channel.to_owned(),
            channel_ref: pseudonym,
            facts: f,
        });
    }
}

/// What is stored as an unparsed receipt's `parse_error`: the reason code,
/// then the parser's message (field names and fixed wording, never values).
pub fn parse_error_text(e: &EnvelopeError) -> String {
    format!("{}: {e}", e.reason_code())
}

/// What a receipt has besides the parsed event: its id, installation,
/// Slack's retry headers and when it was received.
#[derive(Debug, Clone)]
pub struct ReceiptMeta {
    pub id: Uuid,
    pub installation_id: Uuid,
    pub retry_num: i32,
    pub retry_reason: Option<String>,
    pub received_at_unix_ms: i64,
    /// The W3C trace context the bus message continues, if any.
    pub traceparent: Option<String>,
    pub tracestate: Option<String>,
}

/// The receipt and its `EventAccepted` bus message for a parsed event: what
/// the gateway commits for a new delivery, and what a replay of an unparsed
/// receipt commits in its place.
pub fn build(cb: &EventCallback, meta: ReceiptMeta) -> NewReceipt {
    let ReceiptMeta {
        id,
        installation_id,
        retry_num,
        retry_reason,
        received_at_unix_ms,
        traceparent,
        tracestate,
    } = meta;
    let key = cb.installation_key();
    let ev = &cb.event;
    let s = |v: Option<&str>| v.map(str::to_owned);
    let team_id = key
        .team_id
        .as_ref()
        .map(|t| t.to_string())
        .or_else(|| cb.team_id.as_ref().map(|t| t.to_string()));
    let enterprise_id = key.enterprise_id.as_ref().map(|e| e.to_string());
    let message = EventAccepted {
        schema_version: SCHEMA_VERSION,
        receipt_id: id.to_string(),
        installation_id: installation_id.to_string(),
        api_app_id: cb.api_app_id.to_string(),
        event_id: cb.event_id.to_string(),
        team_id: team_id.clone().unwrap_or_default(),
        enterprise_id: enterprise_id.clone().unwrap_or_default(),
        event_type: ev.kind.type_str().to_owned(),
        event_subtype: ev.kind.subtype_str().unwrap_or_default().to_owned(),
        channel_id: ev
            .channel
            .as_ref()
            .map(|c| c.to_string())
            .unwrap_or_default(),
        message_ts: ev.ts.as_ref().map(|t| t.to_string()).unwrap_or_default(),
        thread_ts: ev.root().map(|t| t.to_string()).unwrap_or_default(),
        event_time: cb.event_time,
        received_at_unix_ms,
        retry_num: retry_num.max(0) as u32,
        is_ext_shared_channel: cb.is_ext_shared_channel,
        event_json: serde_json::to_vec(&cb.event_json).unwrap_or_default(),
    };
    NewReceipt {
        id,
        installation_id: Some(installation_id),
        api_app_id: cb.api_app_id.to_string(),
        event_id: cb.event_id.to_string(),
        team_id,
        enterprise_id,
        event_type: ev.kind.type_str().to_owned(),
        event_subtype: s(ev.kind.subtype_str()),
        channel_id: ev.channel.as_ref().map(|c| c.to_string()),
        message_ts: ev.ts.as_ref().map(|t| t.to_string()),
        thread_ts: ev.root().map(|t| t.to_string()),
        event_time: Some(cb.event_time),
        retry_num,
        retry_reason,
        msg_id: format!("evt:{}:{}", cb.api_app_id, cb.event_id),
        payload: message.encode_to_vec(),
        traceparent,
        tracestate: tracestate.filter(|s| !s.is_empty()),
        unparsed: None,
        own_reply: None,
    }
}

/// What replaying one receipt came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Replay {
    /// Now `accepted`, its outbox row committed and its body deleted.
    Accepted {
        installation_id: Uuid,
        event_type: String,
    },
    /// Still does not parse; left `unparsed` with this (current) reason.
    StillUnparsed { parse_error: String },
    /// Parses, but its installation is unknown or disabled: left `unparsed`
    /// (installing or re-enabling the app and replaying again takes it on).
    InstallationNotActive { installation: &'static str },
    /// No receipt has this id.
    NotFound,
    /// The receipt is not `unparsed` (already replayed, or purged).
    NotUnparsed { state: String },
}

struct Held {
    state: String,
    api_app_id: String,
    event_id: String,
    retry_num: i32,
    retry_reason: Option<String>,
    received_at: OffsetDateTime,
    parse_error: Option<String>,
    body: Option<Vec<u8>>,
}

/// Replays one receipt. Database errors are returned; every other outcome
/// is a [`Replay`].
pub async fn replay(pool: &PgPool, receipt_id: Uuid) -> Result<Replay, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let held = sqlx::query_as!(
        Held,
        r#"SELECT r.state, r.api_app_id, r.event_id, r.retry_num, r.retry_reason, r.received_at,
                  r.parse_error, u.body AS "body?"
             FROM event_receipts r LEFT JOIN unparsed_events u ON u.receipt_id = r.id
            WHERE r.id = $1
              FOR UPDATE OF r"#,
        receipt_id
    )
    .fetch_optional(&mut *tx)
    .await?;
    let Some(held) = held else {
        return Ok(Replay::NotFound);
    };
    if held.state != "unparsed" {
        return Ok(Replay::NotUnparsed { state: held.state });
    }
    let Some(body) = held.body else {
        // Cannot happen (the body is written with the receipt and deleted
        // with its state change); reported rather than guessed at.
        return Ok(Replay::StillUnparsed {
            parse_error: "the stored body is missing".into(),
        });
    };
    let cb = match Envelope::parse(&body) {
        Ok(Envelope::EventCallback(cb)) => *cb,
        Ok(_) => {
            return Ok(Replay::StillUnparsed {
                parse_error: "the body is not an event_callback".into(),
            });
        }
        Err(e) => {
            let parse_error = parse_error_text(&e);
            if held.parse_error.as_deref() != Some(parse_error.as_str()) {
                sqlx::query!(
                    "UPDATE event_receipts SET parse_error = $2 WHERE id = $1",
                    receipt_id,
                    parse_error
                )
                .execute(&mut *tx)
                .await?;
                tx.commit().await?;
            }
            return Ok(Replay::StillUnparsed { parse_error });
        }
    };
    if cb.api_app_id.as_str() != held.api_app_id || cb.event_id.as_str() != held.event_id {
        return Ok(Replay::StillUnparsed {
            parse_error: "the body's event_id or api_app_id differs from the receipt's".into(),
        });
    }
    let installation_id = match crate::installations::lookup(pool, &cb.installation_key()).await? {
        Resolved::Active(id) => id,
        Resolved::Disabled(_) => {
            return Ok(Replay::InstallationNotActive {
                installation: "disabled",
            });
        }
        Resolved::Unknown => {
            return Ok(Replay::InstallationNotActive {
                installation: "unknown",
            });
        }
    };
    let r = build(
        &cb,
        ReceiptMeta {
            id: receipt_id,
            installation_id,
            retry_num: held.retry_num,
            retry_reason: held.retry_reason,
            received_at_unix_ms: (held.received_at.unix_timestamp_nanos() / 1_000_000) as i64,
            traceparent: None,
            tracestate: None,
        },
    );
    // Compare-and-set on the state: a concurrent replay finds it accepted.
    let updated = sqlx::query!(
        "UPDATE event_receipts
            SET state = $11, installation_id = $2, team_id = $3, enterprise_id = $4,
                event_type = $5, event_subtype = $6, channel_id = $7, message_ts = $8, thread_ts = $9,
                event_time = to_timestamp($10::bigint), updated_at = now()
          WHERE id = $1 AND state = ANY($12)",
        receipt_id,
        installation_id,
        r.team_id,
        r.enterprise_id,
        r.event_type,
        r.event_subtype,
        r.channel_id,
        r.message_ts,
        r.thread_ts,
        r.event_time,
        ReceiptState::Accepted.as_str(),
        &moves(&[ReceiptState::Unparsed], ReceiptState::Accepted),
    )
    .execute(&mut *tx)
    .await?;
    if updated.rows_affected() != 1 {
        return Ok(Replay::NotUnparsed {
            state: "changed during the replay".into(),
        });
    }
    sqlx::query!(
        "INSERT INTO outbox (installation_id, receipt_id, topic, msg_id, payload, traceparent, tracestate)
         VALUES ($1, $2, 'events', $3, $4, $5, $6)",
        installation_id,
        receipt_id,
        r.msg_id,
        r.payload,
        r.traceparent,
        r.tracestate,
    )
    .execute(&mut *tx)
    .await?;
    sqlx::query!(
        "DELETE FROM unparsed_events WHERE receipt_id = $1",
        receipt_id
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(Replay::Accepted {
        installation_id,
        event_type: r.event_type,
    })
}

/// An `unparsed` receipt as an operator lists it: identifiers, the parse
/// error and the size of the held body (never the body).
#[derive(Debug, Clone, serde::Serialize)]
pub struct HeldUnparsed {
    pub receipt_id: Uuid,
    /// `null` when the installation was unknown on receipt.
    pub installation_id: Option<Uuid>,
    pub api_app_id: String,
    pub event_id: String,
    pub team_id: Option<String>,
    pub enterprise_id: Option<String>,
    pub parse_error: Option<String>,
    #[serde(with = "time::serde::rfc3339")]
    pub received_at: OffsetDateTime,
    pub retry_num: i32,
    pub duplicate_deliveries: i32,
    pub body_bytes: i32,
}

/// The oldest `limit` unparsed receipts.
pub async fn unparsed(pool: &PgPool, limit: i64) -> sqlx::Result<Vec<HeldUnparsed>> {
    sqlx::query_as!(
        HeldUnparsed,
        r#"SELECT r.id AS receipt_id, r.installation_id, r.api_app_id, r.event_id, r.team_id,
                  r.enterprise_id, r.parse_error, r.received_at, r.retry_num,
                  r.duplicate_deliveries, octet_length(u.body) AS "body_bytes!"
             FROM unparsed_events u JOIN event_receipts r ON r.id = u.receipt_id
            WHERE r.state = 'unparsed'
            ORDER BY u.received_at, r.id
            LIMIT $1"#,
        limit.max(0)
    )
    .fetch_all(pool)
    .await
}

/// Every unparsed receipt's id, oldest first.
pub async fn unparsed_ids(pool: &PgPool) -> sqlx::Result<Vec<Uuid>> {
    sqlx::query_scalar!(
        "SELECT r.id FROM unparsed_events u JOIN event_receipts r ON r.id = u.receipt_id
          WHERE r.state = 'unparsed' ORDER BY u.received_at, r.id"
    )
    .fetch_all(pool)
    .await
}

/// Which of `ids` name a receipt.
pub async fn existing(pool: &PgPool, ids: &[Uuid]) -> sqlx::Result<Vec<Uuid>> {
    sqlx::query_scalar!("SELECT id FROM event_receipts WHERE id = ANY($1)", ids)
        .fetch_all(pool)
        .await
}

/// Inserts the receipts of a batch of deliveries with their outbox rows (or,
/// unparsed, their bodies) in one statement, so one transaction and one
/// commit: `ON CONFLICT (api_app_id, event_id) DO NOTHING`, and an outbox
/// row (or body) only for a receipt that was new. Our own new replies
/// ([`OwnReply`]) are settled in the same statement: their receipts end
/// `ignored` (`own_bot`) with one audit record and no outbox row, and
/// their facts and messages are kept (a message already there, an edit or
/// tombstone that arrived first, is left as it is; a thread not yet known
/// gets its row at version 0, in key order). Keeping them may wait for a
/// row another transaction is writing (an edit or deletion of that reply
/// the context-builder applies, a thread both make): at most
/// [`OWN_REPLY_LOCK_WAIT`], then the batch fails with `55P03`
/// ([`is_lock_wait`]), and the caller runs it again with `settle` false,
/// our replies then going the full path like any event. Returns the ids
/// of the receipts inserted. The caller sorts `rs` by identity so that
/// concurrent batches lock in the same order and cannot deadlock.
pub async fn insert_batch(
    pool: &PgPool,
    rs: &[&NewReceipt],
    settle: bool,
) -> sqlx::Result<Vec<Uuid>> {
    let own: Vec<(Uuid, Uuid, &OwnReply)> = rs
        .iter()
        .filter(|_| settle)
        .filter_map(|r| Some((r.id, r.installation_id?, r.own_reply.as_ref()?)))
        .collect();
    insert(pool, rs, &own).await
}

/// How long intake waits for a row lock while keeping our own replies
/// ([`insert_batch`]): well inside Slack's 3 s, and the spool's 1.4 s.
pub const OWN_REPLY_LOCK_WAIT: std::time::Duration = std::time::Duration::from_millis(300);

/// Whether `e` is a lock wait that ran out (`lock_timeout`, `55P03`).
pub fn is_lock_wait(e: &sqlx::Error) -> bool {
    e.as_database_error().and_then(|d| d.code()).as_deref() == Some("55P03")
}

/// [`insert_batch`]'s statement, keeping `own` (each with its receipt's
/// id and installation). Its own transaction: where it keeps replies, its
/// first step (an init plan, run before any row is read, so before any row
/// lock is waited for; a table lock, taken as the statement is planned, is
/// not bounded) sets its `lock_timeout` to [`OWN_REPLY_LOCK_WAIT`] until it
/// ends, which saves a transaction's two round trips per batch. The bound
/// covers the whole batch, a receipt another replica is inserting at the
/// same moment included: past it, the batch runs again without keeping
/// our replies, without a bound.
async fn insert(
    pool: &PgPool,
    rs: &[&NewReceipt],
    own: &[(Uuid, Uuid, &OwnReply)],
) -> sqlx::Result<Vec<Uuid>> {
    let wait = (!own.is_empty()).then(|| format!("{}ms", OWN_REPLY_LOCK_WAIT.as_millis()));
    // Arrays of borrowed or nullable elements are passed `as _` (the
    // statement casts each array to its column's type).
    sqlx::query_scalar!(
        r#"WITH input AS (
             SELECT * FROM UNNEST($1::uuid[], $2::uuid[], $3::text[], $4::text[], $5::text[], $6::text[],
                                  $7::text[], $8::text[], $9::text[], $10::text[], $11::text[], $12::bigint[],
                                  $13::int[], $14::text[], $15::text[], $16::bytea[], $17::text[], $18::text[],
                                  $19::text[], $20::bytea[])
                 AS t(id, installation_id, api_app_id, event_id, team_id, enterprise_id,
                      event_type, event_subtype, channel_id, message_ts, thread_ts, event_time,
                      retry_num, retry_reason, msg_id, payload, traceparent, tracestate,
                      parse_error, unparsed_body)
              WHERE (SELECT set_config('lock_timeout', coalesce($35, current_setting('lock_timeout')), true))
                    IS NOT NULL
         ), ins AS (
             INSERT INTO event_receipts (id, installation_id, api_app_id, event_id, team_id, enterprise_id,
                                         event_type, event_subtype, channel_id, message_ts, thread_ts,
                                         event_time, retry_num, retry_reason, state, state_reason, parse_error)
             SELECT id, installation_id, api_app_id, event_id, team_id, enterprise_id,
                    event_type, event_subtype, channel_id, message_ts, thread_ts,
                    to_timestamp(event_time), retry_num, retry_reason,
                    CASE WHEN parse_error IS NOT NULL THEN 'unparsed'
                         WHEN id = ANY($21::uuid[]) THEN $32
                         ELSE 'accepted' END,
                    CASE WHEN parse_error IS NULL AND id = ANY($21::uuid[]) THEN $33 END,
                    parse_error
               FROM input
             ON CONFLICT (api_app_id, event_id) DO NOTHING
             RETURNING id
         ), outbox_rows AS (
             INSERT INTO outbox (installation_id, receipt_id, topic, msg_id, payload, traceparent, tracestate)
             SELECT input.installation_id, input.id, 'events', input.msg_id, input.payload, input.traceparent,
                    input.tracestate
               FROM input JOIN ins ON ins.id = input.id
              WHERE input.parse_error IS NULL AND NOT input.id = ANY($21::uuid[])
         ), unparsed_rows AS (
             INSERT INTO unparsed_events (receipt_id, body)
             SELECT input.id, input.unparsed_body
               FROM input JOIN ins ON ins.id = input.id
              WHERE input.parse_error IS NOT NULL
         ), own AS (
             SELECT o.* FROM UNNEST($21::uuid[], $22::uuid[], $23::text[], $24::text[], $25::text[],
                                    $26::text[], $27::text[], $28::text[], $29::text[], $30::text[],
                                    $31::text[])
                 AS o(id, installation_id, channel_id, ts, root_ts, user_id, bot_id, text, text_hash,
                      edited_ts, channel_ref)
               JOIN ins ON ins.id = o.id
         ), facts AS (
             INSERT INTO message_facts (installation_id, channel_id, ts, fact, fact_key)
             SELECT installation_id, channel_id, ts, 'create', '' FROM own
              ORDER BY installation_id, channel_id, ts
             ON CONFLICT DO NOTHING
             RETURNING installation_id, channel_id, ts
         ), msgs AS (
             INSERT INTO thread_messages
                    (installation_id, channel_id, ts, root_ts, speaker, user_id, bot_id, text, text_hash, edited_ts)
             SELECT own.installation_id, own.channel_id, own.ts, own.root_ts, $34, own.user_id, own.bot_id,
                    own.text, own.text_hash, own.edited_ts::numeric
               FROM own JOIN facts USING (installation_id, channel_id, ts)
              ORDER BY own.installation_id, own.channel_id, own.ts
             ON CONFLICT (installation_id, channel_id, ts) DO NOTHING
         ), made AS (
             -- (only a thread not known yet: a known one's row is not
             -- touched, so its version bumps in flight are not waited for;
             -- a new fact's message is new, or one an edit or tombstone
             -- that arrived first made, with its thread)
             INSERT INTO threads (installation_id, channel_id, root_ts, version)
             SELECT DISTINCT m.installation_id, m.channel_id, m.root_ts, 0
               FROM own m JOIN facts USING (installation_id, channel_id, ts)
              WHERE NOT EXISTS (SELECT 1 FROM threads t
                                 WHERE t.installation_id = m.installation_id AND t.channel_id = m.channel_id
                                   AND t.root_ts = m.root_ts)
              ORDER BY m.installation_id, m.channel_id, m.root_ts
             ON CONFLICT (installation_id, channel_id, root_ts) DO NOTHING
         ), audit AS (
             INSERT INTO audit_log (stage, outcome, reason, installation_id, event_id, receipt_id, channel_ref,
                                    event_type, received_at, acked_at, retry_count)
             SELECT 'intake', $32, $33, input.installation_id, input.event_id, input.id, own.channel_ref,
                    audit_event_type(input.event_type), now(), now(), input.retry_num
               FROM own JOIN input ON input.id = own.id
         )
         SELECT id AS "id!" FROM ins"#,
        &rs.iter().map(|r| r.id).collect::<Vec<_>>(),
        rs.iter().map(|r| r.installation_id).collect::<Vec<_>>() as _,
        rs.iter().map(|r| r.api_app_id.as_str()).collect::<Vec<_>>() as _,
        rs.iter().map(|r| r.event_id.as_str()).collect::<Vec<_>>() as _,
        rs.iter().map(|r| r.team_id.as_deref()).collect::<Vec<_>>() as _,
        rs.iter().map(|r| r.enterprise_id.as_deref()).collect::<Vec<_>>() as _,
        rs.iter().map(|r| r.event_type.as_str()).collect::<Vec<_>>() as _,
        rs.iter().map(|r| r.event_subtype.as_deref()).collect::<Vec<_>>() as _,
        rs.iter().map(|r| r.channel_id.as_deref()).collect::<Vec<_>>() as _,
        rs.iter().map(|r| r.message_ts.as_deref()).collect::<Vec<_>>() as _,
        rs.iter().map(|r| r.thread_ts.as_deref()).collect::<Vec<_>>() as _,
        rs.iter().map(|r| r.event_time).collect::<Vec<_>>() as _,
        &rs.iter().map(|r| r.retry_num).collect::<Vec<_>>(),
        rs.iter().map(|r| r.retry_reason.as_deref()).collect::<Vec<_>>() as _,
        rs.iter().map(|r| r.msg_id.as_str()).collect::<Vec<_>>() as _,
        rs.iter().map(|r| r.payload.as_slice()).collect::<Vec<_>>() as _,
        rs.iter().map(|r| r.traceparent.as_deref()).collect::<Vec<_>>() as _,
        rs.iter().map(|r| r.tracestate.as_deref()).collect::<Vec<_>>() as _,
        rs.iter()
            .map(|r| r.unparsed.as_ref().map(|u| u.parse_error.as_str()))
            .collect::<Vec<_>>() as _,
        rs.iter()
            .map(|r| r.unparsed.as_ref().map(|u| u.body.as_slice()))
            .collect::<Vec<_>>() as _,
        &own.iter().map(|(id, _, _)| *id).collect::<Vec<_>>(),
        &own.iter().map(|(_, inst, _)| *inst).collect::<Vec<_>>(),
        own.iter().map(|(_, _, o)| o.channel.as_str()).collect::<Vec<_>>() as _,
        own.iter().map(|(_, _, o)| o.facts.ts.as_str()).collect::<Vec<_>>() as _,
        own.iter().map(|(_, _, o)| o.facts.root_ts.as_str()).collect::<Vec<_>>() as _,
        own.iter().map(|(_, _, o)| o.facts.user_id.as_deref()).collect::<Vec<_>>() as _,
        own.iter().map(|(_, _, o)| o.facts.bot_id.as_deref()).collect::<Vec<_>>() as _,
        own.iter().map(|(_, _, o)| o.facts.text.as_str()).collect::<Vec<_>>() as _,
        &own.iter()
            .map(|(_, _, o)| crate::threads::text_hash(&o.facts.text))
            .collect::<Vec<_>>(),
        own.iter().map(|(_, _, o)| o.facts.changed_ts.as_deref()).collect::<Vec<_>>() as _,
        own.iter().map(|(_, _, o)| o.channel_ref.as_str()).collect::<Vec<_>>() as _,
        ReceiptState::Ignored.as_str(),
        OWN_REPLY,
        threadline_domain::classify::Speaker::Assistant.as_str(),
        wait
    )
    .fetch_all(pool)
    .await
}

/// Adds duplicate deliveries to their receipts' counts: `(api_app_id,
/// event_id, deliveries)`, sorted by identity by the caller (the same lock
/// order as [`insert_batch`]).
pub async fn count_duplicates(pool: &PgPool, dups: &[(&str, &str, i32)]) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE event_receipts r
            SET duplicate_deliveries = r.duplicate_deliveries + d.n, last_delivery_at = now()
           FROM UNNEST($1::text[], $2::text[], $3::int[]) AS d(api_app_id, event_id, n)
          WHERE r.api_app_id = d.api_app_id AND r.event_id = d.event_id",
        dups.iter().map(|d| d.0).collect::<Vec<_>>() as _,
        dups.iter().map(|d| d.1).collect::<Vec<_>>() as _,
        &dups.iter().map(|d| d.2).collect::<Vec<_>>(),
    )
    .execute(pool)
    .await?;
    Ok(())
}
