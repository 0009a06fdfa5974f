//! Late events (`late_events`) and what each installation does with a
//! request that arrived late (`late_event_policies`); see
//! `threadline_domain::late`. Identifiers, ages and outcomes only.

use sqlx::{PgConnection, PgPool};
use threadline_domain::late::{LateAction, LateOutcome};
use uuid::Uuid;

/// The installation's policy for late requests ([`LateAction::DEFAULT`]
/// when it never chose).
pub async fn action(pool: &PgPool, installation: Uuid) -> sqlx::Result<LateAction> {
    let stored = sqlx::query_scalar!(
        "SELECT action FROM late_event_policies WHERE installation_id = $1",
        installation
    )
    .fetch_optional(pool)
    .await?;
    match stored {
        None => Ok(LateAction::DEFAULT),
        Some(s) => LateAction::parse(&s).ok_or_else(|| {
            sqlx::Error::Decode(format!("late_event_policies.action: {s:?}").into())
        }),
    }
}

/// Sets the installation's policy for late requests.
pub async fn set_action(pool: &PgPool, installation: Uuid, action: LateAction) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO late_event_policies (installation_id, action) VALUES ($1, $2)
         ON CONFLICT (installation_id) DO UPDATE SET action = EXCLUDED.action, updated_at = now()",
        installation,
        action.as_str()
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// One event that arrived late, and what became of it.
#[derive(Debug, Clone)]
pub struct LateRecord<'a> {
    pub receipt: Uuid,
    pub installation: Uuid,
    pub channel: &'a str,
    pub message_ts: &'a str,
    pub age_ms: i64,
    pub outcome: LateOutcome,
    /// The channel's audit pseudonym (computed by the caller, who holds the key).
    pub channel_ref: Option<&'a str>,
}

/// Records a late event with its audit record (`context` / `late_event`,
/// the outcome as reason), in the caller's transaction; true the first
/// time (a redelivery finds it recorded).
pub async fn record(conn: &mut PgConnection, r: &LateRecord<'_>) -> sqlx::Result<bool> {
    let recorded = sqlx::query_scalar!(
        r#"WITH l AS (
            INSERT INTO late_events (receipt_id, installation_id, channel_id, message_ts, age_ms, outcome)
            VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING
            RETURNING receipt_id),
         a AS (
            INSERT INTO audit_log (stage, outcome, reason, installation_id, event_id, receipt_id, channel_ref,
                                   event_type)
            SELECT 'context', 'late_event', $6, e.installation_id, e.event_id, e.id, $7,
                   audit_event_type(e.event_type)
              FROM l JOIN event_receipts e ON e.id = l.receipt_id
            RETURNING 1)
         SELECT EXISTS (SELECT 1 FROM l) AS "recorded!""#,
        r.receipt,
        r.installation,
        r.channel,
        r.message_ts,
        r.age_ms,
        r.outcome.as_str(),
        r.channel_ref
    )
    .fetch_one(conn)
    .await?;
    Ok(recorded)
}

/// How late (milliseconds) the request of `receipt` arrived, when its
/// answer notes it (its outcome was `noted`): a reconsideration's new
/// context carries the note again.
pub async fn noted_age_ms(pool: &PgPool, receipt: Uuid) -> sqlx::Result<Option<i64>> {
    sqlx::query_scalar!(
        "SELECT age_ms FROM late_events WHERE receipt_id = $1 AND outcome = $2",
        receipt,
        LateOutcome::Noted.as_str()
    )
    .fetch_optional(pool)
    .await
}
