//! Test fixtures and reads for the `outbox` family (see `crate::outbox`).

/// Every outbox row's topic and message id, in insertion order.
pub async fn topics_and_msg_ids(pool: &sqlx::PgPool) -> sqlx::Result<Vec<(String, String)>> {
    let rows = sqlx::query!("SELECT topic, msg_id FROM outbox ORDER BY id")
        .fetch_all(pool)
        .await?;
    Ok(rows.into_iter().map(|r| (r.topic, r.msg_id)).collect())
}

/// The message ids of the outbox rows for `topic`.
pub async fn msg_ids_of_topic(pool: &sqlx::PgPool, topic: &str) -> sqlx::Result<Vec<String>> {
    sqlx::query_scalar!("SELECT msg_id FROM outbox WHERE topic = $1", topic)
        .fetch_all(pool)
        .await
}

/// How many outbox rows are pending.
pub async fn count_outbox(pool: &sqlx::PgPool) -> sqlx::Result<i64> {
    sqlx::query_scalar!(r#"SELECT count(*) AS "n!" FROM outbox"#)
        .fetch_one(pool)
        .await
}

/// Outbox rows ever written: still pending plus published (the ledger's totals).
pub async fn outbox_total(pool: &sqlx::PgPool) -> sqlx::Result<i64> {
    sqlx::query_scalar!(
        r#"SELECT (SELECT count(*) FROM outbox)
                + (SELECT coalesce(sum(published_total), 0) FROM outbox_ledger)::bigint AS "n!""#
    )
    .fetch_one(pool)
    .await
}

/// How many pending outbox rows wait for a later try.
pub async fn count_deferred_outbox(pool: &sqlx::PgPool) -> sqlx::Result<i64> {
    sqlx::query_scalar!(r#"SELECT count(*) AS "n!" FROM outbox WHERE next_attempt_at > now()"#)
        .fetch_one(pool)
        .await
}

/// The failed outbox rows: how many, and their attempts summed (an error when there is none).
pub async fn failed_outbox(pool: &sqlx::PgPool) -> sqlx::Result<(i64, i64)> {
    let r = sqlx::query!(
        r#"SELECT count(*) AS "n!", sum(attempts)::bigint AS "attempts!" FROM outbox WHERE last_error IS NOT NULL"#
    )
    .fetch_one(pool)
    .await?;
    Ok((r.n, r.attempts))
}

/// How many outbox rows have made `attempts` tries and last failed with `last_error`.
pub async fn count_failed_with(
    pool: &sqlx::PgPool,
    attempts: i32,
    last_error: &str,
) -> sqlx::Result<i64> {
    sqlx::query_scalar!(
        r#"SELECT count(*) AS "n!" FROM outbox WHERE attempts = $1 AND last_error = $2"#,
        attempts,
        last_error
    )
    .fetch_one(pool)
    .await
}

/// Makes every outbox row due now (its retry delay or lease has passed).
pub async fn make_outbox_due(pool: &sqlx::PgPool) -> sqlx::Result<()> {
    sqlx::query!("UPDATE outbox SET next_attempt_at = now()")
        .execute(pool)
        .await?;
    Ok(())
}

/// Queues every receipt's event again under its dedupe id, with a one-byte payload (a publish repeated after a crash).
pub async fn requeue_every_receipt(pool: &sqlx::PgPool) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO outbox (installation_id, receipt_id, topic, msg_id, payload)
         SELECT installation_id, id, 'events', 'evt:' || api_app_id || ':' || event_id, '\\x00'::bytea
           FROM event_receipts"
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// The payload of the first outbox row the database returns (the only one, in a test that queued one).
pub async fn outbox_payload(pool: &sqlx::PgPool) -> sqlx::Result<Vec<u8>> {
    sqlx::query_scalar!("SELECT payload FROM outbox")
        .fetch_one(pool)
        .await
}

/// Locks every outbox row without waiting (an error when another session holds one); returns their ids.
pub async fn lock_outbox_nowait(pool: &sqlx::PgPool) -> sqlx::Result<Vec<i64>> {
    sqlx::query_scalar!("SELECT id FROM outbox FOR UPDATE NOWAIT")
        .fetch_all(pool)
        .await
}

/// The ledger's count of rows published on `topic`.
pub async fn published_total(pool: &sqlx::PgPool, topic: &str) -> sqlx::Result<i64> {
    sqlx::query_scalar!(
        "SELECT published_total FROM outbox_ledger WHERE topic = $1",
        topic
    )
    .fetch_one(pool)
    .await
}
