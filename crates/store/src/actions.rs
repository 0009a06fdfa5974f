//! A person's actions (`person_actions`) and the messages that repeat one
//! (`doubled_messages`): Slack has delivered one message as two `message`
//! events with different `ts` and the same `client_msg_id`. The first of
//! its messages the thread store applies owns the action; another is a
//! *doubled* message, recorded here (identifiers only) and never applied
//! to a thread, so it neither asks for an answer nor makes the thread look
//! changed. An `app_mention` and its `message` twin carry one `ts` and own
//! the action together (their turn decides which of them answers).

use sqlx::PgConnection;
use threadline_domain::classify::{Effect, MessageFacts, Speaker};
use uuid::Uuid;

/// Claims the action `client_msg_id` of `channel` for the message `ts`;
/// returns the `ts` of the message that owns it (`ts` itself when it is
/// the first, a twin of the first or a redelivery, or when the owner was
/// deleted before it was answered: the action still shows as this message,
/// which stands for it now). One statement: a claim that meets another's
/// (committed, or committing: it waits for it) reads the owner from the
/// row it conflicted with (an update, which an insert that lost could not
/// see in its own snapshot).
pub async fn claim(
    conn: &mut PgConnection,
    inst: Uuid,
    channel: &str,
    client_msg_id: &str,
    ts: &str,
) -> sqlx::Result<String> {
    sqlx::query_scalar!(
        "INSERT INTO person_actions (installation_id, channel_id, client_msg_id, ts) VALUES ($1, $2, $3, $4)
         ON CONFLICT (installation_id, channel_id, client_msg_id) DO UPDATE
            SET ts = CASE WHEN EXISTS (SELECT 1 FROM thread_messages m
                                        WHERE m.installation_id = $1 AND m.channel_id = $2
                                          AND m.ts = person_actions.ts AND m.deleted)
                           AND NOT EXISTS (SELECT 1 FROM turns t
                                            WHERE t.installation_id = $1 AND t.channel_id = $2
                                              AND t.ts = person_actions.ts AND t.answered_at IS NOT NULL)
                          THEN EXCLUDED.ts ELSE person_actions.ts END
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

/// A doubled message that stands for its action once the message that
/// owned it is deleted: the person deleted one of the two messages Slack
/// made of their one action, and the other still shows.
#[derive(Debug, Clone)]
pub struct Promotion {
    /// The copy, as the thread store will hold it (the owner's text: the
    /// copy's own was never applied).
    pub facts: MessageFacts,
    /// The receipt that delivered the copy.
    pub receipt: Uuid,
    /// The owner's turn source, when the owner asked for an answer and
    /// has none yet: the copy asks for it now.
    pub asks: Option<String>,
}

/// Read before the deletion of the message `ts` is applied (its text goes
/// with it): the copy that will stand for the action `ts` owns, if Slack
/// made another message of it that is not deleted.
pub async fn promotion(
    conn: &mut PgConnection,
    inst: Uuid,
    channel: &str,
    ts: &str,
) -> sqlx::Result<Option<Promotion>> {
    let row = sqlx::query!(
        r#"SELECT d.ts AS copy_ts, d.receipt_id, m.root_ts, m.user_id, m.text, pa.client_msg_id,
                  t.source AS "source?", t.answered_at IS NOT NULL AS "answered!"
             FROM person_actions pa
             JOIN thread_messages m ON m.installation_id = pa.installation_id AND m.channel_id = pa.channel_id
                                   AND m.ts = pa.ts AND NOT m.deleted AND m.speaker = $4
             JOIN doubled_messages d ON d.installation_id = pa.installation_id AND d.channel_id = pa.channel_id
                                    AND d.kept_ts = pa.ts
             LEFT JOIN turns t ON t.installation_id = m.installation_id AND t.channel_id = m.channel_id
                              AND t.ts = m.ts
            WHERE pa.installation_id = $1 AND pa.channel_id = $2 AND pa.ts = $3
              AND NOT EXISTS (SELECT 1 FROM thread_messages c
                               WHERE c.installation_id = d.installation_id AND c.channel_id = d.channel_id
                                 AND c.ts = d.ts AND c.deleted)
            ORDER BY d.ts::numeric
            LIMIT 1"#,
        inst,
        channel,
        ts,
        Speaker::Human.as_str()
    )
    .fetch_optional(&mut *conn)
    .await?;
    Ok(row.map(|r| Promotion {
        facts: MessageFacts {
            // (a copy of a top-level message is a thread of its own; of a
            // reply, a reply in the same thread)
            root_ts: if r.root_ts == ts {
                r.copy_ts.clone()
            } else {
                r.root_ts
            },
            ts: r.copy_ts,
            speaker: Speaker::Human,
            user_id: r.user_id,
            bot_id: None,
            text: r.text,
            changed_ts: None,
            client_msg_id: Some(r.client_msg_id),
        },
        receipt: r.receipt_id,
        asks: r.source.filter(|_| !r.answered),
    }))
}

/// The copy stands for the action from now on (after the owner's deletion
/// was applied, in its transaction): it owns the action, is no longer
/// doubled, is applied to its thread; and when it asks for the answer
/// the owner did not get, it takes a turn and its thread is reconsidered
/// through the outbox, so it is answered. Whether it asks.
pub async fn promote(
    conn: &mut PgConnection,
    inst: Uuid,
    channel: &str,
    owner_ts: &str,
    p: &Promotion,
) -> sqlx::Result<bool> {
    let copy = &p.facts.ts;
    sqlx::query!(
        "UPDATE person_actions SET ts = $4
          WHERE installation_id = $1 AND channel_id = $2 AND ts = $3",
        inst,
        channel,
        owner_ts,
        copy
    )
    .execute(&mut *conn)
    .await?;
    sqlx::query!(
        "DELETE FROM doubled_messages WHERE installation_id = $1 AND channel_id = $2 AND ts = $3",
        inst,
        channel,
        copy
    )
    .execute(&mut *conn)
    .await?;
    crate::threads::apply(conn, inst, channel, &Effect::Upsert(p.facts.clone())).await?;
    let Some(source) = &p.asks else {
        return Ok(false);
    };
    if !crate::threads::claim_turn(conn, inst, channel, copy, p.receipt, source).await? {
        return Ok(false);
    }
    let msg = threadline_proto::v1::Reconsider {
        schema_version: threadline_proto::v1::SCHEMA_VERSION,
        installation_id: inst.to_string(),
        channel_id: channel.to_owned(),
        root_ts: p.facts.root_ts.clone(),
        stale_version: 0,
        receipt_id: p.receipt.to_string(),
        reason: "doubled_copy_stands".to_owned(),
    };
    crate::outbox::enqueue(
        conn,
        inst,
        p.receipt,
        threadline_domain::topic::Topic::Reconsider,
        &format!("recon:copy:{inst}:{channel}:{copy}"),
        prost::Message::encode_to_vec(&msg),
    )
    .await?;
    Ok(true)
}
