//! Reply intents: one per event that may be answered, the claim that makes
//! its post happen once, and the record of what Slack holds.

use prost::Message as _;
use sqlx::{PgConnection, PgPool};
use threadline_domain::state::{IntentState, Machine as _};
use threadline_domain::topic::Topic;
use uuid::Uuid;

/// What recording a post that Slack accepted came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    pub outcome: PostRecord,
    /// Human messages that reached the thread after the answer's context
    /// was taken and before the reply (crossed in flight), newly recorded.
    pub crossed: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PostRecord {
    /// The intent was `sending` (or being reconciled): now `sent`.
    Sent,
    /// The intent had been given up on (held, failed, pending again for a
    /// re-post): the post is recorded all the same, never forgotten.
    Late,
    /// Recorded before with this very ts (a repeated record).
    Already,
    /// Recorded before with another ts: a second post of one intent — a
    /// duplicate-reply incident, kept in `extra_ts`.
    Duplicate,
    /// No such intent.
    Missing,
}

/// Records that Slack holds the post `ts` of `intent`, made from
/// `decision`: the intent becomes `sent` from whatever state it was in (a
/// post that landed after its intent was given up on is still recorded),
/// the decision `published`, the turn answered, and any human message that
/// crossed the answer in flight is recorded. One transaction; the thread
/// row is locked first so that a crossing message committed concurrently
/// by the context-builder is seen by one side or the other.
pub async fn record_post(
    pool: &PgPool,
    intent: Uuid,
    decision: Uuid,
    ts: &str,
    reconciled: bool,
) -> sqlx::Result<Recorded> {
    let mut tx = pool.begin().await?;
    let recorded = record_post_in(&mut tx, intent, decision, ts, reconciled).await?;
    tx.commit().await?;
    Ok(recorded)
}

/// [`record_post`] inside the caller's transaction.
pub async fn record_post_in(
    conn: &mut PgConnection,
    intent: Uuid,
    decision: Uuid,
    ts: &str,
    reconciled: bool,
) -> sqlx::Result<Recorded> {
    // The intent, and its thread's row: a crossing message's insert bumps
    // that row, so one of the two transactions waits for the other and the
    // next statement here sees its message (or it sees this reply).
    let before = sqlx::query!(
        r#"SELECT i.state, i.slack_ts,
                  (SELECT 1 FROM threads t
                    WHERE t.installation_id = i.installation_id AND t.channel_id = i.channel_id
                      AND t.root_ts = i.root_ts
                      FOR SHARE) AS thread_locked
             FROM reply_intents i WHERE i.id = $1
              FOR UPDATE"#,
        intent
    )
    .fetch_optional(&mut *conn)
    .await?;
    let state = match &before {
        None => None,
        Some(b) => Some(
            IntentState::parse(&b.state)
                .map_err(|e| sqlx::Error::Decode(format!("reply_intents.state: {e}").into()))?,
        ),
    };
    let mut crossed: Vec<String> = Vec::new();
    let outcome = match (state, before.and_then(|b| b.slack_ts)) {
        (None, _) => PostRecord::Missing,
        (Some(IntentState::Sent), Some(known)) if known == ts => PostRecord::Already,
        (Some(IntentState::Sent), _) => {
            sqlx::query!(
                "UPDATE reply_intents SET extra_ts = array_append(extra_ts, $2), updated_at = now()
                  WHERE id = $1 AND NOT ($2 = ANY(extra_ts))",
                intent,
                ts
            )
            .execute(&mut *conn)
            .await?;
            PostRecord::Duplicate
        }
        (Some(state), _) => {
            let late = !IntentState::IN_FLIGHT.contains(&state);
            // Sent, the decision published and the turn answered, and the
            // human messages of the thread older than the reply that the
            // answer did not read, within the window its context covered
            // (deleted since or not: they were there when it went out),
            // recorded as crossing it in flight: one statement.
            crossed = sqlx::query_scalar!(
                r#"WITH i AS (
                    UPDATE reply_intents
                       SET state = 'sent', slack_ts = $2, reconciled = $3, decision_id = $4, error_code = NULL,
                           next_check_at = NULL, updated_at = now(),
                           late_recorded_at = CASE WHEN $5 THEN now() END
                     WHERE id = $1 AND state <> 'sent'
                    RETURNING decision_id),
                 d AS (
                    UPDATE decisions SET status = 'published', updated_at = now()
                     WHERE id IN (SELECT decision_id FROM i) AND status NOT IN ('published', 'rejected')
                    RETURNING id),
                 t AS (
                    UPDATE turns t SET answered_at = coalesce(t.answered_at, now())
                      FROM decisions dd
                     WHERE dd.id = $4 AND EXISTS (SELECT 1 FROM i)
                       AND t.installation_id = dd.installation_id AND t.channel_id = dd.channel_id AND t.ts = dd.source_ts
                    RETURNING 1)
                 INSERT INTO crossed_answers (intent_id, installation_id, channel_id, root_ts, reply_ts, crossing_ts, detected_by,
                                              detected_at)
                 SELECT $1, dd.installation_id, dd.channel_id, dd.root_ts, $2, m.ts, 'publisher', clock_timestamp()
                   FROM decisions dd JOIN thread_messages m
                     ON m.installation_id = dd.installation_id AND m.channel_id = dd.channel_id AND m.root_ts = dd.root_ts
                  WHERE dd.id = $4 AND dd.context_ts IS NOT NULL AND EXISTS (SELECT 1 FROM i)
                    AND m.speaker = 'user'
                    -- deleted only after the context was taken: it was there
                    -- when the answer went out
                    AND (NOT m.deleted OR m.deleted_at > dd.created_at)
                    AND m.ts::numeric < $2::numeric
                    AND m.ts::numeric > coalesce(dd.context_floor_ts, '0')::numeric
                    AND NOT (m.ts = ANY(dd.context_ts))
                 ON CONFLICT DO NOTHING
                 RETURNING crossing_ts"#,
                intent,
                ts,
                reconciled || late,
                decision,
                late
            )
            .fetch_all(&mut *conn)
            .await?;
            if late {
                PostRecord::Late
            } else {
                PostRecord::Sent
            }
        }
    };
    if !crossed.is_empty() {
        // Reconsider the thread, in the transaction that recorded the
        // crossing: neither is kept without the other.
        let d = sqlx::query!(
            "SELECT installation_id, channel_id, root_ts, receipt_id FROM decisions WHERE id = $1",
            decision
        )
        .fetch_one(&mut *conn)
        .await?;
        let msg = crate::outbox::crossed_reconsider(
            d.installation_id,
            &d.channel_id,
            &d.root_ts,
            d.receipt_id,
        );
        crate::outbox::enqueue(
            conn,
            d.installation_id,
            d.receipt_id,
            Topic::Reconsider,
            &format!(
                "recon:crossed:{intent}:{}",
                crossed.iter().max().map(String::as_str).unwrap_or_default()
            ),
            msg.encode_to_vec(),
        )
        .await?;
    }
    Ok(Recorded { outcome, crossed })
}
