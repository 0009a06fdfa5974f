//! Replaying `unparsed` receipts: deliveries that were signed and carried an
//! identity but did not parse, held with their raw body (invariant 10).
//!
//! A replay re-parses the stored body with this version's parser. When it
//! parses and its installation is active, the receipt becomes a normal
//! `accepted` receipt with its outbox row — built by the same code as the
//! gateway's intake ([`crate::events::build_receipt`]) — and the body is
//! deleted, all in one transaction. Otherwise the receipt is left as it was,
//! with the reason.

use sqlx::PgPool;
use threadline_domain::Envelope;
use time::OffsetDateTime;
use uuid::Uuid;

use crate::events::{ReceiptMeta, build_receipt, parse_error_text};
use crate::installations::{self, Resolved};

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

#[derive(sqlx::FromRow)]
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
    let held: Option<Held> = sqlx::query_as(
        "SELECT r.state, r.api_app_id, r.event_id, r.retry_num, r.retry_reason, r.received_at,
                r.parse_error, u.body
           FROM event_receipts r LEFT JOIN unparsed_events u ON u.receipt_id = r.id
          WHERE r.id = $1
            FOR UPDATE OF r",
    )
    .bind(receipt_id)
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
                sqlx::query("UPDATE event_receipts SET parse_error = $2 WHERE id = $1")
                    .bind(receipt_id)
                    .bind(&parse_error)
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
    let installation_id = match installations::lookup(pool, &cb.installation_key()).await? {
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
    let r = build_receipt(
        &cb,
        ReceiptMeta {
            id: receipt_id,
            installation_id,
            retry_num: held.retry_num,
            retry_reason: held.retry_reason,
            received_at_unix_ms: (held.received_at.unix_timestamp_nanos() / 1_000_000) as i64,
        },
    );
    // Compare-and-set on the state: a concurrent replay finds it accepted.
    let updated = sqlx::query(
        "UPDATE event_receipts
            SET state = 'accepted', installation_id = $2, team_id = $3, enterprise_id = $4,
                event_type = $5, event_subtype = $6, channel_id = $7, message_ts = $8, thread_ts = $9,
                event_time = to_timestamp($10::bigint), updated_at = now()
          WHERE id = $1 AND state = 'unparsed'",
    )
    .bind(receipt_id)
    .bind(installation_id)
    .bind(&r.team_id)
    .bind(&r.enterprise_id)
    .bind(&r.event_type)
    .bind(&r.event_subtype)
    .bind(&r.channel_id)
    .bind(&r.message_ts)
    .bind(&r.thread_ts)
    .bind(r.event_time)
    .execute(&mut *tx)
    .await?;
    if updated.rows_affected() != 1 {
        return Ok(Replay::NotUnparsed {
            state: "changed during the replay".into(),
        });
    }
    sqlx::query(
        "INSERT INTO outbox (installation_id, receipt_id, topic, msg_id, payload, traceparent, tracestate)
         VALUES ($1, $2, 'events', $3, $4, $5, $6)",
    )
    .bind(installation_id)
    .bind(receipt_id)
    .bind(&r.msg_id)
    .bind(&r.payload)
    .bind(&r.traceparent)
    .bind(&r.tracestate)
    .execute(&mut *tx)
    .await?;
    sqlx::query("DELETE FROM unparsed_events WHERE receipt_id = $1")
        .bind(receipt_id)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(Replay::Accepted {
        installation_id,
        event_type: r.event_type,
    })
}
