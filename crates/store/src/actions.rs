//! A person's actions (`person_actions`) and the messages that repeat one
//! (`doubled_messages`): Slack has delivered one message as two `message`
//! events with different `ts` and the same `client_msg_id`. The first of
//! its messages the thread store applies owns the action; another is a
//! *doubled* message, recorded here (identifiers only) and never a request.
//! A doubled reply is kept as a hidden copy in its thread ([`hide_copy`]),
//! so that it neither makes the first message's answer stale nor crosses
//! it; a doubled top-level message is a thread of its own, shown (people
//! may reply under it). An `app_mention` and its `message` twin carry one
//! `ts` and own the action together (their turn decides which of them
//! answers). When the person deletes the message that owns the action while
//! a copy still shows, the copy stands in for it ([`stand_in`]).

use sqlx::PgConnection;
use uuid::Uuid;

/// Who owns a person's action ([`claim`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    /// The message that owns it.
    pub ts: String,
    /// The deleted message it stands in for ([`stand_in`]).
    pub stood_for: Option<String>,
    /// That deleted message was a request (it had a turn): whether the
    /// copy is asked in its place is decided by [`stand_in`] and
    /// [`ask_stand_in`], never by the copy's own deliveries.
    pub stood_for_asked: bool,
}

/// Claims the action `client_msg_id` of `channel` for the message `ts`;
/// returns the message that owns it (`ts` itself when it is the first, a
/// twin of the first or a redelivery). One statement: a claim
/// that meets another's (committed, or committing: it waits for it) reads
/// the owner from the row it conflicted with (a no-op update, which an
/// insert that lost could not see in its own snapshot).
pub async fn claim(
    conn: &mut PgConnection,
    inst: Uuid,
    channel: &str,
    client_msg_id: &str,
    ts: &str,
) -> sqlx::Result<Owner> {
    let r = sqlx::query!(
        r#"INSERT INTO person_actions (installation_id, channel_id, client_msg_id, ts) VALUES ($1, $2, $3, $4)
         ON CONFLICT (installation_id, channel_id, client_msg_id) DO UPDATE SET ts = person_actions.ts
         RETURNING ts, stood_for,
                   EXISTS (SELECT 1 FROM turns t WHERE t.installation_id = $1 AND t.channel_id = $2
                                                   AND t.ts = person_actions.stood_for) AS "stood_for_asked!""#,
        inst,
        channel,
        client_msg_id,
        ts
    )
    .fetch_one(conn)
    .await?;
    Ok(Owner {
        ts: r.ts,
        stood_for: r.stood_for,
        stood_for_asked: r.stood_for_asked,
    })
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

/// Keeps the doubled reply `f` as a hidden copy of `kept_ts` in its
/// thread: its create fact (a redelivery or its twin is then no news) and
/// its row, deleted (no context or check sees it, and its thread keeps its
/// version) with `copy_of` set and its text kept, for [`stand_in`]. A row
/// already there (the person's deletion or an edit of it arrived first) is
/// left as it is.
pub async fn hide_copy(
    conn: &mut PgConnection,
    inst: Uuid,
    channel: &str,
    f: &threadline_domain::classify::MessageFacts,
    kept_ts: &str,
) -> sqlx::Result<()> {
    sqlx::query!(
        r#"WITH fact AS (
            INSERT INTO message_facts (installation_id, channel_id, ts, fact, fact_key)
            VALUES ($1, $2, $3, 'create', '') ON CONFLICT DO NOTHING RETURNING 1)
         INSERT INTO thread_messages
                (installation_id, channel_id, ts, root_ts, speaker, user_id, bot_id, text, text_hash,
                 edited_ts, deleted, copy_of)
         SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10::text::numeric, true, $11
          WHERE EXISTS (SELECT 1 FROM fact)
         ON CONFLICT (installation_id, channel_id, ts) DO NOTHING"#,
        inst,
        channel,
        &f.ts,
        &f.root_ts,
        f.speaker.as_str(),
        f.user_id.as_deref(),
        f.bot_id.as_deref(),
        &f.text,
        crate::threads::text_hash(&f.text),
        f.changed_ts.as_deref(),
        kept_ts
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// What [`stand_in`] did for a deleted message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoodIn {
    /// The copy that stands in for it now.
    pub ts: String,
    /// Shown now (it was hidden until this call).
    pub shown: bool,
    /// Asked again now: the deleted message was a request nothing answered,
    /// nor has an answer on its way.
    pub asked: bool,
}

/// The person deleted `deleted_ts`, which owned an action Slack delivered
/// as more messages too: the oldest copy still showing stands in for it.
/// It becomes the action's owner and takes the deleted message's place in
/// its burst (double texting); a hidden copy is shown in its thread (a new
/// version, so answers read it). It is asked now when the deleted message
/// was a request that no answer answered or read and none is on its way
/// ([`ask_stand_in`] asks it later, when that answer is discarded). Called
/// by the context-builder where a deletion is applied, and where a doubled
/// message meets an owner already deleted. `None`: nothing stands in.
pub async fn stand_in(
    conn: &mut PgConnection,
    inst: Uuid,
    channel: &str,
    deleted_ts: &str,
) -> sqlx::Result<Option<StoodIn>> {
    let Some(action) = lock_action(conn, inst, channel, deleted_ts).await? else {
        return Ok(None);
    };
    let (ts, shown) = if action.ts == deleted_ts {
        // Deleted by its person (a hidden copy is not), and a copy of it
        // hidden or showing.
        let Some(copy) = sqlx::query!(
            r#"SELECT d.ts, m.root_ts, m.deleted AS hidden FROM doubled_messages d
                 JOIN thread_messages m ON m.installation_id = d.installation_id
                                       AND m.channel_id = d.channel_id AND m.ts = d.ts
                WHERE d.installation_id = $1 AND d.channel_id = $2 AND d.kept_ts = $3
                  AND (m.copy_of = $3 OR NOT m.deleted)
                  AND EXISTS (SELECT 1 FROM thread_messages k
                               WHERE k.installation_id = $1 AND k.channel_id = $2 AND k.ts = $3
                                 AND k.deleted AND k.copy_of IS NULL)
                ORDER BY d.ts::numeric LIMIT 1 FOR UPDATE OF m"#,
            inst,
            channel,
            deleted_ts
        )
        .fetch_optional(&mut *conn)
        .await?
        else {
            return Ok(None);
        };
        take_over(
            conn,
            (inst, channel),
            (&copy.ts, &copy.root_ts),
            deleted_ts,
            &action.client_msg_id,
        )
        .await?;
        (copy.ts, copy.hidden)
    } else {
        (action.ts, false)
    };
    let asked = ask_again(conn, inst, channel, deleted_ts, &ts).await?;
    Ok(Some(StoodIn { ts, shown, asked }))
}

/// The publisher discarded an answer to `deleted_ts`: when a copy stands
/// in for that message ([`stand_in`]) and nothing else answered it, the
/// copy is asked now. `None`: no copy stands in for it.
pub async fn ask_stand_in(
    conn: &mut PgConnection,
    inst: Uuid,
    channel: &str,
    deleted_ts: &str,
) -> sqlx::Result<Option<StoodIn>> {
    let Some(action) = lock_action(conn, inst, channel, deleted_ts).await? else {
        return Ok(None);
    };
    if action.stood_for.as_deref() != Some(deleted_ts) {
        return Ok(None);
    }
    let asked = ask_again(conn, inst, channel, deleted_ts, &action.ts).await?;
    Ok(Some(StoodIn {
        ts: action.ts,
        shown: false,
        asked,
    }))
}

/// The deleted messages of thread `root`, at or before `ts`, that a copy
/// stands in for ([`stand_in`]), oldest first: an answer to `ts` discarded
/// now may be what kept their copies from being asked ([`ask_stand_in`]).
pub async fn stood_for_in_thread(
    conn: &mut PgConnection,
    (inst, channel): (Uuid, &str),
    root: &str,
    ts: &str,
) -> sqlx::Result<Vec<String>> {
    sqlx::query_scalar!(
        r#"SELECT a.stood_for AS "stood_for!" FROM person_actions a
             JOIN thread_messages k ON k.installation_id = a.installation_id AND k.channel_id = a.channel_id
                                   AND k.ts = a.stood_for
            WHERE a.installation_id = $1 AND a.channel_id = $2 AND a.stood_for IS NOT NULL
              AND k.root_ts = $3 AND a.stood_for::numeric <= $4::text::numeric
            ORDER BY a.stood_for::numeric"#,
        inst,
        channel,
        root,
        ts
    )
    .fetch_all(conn)
    .await
}

/// The action `ts` owns or a copy of it stands in for, locked. Both sides
/// lock it so: the one that comes second waits, and its condition holds
/// before the copy is shown and after, so it then sees what the first did
/// (a copy shown, an answer discarded).
async fn lock_action(
    conn: &mut PgConnection,
    inst: Uuid,
    channel: &str,
    ts: &str,
) -> sqlx::Result<Option<LockedAction>> {
    sqlx::query_as!(
        LockedAction,
        "SELECT client_msg_id, ts, stood_for FROM person_actions
          WHERE installation_id = $1 AND channel_id = $2 AND (ts = $3 OR stood_for = $3)
          ORDER BY (ts = $3) DESC LIMIT 1 FOR UPDATE",
        inst,
        channel,
        ts
    )
    .fetch_optional(conn)
    .await
}

struct LockedAction {
    client_msg_id: String,
    ts: String,
    stood_for: Option<String>,
}

/// The copy `ts` (in thread `root`) takes the place of `deleted_ts`: shown
/// when hidden (its thread gets a new version), the other copies now
/// copies of it, the action's owner, and in the deleted message's place in
/// its burst (what it was decided to be, and what it absorbed).
async fn take_over(
    conn: &mut PgConnection,
    (inst, channel): (Uuid, &str),
    (ts, root): (&str, &str),
    deleted_ts: &str,
    action: &str,
) -> sqlx::Result<()> {
    sqlx::query!(
        r#"WITH shown AS (
            UPDATE thread_messages SET deleted = false, copy_of = NULL
             WHERE installation_id = $1 AND channel_id = $2 AND ts = $3 AND copy_of IS NOT NULL
            RETURNING ts),
         others AS (
            UPDATE thread_messages SET copy_of = $3
             WHERE installation_id = $1 AND channel_id = $2 AND copy_of = $5 AND ts <> $3),
         records AS (
            UPDATE doubled_messages SET kept_ts = $3
             WHERE installation_id = $1 AND channel_id = $2 AND kept_ts = $5 AND ts <> $3),
         decided AS (
            UPDATE double_texts SET ts = $3 WHERE installation_id = $1 AND channel_id = $2 AND ts = $5),
         absorbing AS (
            UPDATE double_texts SET later_ts = $3
             WHERE installation_id = $1 AND channel_id = $2 AND later_ts = $5),
         owner AS (
            UPDATE person_actions SET ts = $3, stood_for = $5
             WHERE installation_id = $1 AND channel_id = $2 AND client_msg_id = $6)
         INSERT INTO threads (installation_id, channel_id, root_ts, version)
         SELECT $1, $2, $4, 1 FROM shown
         ON CONFLICT (installation_id, channel_id, root_ts)
         DO UPDATE SET version = threads.version + 1, updated_at = now()"#,
        inst,
        channel,
        ts,
        root,
        deleted_ts,
        action
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// Gives the copy `ts` the turn of the deleted request `deleted_ts`, when
/// nothing answered that request (its own answer sent, an answer in its
/// thread to it or a later message, a later message of its burst that
/// absorbed it) and no such answer is on its way (a decision not
/// discarded: [`ask_stand_in`] runs when one is, for each deleted request
/// of its thread at or before its question); its thread is
/// reconsidered through the outbox. Its receipt stays as it ended (a
/// doubled delivery: receipts are the intake's record, not the
/// publisher's). True when it was asked now.
async fn ask_again(
    conn: &mut PgConnection,
    inst: Uuid,
    channel: &str,
    deleted_ts: &str,
    ts: &str,
) -> sqlx::Result<bool> {
    let Some(turn) = sqlx::query!(
        r#"WITH asked AS (
            SELECT t.source, m.root_ts AS root, d.receipt_id
              FROM turns t
              JOIN thread_messages k ON k.installation_id = t.installation_id AND k.channel_id = t.channel_id
                                    AND k.ts = t.ts
              JOIN thread_messages m ON m.installation_id = t.installation_id AND m.channel_id = t.channel_id
                                    AND m.ts = $4 AND NOT m.deleted
              JOIN doubled_messages d ON d.installation_id = t.installation_id AND d.channel_id = t.channel_id
                                     AND d.ts = $4
             WHERE t.installation_id = $1 AND t.channel_id = $2 AND t.ts = $3 AND t.answered_at IS NULL
               -- (absorbed by a later message of its burst, whose answer
               -- reads the copy in its place)
               AND NOT EXISTS (SELECT 1 FROM double_texts b
                                WHERE b.installation_id = $1 AND b.channel_id = $2 AND b.ts IN ($3, $4)
                                  AND b.outcome = 'absorbed')
               -- (an answer to it, or to a later message of its thread, that
               -- went out or may, and read it or the copy: the over-budget
               -- note answers nothing, and an answer built while neither
               -- showed, the message deleted and the copy still hidden or
               -- not yet delivered, read neither)
               AND NOT EXISTS (SELECT 1 FROM decisions x
                                WHERE x.installation_id = $1 AND x.channel_id = $2 AND x.root_ts = k.root_ts
                                  AND x.source_ts::numeric >= $3::numeric AND x.action_kind <> $5
                                  AND x.status NOT IN ('stale', 'superseded', 'cancelled', 'suppressed')
                                  AND (x.context_ts IS NULL OR x.context_ts && ARRAY[$3, $4]::text[]))),
         turn AS (
            INSERT INTO turns (installation_id, channel_id, ts, receipt_id, source)
            SELECT $1, $2, $4, receipt_id, source FROM asked
            ON CONFLICT DO NOTHING RETURNING receipt_id)
         SELECT turn.receipt_id, (SELECT root FROM asked) AS "root!" FROM turn"#,
        inst,
        channel,
        deleted_ts,
        ts,
        threadline_domain::budget::NOTE_ACTION_KIND
    )
    .fetch_optional(&mut *conn)
    .await?
    else {
        return Ok(false);
    };
    let msg = threadline_proto::v1::Reconsider {
        schema_version: threadline_proto::v1::SCHEMA_VERSION,
        installation_id: inst.to_string(),
        channel_id: channel.to_owned(),
        root_ts: turn.root.clone(),
        stale_version: 0,
        receipt_id: turn.receipt_id.to_string(),
        reason: "stands_for_deleted".to_owned(),
    };
    crate::outbox::enqueue(
        conn,
        inst,
        turn.receipt_id,
        threadline_domain::topic::Topic::Reconsider,
        &format!("recon:standin:{inst}:{channel}:{ts}"),
        prost::Message::encode_to_vec(&msg),
    )
    .await?;
    Ok(true)
}
