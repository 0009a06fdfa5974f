//! Test fixtures and reads for the `intents` family (see `crate::intents`).

/// What every reply intent a test writes names: its identity, its decision and thread, and its body's hash.
#[derive(Debug, Clone)]
pub struct IntentFixture<'a> {
    pub id: uuid::Uuid,
    pub installation_id: uuid::Uuid,
    pub event_id: &'a str,
    pub action_kind: &'a str,
    pub receipt_id: uuid::Uuid,
    pub decision_id: uuid::Uuid,
    pub channel_id: &'a str,
    pub root_ts: &'a str,
    pub body_hash: &'a str,
}

/// How an intent a test writes stands, beyond its state (each field
/// unset leaves its column as a new intent has it).
#[derive(Debug, Clone, Default)]
pub struct Standing<'a> {
    pub attempts: i32,
    pub error_code: Option<&'a str>,
    pub slack_ts: Option<&'a str>,
    /// `sending_since` this many seconds ago.
    pub sending_secs_ago: Option<f64>,
    /// `next_attempt_at` this many seconds from now (else now).
    pub due_in_secs: Option<f64>,
    /// Once of unknown outcome (and `unknown_since` now when its state is
    /// `unknown`).
    pub ever_unknown: bool,
    /// Its body hash among the claimed ones, first sent now.
    pub hash_claimed: bool,
}

/// Inserts an intent in `state`, standing as `s` says.
pub async fn insert_intent<'e>(
    db: impl sqlx::PgExecutor<'e>,
    i: &IntentFixture<'_>,
    state: &str,
    s: &Standing<'_>,
) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO reply_intents (id, installation_id, event_id, action_kind, receipt_id, decision_id, channel_id, root_ts,
                                    body_hash, state, attempts, error_code, slack_ts, sending_since, next_attempt_at,
                                    ever_unknown, unknown_since, claimed_hashes, first_sending_since)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13,
                 now() - make_interval(secs => $14), now() + make_interval(secs => coalesce($15::float8, 0)),
                 $16, CASE WHEN $16 AND $10 = 'unknown' THEN now() END,
                 CASE WHEN $17 THEN ARRAY[$9] ELSE '{}' END, CASE WHEN $17 THEN now() END)",
        i.id,
        i.installation_id,
        i.event_id,
        i.action_kind,
        i.receipt_id,
        i.decision_id,
        i.channel_id,
        i.root_ts,
        i.body_hash,
        state,
        s.attempts,
        s.error_code,
        s.slack_ts,
        s.sending_secs_ago,
        s.due_in_secs,
        s.ever_unknown,
        s.hash_claimed
    )
    .execute(db)
    .await?;
    Ok(())
}

/// Inserts an intent `sending` since `sending_secs_ago` seconds, after `attempts` attempts (a worker that died mid-post).
pub async fn insert_sending_intent(
    pool: &sqlx::PgPool,
    i: &IntentFixture<'_>,
    attempts: i32,
    sending_secs_ago: f64,
) -> sqlx::Result<()> {
    let standing = Standing {
        attempts,
        sending_secs_ago: Some(sending_secs_ago),
        ..Standing::default()
    };
    insert_intent(pool, i, "sending", &standing).await
}

/// Inserts an intent `held` with `error_code`.
pub async fn insert_held_intent(
    pool: &sqlx::PgPool,
    i: &IntentFixture<'_>,
    error_code: &str,
) -> sqlx::Result<()> {
    let standing = Standing {
        error_code: Some(error_code),
        ..Standing::default()
    };
    insert_intent(pool, i, "held", &standing).await
}

/// Inserts an intent `sent` as the message `slack_ts`.
pub async fn insert_sent_intent(
    pool: &sqlx::PgPool,
    i: &IntentFixture<'_>,
    slack_ts: &str,
) -> sqlx::Result<()> {
    let standing = Standing {
        slack_ts: Some(slack_ts),
        ..Standing::default()
    };
    insert_intent(pool, i, "sent", &standing).await
}

/// Inserts a `pending` intent never tried, on `conn` (inside the caller's transaction when it has one).
pub async fn insert_pending_intent(
    conn: &mut sqlx::PgConnection,
    i: &IntentFixture<'_>,
) -> sqlx::Result<()> {
    insert_intent(conn, i, "pending", &Standing::default()).await
}

/// Inserts an intent `withdrawn` after `attempts` attempts, due again `due_in_secs` from now.
pub async fn insert_withdrawn_intent(
    pool: &sqlx::PgPool,
    i: &IntentFixture<'_>,
    attempts: i32,
    due_in_secs: f64,
) -> sqlx::Result<()> {
    let standing = Standing {
        attempts,
        due_in_secs: Some(due_in_secs),
        ..Standing::default()
    };
    insert_intent(pool, i, "withdrawn", &standing).await
}

/// Inserts a `pending` intent after `attempts` attempts, one of them of unknown outcome, its body hash claimed and its sending times now.
pub async fn insert_pending_intent_once_unknown(
    pool: &sqlx::PgPool,
    i: &IntentFixture<'_>,
    attempts: i32,
) -> sqlx::Result<()> {
    let standing = Standing {
        attempts,
        sending_secs_ago: Some(0.0),
        ever_unknown: true,
        hash_claimed: true,
        ..Standing::default()
    };
    insert_intent(pool, i, "pending", &standing).await
}

/// Inserts an intent `unknown` since now, after `attempts` attempts.
pub async fn insert_unknown_intent(
    pool: &sqlx::PgPool,
    i: &IntentFixture<'_>,
    attempts: i32,
) -> sqlx::Result<()> {
    let standing = Standing {
        attempts,
        ever_unknown: true,
        ..Standing::default()
    };
    insert_intent(pool, i, "unknown", &standing).await
}

/// An intent's state, whether it was reconciled, and its error code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IntentOutcome {
    pub state: String,
    pub reconciled: bool,
    pub error_code: Option<String>,
}

/// The outcome of one intent, whichever (for a database that holds one).
pub async fn one_intent_outcome(pool: &sqlx::PgPool) -> sqlx::Result<IntentOutcome> {
    sqlx::query_as!(
        IntentOutcome,
        "SELECT state, reconciled, error_code FROM reply_intents"
    )
    .fetch_one(pool)
    .await
}

/// The Slack ts of one intent, whichever (for a database that holds one).
pub async fn one_intent_slack_ts(pool: &sqlx::PgPool) -> sqlx::Result<Option<String>> {
    sqlx::query_scalar!("SELECT slack_ts FROM reply_intents")
        .fetch_one(pool)
        .await
}

/// An intent's state, whether it was reconciled, and whether its post was recorded late.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IntentLateRecord {
    pub state: String,
    pub reconciled: bool,
    pub late: bool,
}

/// The intent's state, whether it was reconciled and whether its post was recorded late.
pub async fn intent_late_record(
    pool: &sqlx::PgPool,
    id: uuid::Uuid,
) -> sqlx::Result<IntentLateRecord> {
    sqlx::query_as!(
        IntentLateRecord,
        r#"SELECT state, reconciled, late_recorded_at IS NOT NULL AS "late!" FROM reply_intents WHERE id = $1"#,
        id
    )
    .fetch_one(pool)
    .await
}

/// The intent's recorded post (Slack ts) and the ts of any further posts of it.
pub async fn intent_posts(
    pool: &sqlx::PgPool,
    id: uuid::Uuid,
) -> sqlx::Result<(Option<String>, Vec<String>)> {
    let r = sqlx::query!(
        "SELECT slack_ts, extra_ts FROM reply_intents WHERE id = $1",
        id
    )
    .fetch_one(pool)
    .await?;
    Ok((r.slack_ts, r.extra_ts))
}

/// The state and attempts of each intent of the event `event_id`.
pub async fn intent_states_by_event(
    pool: &sqlx::PgPool,
    event_id: &str,
) -> sqlx::Result<Vec<(String, i32)>> {
    let rows = sqlx::query!(
        "SELECT state, attempts FROM reply_intents WHERE event_id = $1",
        event_id
    )
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().map(|r| (r.state, r.attempts)).collect())
}

/// How many intents the event `event_id` has.
pub async fn count_intents_by_event(pool: &sqlx::PgPool, event_id: &str) -> sqlx::Result<i64> {
    sqlx::query_scalar!(
        r#"SELECT count(*) AS "count!" FROM reply_intents WHERE event_id = $1"#,
        event_id
    )
    .fetch_one(pool)
    .await
}

/// Sets the intent's `sending_since` to `secs_ago` seconds ago.
pub async fn set_sending_since(
    pool: &sqlx::PgPool,
    id: uuid::Uuid,
    secs_ago: f64,
) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE reply_intents SET sending_since = now() - make_interval(secs => $2) WHERE id = $1",
        id,
        secs_ago
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// The channels whose next post is allowed more than `secs` seconds from now.
pub async fn channels_paused_beyond(pool: &sqlx::PgPool, secs: f64) -> sqlx::Result<Vec<String>> {
    sqlx::query_scalar!(
        "SELECT channel_id FROM post_budgets WHERE next_allowed_at > now() + make_interval(secs => $1)",
        secs
    )
    .fetch_all(pool)
    .await
}

/// A `thread_reply` intent in `state` (channel C1, thread 1.1, error code `no_evidence_of_post`).
pub async fn insert_with_state(
    pool: &sqlx::PgPool,
    id: uuid::Uuid,
    installation_id: uuid::Uuid,
    event_id: &str,
    receipt_id: uuid::Uuid,
    decision_id: uuid::Uuid,
    state: &str,
) -> sqlx::Result<()> {
    let fixture = IntentFixture {
        id,
        installation_id,
        event_id,
        action_kind: "thread_reply",
        receipt_id,
        decision_id,
        channel_id: "C1",
        root_ts: "1.1",
        body_hash: "h",
    };
    let standing = Standing {
        error_code: Some("no_evidence_of_post"),
        ..Standing::default()
    };
    insert_intent(pool, &fixture, state, &standing).await
}

/// Intent `id`'s state and the ts of its post in Slack.
pub async fn state_and_slack_ts(
    pool: &sqlx::PgPool,
    id: uuid::Uuid,
) -> sqlx::Result<(String, Option<String>)> {
    sqlx::query!(
        "SELECT state, slack_ts FROM reply_intents WHERE id = $1",
        id
    )
    .fetch_one(pool)
    .await
    .map(|r| (r.state, r.slack_ts))
}

/// The state of receipt `receipt_id`'s intent and the thread version its decision was made at.
pub async fn state_and_decided_version_by_receipt(
    pool: &sqlx::PgPool,
    receipt_id: uuid::Uuid,
) -> sqlx::Result<(String, i64)> {
    sqlx::query!(
        "SELECT i.state, d.thread_version FROM reply_intents i JOIN decisions d ON d.id = i.decision_id WHERE i.receipt_id = $1",
        receipt_id
    )
    .fetch_one(pool)
    .await
    .map(|r| (r.state, r.thread_version))
}

/// The first intent's state and whether its outcome was reconciled from Slack.
pub async fn first_state_and_reconciled(pool: &sqlx::PgPool) -> sqlx::Result<(String, bool)> {
    sqlx::query!("SELECT state, reconciled FROM reply_intents")
        .fetch_one(pool)
        .await
        .map(|r| (r.state, r.reconciled))
}

/// The first intent's state and error code.
pub async fn first_state_and_error_code(
    pool: &sqlx::PgPool,
) -> sqlx::Result<(String, Option<String>)> {
    sqlx::query!("SELECT state, error_code FROM reply_intents")
        .fetch_one(pool)
        .await
        .map(|r| (r.state, r.error_code))
}

/// The state of the (first) intent for source event `event_id`.
pub async fn state_by_event(pool: &sqlx::PgPool, event_id: &str) -> sqlx::Result<String> {
    sqlx::query_scalar!(
        "SELECT state FROM reply_intents WHERE event_id = $1",
        event_id
    )
    .fetch_one(pool)
    .await
}

/// The source event id of the (first) intent in `state`.
pub async fn event_id_in_state(pool: &sqlx::PgPool, state: &str) -> sqlx::Result<String> {
    sqlx::query_scalar!("SELECT event_id FROM reply_intents WHERE state = $1", state)
        .fetch_one(pool)
        .await
}

/// A reply intent as the promise tests follow it.
#[derive(Debug, Clone)]
pub struct QuestionIntent {
    pub id: uuid::Uuid,
    pub state: String,
    pub reconciled: bool,
    pub slack_ts: Option<String>,
}

/// The first reply intent of the question `source_ts` (of its decision's event), if any.
pub async fn intent_of_question(
    pool: &sqlx::PgPool,
    source_ts: &str,
) -> sqlx::Result<Option<QuestionIntent>> {
    sqlx::query_as!(
        QuestionIntent,
        "SELECT i.id, i.state, i.reconciled, i.slack_ts FROM reply_intents i
           JOIN decisions d ON d.installation_id = i.installation_id AND d.event_id = i.event_id
          WHERE d.source_ts = $1 ORDER BY i.created_at LIMIT 1",
        source_ts
    )
    .fetch_optional(pool)
    .await
}

/// The state of a reply intent of the thread `root_ts` (the first found) and whether it was reconciled, if any.
pub async fn intent_state_of_thread(
    pool: &sqlx::PgPool,
    root_ts: &str,
) -> sqlx::Result<Option<(String, bool)>> {
    let r = sqlx::query!(
        "SELECT state, reconciled FROM reply_intents WHERE root_ts = $1",
        root_ts
    )
    .fetch_optional(pool)
    .await?;
    Ok(r.map(|r| (r.state, r.reconciled)))
}

/// The reply intents of `channel` (of its thread `root_ts` only, when
/// given) held for want of evidence (`no_evidence_of_post`): each one's
/// thread and when it was first claimed to be sent, in microseconds since
/// the Unix epoch (an intent never claimed has none).
pub async fn held_without_evidence(
    pool: &sqlx::PgPool,
    channel: &str,
    root_ts: Option<&str>,
) -> sqlx::Result<Vec<(String, Option<i64>)>> {
    let rows = sqlx::query!(
        r#"SELECT root_ts, (extract(epoch FROM first_sending_since) * 1000000)::bigint AS "claimed_at?"
             FROM reply_intents
            WHERE channel_id = $1 AND ($2::text IS NULL OR root_ts = $2) AND state = 'held'
              AND error_code = 'no_evidence_of_post'"#,
        channel,
        root_ts
    )
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| (r.root_ts, r.claimed_at))
        .collect())
}

/// One stage of an answered mention's way, over the mentions since a time.
#[derive(Debug, Clone)]
pub struct StageTiming {
    pub stage: String,
    /// Mentions measured.
    pub count: i64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

/// Where the time of each mention at or after `since` (Slack ts, seconds) that was answered went, by the ledger's clocks (the start of the transaction that wrote each row) and Slack's ts: p50 / p99 / max of each stage in ms, in order.
pub async fn stage_timings(pool: &sqlx::PgPool, since: f64) -> sqlx::Result<Vec<StageTiming>> {
    sqlx::query_as!(
        StageTiming,
        r#"
WITH m AS (
  SELECT to_timestamp(r.message_ts::float8) AS mention, r.received_at, c.captured_at,
         d.created_at AS claimed, i.created_at AS intent, i.first_sending_since AS sending,
         to_timestamp(i.slack_ts::float8) AS posted
    FROM reply_intents i
    JOIN decisions d ON d.id = i.decision_id
    JOIN event_receipts r ON r.id = d.receipt_id
    JOIN contexts c ON c.receipt_id = d.receipt_id
   WHERE i.state = 'sent' AND i.slack_ts IS NOT NULL AND r.message_ts::float8 >= $1),
s(stage, ord, ms) AS (
  SELECT 'mention → receipt insert began (slack-sim delivery)', 1, extract(epoch FROM received_at - mention) * 1000 FROM m
  UNION ALL SELECT '→ context captured (intake commit, relay, context-builder)', 2, extract(epoch FROM captured_at - received_at) * 1000 FROM m
  UNION ALL SELECT '→ decision claimed (inference)', 3, extract(epoch FROM claimed - captured_at) * 1000 FROM m
  UNION ALL SELECT '→ reply intent (model, proposal, publisher intake)', 4, extract(epoch FROM intent - claimed) * 1000 FROM m
  UNION ALL SELECT '→ claimed for sending', 5, extract(epoch FROM sending - intent) * 1000 FROM m
  UNION ALL SELECT '→ posted in Slack', 6, extract(epoch FROM posted - sending) * 1000 FROM m
  UNION ALL SELECT 'mention → posted in Slack (whole)', 7, extract(epoch FROM posted - mention) * 1000 FROM m)
SELECT stage AS "stage!", count(*)::bigint AS "count!",
       (percentile_cont(0.5) WITHIN GROUP (ORDER BY ms))::float8 AS "p50_ms!",
       (percentile_cont(0.99) WITHIN GROUP (ORDER BY ms))::float8 AS "p99_ms!",
       max(ms)::float8 AS "max_ms!"
  FROM s GROUP BY stage, ord ORDER BY ord"#,
        since
    )
    .fetch_all(pool)
    .await
}

/// How many reply intents are in `state`.
pub async fn count_in_state(pool: &sqlx::PgPool, state: &str) -> sqlx::Result<i64> {
    sqlx::query_scalar!(
        r#"SELECT count(*) AS "n!" FROM reply_intents WHERE state = $1"#,
        state
    )
    .fetch_one(pool)
    .await
}
