//! The audit log (DESIGN invariant 9): one append-only record per decision
//! point, holding identifiers, hashes, decisions and timings, never message
//! text, names, tokens or headers. Codes are cut to short tokens here
//! ([`sanitise_code`]); the channel arrives as its pseudonym, computed by
//! the caller that holds the key.

use sqlx::PgConnection;
pub use threadline_domain::audit::sanitise_code;
use uuid::Uuid;

/// One decision point.
#[derive(Debug, Default, Clone)]
pub struct Record<'a> {
    pub stage: &'static str,
    pub outcome: &'a str,
    pub reason: Option<&'a str>,
    pub installation_id: Option<Uuid>,
    pub event_id: Option<&'a str>,
    pub receipt_id: Option<Uuid>,
    pub decision_id: Option<Uuid>,
    pub intent_id: Option<Uuid>,
    /// The channel's keyed pseudonym, never its id.
    pub channel_ref: Option<String>,
    pub event_type: Option<&'a str>,
    pub thread_version: Option<i64>,
    pub model_config_id: Option<&'a str>,
    pub prompt_tokens: Option<i32>,
    pub completion_tokens: Option<i32>,
    pub output_hash: Option<&'a str>,
    pub delivery_status: Option<&'a str>,
    pub error_code: Option<&'a str>,
    pub retry_count: Option<i32>,
    pub reviewer: Option<&'a str>,
}

/// Appends `r` on `conn` (inside the caller's transaction when it has one,
/// so the record commits with the change it describes).
pub async fn append(conn: &mut PgConnection, r: &Record<'_>) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO audit_log (stage, outcome, reason, installation_id, event_id, receipt_id, decision_id,
                                intent_id, channel_ref, event_type, thread_version, model_config_id,
                                prompt_tokens, completion_tokens, output_hash, delivery_status, error_code,
                                retry_count, reviewer)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19)",
        r.stage,
        sanitise_code(r.outcome),
        r.reason.map(sanitise_code),
        r.installation_id,
        r.event_id,
        r.receipt_id,
        r.decision_id,
        r.intent_id,
        r.channel_ref,
        r.event_type.map(sanitise_code),
        r.thread_version,
        r.model_config_id,
        r.prompt_tokens,
        r.completion_tokens,
        r.output_hash,
        r.delivery_status.map(sanitise_code),
        r.error_code.map(sanitise_code),
        r.retry_count,
        r.reviewer.map(sanitise_code),
    )
    .execute(conn)
    .await?;
    Ok(())
}
