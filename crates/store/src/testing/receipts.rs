//! Test fixtures and reads for the `receipts` family (see `crate::receipts`).

/// A receipt of an event in a thread as a test writes it; its times are seconds from now (negative: ago).
#[derive(Debug, Clone, Default)]
pub struct ReceiptFixture<'a> {
    pub id: uuid::Uuid,
    pub installation_id: uuid::Uuid,
    pub api_app_id: &'a str,
    pub event_id: &'a str,
    pub event_type: &'a str,
    pub channel_id: &'a str,
    pub message_ts: Option<&'a str>,
    pub thread_ts: &'a str,
    pub state: &'a str,
    pub event_time_in: f64,
    pub received_in: f64,
    pub updated_in: f64,
}

/// Inserts a receipt of an event in a thread.
pub async fn insert_receipt(pool: &sqlx::PgPool, r: &ReceiptFixture<'_>) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO event_receipts (id, installation_id, api_app_id, event_id, event_type, channel_id, message_ts,
                                     thread_ts, state, event_time, received_at, updated_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, now() + make_interval(secs => $10),
                 now() + make_interval(secs => $11), now() + make_interval(secs => $12))",
        r.id,
        r.installation_id,
        r.api_app_id,
        r.event_id,
        r.event_type,
        r.channel_id,
        r.message_ts,
        r.thread_ts,
        r.state,
        r.event_time_in,
        r.received_in,
        r.updated_in
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Sets a receipt's state and, when given, the reason for it (else the reason is left as it is).
pub async fn set_receipt_state(
    pool: &sqlx::PgPool,
    id: uuid::Uuid,
    state: &str,
    reason: Option<&str>,
) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE event_receipts SET state = $2, state_reason = coalesce($3, state_reason) WHERE id = $1",
        id,
        state,
        reason
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// The message ts of one receipt of `event_type`, whichever (for a database that holds one).
pub async fn one_message_ts_of_type(
    pool: &sqlx::PgPool,
    event_type: &str,
) -> sqlx::Result<Option<String>> {
    sqlx::query_scalar!(
        "SELECT message_ts FROM event_receipts WHERE event_type = $1",
        event_type
    )
    .fetch_one(pool)
    .await
}

/// A parsed receipt as a test writes it directly (as the gateway would, without its outbox row).
#[derive(Debug, Clone)]
pub struct NewAcceptedReceipt<'a> {
    pub id: uuid::Uuid,
    pub installation_id: uuid::Uuid,
    pub api_app_id: &'a str,
    pub event_id: &'a str,
    pub event_type: &'a str,
    pub channel_id: &'a str,
    pub message_ts: &'a str,
}

/// Inserts an `accepted` receipt whose event happened now.
pub async fn insert_accepted_receipt(
    pool: &sqlx::PgPool,
    r: &NewAcceptedReceipt<'_>,
) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO event_receipts (id, installation_id, api_app_id, event_id, event_type, channel_id, message_ts, event_time)
         VALUES ($1, $2, $3, $4, $5, $6, $7, now())",
        r.id,
        r.installation_id,
        r.api_app_id,
        r.event_id,
        r.event_type,
        r.channel_id,
        r.message_ts
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// The receipt's state and its reason.
pub async fn receipt_state(
    pool: &sqlx::PgPool,
    id: uuid::Uuid,
) -> sqlx::Result<(String, Option<String>)> {
    let r = sqlx::query!(
        "SELECT state, state_reason FROM event_receipts WHERE id = $1",
        id
    )
    .fetch_one(pool)
    .await?;
    Ok((r.state, r.state_reason))
}

/// The receipt's channel.
pub async fn receipt_channel(pool: &sqlx::PgPool, id: uuid::Uuid) -> sqlx::Result<Option<String>> {
    sqlx::query_scalar!("SELECT channel_id FROM event_receipts WHERE id = $1", id)
        .fetch_one(pool)
        .await
}

/// How many receipts exist.
pub async fn count_receipts(pool: &sqlx::PgPool) -> sqlx::Result<i64> {
    sqlx::query_scalar!(r#"SELECT count(*) AS "n!" FROM event_receipts"#)
        .fetch_one(pool)
        .await
}

/// The duplicate deliveries counted over all receipts (an error when there is no receipt).
pub async fn duplicate_deliveries_total(pool: &sqlx::PgPool) -> sqlx::Result<i64> {
    sqlx::query_scalar!(r#"SELECT sum(duplicate_deliveries)::bigint AS "n!" FROM event_receipts"#)
        .fetch_one(pool)
        .await
}

/// Every receipt's event id and subtype.
pub async fn event_subtypes(pool: &sqlx::PgPool) -> sqlx::Result<Vec<(String, Option<String>)>> {
    let rows = sqlx::query!("SELECT event_id, event_subtype FROM event_receipts")
        .fetch_all(pool)
        .await?;
    Ok(rows
        .into_iter()
        .map(|r| (r.event_id, r.event_subtype))
        .collect())
}

/// The retry headers stored with the receipt of `event_id`.
pub async fn retry_headers(
    pool: &sqlx::PgPool,
    event_id: &str,
) -> sqlx::Result<(i32, Option<String>)> {
    let r = sqlx::query!(
        "SELECT retry_num, retry_reason FROM event_receipts WHERE event_id = $1",
        event_id
    )
    .fetch_one(pool)
    .await?;
    Ok((r.retry_num, r.retry_reason))
}

/// A receipt's intake outcome: state, parse error, installation and duplicate deliveries.
#[derive(Debug, Clone)]
pub struct Intake {
    pub state: String,
    pub parse_error: Option<String>,
    pub installation_id: Option<uuid::Uuid>,
    pub duplicate_deliveries: i32,
}

/// The intake outcome of the receipt of `event_id`.
pub async fn intake_by_event(pool: &sqlx::PgPool, event_id: &str) -> sqlx::Result<Intake> {
    sqlx::query_as!(
        Intake,
        "SELECT state, parse_error, installation_id, duplicate_deliveries FROM event_receipts WHERE event_id = $1",
        event_id
    )
    .fetch_one(pool)
    .await
}

/// What a receipt says of its parsed event (its event time in whole seconds since the epoch).
#[derive(Debug, Clone)]
pub struct ParsedEvent {
    pub state: String,
    pub installation_id: Option<uuid::Uuid>,
    pub event_type: String,
    pub channel_id: Option<String>,
    pub thread_ts: Option<String>,
    pub event_time_secs: Option<i64>,
}

/// What the receipt of `event_id` says of its parsed event.
pub async fn parsed_event_by_event(
    pool: &sqlx::PgPool,
    event_id: &str,
) -> sqlx::Result<ParsedEvent> {
    sqlx::query_as!(
        ParsedEvent,
        r#"SELECT state, installation_id, event_type, channel_id, thread_ts,
                  extract(epoch FROM event_time)::bigint AS event_time_secs
             FROM event_receipts WHERE event_id = $1"#,
        event_id
    )
    .fetch_one(pool)
    .await
}

/// What the receipt `id` says of its parsed event.
pub async fn parsed_event(pool: &sqlx::PgPool, id: uuid::Uuid) -> sqlx::Result<ParsedEvent> {
    sqlx::query_as!(
        ParsedEvent,
        r#"SELECT state, installation_id, event_type, channel_id, thread_ts,
                  extract(epoch FROM event_time)::bigint AS event_time_secs
             FROM event_receipts WHERE id = $1"#,
        id
    )
    .fetch_one(pool)
    .await
}

/// The id of the receipt of `event_id`.
pub async fn receipt_id_by_event(pool: &sqlx::PgPool, event_id: &str) -> sqlx::Result<uuid::Uuid> {
    sqlx::query_scalar!(
        "SELECT id FROM event_receipts WHERE event_id = $1",
        event_id
    )
    .fetch_one(pool)
    .await
}

/// Every receipt's parse error, by event id.
pub async fn parse_errors(pool: &sqlx::PgPool) -> sqlx::Result<Vec<Option<String>>> {
    sqlx::query_scalar!("SELECT parse_error FROM event_receipts ORDER BY event_id")
        .fetch_all(pool)
        .await
}

/// How many unparsed bodies are held.
pub async fn count_unparsed_events(pool: &sqlx::PgPool) -> sqlx::Result<i64> {
    sqlx::query_scalar!(r#"SELECT count(*) AS "n!" FROM unparsed_events"#)
        .fetch_one(pool)
        .await
}

/// How many unparsed bodies are held for the receipt of `event_id`.
pub async fn count_unparsed_events_of(pool: &sqlx::PgPool, event_id: &str) -> sqlx::Result<i64> {
    sqlx::query_scalar!(
        r#"SELECT count(*) AS "n!" FROM unparsed_events
            WHERE receipt_id IN (SELECT id FROM event_receipts WHERE event_id = $1)"#,
        event_id
    )
    .fetch_one(pool)
    .await
}

/// The body held for the unparsed receipt of `event_id`.
pub async fn unparsed_body(pool: &sqlx::PgPool, event_id: &str) -> sqlx::Result<Vec<u8>> {
    sqlx::query_scalar!(
        "SELECT u.body FROM unparsed_events u JOIN event_receipts r ON r.id = u.receipt_id WHERE r.event_id = $1",
        event_id
    )
    .fetch_one(pool)
    .await
}

/// The event ids of the `unparsed` receipts that hold a body, in order.
pub async fn held_unparsed_event_ids(pool: &sqlx::PgPool) -> sqlx::Result<Vec<String>> {
    sqlx::query_scalar!(
        "SELECT r.event_id FROM event_receipts r JOIN unparsed_events u ON u.receipt_id = r.id
          WHERE r.state = 'unparsed' ORDER BY r.event_id"
    )
    .fetch_all(pool)
    .await
}

/// An unparsed receipt and its body as an older gateway held them.
#[derive(Debug, Clone)]
pub struct NewUnparsedReceipt<'a> {
    pub id: uuid::Uuid,
    pub installation_id: Option<uuid::Uuid>,
    pub api_app_id: &'a str,
    pub event_id: &'a str,
    pub team_id: &'a str,
    pub event_type: &'a str,
    pub parse_error: &'a str,
    pub retry_num: i32,
    pub body: &'a [u8],
}

/// Inserts an `unparsed` receipt with its held body, in one statement.
pub async fn insert_unparsed_receipt(
    pool: &sqlx::PgPool,
    r: &NewUnparsedReceipt<'_>,
) -> sqlx::Result<()> {
    sqlx::query!(
        "WITH r AS (INSERT INTO event_receipts (id, installation_id, api_app_id, event_id, team_id, event_type,
                                                state, parse_error, retry_num)
                    VALUES ($1, $2, $3, $4, $5, $6, 'unparsed', $7, $8))
         INSERT INTO unparsed_events (receipt_id, body) VALUES ($1, $9)",
        r.id,
        r.installation_id,
        r.api_app_id,
        r.event_id,
        r.team_id,
        r.event_type,
        r.parse_error,
        r.retry_num,
        r.body
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Every receipt's event id and installation, by event id.
pub async fn event_installations(
    pool: &sqlx::PgPool,
) -> sqlx::Result<Vec<(String, Option<uuid::Uuid>)>> {
    let rows =
        sqlx::query!("SELECT event_id, installation_id FROM event_receipts ORDER BY event_id")
            .fetch_all(pool)
            .await?;
    Ok(rows
        .into_iter()
        .map(|r| (r.event_id, r.installation_id))
        .collect())
}

/// An `app_mention` delivery held as `unparsed` since `ago`, with its body.
#[derive(Debug, Clone)]
pub struct HeldSince<'a> {
    pub id: uuid::Uuid,
    pub installation_id: uuid::Uuid,
    pub api_app_id: &'a str,
    pub event_id: &'a str,
    pub team_id: &'a str,
    pub parse_error: &'a str,
    pub body: &'a [u8],
    pub ago: std::time::Duration,
}

/// Inserts an unparsed receipt and its body, both received `h.ago` before now.
pub async fn insert_unparsed(pool: &sqlx::PgPool, h: &HeldSince<'_>) -> sqlx::Result<()> {
    let ago = sqlx::postgres::types::PgInterval::try_from(h.ago).map_err(sqlx::Error::Encode)?;
    sqlx::query!(
        "WITH r AS (INSERT INTO event_receipts (id, installation_id, api_app_id, event_id, team_id, event_type,
                                                state, parse_error, received_at)
                    VALUES ($1, $2, $3, $4, $5, 'app_mention', 'unparsed', $6, now() - $8::interval))
         INSERT INTO unparsed_events (receipt_id, body, received_at) VALUES ($1, $7, now() - $8::interval)",
        h.id,
        h.installation_id,
        h.api_app_id,
        h.event_id,
        h.team_id,
        h.parse_error,
        h.body,
        ago
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// The event ids of the receipts whose unparsed body is still held.
pub async fn unparsed_event_ids(pool: &sqlx::PgPool) -> sqlx::Result<Vec<String>> {
    sqlx::query_scalar!(
        "SELECT r.event_id FROM unparsed_events u JOIN event_receipts r ON r.id = u.receipt_id"
    )
    .fetch_all(pool)
    .await
}

/// Every receipt's state and the reason for it.
pub async fn states_and_reasons(
    pool: &sqlx::PgPool,
) -> sqlx::Result<Vec<(String, Option<String>)>> {
    let rows = sqlx::query!("SELECT state, state_reason FROM event_receipts")
        .fetch_all(pool)
        .await?;
    Ok(rows
        .into_iter()
        .map(|r| (r.state, r.state_reason))
        .collect())
}

/// The reason of the (first) processed receipt of subtype `subtype`, none while none is processed.
pub async fn processed_reason_by_subtype(
    pool: &sqlx::PgPool,
    subtype: &str,
) -> sqlx::Result<Option<Option<String>>> {
    sqlx::query_scalar!(
        "SELECT state_reason FROM event_receipts
          WHERE event_subtype = $1 AND state NOT IN ('accepted', 'processing')",
        subtype
    )
    .fetch_optional(pool)
    .await
}

/// A `message` receipt of app A1 in `state`, last updated `ago` before now.
pub async fn insert_updated_ago(
    pool: &sqlx::PgPool,
    id: uuid::Uuid,
    installation_id: uuid::Uuid,
    event_id: &str,
    state: &str,
    ago: std::time::Duration,
) -> sqlx::Result<()> {
    let ago = sqlx::postgres::types::PgInterval::try_from(ago).map_err(sqlx::Error::Encode)?;
    sqlx::query!(
        "INSERT INTO event_receipts (id, installation_id, api_app_id, event_id, event_type, event_time, state, updated_at)
         VALUES ($1, $2, 'A1', $3, 'message', now(), $4, now() - $5::interval)",
        id,
        installation_id,
        event_id,
        state,
        ago
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Every receipt's event id, sorted.
pub async fn event_ids(pool: &sqlx::PgPool) -> sqlx::Result<Vec<String>> {
    sqlx::query_scalar!("SELECT event_id FROM event_receipts ORDER BY event_id")
        .fetch_all(pool)
        .await
}

/// Every receipt's event id, in the order the receipts were made (their
/// ids are UUIDv7, made when the delivery is recorded).
pub async fn event_ids_in_order(pool: &sqlx::PgPool) -> sqlx::Result<Vec<String>> {
    sqlx::query_scalar!("SELECT event_id FROM event_receipts ORDER BY id")
        .fetch_all(pool)
        .await
}

/// The installations of the receipts whose event id is `LIKE pattern` (each must have one).
pub async fn installation_ids_by_event_like(
    pool: &sqlx::PgPool,
    pattern: &str,
) -> sqlx::Result<Vec<uuid::Uuid>> {
    sqlx::query_scalar!(
        r#"SELECT installation_id AS "installation_id!" FROM event_receipts WHERE event_id LIKE $1"#,
        pattern
    )
    .fetch_all(pool)
    .await
}

/// How many receipts there are, and how many of them are still open (`accepted`, `processing`).
pub async fn count_all_and_open(pool: &sqlx::PgPool) -> sqlx::Result<(i64, i64)> {
    sqlx::query!(
        r#"SELECT count(*) AS "all!", count(*) FILTER (WHERE state IN ('accepted', 'processing')) AS "open!"
             FROM event_receipts"#
    )
    .fetch_one(pool)
    .await
    .map(|r| (r.all, r.open))
}

/// The reasons of installation `installation_id`'s ignored `message` receipts, oldest first.
pub async fn ignored_message_reasons(
    pool: &sqlx::PgPool,
    installation_id: uuid::Uuid,
) -> sqlx::Result<Vec<Option<String>>> {
    sqlx::query_scalar!(
        "SELECT state_reason FROM event_receipts WHERE installation_id = $1 AND event_type = 'message' AND state = 'ignored' ORDER BY received_at",
        installation_id
    )
    .fetch_all(pool)
    .await
}

/// What one thread root left behind: its receipts, their duplicate deliveries, its decisions and intents.
#[derive(Debug, Clone)]
pub struct RootLedger {
    pub receipts: i64,
    pub duplicates: i64,
    pub decisions: i64,
    pub intents: i64,
}

/// The receipts (and duplicates) of message `root_ts`, and the decisions and intents of its thread.
pub async fn ledger_by_root(pool: &sqlx::PgPool, root_ts: &str) -> sqlx::Result<RootLedger> {
    sqlx::query_as!(
        RootLedger,
        r#"SELECT (SELECT count(*) FROM event_receipts WHERE message_ts = $1) AS "receipts!",
                  (SELECT coalesce(sum(duplicate_deliveries), 0)::bigint FROM event_receipts WHERE message_ts = $1) AS "duplicates!",
                  (SELECT count(*) FROM decisions WHERE root_ts = $1) AS "decisions!",
                  (SELECT count(*) FROM reply_intents WHERE root_ts = $1) AS "intents!""#,
        root_ts
    )
    .fetch_one(pool)
    .await
}

/// How many receipts are of the message `message_ts`.
pub async fn count_receipts_of_message(pool: &sqlx::PgPool, message_ts: &str) -> sqlx::Result<i64> {
    sqlx::query_scalar!(
        r#"SELECT count(*) AS "n!" FROM event_receipts WHERE message_ts = $1"#,
        message_ts
    )
    .fetch_one(pool)
    .await
}

/// How many receipts are still open (`accepted` or `processing`).
pub async fn count_open_receipts(pool: &sqlx::PgPool) -> sqlx::Result<i64> {
    sqlx::query_scalar!(
        r#"SELECT count(*) AS "n!" FROM event_receipts WHERE state IN ('accepted', 'processing')"#
    )
    .fetch_one(pool)
    .await
}

/// How many receipts are of events of the type `event_type`.
pub async fn count_receipts_of_type(pool: &sqlx::PgPool, event_type: &str) -> sqlx::Result<i64> {
    sqlx::query_scalar!(
        r#"SELECT count(*) AS "n!" FROM event_receipts WHERE event_type = $1"#,
        event_type
    )
    .fetch_one(pool)
    .await
}

/// The state and reason of a receipt of the message `message_ts` (the first found), if any.
pub async fn receipt_state_of_message(
    pool: &sqlx::PgPool,
    message_ts: &str,
) -> sqlx::Result<Option<(String, Option<String>)>> {
    let r = sqlx::query!(
        "SELECT state, state_reason FROM event_receipts WHERE message_ts = $1",
        message_ts
    )
    .fetch_optional(pool)
    .await?;
    Ok(r.map(|r| (r.state, r.state_reason)))
}

/// What a receipt of an event counts of its deliveries.
#[derive(Debug, Clone)]
pub struct DeliveryCounts {
    /// Receipts of the event (one, unless the dedupe failed).
    pub receipts: i64,
    pub duplicate_deliveries: i32,
    pub retry_num: i32,
}

/// The delivery counts of a receipt of the event `event_id` (the first found).
pub async fn delivery_counts_of_event(
    pool: &sqlx::PgPool,
    event_id: &str,
) -> sqlx::Result<DeliveryCounts> {
    sqlx::query_as!(
        DeliveryCounts,
        r#"SELECT count(*) OVER () AS "receipts!", duplicate_deliveries, retry_num
             FROM event_receipts WHERE event_id = $1"#,
        event_id
    )
    .fetch_one(pool)
    .await
}

/// How many receipts the message `message_ts` has, and the duplicate deliveries they counted.
pub async fn receipt_and_duplicate_counts(
    pool: &sqlx::PgPool,
    message_ts: &str,
) -> sqlx::Result<(i64, i64)> {
    let r = sqlx::query!(
        r#"SELECT count(*) AS "receipts!", coalesce(sum(duplicate_deliveries), 0)::bigint AS "duplicates!"
             FROM event_receipts WHERE message_ts = $1"#,
        message_ts
    )
    .fetch_one(pool)
    .await?;
    Ok((r.receipts, r.duplicates))
}

/// Where a receipt's event ended.
#[derive(Debug, Clone)]
pub struct ReceiptOutcome {
    pub event_id: String,
    pub state: String,
    pub thread_ts: Option<String>,
}

/// Every receipt's event id, state and thread.
pub async fn receipt_outcomes(pool: &sqlx::PgPool) -> sqlx::Result<Vec<ReceiptOutcome>> {
    sqlx::query_as!(
        ReceiptOutcome,
        "SELECT event_id, state, thread_ts FROM event_receipts"
    )
    .fetch_all(pool)
    .await
}

/// What the tables hold about the message `ts` in `channel_id` (receipts, turn, decisions, intents), one line each.
pub async fn message_records(
    pool: &sqlx::PgPool,
    channel_id: &str,
    ts: &str,
) -> sqlx::Result<Vec<String>> {
    sqlx::query_scalar!(
        r#"SELECT 'receipt ' || r.event_type || '/' || coalesce(r.event_subtype, '') || ' ' || r.state || ':' || coalesce(r.state_reason, '-') AS "record!"
             FROM event_receipts r WHERE r.channel_id = $1 AND r.message_ts = $2
           UNION ALL
           SELECT 'turn ' || coalesce(t.answered_at::text, 'unanswered') FROM turns t WHERE t.channel_id = $1 AND t.ts = $2
           UNION ALL
           SELECT 'decision v' || d.thread_version || ' ' || d.status || ':' || coalesce(d.status_reason, '-') || ' ' || d.created_at::text
             FROM decisions d WHERE d.channel_id = $1 AND d.source_ts = $2
           UNION ALL
           SELECT 'intent ' || i.state || ':' || coalesce(i.error_code, '-') || ' attempts ' || i.attempts
             FROM reply_intents i JOIN decisions d ON d.id = i.decision_id WHERE d.channel_id = $1 AND d.source_ts = $2"#,
        channel_id,
        ts
    )
    .fetch_all(pool)
    .await
}

/// What is still in flight, by kind (nothing when all are zero).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenWork {
    /// Receipts `accepted` or `processing`.
    pub receipts: i64,
    /// Outbox rows not yet published.
    pub outbox: i64,
    /// Decisions not final, unless waiting on a reply held for an operator.
    pub decisions: i64,
    /// Reply intents not settled.
    pub intents: i64,
    /// Crossed answers awaiting reconsideration.
    pub crossed: i64,
}

/// The work still in flight across the pipeline's tables.
pub async fn open_work(pool: &sqlx::PgPool) -> sqlx::Result<OpenWork> {
    sqlx::query_as!(
        OpenWork,
        r#"SELECT (SELECT count(*) FROM event_receipts WHERE state IN ('accepted', 'processing')) AS "receipts!",
                  (SELECT count(*) FROM outbox) AS "outbox!",
                  (SELECT count(*) FROM decisions d WHERE d.status IN ('calling', 'proposed', 'approved')
                      -- waiting on a reply held for an operator is settled as far as it goes
                      AND NOT EXISTS (SELECT 1 FROM reply_intents i
                                       WHERE i.installation_id = d.installation_id AND i.event_id = d.event_id
                                         AND i.state = 'held')) AS "decisions!",
                  (SELECT count(*) FROM reply_intents
                    WHERE state IN ('pending', 'sending', 'unknown', 'reconciling', 'failed_retryable', 'streaming')) AS "intents!",
                  (SELECT count(*) FROM crossed_answers WHERE reconsidered_at IS NULL) AS "crossed!""#
    )
    .fetch_one(pool)
    .await
}

/// Acknowledged work not finished, in all: open receipts, outbox rows, decisions calling or proposed, intents pending or sending.
pub async fn in_flight_total(pool: &sqlx::PgPool) -> sqlx::Result<i64> {
    sqlx::query_scalar!(
        r#"SELECT (SELECT count(*) FROM event_receipts WHERE state IN ('accepted', 'processing'))
                + (SELECT count(*) FROM outbox)
                + (SELECT count(*) FROM decisions WHERE status IN ('calling', 'proposed'))
                + (SELECT count(*) FROM reply_intents WHERE state IN ('pending', 'sending')) AS "n!""#
    )
    .fetch_one(pool)
    .await
}

/// How many receipts were finished with `reason`.
pub async fn count_with_reason(pool: &sqlx::PgPool, reason: &str) -> sqlx::Result<i64> {
    sqlx::query_scalar!(
        r#"SELECT count(*) AS "n!" FROM event_receipts WHERE state_reason = $1"#,
        reason
    )
    .fetch_one(pool)
    .await
}

/// How many receipts event `event_id` has (one at most, by the unique key).
pub async fn count_receipts_of(pool: &sqlx::PgPool, event_id: &str) -> sqlx::Result<i64> {
    sqlx::query_scalar!(
        r#"SELECT count(*) AS "n!" FROM event_receipts WHERE event_id = $1"#,
        event_id
    )
    .fetch_one(pool)
    .await
}

/// Locks the receipts in `conn`'s transaction until it ends: whatever
/// records a delivery meanwhile waits in its insert.
pub async fn lock_receipts(conn: &mut sqlx::PgConnection) -> sqlx::Result<()> {
    sqlx::query!("LOCK TABLE event_receipts IN ACCESS EXCLUSIVE MODE")
        .execute(conn)
        .await?;
    Ok(())
}

/// Sessions of this database waiting for a lock now.
pub async fn lock_waits(pool: &sqlx::PgPool) -> sqlx::Result<i64> {
    sqlx::query_scalar!(
        r#"SELECT count(*) AS "n!" FROM pg_stat_activity
            WHERE datname = current_database() AND wait_event_type = 'Lock'"#
    )
    .fetch_one(pool)
    .await
}

/// The receipts of the message at `message_ts` (its `app_mention` and
/// `message` events): how many, how many are still open, and when the last
/// of them was last updated (seconds since the epoch; 0 without any).
pub async fn message_receipts(
    pool: &sqlx::PgPool,
    message_ts: &str,
) -> sqlx::Result<(i64, i64, f64)> {
    sqlx::query!(
        r#"SELECT count(*) AS "all!", count(*) FILTER (WHERE state IN ('accepted', 'processing')) AS "open!",
                  coalesce(extract(epoch FROM max(updated_at)), 0)::float8 AS "updated!"
             FROM event_receipts WHERE message_ts = $1"#,
        message_ts
    )
    .fetch_one(pool)
    .await
    .map(|r| (r.all, r.open, r.updated))
}
