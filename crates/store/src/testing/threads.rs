//! Test fixtures and reads for the `threads` family (see `crate::threads`).

/// Inserts a thread's row at `version`.
pub async fn insert_thread(
    pool: &sqlx::PgPool,
    inst: uuid::Uuid,
    channel: &str,
    root_ts: &str,
    version: i64,
) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO threads (installation_id, channel_id, root_ts, version) VALUES ($1, $2, $3, $4)",
        inst,
        channel,
        root_ts,
        version
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// The root ts of one thread, whichever (for a database that holds one).
pub async fn one_thread_root(pool: &sqlx::PgPool) -> sqlx::Result<String> {
    sqlx::query_scalar!("SELECT root_ts FROM threads LIMIT 1")
        .fetch_one(pool)
        .await
}

/// Sets a thread's version.
pub async fn set_thread_version(
    pool: &sqlx::PgPool,
    inst: uuid::Uuid,
    channel: &str,
    root_ts: &str,
    version: i64,
) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE threads SET version = $4 WHERE installation_id = $1 AND channel_id = $2 AND root_ts = $3",
        inst,
        channel,
        root_ts,
        version
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Bumps a thread's version by one on `conn`, whose transaction then holds the row's lock until it ends.
pub async fn bump_thread_version(
    conn: &mut sqlx::PgConnection,
    inst: uuid::Uuid,
    channel: &str,
    root_ts: &str,
) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE threads SET version = version + 1 WHERE installation_id = $1 AND channel_id = $2 AND root_ts = $3",
        inst,
        channel,
        root_ts
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// Inserts a user's message (text hash `h`) into a thread unless a message with its ts is there; whether it was inserted.
pub async fn insert_user_message(
    pool: &sqlx::PgPool,
    inst: uuid::Uuid,
    channel: &str,
    ts: &str,
    root_ts: &str,
    text: &str,
) -> sqlx::Result<bool> {
    let r = sqlx::query!(
        "INSERT INTO thread_messages (installation_id, channel_id, ts, root_ts, speaker, text, text_hash)
         VALUES ($1, $2, $3, $4, 'user', $5, 'h') ON CONFLICT DO NOTHING",
        inst,
        channel,
        ts,
        root_ts,
        text
    )
    .execute(pool)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// Marks a message deleted, or not.
pub async fn set_message_deleted(
    pool: &sqlx::PgPool,
    inst: uuid::Uuid,
    channel: &str,
    ts: &str,
    deleted: bool,
) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE thread_messages SET deleted = $4 WHERE installation_id = $1 AND channel_id = $2 AND ts = $3",
        inst,
        channel,
        ts,
        deleted
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Inserts the turn of the message `ts` (from `source`) unless it has one.
pub async fn insert_turn(
    pool: &sqlx::PgPool,
    inst: uuid::Uuid,
    channel: &str,
    ts: &str,
    receipt: uuid::Uuid,
    source: &str,
) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO turns (installation_id, channel_id, ts, receipt_id, source) VALUES ($1, $2, $3, $4, $5)
         ON CONFLICT DO NOTHING",
        inst,
        channel,
        ts,
        receipt,
        source
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Whether the message `ts` (any channel) has a turn: it was asked.
pub async fn has_turn(pool: &sqlx::PgPool, ts: &str) -> sqlx::Result<bool> {
    sqlx::query_scalar!(
        r#"SELECT EXISTS (SELECT 1 FROM turns WHERE ts = $1) AS "found!""#,
        ts
    )
    .fetch_one(pool)
    .await
}

/// Whether the turn of the message `ts` (any channel) is answered.
pub async fn turn_answered(pool: &sqlx::PgPool, ts: &str) -> sqlx::Result<bool> {
    sqlx::query_scalar!(
        r#"SELECT answered_at IS NOT NULL AS "answered!" FROM turns WHERE ts = $1"#,
        ts
    )
    .fetch_one(pool)
    .await
}

/// The highest version of any thread rooted at `root_ts`, 0 when there is none.
pub async fn max_thread_version(pool: &sqlx::PgPool, root_ts: &str) -> sqlx::Result<i64> {
    sqlx::query_scalar!(
        r#"SELECT coalesce(max(version), 0) AS "version!" FROM threads WHERE root_ts = $1"#,
        root_ts
    )
    .fetch_one(pool)
    .await
}

/// The version of the thread rooted at `root_ts`.
pub async fn thread_version(pool: &sqlx::PgPool, root_ts: &str) -> sqlx::Result<i64> {
    sqlx::query_scalar!("SELECT version FROM threads WHERE root_ts = $1", root_ts)
        .fetch_one(pool)
        .await
}

/// The backfill state (`none`, `complete`, `partial`) of the thread rooted at `root_ts`.
pub async fn backfill_state(pool: &sqlx::PgPool, root_ts: &str) -> sqlx::Result<String> {
    sqlx::query_scalar!(
        "SELECT backfill_state FROM threads WHERE root_ts = $1",
        root_ts
    )
    .fetch_one(pool)
    .await
}

/// How many stored messages have timestamp `ts` and were said by `speaker`.
pub async fn count_messages_by(pool: &sqlx::PgPool, ts: &str, speaker: &str) -> sqlx::Result<i64> {
    sqlx::query_scalar!(
        r#"SELECT count(*) AS "n!" FROM thread_messages WHERE ts = $1 AND speaker = $2"#,
        ts,
        speaker
    )
    .fetch_one(pool)
    .await
}

/// The stored text of the message with timestamp `ts`.
pub async fn message_text(pool: &sqlx::PgPool, ts: &str) -> sqlx::Result<String> {
    sqlx::query_scalar!("SELECT text FROM thread_messages WHERE ts = $1", ts)
        .fetch_one(pool)
        .await
}

/// A stored message's timestamp, text and tombstone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageContent {
    pub ts: String,
    pub text: String,
    pub deleted: bool,
}

/// Every stored message's content, by timestamp.
pub async fn message_contents(pool: &sqlx::PgPool) -> sqlx::Result<Vec<MessageContent>> {
    sqlx::query_as!(
        MessageContent,
        "SELECT ts, text, deleted FROM thread_messages ORDER BY ts"
    )
    .fetch_all(pool)
    .await
}

/// One message [`insert_thread_messages`] writes.
#[derive(Debug, Clone)]
pub struct NewMessage<'a> {
    pub ts: &'a str,
    pub speaker: &'a str,
    pub user_id: Option<&'a str>,
    pub bot_id: Option<&'a str>,
    pub text: &'a str,
    pub deleted: bool,
}

/// Writes `messages` into one thread in one statement, with a placeholder text hash.
pub async fn insert_thread_messages(
    pool: &sqlx::PgPool,
    inst: uuid::Uuid,
    channel: &str,
    root_ts: &str,
    messages: &[NewMessage<'_>],
) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO thread_messages (installation_id, channel_id, ts, root_ts, speaker, user_id, bot_id, text, text_hash, deleted)
         SELECT $1, $2, t.ts, $3, t.speaker, t.user_id, t.bot_id, t.text, 'h', t.deleted
           FROM UNNEST($4::text[], $5::text[], $6::text[], $7::text[], $8::text[], $9::bool[])
                AS t(ts, speaker, user_id, bot_id, text, deleted)",
        inst,
        channel,
        root_ts,
        messages.iter().map(|m| m.ts).collect::<Vec<_>>() as _,
        messages.iter().map(|m| m.speaker).collect::<Vec<_>>() as _,
        messages.iter().map(|m| m.user_id).collect::<Vec<_>>() as _,
        messages.iter().map(|m| m.bot_id).collect::<Vec<_>>() as _,
        messages.iter().map(|m| m.text).collect::<Vec<_>>() as _,
        &messages.iter().map(|m| m.deleted).collect::<Vec<_>>(),
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Marks the turn of the request at `ts` answered now (as the publisher does when its reply is sent).
pub async fn set_turn_answered(pool: &sqlx::PgPool, ts: &str) -> sqlx::Result<()> {
    sqlx::query!("UPDATE turns SET answered_at = now() WHERE ts = $1", ts)
        .execute(pool)
        .await?;
    Ok(())
}

/// Marks every turn answered now.
pub async fn set_all_turns_answered(pool: &sqlx::PgPool) -> sqlx::Result<()> {
    sqlx::query!("UPDATE turns SET answered_at = now()")
        .execute(pool)
        .await?;
    Ok(())
}

/// Whether the turn at `ts` recorded a source change after its answer; `None` without a turn.
pub async fn source_changed_after_answer(
    pool: &sqlx::PgPool,
    ts: &str,
) -> sqlx::Result<Option<bool>> {
    sqlx::query_scalar!(
        r#"SELECT source_changed_after_answer_at IS NOT NULL AS "changed!" FROM turns WHERE ts = $1"#,
        ts
    )
    .fetch_optional(pool)
    .await
}

/// A captured context: the receipt it answers, the thread version it saw and its source message.
#[derive(Debug, Clone)]
pub struct CapturedContext {
    pub receipt_id: uuid::Uuid,
    pub thread_version: i64,
    pub source_ts: String,
}

/// The first captured context.
pub async fn first_context(pool: &sqlx::PgPool) -> sqlx::Result<CapturedContext> {
    sqlx::query_as!(
        CapturedContext,
        "SELECT receipt_id, thread_version, source_ts FROM contexts"
    )
    .fetch_one(pool)
    .await
}

/// A thread's version with the decisions made in it and how many of them went stale.
#[derive(Debug, Clone)]
pub struct VersionAndDecisions {
    pub version: i64,
    pub decisions: i64,
    pub stale: i64,
}

/// The version of the thread rooted at `root_ts` (which must exist), its decisions and stale decisions.
pub async fn version_and_decisions_by_root(
    pool: &sqlx::PgPool,
    root_ts: &str,
) -> sqlx::Result<VersionAndDecisions> {
    sqlx::query_as!(
        VersionAndDecisions,
        r#"SELECT (SELECT version FROM threads WHERE root_ts = $1) AS "version!",
                  (SELECT count(*) FROM decisions WHERE root_ts = $1) AS "decisions!",
                  (SELECT count(*) FROM decisions WHERE root_ts = $1 AND status = 'stale') AS "stale!""#,
        root_ts
    )
    .fetch_one(pool)
    .await
}

/// A thread in channel C1 at version 2, last updated `ago` before now.
pub async fn insert_thread_updated_ago(
    pool: &sqlx::PgPool,
    installation_id: uuid::Uuid,
    root_ts: &str,
    ago: std::time::Duration,
) -> sqlx::Result<()> {
    let ago = sqlx::postgres::types::PgInterval::try_from(ago).map_err(sqlx::Error::Encode)?;
    sqlx::query!(
        "INSERT INTO threads (installation_id, channel_id, root_ts, version, updated_at)
         VALUES ($1, 'C1', $2, 2, now() - $3::interval)",
        installation_id,
        root_ts,
        ago
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// How many rows installation `installation_id` has in threads, messages, turns, channel kinds and policies, and receipts.
pub async fn count_rows_of_installation(
    pool: &sqlx::PgPool,
    installation_id: uuid::Uuid,
) -> sqlx::Result<i64> {
    sqlx::query_scalar!(
        r#"SELECT (SELECT count(*) FROM threads WHERE installation_id = $1)
                + (SELECT count(*) FROM thread_messages WHERE installation_id = $1)
                + (SELECT count(*) FROM turns WHERE installation_id = $1)
                + (SELECT count(*) FROM channel_kinds WHERE installation_id = $1)
                + (SELECT count(*) FROM channel_policies WHERE installation_id = $1)
                + (SELECT count(*) FROM event_receipts WHERE installation_id = $1) AS "n!""#,
        installation_id
    )
    .fetch_one(pool)
    .await
}

/// The crossing ts and reconsideration of a crossed answer (the first found), if any.
pub async fn any_crossed_answer(
    pool: &sqlx::PgPool,
) -> sqlx::Result<Option<(String, Option<String>)>> {
    let r = sqlx::query!("SELECT crossing_ts, reconsideration FROM crossed_answers")
        .fetch_optional(pool)
        .await?;
    Ok(r.map(|r| (r.crossing_ts, r.reconsideration)))
}

/// A crossed answer as [`insert_crossed_answer`] writes it.
#[derive(Debug, Clone)]
pub struct CrossedAnswerRow<'a> {
    pub intent_id: uuid::Uuid,
    pub installation_id: uuid::Uuid,
    pub channel_id: &'a str,
    pub root_ts: &'a str,
    pub reply_ts: &'a str,
    pub crossing_ts: &'a str,
    pub detected_by: &'a str,
    /// With a reconsideration, the answer was reconsidered now.
    pub reconsideration: Option<&'a str>,
}

/// Inserts a crossed answer, reconsidered now when it has a reconsideration.
pub async fn insert_crossed_answer(
    pool: &sqlx::PgPool,
    c: &CrossedAnswerRow<'_>,
) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO crossed_answers (intent_id, installation_id, channel_id, root_ts, reply_ts, crossing_ts, detected_by,
                                      reconsidered_at, reconsideration)
         VALUES ($1, $2, $3, $4, $5, $6, $7, CASE WHEN $8::text IS NOT NULL THEN now() END, $8)",
        c.intent_id,
        c.installation_id,
        c.channel_id,
        c.root_ts,
        c.reply_ts,
        c.crossing_ts,
        c.detected_by,
        c.reconsideration
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// The reconsideration of the answer `reply_ts` crossed by `crossing_ts` in `channel_id`: `None` when not recorded, `Some(None)` when not reconsidered.
pub async fn crossed_answer_reconsideration(
    pool: &sqlx::PgPool,
    channel_id: &str,
    reply_ts: &str,
    crossing_ts: &str,
) -> sqlx::Result<Option<Option<String>>> {
    sqlx::query_scalar!(
        "SELECT reconsideration FROM crossed_answers
          WHERE channel_id = $1 AND reply_ts = $2 AND crossing_ts = $3",
        channel_id,
        reply_ts,
        crossing_ts
    )
    .fetch_optional(pool)
    .await
}

/// How many crossed answers wait for their reconsideration.
pub async fn count_unreconsidered_crossed_answers(pool: &sqlx::PgPool) -> sqlx::Result<i64> {
    sqlx::query_scalar!(
        r#"SELECT count(*) AS "n!" FROM crossed_answers WHERE reconsidered_at IS NULL"#
    )
    .fetch_one(pool)
    .await
}

/// How many contexts receipt `receipt` has recorded (one at most: a later
/// build replaces the earlier).
pub async fn context_count(pool: &sqlx::PgPool, receipt: uuid::Uuid) -> sqlx::Result<i64> {
    sqlx::query_scalar!(
        r#"SELECT count(*) AS "n!" FROM contexts WHERE receipt_id = $1"#,
        receipt
    )
    .fetch_one(pool)
    .await
}

/// The version of the thread rooted at `root_ts` (`None`: not in the store).
pub async fn version_of(pool: &sqlx::PgPool, root_ts: &str) -> sqlx::Result<Option<i64>> {
    sqlx::query_scalar!("SELECT version FROM threads WHERE root_ts = $1", root_ts)
        .fetch_optional(pool)
        .await
}

/// How many answers were recorded as crossed in flight.
pub async fn count_crossed_answers(pool: &sqlx::PgPool) -> sqlx::Result<i64> {
    sqlx::query_scalar!(r#"SELECT count(*) AS "n!" FROM crossed_answers"#)
        .fetch_one(pool)
        .await
}

/// The later request of its burst that absorbed the request at `ts` of
/// `channel` (double texting), if one did.
pub async fn absorbed_by(pool: &sqlx::PgPool, channel: &str, ts: &str) -> Option<String> {
    sqlx::query_scalar!(
        "SELECT later_ts FROM double_texts WHERE channel_id = $1 AND ts = $2 AND outcome = 'absorbed'",
        channel,
        ts
    )
    .fetch_optional(pool)
    .await
    .ok()
    .flatten()
    .flatten()
}

/// Records request `ts` of `channel` as absorbed into the later request
/// `later` of its burst (double texting), as the context-builder would.
pub async fn insert_absorbed(
    pool: &sqlx::PgPool,
    installation: uuid::Uuid,
    channel: &str,
    ts: &str,
    later: &str,
) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO double_texts (installation_id, channel_id, ts, outcome, later_ts) VALUES ($1, $2, $3, 'absorbed', $4)",
        installation,
        channel,
        ts,
        later
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// The message kept for the action the doubled message `ts` repeats; for
/// a kept message the person deleted, the copy that stands in for it.
pub async fn kept_for(pool: &sqlx::PgPool, channel: &str, ts: &str) -> Option<String> {
    sqlx::query_scalar!(
        r#"SELECT coalesce((SELECT kept_ts FROM doubled_messages WHERE channel_id = $1 AND ts = $2),
                           (SELECT ts FROM person_actions WHERE channel_id = $1 AND stood_for = $2 LIMIT 1))
                  AS "kept""#,
        channel,
        ts
    )
    .fetch_one(pool)
    .await
    .ok()
    .flatten()
}

/// The root of the thread of message `ts`.
pub async fn root_of(pool: &sqlx::PgPool, channel: &str, ts: &str) -> Option<String> {
    sqlx::query_scalar!(
        "SELECT root_ts FROM thread_messages WHERE channel_id = $1 AND ts = $2",
        channel,
        ts
    )
    .fetch_optional(pool)
    .await
    .ok()
    .flatten()
}

/// The thread of the message `ts`, one line a message (ts, author,
/// speaker, deleted, turn, double-texting part, decisions): a diagnosis
/// of a burst's thread, identifiers only.
pub async fn thread_of(pool: &sqlx::PgPool, channel: &str, ts: &str) -> Vec<String> {
    sqlx::query_scalar!(
        r#"SELECT m.ts || ' ' || coalesce(m.user_id, '-') || ' ' || m.speaker
                  || CASE WHEN m.deleted THEN ' deleted' ELSE '' END
                  || coalesce(' turn ' || coalesce(t.answered_at::text, 'unanswered'), '')
                  || coalesce(' dt ' || d.outcome || coalesce('>' || d.later_ts, ''), '')
                  || coalesce((SELECT string_agg(' decision v' || x.thread_version || ' ' || x.status
                                                 || ':' || coalesce(x.status_reason, '-'), ',')
                                 FROM decisions x WHERE x.channel_id = m.channel_id AND x.source_ts = m.ts), '')
                  AS "line!"
             FROM thread_messages m
             LEFT JOIN turns t ON t.channel_id = m.channel_id AND t.ts = m.ts
             LEFT JOIN double_texts d ON d.channel_id = m.channel_id AND d.ts = m.ts
            WHERE m.channel_id = $1
              AND m.root_ts = (SELECT root_ts FROM thread_messages WHERE channel_id = $1 AND ts = $2)
            ORDER BY m.ts::numeric"#,
        channel,
        ts
    )
    .fetch_all(pool)
    .await
    .unwrap_or_default()
}

/// The person's action the message `ts` owns: `None` when it owns none,
/// else the deleted message it stands in for, if any (a copy Slack
/// delivered, shown in that message's place).
pub async fn action_owned(pool: &sqlx::PgPool, ts: &str) -> sqlx::Result<Option<Option<String>>> {
    Ok(
        sqlx::query!("SELECT stood_for FROM person_actions WHERE ts = $1", ts)
            .fetch_optional(pool)
            .await?
            .map(|r| r.stood_for),
    )
}

/// Inserts a fact of message `ts` in the caller's transaction (left open,
/// it holds the fact's key as a writer in flight does).
pub async fn insert_fact_in(
    conn: &mut sqlx::PgConnection,
    inst: uuid::Uuid,
    channel: &str,
    ts: &str,
    fact: &str,
) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO message_facts (installation_id, channel_id, ts, fact, fact_key) VALUES ($1, $2, $3, $4, '')",
        inst,
        channel,
        ts,
        fact
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// Holds the thread `root_ts`'s row locked (as another batch recording in
/// it would) until the transaction ends.
pub async fn hold_thread(
    pool: &sqlx::PgPool,
    root_ts: &str,
) -> sqlx::Result<sqlx::Transaction<'static, sqlx::Postgres>> {
    let mut tx = pool.begin().await?;
    sqlx::query!(
        r#"SELECT 1 AS "one!" FROM threads WHERE root_ts = $1 FOR UPDATE"#,
        root_ts
    )
    .fetch_one(&mut *tx)
    .await?;
    Ok(tx)
}
