//! The thread store: facts, messages, threads, turns and contexts, as the
//! context-builder reads and writes them. Every content change is a fact
//! applied at most once; each new fact bumps its thread's version in the
//! same transaction. The final state depends only on the set of facts, not
//! on their order or how often they arrive.

use prost::Message as _;
use sha2::{Digest, Sha256};
use sqlx::{PgConnection, PgPool};
use threadline_domain::classify::{
    BotIdentity, ChannelMode, Effect, MessageFacts, Speaker, TriggerPolicy,
};
use threadline_domain::context::{self, Built, Limits, Offer, StoredMessage};
use threadline_domain::double_text::DoubleTexting;
use threadline_domain::state::{Machine as _, ReceiptState};
use threadline_domain::topic::Topic;
use uuid::Uuid;

use crate::audit::{self, sanitise_code};
use crate::moves;

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
    /// What a person's quick messages come to.
    pub double_texting: DoubleTexting,
}

/// The installation's row and its policy's, as read.
struct InstallationRow {
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
    double_texting: Option<String>,
    double_texting_quiet_ms: Option<i32>,
}

impl From<InstallationRow> for Installation {
    fn from(r: InstallationRow) -> Self {
        Installation {
            id: r.id,
            identity: BotIdentity {
                app_id: r.app_id,
                bot_id: r.bot_id,
                bot_user_id: r.bot_user_id,
            },
            active: r.status == "active",
            token_sealed: r.bot_token_sealed,
            token_key_id: r.bot_token_key_id,
            dms_allowed: r.dms_allowed.unwrap_or(false),
            approved_bots: r.approved_bots.unwrap_or_default(),
            non_marketplace: r.read_limits.as_deref() == Some("non_marketplace"),
            private_allowed: r.private_channels_allowed.unwrap_or(false),
            shared_allowed: r.shared_channels_allowed.unwrap_or(false),
            allowlist_only: r.allowlist_only.unwrap_or(false),
            scopes: r.scopes,
            // (the columns' checks keep what is stored parseable)
            double_texting: r
                .double_texting
                .zip(r.double_texting_quiet_ms)
                .and_then(|(a, q)| DoubleTexting::parse(&a, q.max(0) as u32))
                .unwrap_or(DoubleTexting::DEFAULT),
        }
    }
}

pub async fn installation(pool: &PgPool, id: Uuid) -> sqlx::Result<Option<Installation>> {
    let row = sqlx::query_as!(
        InstallationRow,
        r#"SELECT i.id, i.app_id, i.bot_id, i.bot_user_id, i.status, i.bot_token_sealed, i.bot_token_key_id,
                  p.dms_allowed AS "dms_allowed?", p.approved_bots AS "approved_bots?",
                  p.read_limits AS "read_limits?", p.private_channels_allowed AS "private_channels_allowed?",
                  p.shared_channels_allowed AS "shared_channels_allowed?", i.scopes,
                  p.allowlist_only AS "allowlist_only?", p.double_texting AS "double_texting?",
                  p.double_texting_quiet_ms AS "double_texting_quiet_ms?"
             FROM installations i LEFT JOIN installation_policies p ON p.installation_id = i.id
            WHERE i.id = $1"#,
        id
    )
    .fetch_optional(pool)
    .await?;
    Ok(row.map(Installation::from))
}

/// What handling an event starts from, read (and the receipt moved to
/// `processing`) in one statement.
pub struct Opened {
    /// The installation and its trigger policy for the event's channel;
    /// `None`: no such installation.
    pub installation: Option<(Installation, TriggerPolicy)>,
    /// Whether the channel is private, as learned within the hour.
    pub channel_private: Option<bool>,
    /// Whether that was learned within ten minutes (a channel's kind is
    /// written again only when it changed or is older).
    pub kind_fresh: bool,
    /// The receipt moved to `processing`; false when the installation is
    /// missing or inactive (it was not touched) or the receipt had already
    /// ended (a redelivery of finished work).
    pub begun: bool,
}

/// Reads, for each event `(installation, receipt, channel)`, the
/// installation, its policy for the channel and the channel's known kind,
/// and moves the receipt to `processing` when the installation is active:
/// one statement (one round trip, one commit) for many events, answered
/// each in order. A receipt named twice (two deliveries of one event in a
/// batch) is begun for both, as two statements one after the other would.
pub async fn open_many(
    pool: &PgPool,
    events: &[(Uuid, Uuid, String)],
) -> sqlx::Result<Vec<Opened>> {
    let insts: Vec<Uuid> = events.iter().map(|e| e.0).collect();
    let receipts: Vec<Uuid> = events.iter().map(|e| e.1).collect();
    let channels: Vec<String> = events.iter().map(|e| e.2.clone()).collect();
    let rows = sqlx::query!(
        r#"WITH u AS (
            SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::text[]) WITH ORDINALITY AS u(inst, receipt, channel, n)),
         begun AS (
            UPDATE event_receipts r SET state = $4, updated_at = now(),
                                        failures = CASE WHEN r.state = 'failed' THEN 0 ELSE r.failures END
              FROM u JOIN installations i ON i.id = u.inst AND i.status = 'active'
             WHERE r.id = u.receipt AND r.installation_id = u.inst
               -- a dead-lettered event replayed by an operator is reopened
               AND r.state = ANY($5) AND (r.state <> 'failed' OR r.state_reason = 'handler_error')
            RETURNING r.id)
         SELECT u.n AS "n!", i.id AS "id?", i.app_id AS "app_id?", i.bot_id AS "bot_id?",
                i.bot_user_id AS "bot_user_id?", i.status AS "status?",
                i.bot_token_sealed AS "bot_token_sealed?", i.bot_token_key_id AS "bot_token_key_id?",
                p.dms_allowed AS "dms_allowed?", p.approved_bots AS "approved_bots?",
                p.read_limits AS "read_limits?", p.private_channels_allowed AS "private_channels_allowed?",
                p.shared_channels_allowed AS "shared_channels_allowed?", i.scopes AS "scopes?",
                p.allowlist_only AS "allowlist_only?", p.double_texting AS "double_texting?",
                p.double_texting_quiet_ms AS "double_texting_quiet_ms?",
                cp.mode AS "mode?", cp.keywords AS "keywords?", cp.allowed AS "allowed?",
                ck.is_private AS "is_private?",
                ck.checked_at >= now() - interval '10 minutes' AS "kind_fresh?",
                EXISTS (SELECT 1 FROM begun WHERE begun.id = u.receipt) AS "begun!"
           FROM u
           LEFT JOIN installations i ON i.id = u.inst
           -- (keyed by the input's columns, so each lookup uses its whole key)
           LEFT JOIN installation_policies p ON p.installation_id = u.inst
           LEFT JOIN channel_policies cp ON cp.installation_id = u.inst AND cp.channel_id = u.channel
           LEFT JOIN channel_kinds ck ON ck.installation_id = u.inst AND ck.channel_id = u.channel
                                     AND ck.checked_at > now() - interval '1 hour'
          ORDER BY u.n"#,
        &insts,
        &receipts,
        &channels,
        ReceiptState::Processing.as_str(),
        &moves(
            &[
                ReceiptState::Accepted,
                ReceiptState::Processing,
                ReceiptState::Failed
            ],
            ReceiptState::Processing
        )
    )
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| {
            let (
                Some(id),
                Some(app_id),
                Some(bot_id),
                Some(bot_user_id),
                Some(status),
                Some(scopes),
            ) = (r.id, r.app_id, r.bot_id, r.bot_user_id, r.status, r.scopes)
            else {
                return Opened {
                    installation: None,
                    channel_private: None,
                    kind_fresh: false,
                    begun: false,
                };
            };
            let installation = Installation::from(InstallationRow {
                id,
                app_id,
                bot_id,
                bot_user_id,
                status,
                bot_token_sealed: r.bot_token_sealed,
                bot_token_key_id: r.bot_token_key_id,
                dms_allowed: r.dms_allowed,
                approved_bots: r.approved_bots,
                read_limits: r.read_limits,
                private_channels_allowed: r.private_channels_allowed,
                shared_channels_allowed: r.shared_channels_allowed,
                scopes,
                allowlist_only: r.allowlist_only,
                double_texting: r.double_texting,
                double_texting_quiet_ms: r.double_texting_quiet_ms,
            });
            let allowed = r.allowed.unwrap_or(false);
            let policy = trigger_policy(
                &installation,
                r.mode.zip(r.keywords).map(|(m, k)| (m, k, allowed)),
            );
            Opened {
                installation: Some((installation, policy)),
                channel_private: r.is_private,
                kind_fresh: r.kind_fresh.unwrap_or(false),
                begun: r.begun,
            }
        })
        .collect())
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

/// Disables an installation and purges its tokens (bot and refresh), with
/// its audit record.
pub async fn disable(pool: &PgPool, inst: Uuid, reason: &str) -> sqlx::Result<()> {
    let mut tx = pool.begin().await?;
    sqlx::query!(
        "UPDATE installations
            SET status = 'disabled', disabled_reason = $2, bot_token_sealed = NULL, bot_token_key_id = NULL,
                refresh_token_sealed = NULL, refresh_token_key_id = NULL, refresh_lease_until = NULL,
                refresh_lease_holder = NULL, refresh_unknown_since = NULL, updated_at = now()
          WHERE id = $1",
        inst,
        reason
    )
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
/// transient; at `limit` the receipt is failed (`handler_error`) in the
/// same statement. Returns the count (none when the receipt has ended).
pub async fn note_failure(pool: &PgPool, receipt: Uuid, limit: i32) -> sqlx::Result<Option<i32>> {
    sqlx::query_scalar!(
        "UPDATE event_receipts
            SET failures = failures + 1, updated_at = now(),
                state = CASE WHEN failures + 1 >= $2 THEN $3 ELSE state END,
                state_reason = CASE WHEN failures + 1 >= $2 THEN 'handler_error' ELSE state_reason END
          WHERE id = $1 AND state = ANY($4)
         RETURNING failures",
        receipt,
        limit,
        ReceiptState::Failed.as_str(),
        &moves(
            &[ReceiptState::Accepted, ReceiptState::Processing],
            ReceiptState::Failed
        )
    )
    .fetch_optional(pool)
    .await
}

/// Ends a receipt: `processing → done | ignored(reason)`, compare-and-set,
/// with its audit record written by the same statement, except where a
/// context was recorded for it and it ends `done` with no reason: its
/// context's record (`context_built`, written in the build's transaction,
/// before the context was handed on) is then the context stage's record,
/// so a handed-on request costs one record, not two. `at` is the
/// installation and channel the event named, with the channel's pseudonym
/// (written only when the receipt agrees).
pub async fn finish(
    conn: &mut PgConnection,
    receipt: Uuid,
    state: ReceiptState,
    reason: Option<&str>,
    at: (Uuid, &str, Option<&str>),
) -> sqlx::Result<bool> {
    // Only an open receipt ends, by a move the machine allows.
    // (one row by its key: [`finish_many`]'s array form costs a plan of its
    // own at every execution for a single receipt)
    let from = moves(&[ReceiptState::Accepted, ReceiptState::Processing], state);
    let ended = sqlx::query_scalar!(
        "WITH r AS (
            UPDATE event_receipts SET state = $2, state_reason = $3, updated_at = now()
             WHERE id = $1 AND state = ANY($9)
            RETURNING id, installation_id, event_id, channel_id, event_type, retry_num + duplicate_deliveries AS retries),
         a AS (
            INSERT INTO audit_log (stage, outcome, reason, installation_id, event_id, receipt_id, channel_ref,
                                   event_type, retry_count)
            SELECT 'context', $4, $5, r.installation_id, r.event_id, r.id,
                   CASE WHEN r.installation_id = $6 AND r.channel_id = $7 THEN $8 END,
                   audit_event_type(r.event_type),
                   r.retries
              FROM r
             WHERE NOT ($2 = 'done' AND $3::text IS NULL
                        AND EXISTS (SELECT 1 FROM contexts c WHERE c.receipt_id = r.id)))
         SELECT id FROM r",
        receipt,
        state.as_str(),
        reason,
        sanitise_code(state.as_str()),
        reason.map(sanitise_code),
        at.0,
        at.1,
        at.2,
        &from
    )
    .fetch_optional(conn)
    .await?;
    Ok(ended.is_some())
}

/// A receipt for [`finish_many`]: its id and the installation, channel and
/// channel pseudonym its event named.
#[derive(Debug, Clone)]
pub struct Ending {
    pub receipt: Uuid,
    pub installation: Uuid,
    pub channel: String,
    pub pseudonym: Option<String>,
}

/// [`finish`] for several receipts in one statement, each ending in
/// `state` with `reason`. Returns, in the order given, whether each ended
/// here (a receipt named twice ends once, as two calls in a row would
/// leave it).
pub async fn finish_many(
    conn: &mut PgConnection,
    endings: &[Ending],
    state: ReceiptState,
    reason: Option<&str>,
) -> sqlx::Result<Vec<bool>> {
    // Only an open receipt ends, by a move the machine allows.
    let from = moves(&[ReceiptState::Accepted, ReceiptState::Processing], state);
    let ended = sqlx::query_scalar!(
        // (the receipts are found by `id = ANY`: an index scan whatever the
        // plan guesses of the array, where a join with the unnested input
        // may be planned as a scan of the whole table)
        r#"WITH r AS (
            UPDATE event_receipts SET state = $5, state_reason = $6, updated_at = now()
             WHERE id = ANY($1) AND state = ANY($9)
            RETURNING id, installation_id, event_id, channel_id, event_type, retry_num + duplicate_deliveries AS retries),
         a AS (
            INSERT INTO audit_log (stage, outcome, reason, installation_id, event_id, receipt_id, channel_ref,
                                   event_type, retry_count)
            SELECT 'context', $7, $8, r.installation_id, r.event_id, r.id,
                   (SELECT e.pseudonym
                      FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::text[]) AS e(receipt, inst, channel, pseudonym)
                     WHERE e.receipt = r.id AND e.inst = r.installation_id AND e.channel = r.channel_id
                     LIMIT 1),
                   audit_event_type(r.event_type),
                   r.retries
              FROM r
             WHERE NOT ($5 = 'done' AND $6::text IS NULL
                        AND EXISTS (SELECT 1 FROM contexts c WHERE c.receipt_id = r.id)))
         SELECT id AS "receipt_id!" FROM r"#,
        &endings.iter().map(|e| e.receipt).collect::<Vec<_>>(),
        &endings.iter().map(|e| e.installation).collect::<Vec<_>>(),
        &endings.iter().map(|e| e.channel.clone()).collect::<Vec<_>>(),
        &endings.iter().map(|e| e.pseudonym.clone()).collect::<Vec<_>>() as &[Option<String>],
        state.as_str(),
        reason,
        sanitise_code(state.as_str()),
        reason.map(sanitise_code),
        &from
    )
    .fetch_all(conn)
    .await?;
    let ended: std::collections::HashSet<Uuid> = ended.into_iter().collect();
    let mut once = std::collections::HashSet::new();
    Ok(endings
        .iter()
        .map(|e| ended.contains(&e.receipt) && once.insert(e.receipt))
        .collect())
}

pub(crate) fn text_hash(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

/// Records the answers of thread `root` that the human message `ts`
/// crossed in flight: replies already sent, whole after `ts` (a stream
/// stopped after it), whose context
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
    let crossed = sqlx::query!(
        r#"INSERT INTO crossed_answers (intent_id, installation_id, channel_id, root_ts, reply_ts, crossing_ts, detected_by,
                                      detected_at)
         SELECT i.id, i.installation_id, i.channel_id, i.root_ts, i.slack_ts, $4, 'context-builder', clock_timestamp()
           FROM reply_intents i JOIN decisions d ON d.id = i.decision_id
          WHERE i.installation_id = $1 AND i.channel_id = $2 AND i.root_ts = $3
            AND i.state = 'sent' AND i.slack_ts IS NOT NULL
            -- said before the answer was whole (a stream: before it stopped)
            AND $4::text::numeric < coalesce(i.whole_ts, i.slack_ts::numeric)
            AND d.context_ts IS NOT NULL AND NOT ($4 = ANY(d.context_ts))
            AND $4::text::numeric > coalesce(d.context_floor_ts, '0')::numeric
         ON CONFLICT DO NOTHING
         RETURNING intent_id, (SELECT receipt_id FROM reply_intents WHERE id = intent_id) AS "receipt_id!""#,
        inst,
        channel,
        root,
        ts
    )
    .fetch_all(&mut *conn)
    .await?;
    for c in &crossed {
        let msg = crate::outbox::crossed_reconsider(inst, channel, root, c.receipt_id);
        crate::outbox::enqueue(
            conn,
            inst,
            c.receipt_id,
            Topic::Reconsider,
            &format!("recon:crossed:{}:{ts}", c.intent_id),
            msg.encode_to_vec(),
        )
        .await?;
    }
    Ok(crossed.into_iter().map(|c| c.intent_id).collect())
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
    let r = sqlx::query!(
        "UPDATE crossed_answers SET reconsidered_at = now(), reconsideration = $4
          WHERE installation_id = $1 AND channel_id = $2 AND root_ts = $3 AND reconsidered_at IS NULL
            AND detected_at <= $5",
        inst,
        channel,
        root,
        result,
        started
    )
    .execute(pool)
    .await?;
    Ok(r.rows_affected())
}

/// The database's clock now (not the transaction's start): where a
/// reconsideration begins, compared with `crossed_answers.detected_at`.
pub async fn clock(pool: &PgPool) -> sqlx::Result<time::OffsetDateTime> {
    sqlx::query_scalar!(r#"SELECT clock_timestamp() AS "now!""#)
        .fetch_one(pool)
        .await
}

/// The newest live human turn of a thread: its receipt, ts, whether it was
/// answered, and its event id.
pub struct LatestTurn {
    pub receipt_id: Uuid,
    pub ts: String,
    pub answered: bool,
    pub event_id: String,
}

pub async fn latest_turn(
    pool: &PgPool,
    inst: Uuid,
    channel: &str,
    root: &str,
) -> sqlx::Result<Option<LatestTurn>> {
    sqlx::query_as!(
        LatestTurn,
        r#"SELECT t.receipt_id, t.ts, t.answered_at IS NOT NULL AS "answered!", r.event_id
             FROM turns t
             JOIN thread_messages m ON m.installation_id = t.installation_id AND m.channel_id = t.channel_id AND m.ts = t.ts
             JOIN event_receipts r ON r.id = t.receipt_id
            WHERE t.installation_id = $1 AND t.channel_id = $2 AND m.root_ts = $3 AND NOT m.deleted
            ORDER BY t.ts::numeric DESC LIMIT 1"#,
        inst,
        channel,
        root
    )
    .fetch_optional(pool)
    .await
}

/// Applies an effect in one statement (a fact, the message it changes and
/// its thread's version); returns the thread it touched and its version if
/// the fact was new. The message's stored root wins over the event's (an
/// edit or tombstone that arrived first keeps it), as the statement's
/// upsert returns it.
pub async fn apply(
    conn: &mut PgConnection,
    inst: Uuid,
    channel: &str,
    effect: &Effect,
) -> sqlx::Result<Option<(String, i64)>> {
    let applied = match effect {
        Effect::None => return Ok(None),
        // Our own reply changes nothing a person asked: it is kept (later
        // answers read it) without a new version, so the answers in flight
        // to other requests of the thread stay current instead of going
        // stale and costing a model call.
        Effect::Upsert(f) if f.speaker == Speaker::Assistant => {
            keep_reply(conn, inst, channel, f).await?
        }
        Effect::Upsert(f) => create(conn, inst, channel, f).await?,
        // The same for our own reply's edits (a streamed answer's final
        // text arrives as one): kept, no new version.
        Effect::Edit(f) if f.speaker == Speaker::Assistant => {
            edit_own_reply(conn, inst, channel, f).await?
        }
        Effect::Edit(f) => edit(conn, inst, channel, f).await?,
        Effect::Delete { ts, root_ts } => delete(conn, inst, channel, ts, root_ts).await?,
    };
    let Some(Applied { root, version }) = applied else {
        return Ok(None);
    };
    let version = match version {
        Some(v) => v,
        // The thread row was made by a transaction that committed while
        // the statement waited for it, or the change gave the thread no
        // new version (a hidden copy's): read it now.
        None => thread_version(conn, inst, channel, &root).await?,
    };
    Ok(Some((root, version)))
}

/// What one apply statement returns: the message's stored root (none when
/// the fact was not new) and the thread's version (none when the statement
/// could not see the thread row, see [`apply`], or gave it no new version:
/// a hidden copy's edit or deletion).
struct Applied {
    root: String,
    version: Option<i64>,
}

impl Applied {
    /// What a statement's two columns say: nothing when the fact was not
    /// new (no root).
    fn of(root: Option<String>, version: Option<i64>) -> Option<Self> {
        root.map(|root| Applied { root, version })
    }
}

/// A new human (or another bot's) message: the fact, the message (an edit
/// or a tombstone already here is kept: the no-op update only returns the
/// stored root), and a new version of its thread.
async fn create(
    conn: &mut PgConnection,
    inst: Uuid,
    channel: &str,
    f: &MessageFacts,
) -> sqlx::Result<Option<Applied>> {
    let r = sqlx::query!(
        r#"WITH fact AS (
            INSERT INTO message_facts (installation_id, channel_id, ts, fact, fact_key)
            VALUES ($1, $2, $3, 'create', '') ON CONFLICT DO NOTHING RETURNING 1),
         msg AS (
            INSERT INTO thread_messages
                   (installation_id, channel_id, ts, root_ts, speaker, user_id, bot_id, text, text_hash, edited_ts)
            SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10::text::numeric WHERE EXISTS (SELECT 1 FROM fact)
            ON CONFLICT (installation_id, channel_id, ts) DO UPDATE SET root_ts = thread_messages.root_ts
            RETURNING root_ts),
         bumped AS (
            INSERT INTO threads (installation_id, channel_id, root_ts, version) SELECT $1, $2, root_ts, 1 FROM msg
            ON CONFLICT (installation_id, channel_id, root_ts)
            DO UPDATE SET version = threads.version + 1, updated_at = now()
            RETURNING version)
         SELECT (SELECT root_ts FROM msg) AS root, (SELECT version FROM bumped) AS version"#,
        inst,
        channel,
        &f.ts,
        &f.root_ts,
        f.speaker.as_str(),
        f.user_id.as_deref(),
        f.bot_id.as_deref(),
        &f.text,
        text_hash(&f.text),
        f.changed_ts.as_deref()
    )
    .fetch_one(conn)
    .await?;
    Ok(Applied::of(r.root, r.version))
}

/// Our own reply: the fact and the message, and the thread's version as
/// it is. An existing thread row is not written (`DO NOTHING`: no update,
/// though a bump in flight is waited for); a thread our reply is the first
/// to name gets its row at version 0, so the version people's facts give
/// it does not depend on whether our reply arrived first.
async fn keep_reply(
    conn: &mut PgConnection,
    inst: Uuid,
    channel: &str,
    f: &MessageFacts,
) -> sqlx::Result<Option<Applied>> {
    let r = sqlx::query!(
        r#"WITH fact AS (
            INSERT INTO message_facts (installation_id, channel_id, ts, fact, fact_key)
            VALUES ($1, $2, $3, 'create', '') ON CONFLICT DO NOTHING RETURNING 1),
         msg AS (
            INSERT INTO thread_messages
                   (installation_id, channel_id, ts, root_ts, speaker, user_id, bot_id, text, text_hash, edited_ts)
            SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10::text::numeric WHERE EXISTS (SELECT 1 FROM fact)
            ON CONFLICT (installation_id, channel_id, ts) DO UPDATE SET root_ts = thread_messages.root_ts
            RETURNING root_ts),
         made AS (
            INSERT INTO threads (installation_id, channel_id, root_ts, version) SELECT $1, $2, root_ts, 0 FROM msg
            ON CONFLICT (installation_id, channel_id, root_ts) DO NOTHING
            RETURNING version)
         SELECT (SELECT root_ts FROM msg) AS root,
                coalesce((SELECT version FROM made),
                         (SELECT t.version FROM threads t JOIN msg ON t.root_ts = msg.root_ts
                           WHERE t.installation_id = $1 AND t.channel_id = $2)) AS version"#,
        inst,
        channel,
        &f.ts,
        &f.root_ts,
        f.speaker.as_str(),
        f.user_id.as_deref(),
        f.bot_id.as_deref(),
        &f.text,
        text_hash(&f.text),
        f.changed_ts.as_deref()
    )
    .fetch_one(conn)
    .await?;
    Ok(Applied::of(r.root, r.version))
}

/// An edit, keyed by the time of its change (or its text's hash when Slack
/// gave none): the newest change wins whatever order changes arrive in (the
/// column `edited_ts` holds the time of the change whose text is kept), a
/// deleted message stays deleted (a hidden copy of a doubled message takes
/// its edits: it may yet be shown), and the thread gets a new version.
async fn edit(
    conn: &mut PgConnection,
    inst: Uuid,
    channel: &str,
    f: &MessageFacts,
) -> sqlx::Result<Option<Applied>> {
    let key = f.changed_ts.clone().unwrap_or_else(|| text_hash(&f.text));
    // Every column is set through one condition, so the upsert always
    // returns the stored root, newer or not.
    let r = sqlx::query!(
        r#"WITH fact AS (
            INSERT INTO message_facts (installation_id, channel_id, ts, fact, fact_key)
            VALUES ($1, $2, $3, 'edit', $11) ON CONFLICT DO NOTHING RETURNING 1),
         msg AS (
            INSERT INTO thread_messages AS m
                   (installation_id, channel_id, ts, root_ts, speaker, user_id, bot_id, text, text_hash, edited_ts)
            SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10::text::numeric WHERE EXISTS (SELECT 1 FROM fact)
            ON CONFLICT (installation_id, channel_id, ts) DO UPDATE
               SET text = CASE WHEN (NOT m.deleted OR m.copy_of IS NOT NULL) AND (m.edited_ts IS NULL OR m.edited_ts < EXCLUDED.edited_ts)
                               THEN EXCLUDED.text ELSE m.text END,
                   text_hash = CASE WHEN (NOT m.deleted OR m.copy_of IS NOT NULL) AND (m.edited_ts IS NULL OR m.edited_ts < EXCLUDED.edited_ts)
                                    THEN EXCLUDED.text_hash ELSE m.text_hash END,
                   edited_ts = CASE WHEN (NOT m.deleted OR m.copy_of IS NOT NULL) AND (m.edited_ts IS NULL OR m.edited_ts < EXCLUDED.edited_ts)
                                    THEN EXCLUDED.edited_ts ELSE m.edited_ts END
            RETURNING root_ts, copy_of IS NOT NULL AS hidden),
         bumped AS (
            -- (a hidden copy's edit changes nothing a reader sees)
            INSERT INTO threads (installation_id, channel_id, root_ts, version)
            SELECT $1, $2, root_ts, 1 FROM msg WHERE NOT hidden
            ON CONFLICT (installation_id, channel_id, root_ts)
            DO UPDATE SET version = threads.version + 1, updated_at = now()
            RETURNING version)
         SELECT (SELECT root_ts FROM msg) AS root, (SELECT version FROM bumped) AS version"#,
        inst,
        channel,
        &f.ts,
        &f.root_ts,
        f.speaker.as_str(),
        f.user_id.as_deref(),
        f.bot_id.as_deref(),
        &f.text,
        text_hash(&f.text),
        f.changed_ts.as_deref(),
        &key
    )
    .fetch_one(conn)
    .await?;
    Ok(Applied::of(r.root, r.version))
}

/// An edit of our own reply (a streamed answer's final text): kept as
/// [`edit`] keeps an edit, without a new version of its thread.
async fn edit_own_reply(
    conn: &mut PgConnection,
    inst: Uuid,
    channel: &str,
    f: &MessageFacts,
) -> sqlx::Result<Option<Applied>> {
    let key = f.changed_ts.clone().unwrap_or_else(|| text_hash(&f.text));
    let r = sqlx::query!(
        r#"WITH fact AS (
            INSERT INTO message_facts (installation_id, channel_id, ts, fact, fact_key)
            VALUES ($1, $2, $3, 'edit', $11) ON CONFLICT DO NOTHING RETURNING 1),
         msg AS (
            INSERT INTO thread_messages AS m
                   (installation_id, channel_id, ts, root_ts, speaker, user_id, bot_id, text, text_hash, edited_ts)
            SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10::text::numeric WHERE EXISTS (SELECT 1 FROM fact)
            ON CONFLICT (installation_id, channel_id, ts) DO UPDATE
               SET text = CASE WHEN NOT m.deleted AND (m.edited_ts IS NULL OR m.edited_ts < EXCLUDED.edited_ts)
                               THEN EXCLUDED.text ELSE m.text END,
                   text_hash = CASE WHEN NOT m.deleted AND (m.edited_ts IS NULL OR m.edited_ts < EXCLUDED.edited_ts)
                                    THEN EXCLUDED.text_hash ELSE m.text_hash END,
                   edited_ts = CASE WHEN NOT m.deleted AND (m.edited_ts IS NULL OR m.edited_ts < EXCLUDED.edited_ts)
                                    THEN EXCLUDED.edited_ts ELSE m.edited_ts END
            RETURNING root_ts),
         made AS (
            INSERT INTO threads (installation_id, channel_id, root_ts, version) SELECT $1, $2, root_ts, 0 FROM msg
            ON CONFLICT (installation_id, channel_id, root_ts) DO NOTHING
            RETURNING version)
         SELECT (SELECT root_ts FROM msg) AS root,
                coalesce((SELECT version FROM made),
                         (SELECT t.version FROM threads t JOIN msg ON t.root_ts = msg.root_ts
                           WHERE t.installation_id = $1 AND t.channel_id = $2)) AS version"#,
        inst,
        channel,
        &f.ts,
        &f.root_ts,
        f.speaker.as_str(),
        f.user_id.as_deref(),
        f.bot_id.as_deref(),
        &f.text,
        text_hash(&f.text),
        f.changed_ts.as_deref(),
        &key
    )
    .fetch_one(conn)
    .await?;
    Ok(Applied::of(r.root, r.version))
}

/// A deletion: a tombstone keeps the message's identity (and its stored
/// root) and drops the text; the thread gets a new version. The deletion's
/// time is the statement's own (`clock_timestamp()`), not its
/// transaction's start: a batch of applies can start before the decision
/// it is compared with (a crossing is a message deleted after the answer's
/// context was taken).
async fn delete(
    conn: &mut PgConnection,
    inst: Uuid,
    channel: &str,
    ts: &str,
    root_ts: &str,
) -> sqlx::Result<Option<Applied>> {
    let r = sqlx::query!(
        r#"WITH fact AS (
            INSERT INTO message_facts (installation_id, channel_id, ts, fact, fact_key)
            VALUES ($1, $2, $3, 'delete', '') ON CONFLICT DO NOTHING RETURNING 1),
         msg AS (
            INSERT INTO thread_messages (installation_id, channel_id, ts, root_ts, speaker, text, text_hash, deleted, deleted_at)
            SELECT $1, $2, $3, $4, 'user', '', '', true, clock_timestamp() WHERE EXISTS (SELECT 1 FROM fact)
            ON CONFLICT (installation_id, channel_id, ts)
            DO UPDATE SET deleted = true, text = '', text_hash = '', copy_of = NULL,
                          -- (a hidden copy was never seen: its deletion is
                          -- no change of its thread, and crosses nothing)
                          deleted_at = CASE WHEN thread_messages.copy_of IS NULL
                                            THEN coalesce(thread_messages.deleted_at, clock_timestamp()) END
            RETURNING root_ts, deleted_at IS NOT NULL AS seen),
         bumped AS (
            INSERT INTO threads (installation_id, channel_id, root_ts, version)
            SELECT $1, $2, root_ts, 1 FROM msg WHERE seen
            ON CONFLICT (installation_id, channel_id, root_ts)
            DO UPDATE SET version = threads.version + 1, updated_at = now()
            RETURNING version)
         SELECT (SELECT root_ts FROM msg) AS root, (SELECT version FROM bumped) AS version"#,
        inst,
        channel,
        ts,
        root_ts
    )
    .fetch_one(conn)
    .await?;
    Ok(Applied::of(r.root, r.version))
}

/// The thread's version as committed now.
async fn thread_version(
    conn: &mut PgConnection,
    inst: Uuid,
    channel: &str,
    root: &str,
) -> sqlx::Result<i64> {
    sqlx::query_scalar!(
        "SELECT version FROM threads WHERE installation_id = $1 AND channel_id = $2 AND root_ts = $3",
        inst,
        channel,
        root
    )
    .fetch_one(conn)
    .await
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
    let claimed = sqlx::query_scalar!(
        "INSERT INTO turns (installation_id, channel_id, ts, receipt_id, source) VALUES ($1, $2, $3, $4, $5)
         ON CONFLICT DO NOTHING RETURNING receipt_id",
        inst,
        channel,
        ts,
        receipt,
        source
    )
    .fetch_optional(&mut *conn)
    .await?;
    if claimed.is_some() {
        return Ok(true);
    }
    // Claimed before: by this receipt (a redelivery) or by its twin.
    let owner = sqlx::query_scalar!(
        "SELECT receipt_id FROM turns WHERE installation_id = $1 AND channel_id = $2 AND ts = $3",
        inst,
        channel,
        ts
    )
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
    let r = sqlx::query!(
        "UPDATE event_receipts SET state = $5, state_reason = 'source_deleted', updated_at = now()
          WHERE installation_id = $1 AND channel_id = $2 AND message_ts = $3 AND state = ANY($6) AND id <> $4",
        inst,
        channel,
        ts,
        except,
        ReceiptState::Ignored.as_str(),
        &moves(&[ReceiptState::Accepted], ReceiptState::Ignored)
    )
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
    let r = sqlx::query!(
        "UPDATE turns SET source_changed_after_answer_at = now()
          WHERE installation_id = $1 AND channel_id = $2 AND ts = $3 AND answered_at IS NOT NULL",
        inst,
        channel,
        ts
    )
    .execute(conn)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// Whether the store has the message (deleted or not).
pub async fn has_message(pool: &PgPool, inst: Uuid, channel: &str, ts: &str) -> sqlx::Result<bool> {
    sqlx::query_scalar!(
        r#"SELECT EXISTS (SELECT 1 FROM thread_messages
                           WHERE installation_id = $1 AND channel_id = $2 AND ts = $3) AS "found!""#,
        inst,
        channel,
        ts
    )
    .fetch_one(pool)
    .await
}

/// Records how far the thread's backfill got; `complete` is never undone.
pub async fn set_backfill(
    pool: &PgPool,
    inst: Uuid,
    channel: &str,
    root: &str,
    state: &str,
) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO threads (installation_id, channel_id, root_ts, backfill_state) VALUES ($1, $2, $3, $4)
         ON CONFLICT (installation_id, channel_id, root_ts) DO UPDATE
            SET backfill_state = CASE WHEN threads.backfill_state = 'complete' THEN 'complete' ELSE EXCLUDED.backfill_state END",
        inst,
        channel,
        root,
        state
    )
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

/// How many replies' sizes one read brings, beyond the count limit (room
/// for replies skipped as too big).
const PAGE_SLACK: usize = 16;

/// One message's size, as the context's choice reads it. `part` 0: the
/// oldest readable message; 1: the source; 2: a reply (newest first).
struct Size {
    part: i32,
    ts: String,
    len: i32,
}

/// The sizes of a page of `j`'s replies older than `cursor`, newest first
/// (the pages after [`snapshot_many`]'s first).
async fn replies_page(
    conn: &mut PgConnection,
    j: &SnapshotJob,
    cursor: Option<&str>,
    page: i64,
) -> sqlx::Result<Vec<(String, i32)>> {
    let rows = sqlx::query!(
        r#"SELECT ts, octet_length(text) AS "len!" FROM thread_messages
            WHERE installation_id = $1 AND channel_id = $2 AND root_ts = $3 AND NOT deleted
              AND (speaker <> 'bot' OR bot_id = ANY($4))
              AND ($5::text IS NULL OR ts::numeric < $5::text::numeric)
            ORDER BY ts::numeric DESC LIMIT $6"#,
        j.inst,
        j.channel,
        j.root,
        &j.approved_bots,
        cursor,
        page
    )
    .fetch_all(conn)
    .await?;
    Ok(rows.into_iter().map(|r| (r.ts, r.len)).collect())
}

/// A transaction whose reads all see one snapshot (REPEATABLE READ): a
/// thread's version and the messages it numbers, read together.
pub async fn begin_snapshot(
    pool: &PgPool,
) -> sqlx::Result<sqlx::Transaction<'static, sqlx::Postgres>> {
    pool.begin_with("BEGIN ISOLATION LEVEL REPEATABLE READ")
        .await
}

/// A context to read: the thread `root` of `channel` in the installation
/// `inst`, for its message `source_ts`, within `limits`. A message is
/// readable when live, and another bot's only when one of `approved_bots`.
#[derive(Debug, Clone)]
pub struct SnapshotJob {
    pub inst: Uuid,
    pub approved_bots: Vec<String>,
    pub channel: String,
    pub root: String,
    pub source_ts: String,
    pub limits: Limits,
}

/// Reads the context of `source_ts` in `root`'s thread without reading the
/// whole thread ([`snapshot_many`] of one). Call inside one REPEATABLE READ
/// transaction.
pub async fn snapshot(
    conn: &mut PgConnection,
    inst: &Installation,
    channel: &str,
    root: &str,
    source_ts: &str,
    limits: Limits,
) -> sqlx::Result<Snapshot> {
    let job = SnapshotJob {
        inst: inst.id,
        approved_bots: inst.approved_bots.clone(),
        channel: channel.to_owned(),
        root: root.to_owned(),
        source_ts: source_ts.to_owned(),
        limits,
    };
    let mut snaps = snapshot_many(conn, std::slice::from_ref(&job)).await?;
    Ok(snaps.pop().expect("one snapshot per job"))
}

/// Reads the contexts of several threads at once, each without reading its
/// whole thread: in one statement, each thread's version, backfill state,
/// source's deletion and readable count with the sizes of its oldest
/// readable message (the root), its source and a first page of its newest
/// replies; the choice of [`context::Chooser`] (the same choice
/// [`context::build`] makes over the whole thread), with a further page
/// read for a thread only when its first did not meet the limits; then in
/// one statement the text of only the chosen messages of every thread.
/// Each snapshot in the order given. Call inside one REPEATABLE READ
/// transaction, so that each version and the messages it numbers are read
/// together.
pub async fn snapshot_many(
    conn: &mut PgConnection,
    jobs: &[SnapshotJob],
) -> sqlx::Result<Vec<Snapshot>> {
    if jobs.is_empty() {
        return Ok(Vec::new());
    }
    let page = |j: &SnapshotJob| (j.limits.max_messages + PAGE_SLACK) as i64;
    let (mut bot_k, mut bots) = (Vec::new(), Vec::new());
    for (k, j) in jobs.iter().enumerate() {
        for b in &j.approved_bots {
            bot_k.push(k as i64 + 1);
            bots.push(b.clone());
        }
    }
    // Rows in job order; a job's sizes by part, its replies newest first; a
    // thread with no readable message gives one row without sizes.
    let rows = sqlx::query!(
        r#"SELECT j.k AS "k!", coalesce(t.version, 0) AS "version!",
                  coalesce(t.backfill_state, 'none') AS "backfill!",
                  h.source_deleted AS "source_deleted!", h.readable AS "readable!",
                  s.part AS "part?", s.ts AS "ts?", s.len AS "len?"
             FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::int8[])
                  WITH ORDINALITY AS j(inst, channel, root, source, page, k)
             -- (lateral lookups by key: index scans whatever the plan guesses of the arrays)
             LEFT JOIN LATERAL (SELECT version, backfill_state FROM threads
                                 WHERE installation_id = j.inst AND channel_id = j.channel AND root_ts = j.root) t ON true
            CROSS JOIN LATERAL (SELECT coalesce(array_agg(x.b), '{}') AS bots
                                  FROM unnest($6::int8[], $7::text[]) AS x(k, b) WHERE x.k = j.k) b
            -- (once per thread, not once per row of its sizes)
            CROSS JOIN LATERAL (
                  SELECT coalesce((SELECT bool_or(m.deleted) FROM thread_messages m
                                    WHERE m.installation_id = j.inst AND m.channel_id = j.channel AND m.ts = j.source),
                                  false) AS source_deleted,
                         (SELECT count(*) FROM thread_messages m
                           WHERE m.installation_id = j.inst AND m.channel_id = j.channel AND m.root_ts = j.root
                             AND NOT m.deleted AND (m.speaker <> 'bot' OR m.bot_id = ANY(b.bots))) AS readable) h
             LEFT JOIN LATERAL (
                  (SELECT 0 AS part, 0::int8 AS o, m.ts, octet_length(m.text) AS len FROM thread_messages m
                    WHERE m.installation_id = j.inst AND m.channel_id = j.channel AND m.root_ts = j.root
                      AND NOT m.deleted AND (m.speaker <> 'bot' OR m.bot_id = ANY(b.bots))
                    ORDER BY m.ts::numeric LIMIT 1)
                  UNION ALL
                  (SELECT 1, 0, m.ts, octet_length(m.text) FROM thread_messages m
                    WHERE m.installation_id = j.inst AND m.channel_id = j.channel AND m.root_ts = j.root
                      AND NOT m.deleted AND (m.speaker <> 'bot' OR m.bot_id = ANY(b.bots)) AND m.ts = j.source)
                  UNION ALL
                  (SELECT 2, row_number() OVER (ORDER BY m.ts::numeric DESC), m.ts, octet_length(m.text)
                     FROM thread_messages m
                    WHERE m.installation_id = j.inst AND m.channel_id = j.channel AND m.root_ts = j.root
                      AND NOT m.deleted AND (m.speaker <> 'bot' OR m.bot_id = ANY(b.bots))
                    ORDER BY m.ts::numeric DESC LIMIT j.page)
             ) s ON true
            ORDER BY j.k, s.part, s.o"#,
        &jobs.iter().map(|j| j.inst).collect::<Vec<_>>(),
        &jobs.iter().map(|j| j.channel.clone()).collect::<Vec<_>>(),
        &jobs.iter().map(|j| j.root.clone()).collect::<Vec<_>>(),
        &jobs.iter().map(|j| j.source_ts.clone()).collect::<Vec<_>>(),
        &jobs.iter().map(page).collect::<Vec<_>>(),
        &bot_k,
        &bots
    )
    .fetch_all(&mut *conn)
    .await?;
    struct Head {
        version: i64,
        backfill_partial: bool,
        source_deleted: bool,
        readable: i64,
        sizes: Vec<Size>,
    }
    let mut heads: Vec<Option<Head>> = (0..jobs.len()).map(|_| None).collect();
    for r in rows {
        let head = heads
            .get_mut((r.k - 1) as usize)
            .expect("a row names one of the jobs")
            .get_or_insert_with(|| Head {
                version: r.version,
                backfill_partial: r.backfill == "partial",
                source_deleted: r.source_deleted,
                readable: r.readable,
                sizes: Vec::new(),
            });
        if let (Some(part), Some(ts), Some(len)) = (r.part, r.ts, r.len) {
            head.sizes.push(Size { part, ts, len });
        }
    }
    let heads: Vec<Head> = heads
        .into_iter()
        .map(|h| h.expect("one row at least per job"))
        .collect();
    // Each thread's choice; `None` where it has no readable message.
    let mut chosen: Vec<Option<Vec<String>>> = Vec::with_capacity(jobs.len());
    for (j, head) in jobs.iter().zip(&heads) {
        chosen.push(choose(conn, j, &head.sizes, page(j)).await?);
    }
    let (mut text_k, mut text_inst, mut text_channel, mut text_root, mut text_ts) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (k, (j, c)) in jobs.iter().zip(&chosen).enumerate() {
        for ts in c.iter().flatten() {
            text_k.push(k as i64 + 1);
            text_inst.push(j.inst);
            text_channel.push(j.channel.clone());
            text_root.push(j.root.clone());
            text_ts.push(ts.clone());
        }
    }
    let mut messages: Vec<Vec<StoredMessage>> = vec![Vec::new(); jobs.len()];
    if !text_k.is_empty() {
        let texts = sqlx::query!(
            // Every chosen message is in its thread, so the lookup names the
            // thread's root too: whichever index the planner takes (the key,
            // or the thread window before the table has statistics) finds
            // the thread's messages only; OFFSET 0 keeps the lookup a lateral
            // one, never folded into a hash join over the table.
            r#"SELECT x.k AS "k!", m.ts, m.speaker, m.user_id, m.bot_id, m.text
                 FROM unnest($1::int8[], $2::uuid[], $3::text[], $4::text[], $5::text[]) AS x(k, inst, channel, root, ts)
                CROSS JOIN LATERAL (SELECT ts, speaker, user_id, bot_id, text FROM thread_messages
                                     WHERE installation_id = x.inst AND channel_id = x.channel
                                       AND root_ts = x.root AND ts = x.ts
                                    OFFSET 0) m
                ORDER BY x.k, m.ts::numeric"#,
            &text_k,
            &text_inst,
            &text_channel,
            &text_root,
            &text_ts
        )
        .fetch_all(&mut *conn)
        .await?;
        for m in texts {
            messages[(m.k - 1) as usize].push(StoredMessage {
                ts: m.ts,
                speaker: m.speaker,
                user_id: m.user_id.or(m.bot_id).unwrap_or_default(),
                text: m.text,
            });
        }
    }
    Ok(heads
        .into_iter()
        .zip(messages)
        .map(|(h, messages)| Snapshot {
            version: h.version,
            backfill_partial: h.backfill_partial,
            source_deleted: h.source_deleted,
            built: context::finish(messages, h.readable as usize),
        })
        .collect())
}

/// The messages of `j`'s context, from the sizes of its first page (the
/// oldest readable message, the source, the newest replies), reading
/// further pages of replies while the limits are not met. `None` when the
/// thread has no readable message.
async fn choose(
    conn: &mut PgConnection,
    j: &SnapshotJob,
    first_page: &[Size],
    page: i64,
) -> sqlx::Result<Option<Vec<String>>> {
    let Some(first) = first_page.iter().find(|r| r.part == 0) else {
        return Ok(None);
    };
    let source_ts = j.source_ts.as_str();
    let (first_ts, first_len) = (first.ts.clone(), first.len);
    let source = first_page
        .iter()
        .find(|r| r.part == 1 && r.ts != first_ts)
        .map(|r| (r.ts.clone(), r.len as usize));
    let mut chooser = context::Chooser::new(
        first_len as usize,
        source.as_ref().map(|s| s.1),
        source_ts,
        j.limits,
    );
    let mut chosen = vec![first_ts.clone()];
    chosen.extend(source.map(|s| s.0));
    let mut replies: Vec<(String, i32)> = first_page
        .iter()
        .filter(|r| r.part == 2)
        .map(|r| (r.ts.clone(), r.len))
        .collect();
    'pages: loop {
        let full = replies.len() as i64 == page;
        let mut cursor = None;
        for (ts, len) in replies.drain(..) {
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
        replies = replies_page(conn, j, cursor.as_deref(), page).await?;
    }
    Ok(Some(chosen))
}

/// What a receipt's context was built from (no text).
pub struct ContextRecord<'a> {
    pub event_id: &'a str,
    pub receipt_id: Uuid,
    pub installation_id: Uuid,
    pub channel_id: &'a str,
    /// The channel's pseudonym for the audit record.
    pub channel_ref: Option<String>,
    pub root_ts: &'a str,
    pub source_ts: &'a str,
    pub thread_version: i64,
    pub content_hash: &'a str,
    pub message_count: usize,
    pub truncated: bool,
    pub backfill_partial: bool,
}

/// Records the context (replacing an earlier one of the same receipt) with
/// its audit record.
pub async fn record_context(conn: &mut PgConnection, c: &ContextRecord<'_>) -> sqlx::Result<()> {
    record_contexts(conn, std::slice::from_ref(c)).await
}

/// Records several contexts, each replacing an earlier one of the same
/// receipt, with their audit records, in one statement. A receipt named
/// twice is recorded in turn (one statement cannot change a row twice), the
/// later record last, as calls in a row would leave it.
pub async fn record_contexts(
    conn: &mut PgConnection,
    cs: &[ContextRecord<'_>],
) -> sqlx::Result<()> {
    let mut rest = cs;
    while !rest.is_empty() {
        // The longest prefix without a receipt named twice.
        let mut seen = std::collections::HashSet::new();
        let n = rest
            .iter()
            .take_while(|c| seen.insert(c.receipt_id))
            .count();
        let (round, later) = rest.split_at(n);
        // (rows locked in key order, as another batch would lock them)
        let mut round: Vec<&ContextRecord<'_>> = round.iter().collect();
        round.sort_by_key(|c| c.receipt_id);
        record_round(conn, &round).await?;
        rest = later;
    }
    Ok(())
}

async fn record_round(conn: &mut PgConnection, cs: &[&ContextRecord<'_>]) -> sqlx::Result<()> {
    sqlx::query!(
        r#"WITH c AS (
            SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::text[], $5::text[], $6::int8[], $7::text[],
                                 $8::int4[], $9::bool[], $10::bool[], $11::text[], $12::text[])
                AS c(receipt_id, installation_id, channel_id, root_ts, source_ts, thread_version, content_hash,
                     message_count, truncated, backfill_partial, event_id, channel_ref)),
         recorded AS (
            INSERT INTO contexts (receipt_id, installation_id, channel_id, root_ts, source_ts, thread_version,
                                  content_hash, message_count, truncated, backfill_partial)
            SELECT receipt_id, installation_id, channel_id, root_ts, source_ts, thread_version, content_hash,
                   message_count, truncated, backfill_partial FROM c
            ON CONFLICT (receipt_id) DO UPDATE
               SET thread_version = EXCLUDED.thread_version, content_hash = EXCLUDED.content_hash,
                   message_count = EXCLUDED.message_count, truncated = EXCLUDED.truncated,
                   backfill_partial = EXCLUDED.backfill_partial, captured_at = now())
         -- (the event's type and deliveries so far, as the receipt's ending
         -- records them: for a request handed on, this record is the
         -- context stage's only one)
         INSERT INTO audit_log (stage, outcome, reason, installation_id, event_id, receipt_id, channel_ref, thread_version,
                                event_type, retry_count)
         SELECT 'context', 'context_built', CASE WHEN c.backfill_partial THEN 'backfill_partial' END,
                c.installation_id, c.event_id, c.receipt_id, c.channel_ref, c.thread_version,
                audit_event_type(r.event_type),
                r.retry_num + r.duplicate_deliveries
           FROM c LEFT JOIN event_receipts r ON r.id = c.receipt_id"#,
        &cs.iter().map(|c| c.receipt_id).collect::<Vec<_>>(),
        &cs.iter().map(|c| c.installation_id).collect::<Vec<_>>(),
        &cs.iter().map(|c| c.channel_id.to_owned()).collect::<Vec<_>>(),
        &cs.iter().map(|c| c.root_ts.to_owned()).collect::<Vec<_>>(),
        &cs.iter().map(|c| c.source_ts.to_owned()).collect::<Vec<_>>(),
        &cs.iter().map(|c| c.thread_version).collect::<Vec<_>>(),
        &cs.iter().map(|c| c.content_hash.to_owned()).collect::<Vec<_>>(),
        &cs.iter().map(|c| c.message_count as i32).collect::<Vec<_>>(),
        &cs.iter().map(|c| c.truncated).collect::<Vec<_>>(),
        &cs.iter().map(|c| c.backfill_partial).collect::<Vec<_>>(),
        &cs.iter().map(|c| c.event_id.to_owned()).collect::<Vec<_>>(),
        &cs.iter().map(|c| c.channel_ref.clone()).collect::<Vec<_>>() as &[Option<String>]
    )
    .execute(&mut *conn)
    .await?;
    Ok(())
}
