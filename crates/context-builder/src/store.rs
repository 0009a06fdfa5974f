//! The thread store: facts, messages, threads, turns and receipts. Every
//! content change is a fact applied at most once; each new fact bumps its
//! thread's version in the same transaction. The final state depends only on
//! the set of facts, not on their order or how often they arrive.

use prost::Message as _;
use sha2::{Digest, Sha256};
use sqlx::{PgConnection, PgPool};
use threadline_domain::classify::{
    BotIdentity, ChannelMode, Effect, MessageFacts, Speaker, TriggerPolicy,
};
use threadline_domain::state::{Machine as _, ReceiptState};
use threadline_runtime::audit;
use threadline_runtime::bus::Topic;
use uuid::Uuid;

use crate::context::{self, Built, Limits, Offer, StoredMessage};

/// An installation as the context-builder needs it.
#[derive(Debug, Clone)]
pub struct Installation {
    pub id: Uuid,
    pub identity: BotIdentity,
    pub active: bool,
    pub token_sealed: Option<Vec<u8>>,
    pub token_key_id: Option<String>,
    pub dms_allowed: bool,
    pub approved_bots: Vec<String>,
    pub non_marketplace: bool,
    pub private_allowed: bool,
    pub shared_allowed: bool,
    /// Answers only in allow-listed channels.
    pub allowlist_only: bool,
    /// Granted bot scopes; empty when never recorded (a manual install).
    pub scopes: Vec<String>,
}

type InstallationRow = (
    Uuid,
    String,
    String,
    String,
    String,
    Option<Vec<u8>>,
    Option<String>,
    Option<bool>,
    Option<Vec<String>>,
    Option<String>,
    Option<bool>,
    Option<bool>,
    Vec<String>,
    Option<bool>,
);

const INSTALLATION_COLUMNS: &str = "i.id, i.app_id, i.bot_id, i.bot_user_id, i.status, i.bot_token_sealed, i.bot_token_key_id,
     p.dms_allowed, p.approved_bots, p.read_limits, p.private_channels_allowed, p.shared_channels_allowed, i.scopes,
     p.allowlist_only";

pub async fn installation(pool: &PgPool, id: Uuid) -> sqlx::Result<Option<Installation>> {
    let row: Option<InstallationRow> = sqlx::query_as(&format!(
        "SELECT {INSTALLATION_COLUMNS}
           FROM installations i LEFT JOIN installation_policies p ON p.installation_id = i.id
          WHERE i.id = $1"
    ))
    .bind(id)
    .fetch_optional(pool)
    .await?;
    Ok(row.map(into_installation))
}

fn into_installation(
    (
        id,
        app_id,
        bot_id,
        bot_user_id,
        status,
        sealed,
        key_id,
        dms,
        bots,
        limits,
        private,
        shared,
        scopes,
        allowlist_only,
    ): InstallationRow,
) -> Installation {
    Installation {
        id,
        identity: BotIdentity {
            app_id,
            bot_id,
            bot_user_id,
        },
        active: status == "active",
        token_sealed: sealed,
        token_key_id: key_id,
        dms_allowed: dms.unwrap_or(false),
        approved_bots: bots.unwrap_or_default(),
        non_marketplace: limits.as_deref() == Some("non_marketplace"),
        private_allowed: private.unwrap_or(false),
        shared_allowed: shared.unwrap_or(false),
        allowlist_only: allowlist_only.unwrap_or(false),
        scopes,
    }
}

/// What handling an event starts from, read (and the receipt moved to
/// `processing`) in one statement.
pub struct Opened {
    /// The installation and its trigger policy for the event's channel;
    /// `None`: no such installation.
    pub installation: Option<(Installation, TriggerPolicy)>,
    /// Whether the channel is private, as learned within the hour.
    pub channel_private: Option<bool>,
    /// The receipt moved to `processing`; false when the installation is
    /// missing or inactive (it was not touched) or the receipt had already
    /// ended (a redelivery of finished work).
    pub begun: bool,
}

/// Reads the installation, its policy for `channel` and the channel's
/// known kind, and moves the receipt to `processing` when the installation
/// is active: one round trip.
pub async fn open(pool: &PgPool, inst: Uuid, receipt: Uuid, channel: &str) -> sqlx::Result<Opened> {
    #[derive(sqlx::FromRow)]
    struct Row {
        id: Uuid,
        app_id: String,
        bot_id: String,
        bot_user_id: String,
        status: String,
        bot_token_sealed: Option<Vec<u8>>,
        bot_token_key_id: Option<String>,
        dms_allowed: Option<bool>,
        approved_bots: Option<Vec<String>>,
        read_limits: Option<String>,
        private_channels_allowed: Option<bool>,
        shared_channels_allowed: Option<bool>,
        scopes: Vec<String>,
        allowlist_only: Option<bool>,
        mode: Option<String>,
        keywords: Option<Vec<String>>,
        allowed: Option<bool>,
        is_private: Option<bool>,
        begun: bool,
    }
    let row: Option<Row> = sqlx::query_as(&format!(
        "WITH inst AS (
            SELECT {INSTALLATION_COLUMNS}
              FROM installations i LEFT JOIN installation_policies p ON p.installation_id = i.id
             WHERE i.id = $1),
         begun AS (
            UPDATE event_receipts SET state = 'processing', updated_at = now(),
                                      failures = CASE WHEN state = 'failed' THEN 0 ELSE failures END
             WHERE id = $2
               -- a dead-lettered event replayed by an operator is reopened
               AND (state IN ('accepted', 'processing') OR (state = 'failed' AND state_reason = 'handler_error'))
               AND EXISTS (SELECT 1 FROM inst WHERE status = 'active')
            RETURNING id)
         SELECT inst.*, cp.mode, cp.keywords, cp.allowed, ck.is_private, EXISTS (SELECT 1 FROM begun) AS begun
           FROM inst
           LEFT JOIN channel_policies cp ON cp.installation_id = inst.id AND cp.channel_id = $3
           LEFT JOIN channel_kinds ck ON ck.installation_id = inst.id AND ck.channel_id = $3
                                     AND ck.checked_at > now() - interval '1 hour'"
    ))
    .bind(inst)
    .bind(receipt)
    .bind(channel)
    .fetch_optional(pool)
    .await?;
    let Some(r) = row else {
        return Ok(Opened {
            installation: None,
            channel_private: None,
            begun: false,
        });
    };
    let installation = into_installation((
        r.id,
        r.app_id,
        r.bot_id,
        r.bot_user_id,
        r.status,
        r.bot_token_sealed,
        r.bot_token_key_id,
        r.dms_allowed,
        r.approved_bots,
        r.read_limits,
        r.private_channels_allowed,
        r.shared_channels_allowed,
        r.scopes,
        r.allowlist_only,
    ));
    let allowed = r.allowed.unwrap_or(false);
    let policy = trigger_policy(
        &installation,
        r.mode.zip(r.keywords).map(|(m, k)| (m, k, allowed)),
    );
    Ok(Opened {
        installation: Some((installation, policy)),
        channel_private: r.is_private,
        begun: r.begun,
    })
}

/// The policy for one channel: the installation's switches and the
/// channel's row (mode, keywords, allow-listed), if it has one.
fn trigger_policy(
    inst: &Installation,
    channel_row: Option<(String, Vec<String>, bool)>,
) -> TriggerPolicy {
    let channel_allowed = channel_row.as_ref().is_some_and(|r| r.2);
    let channel_mode = match channel_row {
        Some((mode, _, _)) if mode == "every_message" => ChannelMode::EveryMessage,
        Some((mode, keywords, _)) if mode == "keywords" => ChannelMode::Keywords(keywords),
        _ => ChannelMode::MentionsOnly,
    };
    TriggerPolicy {
        dms_allowed: inst.dms_allowed,
        channel_mode,
        approved_bots: inst.approved_bots.clone(),
        private_allowed: inst.private_allowed,
        shared_allowed: inst.shared_allowed,
        channel_allowed,
        allowlist_only: inst.allowlist_only,
    }
}

/// What the installation learned within the hour about whether `channel`
/// is private (a channel can be converted, so nothing is kept for ever).
pub async fn channel_kind(pool: &PgPool, inst: Uuid, channel: &str) -> sqlx::Result<Option<bool>> {
    sqlx::query_scalar(
        "SELECT is_private FROM channel_kinds
          WHERE installation_id = $1 AND channel_id = $2 AND checked_at > now() - interval '1 hour'",
    )
    .bind(inst)
    .bind(channel)
    .fetch_optional(pool)
    .await
}

/// Remembers whether `channel` is private; writes only when the answer
/// changed or is getting old, so message traffic does not churn the row.
pub async fn learn_channel_kind(
    pool: &PgPool,
    inst: Uuid,
    channel: &str,
    private: bool,
    from: &str,
) -> sqlx::Result<()> {
    // The NOT EXISTS keeps the common case (nothing new) a plain read: an
    // ON CONFLICT that updates nothing still locks the row and commits a
    // write, and every message of a channel would queue on it.
    sqlx::query(
        "INSERT INTO channel_kinds (installation_id, channel_id, is_private, learned_from)
         SELECT $1, $2, $3, $4
          WHERE NOT EXISTS (SELECT 1 FROM channel_kinds
                             WHERE installation_id = $1 AND channel_id = $2 AND is_private = $3
                               AND checked_at >= now() - interval '10 minutes')
         ON CONFLICT (installation_id, channel_id) DO UPDATE
            SET is_private = EXCLUDED.is_private, learned_from = EXCLUDED.learned_from, checked_at = now()
          WHERE channel_kinds.is_private IS DISTINCT FROM EXCLUDED.is_private
             OR channel_kinds.checked_at < now() - interval '10 minutes'",
    )
    .bind(inst)
    .bind(channel)
    .bind(private)
    .bind(from)
    .execute(pool)
    .await?;
    Ok(())
}

/// Disables an installation and purges its tokens (bot and refresh), with
/// its audit record.
pub async fn disable(pool: &PgPool, inst: Uuid, reason: &str) -> sqlx::Result<()> {
    let mut tx = pool.begin().await?;
    sqlx::query(
        "UPDATE installations
            SET status = 'disabled', disabled_reason = $2, bot_token_sealed = NULL, bot_token_key_id = NULL,
                refresh_token_sealed = NULL, refresh_token_key_id = NULL, refresh_lease_until = NULL,
                refresh_lease_holder = NULL, refresh_unknown_since = NULL, updated_at = now()
          WHERE id = $1",
    )
    .bind(inst)
    .bind(reason)
    .execute(&mut *tx)
    .await?;
    audit::append(
        &mut tx,
        &audit::Record {
            stage: "lifecycle",
            outcome: "installation_disabled",
            reason: Some(reason),
            installation_id: Some(inst),
            ..Default::default()
        },
    )
    .await?;
    tx.commit().await
}

/// Counts a failure of the context-builder on this receipt that was not
/// transient; at the limit the receipt is failed (`handler_error`) in the
/// same statement. Returns the count (none when the receipt has ended).
pub async fn note_failure(pool: &PgPool, receipt: Uuid) -> sqlx::Result<Option<i32>> {
    let n: Option<i32> = sqlx::query_scalar(
        "UPDATE event_receipts
            SET failures = failures + 1, updated_at = now(),
                state = CASE WHEN failures + 1 >= $2 THEN 'failed' ELSE state END,
                state_reason = CASE WHEN failures + 1 >= $2 THEN 'handler_error' ELSE state_reason END
          WHERE id = $1 AND state IN ('accepted', 'processing')
         RETURNING failures",
    )
    .bind(receipt)
    .bind(threadline_runtime::worker::FAILURE_LIMIT as i32)
    .fetch_optional(pool)
    .await?;
    Ok(n)
}

/// Ends a receipt: `processing → done | ignored(reason)`, compare-and-set,
/// with its audit record written by the same statement. `at` is the
/// installation and channel the event named, for the channel's pseudonym
/// (used only when the receipt agrees).
pub async fn finish(
    conn: &mut PgConnection,
    receipt: Uuid,
    state: ReceiptState,
    reason: Option<&str>,
    at: (Uuid, &str),
) -> sqlx::Result<bool> {
    // Only an open receipt ends, by a move the machine allows.
    let from: Vec<&str> = [ReceiptState::Accepted, ReceiptState::Processing]
        .into_iter()
        .filter(|s| s.can_become(state))
        .map(ReceiptState::as_str)
        .collect();
    let ended: Option<Uuid> = sqlx::query_scalar(
        "WITH r AS (
            UPDATE event_receipts SET state = $2, state_reason = $3, updated_at = now()
             WHERE id = $1 AND state = ANY($9)
            RETURNING id, installation_id, event_id, channel_id, event_type, retry_num + duplicate_deliveries AS retries)
         INSERT INTO audit_log (stage, outcome, reason, installation_id, event_id, receipt_id, channel_ref,
                                event_type, retry_count)
         SELECT 'context', $4, $5, r.installation_id, r.event_id, r.id,
                CASE WHEN r.installation_id = $6 AND r.channel_id = $7 THEN $8 END,
                coalesce(nullif(left(regexp_replace(lower(r.event_type), '[^a-z0-9_.:-]', '_', 'g'), 64), ''), 'unknown'),
                r.retries
           FROM r
         RETURNING receipt_id",
    )
    .bind(receipt)
    .bind(state.as_str())
    .bind(reason)
    .bind(audit::sanitise_code(state.as_str()))
    .bind(reason.map(audit::sanitise_code))
    .bind(at.0)
    .bind(at.1)
    .bind(audit::channel_ref(at.0, at.1))
    .bind(&from)
    .fetch_optional(conn)
    .await?;
    Ok(ended.is_some())
}

fn text_hash(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

async fn new_fact(
    conn: &mut PgConnection,
    inst: Uuid,
    channel: &str,
    ts: &str,
    fact: &str,
    key: &str,
) -> sqlx::Result<bool> {
    let r = sqlx::query(
        "INSERT INTO message_facts (installation_id, channel_id, ts, fact, fact_key) VALUES ($1, $2, $3, $4, $5)
         ON CONFLICT DO NOTHING",
    )
    .bind(inst)
    .bind(channel)
    .bind(ts)
    .bind(fact)
    .bind(key)
    .execute(conn)
    .await?;
    Ok(r.rows_affected() == 1)
}

async fn bump(conn: &mut PgConnection, inst: Uuid, channel: &str, root: &str) -> sqlx::Result<i64> {
    sqlx::query_scalar(
        "INSERT INTO threads (installation_id, channel_id, root_ts, version) VALUES ($1, $2, $3, 1)
         ON CONFLICT (installation_id, channel_id, root_ts)
         DO UPDATE SET version = threads.version + 1, updated_at = now()
         RETURNING version",
    )
    .bind(inst)
    .bind(channel)
    .bind(root)
    .fetch_one(conn)
    .await
}

/// The thread's version, creating the thread row (version 1) if needed,
/// without bumping it.
async fn touch(
    conn: &mut PgConnection,
    inst: Uuid,
    channel: &str,
    root: &str,
) -> sqlx::Result<i64> {
    sqlx::query_scalar(
        "WITH ins AS (
            INSERT INTO threads (installation_id, channel_id, root_ts, version) VALUES ($1, $2, $3, 1)
            ON CONFLICT (installation_id, channel_id, root_ts) DO NOTHING
            RETURNING version)
         SELECT version FROM ins
         UNION ALL
         SELECT version FROM threads WHERE installation_id = $1 AND channel_id = $2 AND root_ts = $3
         LIMIT 1",
    )
    .bind(inst)
    .bind(channel)
    .bind(root)
    .fetch_one(conn)
    .await
}

/// Records the answers of thread `root` that the human message `ts`
/// crossed in flight: replies already sent, newer than `ts`, whose context
/// did not read it though it falls inside the window the context covered.
/// Runs after the message's insert bumped (and so locked) the thread row,
/// so a reply being recorded concurrently sees the message or is seen here.
/// Each crossed answer's thread is reconsidered through the outbox, in
/// this transaction. Returns the crossed intents.
pub async fn crossed_answers(
    conn: &mut PgConnection,
    inst: Uuid,
    channel: &str,
    root: &str,
    ts: &str,
) -> sqlx::Result<Vec<Uuid>> {
    let crossed: Vec<(Uuid, Uuid)> = sqlx::query_as(
        "INSERT INTO crossed_answers (intent_id, installation_id, channel_id, root_ts, reply_ts, crossing_ts, detected_by,
                                      detected_at)
         SELECT i.id, i.installation_id, i.channel_id, i.root_ts, i.slack_ts, $4, 'context-builder', clock_timestamp()
           FROM reply_intents i JOIN decisions d ON d.id = i.decision_id
          WHERE i.installation_id = $1 AND i.channel_id = $2 AND i.root_ts = $3
            AND i.state = 'sent' AND i.slack_ts IS NOT NULL
            AND $4::numeric < i.slack_ts::numeric
            AND d.context_ts IS NOT NULL AND NOT ($4 = ANY(d.context_ts))
            AND $4::numeric > coalesce(d.context_floor_ts, '0')::numeric
         ON CONFLICT DO NOTHING
         RETURNING intent_id, (SELECT receipt_id FROM reply_intents WHERE id = intent_id)",
    )
    .bind(inst)
    .bind(channel)
    .bind(root)
    .bind(ts)
    .fetch_all(&mut *conn)
    .await?;
    for (intent, receipt) in &crossed {
        let msg = threadline_store::outbox::crossed_reconsider(inst, channel, root, *receipt);
        threadline_store::outbox::enqueue(
            conn,
            inst,
            *receipt,
            Topic::Reconsider,
            &format!("recon:crossed:{intent}:{ts}"),
            msg.encode_to_vec(),
        )
        .await?;
    }
    Ok(crossed.into_iter().map(|(i, _)| i).collect())
}

/// Records what the reconsideration of a thread, begun at `started`,
/// decided for the answers crossed in flight there that were recorded
/// before it began (later ones wait for their own reconsideration).
pub async fn crossed_reconsidered(
    pool: &PgPool,
    inst: Uuid,
    channel: &str,
    root: &str,
    result: &str,
    started: time::OffsetDateTime,
) -> sqlx::Result<u64> {
    let r = sqlx::query(
        "UPDATE crossed_answers SET reconsidered_at = now(), reconsideration = $4
          WHERE installation_id = $1 AND channel_id = $2 AND root_ts = $3 AND reconsidered_at IS NULL
            AND detected_at <= $5",
    )
    .bind(inst)
    .bind(channel)
    .bind(root)
    .bind(result)
    .bind(started)
    .execute(pool)
    .await?;
    Ok(r.rows_affected())
}

async fn stored_root(
    conn: &mut PgConnection,
    inst: Uuid,
    channel: &str,
    ts: &str,
) -> sqlx::Result<Option<String>> {
    sqlx::query_scalar("SELECT root_ts FROM thread_messages WHERE installation_id = $1 AND channel_id = $2 AND ts = $3")
        .bind(inst)
        .bind(channel)
        .bind(ts)
        .fetch_optional(conn)
        .await
}

/// Applies an effect; returns the thread it touched and its version if a
/// new fact was recorded.
pub async fn apply(
    conn: &mut PgConnection,
    inst: Uuid,
    channel: &str,
    effect: &Effect,
) -> sqlx::Result<Option<(String, i64)>> {
    match effect {
        Effect::None => Ok(None),
        Effect::Upsert(f) => {
            if !new_fact(conn, inst, channel, &f.ts, "create", "").await? {
                return Ok(None);
            }
            // A later edit or a tombstone may already be here: keep it.
            insert_message(conn, inst, channel, f, "ON CONFLICT DO NOTHING").await?;
            let root = stored_root(conn, inst, channel, &f.ts)
                .await?
                .unwrap_or_else(|| f.root_ts.clone());
            if f.speaker == Speaker::Assistant {
                // Our own reply changes nothing a person asked: it is kept
                // (later answers read it) without a new version, so the
                // answers in flight to other requests of the thread stay
                // current instead of going stale and costing a model call.
                return Ok(Some((
                    root.clone(),
                    touch(conn, inst, channel, &root).await?,
                )));
            }
            Ok(Some((
                root.clone(),
                bump(conn, inst, channel, &root).await?,
            )))
        }
        Effect::Edit(f) => {
            let key = f.edited_ts.clone().unwrap_or_else(|| text_hash(&f.text));
            if !new_fact(conn, inst, channel, &f.ts, "edit", &key).await? {
                return Ok(None);
            }
            // The newest edit wins, whatever order edits arrive in; a
            // deleted message stays deleted.
            insert_message(
                conn,
                inst,
                channel,
                f,
                "ON CONFLICT (installation_id, channel_id, ts) DO UPDATE
                    SET text = EXCLUDED.text, text_hash = EXCLUDED.text_hash, edited_ts = EXCLUDED.edited_ts
                  WHERE NOT thread_messages.deleted
                    AND (thread_messages.edited_ts IS NULL OR thread_messages.edited_ts < EXCLUDED.edited_ts)",
            )
            .await?;
            let root = stored_root(conn, inst, channel, &f.ts)
                .await?
                .unwrap_or_else(|| f.root_ts.clone());
            Ok(Some((
                root.clone(),
                bump(conn, inst, channel, &root).await?,
            )))
        }
        Effect::Delete { ts, root_ts } => {
            if !new_fact(conn, inst, channel, ts, "delete", "").await? {
                return Ok(None);
            }
            let root = stored_root(conn, inst, channel, ts)
                .await?
                .unwrap_or_else(|| root_ts.clone());
            // A tombstone keeps the identity and drops the text.
            sqlx::query(
                "INSERT INTO thread_messages (installation_id, channel_id, ts, root_ts, speaker, text, text_hash, deleted, deleted_at)
                 VALUES ($1, $2, $3, $4, 'user', '', '', true, now())
                 ON CONFLICT (installation_id, channel_id, ts)
                 DO UPDATE SET deleted = true, text = '', text_hash = '',
                               deleted_at = coalesce(thread_messages.deleted_at, now())",
            )
            .bind(inst)
            .bind(channel)
            .bind(ts)
            .bind(&root)
            .execute(&mut *conn)
            .await?;
            Ok(Some((
                root.clone(),
                bump(conn, inst, channel, &root).await?,
            )))
        }
    }
}

async fn insert_message(
    conn: &mut PgConnection,
    inst: Uuid,
    channel: &str,
    f: &MessageFacts,
    conflict: &'static str,
) -> sqlx::Result<()> {
    macro_rules! insert {
        ($conflict:expr) => {
            sqlx::query(&format!(
                "INSERT INTO thread_messages
                    (installation_id, channel_id, ts, root_ts, speaker, user_id, bot_id, text, text_hash, edited_ts)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10::numeric) {}",
                $conflict
            ))
        };
    }
    insert!(conflict)
        .bind(inst)
        .bind(channel)
        .bind(&f.ts)
        .bind(&f.root_ts)
        .bind(f.speaker.as_str())
        .bind(&f.user_id)
        .bind(&f.bot_id)
        .bind(&f.text)
        .bind(text_hash(&f.text))
        .bind(&f.edited_ts)
        .execute(conn)
        .await?;
    Ok(())
}

/// Claims the turn of a human message for `receipt`; true when this
/// receipt owns it (first claim, or its own earlier claim).
pub async fn claim_turn(
    conn: &mut PgConnection,
    inst: Uuid,
    channel: &str,
    ts: &str,
    receipt: Uuid,
    source: &str,
) -> sqlx::Result<bool> {
    sqlx::query(
        "INSERT INTO turns (installation_id, channel_id, ts, receipt_id, source) VALUES ($1, $2, $3, $4, $5)
         ON CONFLICT DO NOTHING",
    )
    .bind(inst)
    .bind(channel)
    .bind(ts)
    .bind(receipt)
    .bind(source)
    .execute(&mut *conn)
    .await?;
    let owner: Uuid = sqlx::query_scalar(
        "SELECT receipt_id FROM turns WHERE installation_id = $1 AND channel_id = $2 AND ts = $3",
    )
    .bind(inst)
    .bind(channel)
    .bind(ts)
    .fetch_one(conn)
    .await?;
    Ok(owner == receipt)
}

/// A deleted message cancels work not yet started from it.
pub async fn cancel_pending(
    conn: &mut PgConnection,
    inst: Uuid,
    channel: &str,
    ts: &str,
    except: Uuid,
) -> sqlx::Result<u64> {
    let r = sqlx::query(
        "UPDATE event_receipts SET state = 'ignored', state_reason = 'source_deleted', updated_at = now()
          WHERE installation_id = $1 AND channel_id = $2 AND message_ts = $3 AND state = 'accepted' AND id <> $4",
    )
    .bind(inst)
    .bind(channel)
    .bind(ts)
    .bind(except)
    .execute(conn)
    .await?;
    Ok(r.rows_affected())
}

/// Marks an answered turn whose source was edited afterwards.
pub async fn note_answered_source_changed(
    conn: &mut PgConnection,
    inst: Uuid,
    channel: &str,
    ts: &str,
) -> sqlx::Result<bool> {
    let r = sqlx::query(
        "UPDATE turns SET source_changed_after_answer_at = now()
          WHERE installation_id = $1 AND channel_id = $2 AND ts = $3 AND answered_at IS NOT NULL",
    )
    .bind(inst)
    .bind(channel)
    .bind(ts)
    .execute(conn)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// Whether the store has the message (deleted or not).
pub async fn has_message(pool: &PgPool, inst: Uuid, channel: &str, ts: &str) -> sqlx::Result<bool> {
    let n: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM thread_messages WHERE installation_id = $1 AND channel_id = $2 AND ts = $3",
    )
    .bind(inst)
    .bind(channel)
    .bind(ts)
    .fetch_one(pool)
    .await?;
    Ok(n > 0)
}

pub async fn set_backfill(
    pool: &PgPool,
    inst: Uuid,
    channel: &str,
    root: &str,
    state: &str,
) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO threads (installation_id, channel_id, root_ts, backfill_state) VALUES ($1, $2, $3, $4)
         ON CONFLICT (installation_id, channel_id, root_ts) DO UPDATE
            SET backfill_state = CASE WHEN threads.backfill_state = 'complete' THEN 'complete' ELSE EXCLUDED.backfill_state END",
    )
    .bind(inst)
    .bind(channel)
    .bind(root)
    .bind(state)
    .execute(pool)
    .await?;
    Ok(())
}

/// The thread as it is now, as far as its context needs it: version,
/// whether its backfill is partial, whether `source_ts` is deleted, and the
/// context built from the root, the source and the newest replies within
/// the limits.
pub struct Snapshot {
    pub version: i64,
    pub backfill_partial: bool,
    pub source_deleted: bool,
    pub built: Built,
}

/// Messages the context may read: live, and another bot's only when that
/// bot is approved ($4). $1..$3: installation, channel, root.
const READABLE: &str = "installation_id = $1 AND channel_id = $2 AND root_ts = $3 AND NOT deleted
                        AND (speaker <> 'bot' OR bot_id = ANY($4))";

/// How many replies' sizes one read brings, beyond the count limit (room
/// for replies skipped as too big).
const PAGE_SLACK: usize = 16;

/// Reads the context of `source_ts` in `root`'s thread without reading the
/// whole thread: the sizes of the oldest readable message (the root), the
/// source and the newest replies page by page until the limits are met
/// ([`context::Chooser`], the same choice [`context::build`] makes over the
/// whole thread), then the text of only the chosen messages and a count of
/// the rest. Call inside one REPEATABLE READ transaction.
pub async fn snapshot(
    conn: &mut PgConnection,
    inst: &Installation,
    channel: &str,
    root: &str,
    source_ts: &str,
    limits: Limits,
) -> sqlx::Result<Snapshot> {
    let (version, backfill, source_deleted, readable): (i64, String, bool, i64) =
        sqlx::query_as(&format!(
            "SELECT coalesce((SELECT version FROM threads
                               WHERE installation_id = $1 AND channel_id = $2 AND root_ts = $3), 0),
                    coalesce((SELECT backfill_state FROM threads
                               WHERE installation_id = $1 AND channel_id = $2 AND root_ts = $3), 'none'),
                    coalesce((SELECT bool_or(deleted) FROM thread_messages
                               WHERE installation_id = $1 AND channel_id = $2 AND ts = $5), false),
                    (SELECT count(*) FROM thread_messages WHERE {READABLE})"
        ))
        .bind(inst.id)
        .bind(channel)
        .bind(root)
        .bind(&inst.approved_bots)
        .bind(source_ts)
        .fetch_one(&mut *conn)
        .await?;
    let page = (limits.max_messages + PAGE_SLACK) as i64;
    // part 0: the oldest readable message; 1: the source; 2: replies newest
    // first, older than the cursor ($6, none at first).
    let sizes = format!(
        "(SELECT 0 AS part, ts, octet_length(text) FROM thread_messages WHERE {READABLE}
           ORDER BY ts::numeric LIMIT 1)
         UNION ALL
         (SELECT 1, ts, octet_length(text) FROM thread_messages WHERE {READABLE} AND ts = $5)
         UNION ALL
         (SELECT 2, ts, octet_length(text) FROM thread_messages
           WHERE {READABLE} AND ($6::numeric IS NULL OR ts::numeric < $6::numeric)
           ORDER BY ts::numeric DESC LIMIT $7)"
    );
    let mut rows: Vec<(i32, String, i32)> = sqlx::query_as(&sizes)
        .bind(inst.id)
        .bind(channel)
        .bind(root)
        .bind(&inst.approved_bots)
        .bind(source_ts)
        .bind(None::<String>)
        .bind(page)
        .fetch_all(&mut *conn)
        .await?;
    let Some((_, first_ts, first_len)) = rows.iter().find(|r| r.0 == 0).cloned() else {
        return Ok(Snapshot {
            version,
            backfill_partial: backfill == "partial",
            source_deleted,
            built: context::finish(Vec::new(), 0),
        });
    };
    let source = rows
        .iter()
        .find(|r| r.0 == 1 && r.1 != first_ts)
        .map(|r| (r.1.clone(), r.2 as usize));
    let mut chooser = context::Chooser::new(
        first_len as usize,
        source.as_ref().map(|s| s.1),
        source_ts,
        limits,
    );
    let mut chosen = vec![first_ts.clone()];
    chosen.extend(source.map(|s| s.0));
    'pages: loop {
        let replies: Vec<(String, i32)> = rows
            .drain(..)
            .filter(|r| r.0 == 2)
            .map(|r| (r.1, r.2))
            .collect();
        let full = replies.len() as i64 == page;
        let mut cursor = None;
        for (ts, len) in replies {
            cursor = Some(ts.clone());
            if ts == first_ts || ts == source_ts {
                continue;
            }
            match chooser.offer(&ts, len as usize) {
                Offer::Keep => chosen.push(ts),
                Offer::Skip => {}
                Offer::Done => break 'pages,
            }
        }
        if !full {
            break;
        }
        rows = sqlx::query_as(&sizes)
            .bind(inst.id)
            .bind(channel)
            .bind(root)
            .bind(&inst.approved_bots)
            .bind(source_ts)
            .bind(cursor)
            .bind(page)
            .fetch_all(&mut *conn)
            .await?;
    }
    type Row = (String, String, Option<String>, Option<String>, String);
    let texts: Vec<Row> = sqlx::query_as(
        "SELECT ts, speaker, user_id, bot_id, text FROM thread_messages
          WHERE installation_id = $1 AND channel_id = $2 AND ts = ANY($3)
          ORDER BY ts::numeric",
    )
    .bind(inst.id)
    .bind(channel)
    .bind(&chosen)
    .fetch_all(&mut *conn)
    .await?;
    let messages = texts
        .into_iter()
        .map(|(ts, speaker, user, bot, text)| StoredMessage {
            ts,
            speaker,
            user_id: user.or(bot).unwrap_or_default(),
            text,
        })
        .collect();
    Ok(Snapshot {
        version,
        backfill_partial: backfill == "partial",
        source_deleted,
        built: context::finish(messages, readable as usize),
    })
}

#[allow(clippy::too_many_arguments)]
pub async fn record_context(
    conn: &mut PgConnection,
    event_id: &str,
    receipt: Uuid,
    inst: Uuid,
    channel: &str,
    root: &str,
    source_ts: &str,
    version: i64,
    hash: &str,
    count: usize,
    truncated: bool,
    backfill_partial: bool,
) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO contexts (receipt_id, installation_id, channel_id, root_ts, source_ts, thread_version,
                               content_hash, message_count, truncated, backfill_partial)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
         ON CONFLICT (receipt_id) DO UPDATE
            SET thread_version = EXCLUDED.thread_version, content_hash = EXCLUDED.content_hash,
                message_count = EXCLUDED.message_count, truncated = EXCLUDED.truncated,
                backfill_partial = EXCLUDED.backfill_partial, captured_at = now()",
    )
    .bind(receipt)
    .bind(inst)
    .bind(channel)
    .bind(root)
    .bind(source_ts)
    .bind(version)
    .bind(hash)
    .bind(count as i32)
    .bind(truncated)
    .bind(backfill_partial)
    .execute(&mut *conn)
    .await?;
    audit::append(
        conn,
        &audit::Record {
            stage: "context",
            outcome: "context_built",
            reason: backfill_partial.then_some("backfill_partial"),
            installation_id: Some(inst),
            receipt_id: Some(receipt),
            channel: Some(channel),
            event_id: Some(event_id),
            thread_version: Some(version),
            ..Default::default()
        },
    )
    .await?;
    Ok(())
}
