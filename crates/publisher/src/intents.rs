//! Reply intents and the checks before a claim, in short transactions.

use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

/// What the pre-post checks found.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// This worker owns the post: `sending` by compare-and-set.
    Claimed(Uuid),
    /// The thread changed since the proposal's version.
    Stale,
    /// A newer trigger in the same thread will be answered instead.
    Superseded,
    /// The source message was deleted.
    SourceDeleted,
    /// Already sent for this source event.
    AlreadySent,
    /// Another worker is posting, or a retry is not due yet (seconds).
    NotNow(f64),
    /// The intent's outcome is unknown: reconcile it before anything else.
    Reconcile(Uuid),
    /// Held for an operator, or failed for good: nothing to do.
    Closed,
}

pub struct Proposal<'a> {
    pub installation: Uuid,
    pub receipt: Uuid,
    pub decision: Uuid,
    pub event_id: &'a str,
    pub action_kind: &'a str,
    pub channel: &'a str,
    pub root_ts: &'a str,
    pub source_ts: &'a str,
    pub version: i64,
    pub body_hash: &'a str,
}

/// An earlier attempt of this intent whose outcome is not known: `unknown`,
/// `reconciling`, or `sending` for longer than `sending_stale` seconds (its
/// worker died between Slack's answer and recording it; configured longer
/// than the Slack timeout, so a post still in flight is never taken for dead).
pub async fn unsettled(
    pool: &PgPool,
    installation: Uuid,
    event_id: &str,
    action_kind: &str,
    sending_stale: f64,
) -> sqlx::Result<Option<Uuid>> {
    let row: Option<(Uuid, String, Option<f64>)> = sqlx::query_as(
        "SELECT id, state, extract(epoch FROM now() - sending_since)::float8
           FROM reply_intents WHERE installation_id = $1 AND event_id = $2 AND action_kind = $3",
    )
    .bind(installation)
    .bind(event_id)
    .bind(action_kind)
    .fetch_optional(pool)
    .await?;
    Ok(match row {
        Some((id, state, _)) if state == "unknown" || state == "reconciling" => Some(id),
        Some((id, state, Some(age))) if state == "sending" && age > sending_stale => {
            sqlx::query("UPDATE reply_intents SET state = 'unknown', unknown_since = now(), updated_at = now() WHERE id = $1 AND state = 'sending'")
                .bind(id)
                .execute(pool)
                .await?;
            Some(id)
        }
        _ => None,
    })
}

/// The checks of DESIGN §5 and the claim of §6, in one short transaction.
/// A `sending` intent older than `sending_stale` seconds is taken as unknown.
pub async fn check_and_claim(
    pool: &PgPool,
    p: &Proposal<'_>,
    sending_stale: f64,
) -> sqlx::Result<Verdict> {
    let mut tx = pool.begin().await?;
    // Lock the thread row so no content change commits between the check
    // and the claim.
    let version: Option<i64> = sqlx::query_scalar(
        "SELECT version FROM threads WHERE installation_id = $1 AND channel_id = $2 AND root_ts = $3 FOR SHARE",
    )
    .bind(p.installation)
    .bind(p.channel)
    .bind(p.root_ts)
    .fetch_optional(&mut *tx)
    .await?;
    let existing: Option<(Uuid, String, f64, Option<f64>)> = sqlx::query_as(
        "SELECT id, state, extract(epoch FROM next_attempt_at - now())::float8,
                extract(epoch FROM now() - sending_since)::float8
           FROM reply_intents WHERE installation_id = $1 AND event_id = $2 AND action_kind = $3",
    )
    .bind(p.installation)
    .bind(p.event_id)
    .bind(p.action_kind)
    .fetch_optional(&mut *tx)
    .await?;
    if let Some((id, state, due_in, sending_for)) = &existing {
        match state.as_str() {
            "sent" => return Ok(Verdict::AlreadySent),
            "held" | "failed_permanent" => return Ok(Verdict::Closed),
            "unknown" | "reconciling" => return Ok(Verdict::Reconcile(*id)),
            "sending" if sending_for.is_some_and(|s| s > sending_stale) => {
                sqlx::query("UPDATE reply_intents SET state = 'unknown', unknown_since = now(), updated_at = now() WHERE id = $1 AND state = 'sending'")
                    .bind(id)
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
                return Ok(Verdict::Reconcile(*id));
            }
            "sending" => return Ok(Verdict::NotNow(5.0)),
            "failed_retryable" | "pending" if *due_in > 0.0 => return Ok(Verdict::NotNow(*due_in)),
            _ => {}
        }
    }
    if version != Some(p.version) {
        return Ok(Verdict::Stale);
    }
    let deleted: bool = sqlx::query_scalar(
        "SELECT coalesce(bool_or(deleted), false) FROM thread_messages WHERE installation_id = $1 AND channel_id = $2 AND ts = $3",
    )
    .bind(p.installation)
    .bind(p.channel)
    .bind(p.source_ts)
    .fetch_one(&mut *tx)
    .await?;
    if deleted {
        return Ok(Verdict::SourceDeleted);
    }
    // A newer trigger in this thread answers instead of this one.
    let newer_trigger: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM turns t JOIN thread_messages m
                          ON m.installation_id = t.installation_id AND m.channel_id = t.channel_id AND m.ts = t.ts
                         WHERE t.installation_id = $1 AND t.channel_id = $2 AND m.root_ts = $3
                           AND t.ts::numeric > $4::numeric AND NOT m.deleted)",
    )
    .bind(p.installation)
    .bind(p.channel)
    .bind(p.root_ts)
    .bind(p.source_ts)
    .fetch_one(&mut *tx)
    .await?;
    if newer_trigger {
        return Ok(Verdict::Superseded);
    }
    // Anything else in the thread accepted but not yet processed (an edit
    // that arrived before the trigger counts too). A receipt untouched for
    // ten minutes is not waited for: its worker is gone, and an answer must
    // not hang on it forever.
    // The source's twin (the `message` event of an `app_mention`, or the
    // reverse) is the same message being created: it changes nothing.
    let pending_newer: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM event_receipts r
                         WHERE r.installation_id = $1 AND r.channel_id = $2 AND r.thread_ts = $3
                           AND r.state IN ('accepted', 'processing') AND r.id <> $4
                           AND r.updated_at > now() - interval '10 minutes'
                           AND NOT coalesce(r.message_ts = $5 AND r.event_subtype IS NULL
                                            AND r.event_type IN ('message', 'app_mention'), false))",
    )
    .bind(p.installation)
    .bind(p.channel)
    .bind(p.root_ts)
    .bind(p.receipt)
    .bind(p.source_ts)
    .fetch_one(&mut *tx)
    .await?;
    if pending_newer {
        // Not stale yet: wait until it is processed, then check again (it
        // may change the thread, or be a reaction or an unchanged edit).
        return Ok(Verdict::NotNow(0.5));
    }
    let id = match existing {
        Some((id, ..)) => id,
        None => {
            let id = Uuid::now_v7();
            sqlx::query(
                "INSERT INTO reply_intents (id, installation_id, event_id, action_kind, receipt_id, decision_id, channel_id,
                                            root_ts, body_hash, state, channel_ref)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 'pending', $10)
                 ON CONFLICT ON CONSTRAINT reply_intents_once DO NOTHING",
            )
            .bind(id)
            .bind(p.installation)
            .bind(p.event_id)
            .bind(p.action_kind)
            .bind(p.receipt)
            .bind(p.decision)
            .bind(p.channel)
            .bind(p.root_ts)
            .bind(p.body_hash)
            .bind(threadline_runtime::audit::channel_ref(p.installation, p.channel))
            .execute(&mut *tx)
            .await?;
            id
        }
    };
    let claimed = sqlx::query(
        "UPDATE reply_intents
            SET state = 'sending', sending_since = now(), attempts = attempts + 1, decision_id = $2, body_hash = $3,
                updated_at = now()
          WHERE id = $1 AND state IN ('pending', 'failed_retryable', 'withdrawn') AND next_attempt_at <= now()",
    )
    .bind(id)
    .bind(p.decision)
    .bind(p.body_hash)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(if claimed.rows_affected() == 1 {
        Verdict::Claimed(id)
    } else {
        Verdict::NotNow(5.0)
    })
}

/// Reserves the channel's next post slot (about one a second, shared by
/// all replicas) unless the workspace is paused; returns how long to wait
/// when no slot is free now.
pub async fn reserve_slot(
    pool: &PgPool,
    installation: Uuid,
    channel: &str,
    spacing_secs: f64,
) -> sqlx::Result<Option<f64>> {
    let paused: Option<f64> = sqlx::query_scalar(
        "SELECT extract(epoch FROM paused_until - now())::float8 FROM workspace_pauses
          WHERE installation_id = $1 AND paused_until > now()",
    )
    .bind(installation)
    .fetch_optional(pool)
    .await?;
    if let Some(wait) = paused {
        return Ok(Some(wait));
    }
    let got: Option<i32> = sqlx::query_scalar(
        "INSERT INTO post_budgets (installation_id, channel_id, next_allowed_at)
         VALUES ($1, $2, now() + make_interval(secs => $3))
         ON CONFLICT (installation_id, channel_id) DO UPDATE
            SET next_allowed_at = now() + make_interval(secs => $3)
          WHERE post_budgets.next_allowed_at <= now()
         RETURNING 1",
    )
    .bind(installation)
    .bind(channel)
    .bind(spacing_secs)
    .fetch_optional(pool)
    .await?;
    if got.is_some() {
        return Ok(None);
    }
    let wait: f64 = sqlx::query_scalar(
        "SELECT greatest(extract(epoch FROM next_allowed_at - now())::float8, 0.05) FROM post_budgets
          WHERE installation_id = $1 AND channel_id = $2",
    )
    .bind(installation)
    .bind(channel)
    .fetch_one(pool)
    .await?;
    Ok(Some(wait))
}

pub async fn pause_workspace(pool: &PgPool, installation: Uuid, secs: f64) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO workspace_pauses (installation_id, paused_until) VALUES ($1, now() + make_interval(secs => $2))
         ON CONFLICT (installation_id) DO UPDATE SET paused_until = greatest(workspace_pauses.paused_until, EXCLUDED.paused_until)",
    )
    .bind(installation)
    .bind(secs)
    .execute(pool)
    .await?;
    Ok(())
}

/// `sending`/`reconciling` → `sent`, and the turn and decision follow, in
/// one statement (the audit triggers record both changes with it).
pub async fn mark_sent(pool: &PgPool, id: Uuid, ts: &str, reconciled: bool) -> sqlx::Result<bool> {
    let sent: i64 = sqlx::query_scalar(
        "WITH i AS (
            UPDATE reply_intents SET state = 'sent', slack_ts = $2, reconciled = $3, error_code = NULL, updated_at = now()
             WHERE id = $1 AND state IN ('sending', 'unknown', 'reconciling')
            RETURNING decision_id),
         d AS (
            UPDATE decisions SET status = 'published', updated_at = now()
             WHERE id IN (SELECT decision_id FROM i) AND status IN ('proposed', 'approved')
            RETURNING id),
         t AS (
            UPDATE turns t SET answered_at = now()
              FROM decisions dd JOIN i ON i.decision_id = dd.id
             WHERE t.installation_id = dd.installation_id AND t.channel_id = dd.channel_id AND t.ts = dd.source_ts
            RETURNING 1)
         -- (d and t run to completion whether read or not)
         SELECT count(*) FROM i",
    )
    .bind(id)
    .bind(ts)
    .bind(reconciled)
    .fetch_one(pool)
    .await?;
    Ok(sent == 1)
}

/// Moves an intent from `sending` to another state.
pub async fn transition(
    conn: &mut PgConnection,
    id: Uuid,
    to: &str,
    code: Option<&str>,
    retry_in: Option<f64>,
) -> sqlx::Result<bool> {
    let r = sqlx::query(
        "UPDATE reply_intents
            SET state = $2, error_code = $3,
                next_attempt_at = CASE WHEN $4::float8 IS NULL THEN next_attempt_at ELSE now() + make_interval(secs => $4) END,
                unknown_since = CASE WHEN $2 = 'unknown' THEN now() ELSE unknown_since END,
                updated_at = now()
          WHERE id = $1 AND state IN ('sending', 'unknown', 'reconciling')",
    )
    .bind(id)
    .bind(to)
    .bind(code)
    .bind(retry_in)
    .execute(conn)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// Discards a decision (`stale`, `superseded`, `cancelled`, `suppressed`);
/// an intent of it that never reached Slack is withdrawn with it, so no
/// post is left waiting for a decision that will never come.
pub async fn set_decision(
    pool: &PgPool,
    decision: Uuid,
    status: &str,
    reason: Option<&str>,
) -> sqlx::Result<()> {
    sqlx::query(
        "WITH d AS (
             UPDATE decisions SET status = $2, status_reason = $3, updated_at = now()
              WHERE id = $1 AND status IN ('proposed', 'approved')
             RETURNING id)
         UPDATE reply_intents SET state = 'withdrawn', error_code = $2, updated_at = now()
          WHERE decision_id IN (SELECT id FROM d) AND state IN ('pending', 'failed_retryable')",
    )
    .bind(decision)
    .bind(status)
    .bind(reason)
    .execute(pool)
    .await?;
    Ok(())
}
