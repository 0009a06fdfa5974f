//! Reads of the server itself rather than of a table: scratch databases, sessions, locks, and pg_stat_statements for the benches.

/// How many sessions of the current database wait for a lock.
pub async fn sessions_waiting_for_a_lock(pool: &sqlx::PgPool) -> sqlx::Result<i64> {
    sqlx::query_scalar!(
        r#"SELECT count(*) AS "count!" FROM pg_stat_activity
            WHERE datname = current_database() AND wait_event_type = 'Lock'"#
    )
    .fetch_one(pool)
    .await
}

/// Terminates every other session of the current database (a failover, as its clients see it).
pub async fn terminate_other_sessions(pool: &sqlx::PgPool) -> sqlx::Result<()> {
    sqlx::query!(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
          WHERE datname = current_database() AND pid <> pg_backend_pid()"
    )
    .fetch_all(pool)
    .await?;
    Ok(())
}

/// How many sessions of the current database sit idle inside a transaction.
pub async fn idle_in_transaction_sessions(pool: &sqlx::PgPool) -> sqlx::Result<i64> {
    sqlx::query_scalar!(
        r#"SELECT count(*) AS "n!" FROM pg_stat_activity
            WHERE datname = current_database() AND state LIKE 'idle in transaction%'"#
    )
    .fetch_one(pool)
    .await
}

/// Creates the empty database `name`.
pub async fn create_database(conn: &mut sqlx::PgConnection, name: &str) -> sqlx::Result<()> {
    // A database's name is an identifier, which no statement takes as a
    // parameter: this DDL can only be written out, so it is not checked.
    sqlx::raw_sql(&format!("CREATE DATABASE \"{name}\""))
        .execute(conn)
        .await?;
    Ok(())
}

/// Drops the database `name` if it exists, cutting its connections.
pub async fn drop_database(conn: &mut sqlx::PgConnection, name: &str) -> sqlx::Result<()> {
    // A database's name is an identifier, which no statement takes as a
    // parameter: this DDL can only be written out, so it is not checked.
    sqlx::raw_sql(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
        .execute(conn)
        .await?;
    Ok(())
}

/// Makes the database `name` accept new connections or refuse them.
pub async fn set_database_connectable(
    conn: &mut sqlx::PgConnection,
    name: &str,
    allow: bool,
) -> sqlx::Result<()> {
    // A database's name is an identifier, which no statement takes as a
    // parameter: this DDL can only be written out, so it is not checked.
    sqlx::raw_sql(&format!(
        "ALTER DATABASE \"{name}\" ALLOW_CONNECTIONS {allow}"
    ))
    .execute(conn)
    .await?;
    Ok(())
}

/// Ends every session of the database `name` but this one.
pub async fn terminate_connections(conn: &mut sqlx::PgConnection, name: &str) -> sqlx::Result<()> {
    sqlx::query!(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()",
        name
    )
    .fetch_all(conn)
    .await?;
    Ok(())
}

/// The names of the databases that match the `LIKE` pattern `pattern`.
pub async fn database_names_like(
    conn: &mut sqlx::PgConnection,
    pattern: &str,
) -> sqlx::Result<Vec<String>> {
    sqlx::query_scalar!(
        "SELECT datname FROM pg_database WHERE datname LIKE $1",
        pattern
    )
    .fetch_all(conn)
    .await
}

/// The definition of the constraint `name`, as Postgres renders it.
pub async fn constraint_definition(pool: &sqlx::PgPool, name: &str) -> sqlx::Result<String> {
    sqlx::query_scalar!(
        r#"SELECT pg_get_constraintdef(oid) AS "def!" FROM pg_constraint WHERE conname = $1"#,
        name
    )
    .fetch_one(pool)
    .await
}

/// Creates the `pg_stat_statements` extension in this database if it is not there (it counts only where the server preloads it).
pub async fn create_pg_stat_statements(pool: &sqlx::PgPool) -> sqlx::Result<()> {
    sqlx::query!("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .execute(pool)
        .await?;
    Ok(())
}

/// Gathers the planner's statistics of every table of this database, as
/// autovacuum does within a minute or so of a table's first writes.
pub async fn analyze(pool: &sqlx::PgPool) -> sqlx::Result<()> {
    sqlx::query!("ANALYZE").execute(pool).await?;
    Ok(())
}

/// Resets the counts of `pg_stat_statements`.
pub async fn reset_pg_stat_statements(pool: &sqlx::PgPool) -> sqlx::Result<()> {
    sqlx::query!("SELECT pg_stat_statements_reset()")
        .fetch_one(pool)
        .await?;
    Ok(())
}

/// Calls of top-level statements in this database so far (`pg_stat_statements`); `None` when it has none.
pub async fn statement_calls(pool: &sqlx::PgPool) -> sqlx::Result<Option<i64>> {
    sqlx::query_scalar!(
        r#"SELECT sum(calls)::bigint AS "calls?" FROM pg_stat_statements
            WHERE toplevel AND dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"#
    )
    .fetch_one(pool)
    .await
}

/// Transactions committed in this database so far (`pg_stat_database`).
pub async fn commit_count(pool: &sqlx::PgPool) -> sqlx::Result<i64> {
    sqlx::query_scalar!(
        r#"SELECT xact_commit AS "xact_commit!" FROM pg_stat_database WHERE datname = current_database()"#
    )
    .fetch_one(pool)
    .await
}

/// Rows inserted, updated or deleted so far in each table of this database (`pg_stat_user_tables`).
pub async fn table_write_counts(pool: &sqlx::PgPool) -> sqlx::Result<Vec<(String, i64)>> {
    let rows = sqlx::query!(
        r#"SELECT relname::text AS "table!", (n_tup_ins + n_tup_upd + n_tup_del)::bigint AS "writes!"
             FROM pg_stat_user_tables"#
    )
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().map(|r| (r.table, r.writes)).collect())
}

/// WAL the whole server has written so far, in bytes (`pg_stat_wal`).
pub async fn wal_bytes(pool: &sqlx::PgPool) -> sqlx::Result<i64> {
    sqlx::query_scalar!(r#"SELECT wal_bytes::bigint AS "bytes!" FROM pg_stat_wal"#)
        .fetch_one(pool)
        .await
}

/// A statement as `pg_stat_statements` counts it.
#[derive(Debug, Clone)]
pub struct StatementCalls {
    pub calls: i64,
    pub total_exec_ms: f64,
    /// The first 110 characters, whitespace collapsed.
    pub text: String,
}

/// The 40 top-level statements of this database called most (`pg_stat_statements`).
pub async fn top_statements(pool: &sqlx::PgPool) -> sqlx::Result<Vec<StatementCalls>> {
    sqlx::query_as!(
        StatementCalls,
        r#"SELECT calls AS "calls!", total_exec_time AS "total_exec_ms!",
                  regexp_replace(left(query, 110), '\s+', ' ', 'g') AS "text!"
             FROM pg_stat_statements
            WHERE toplevel AND dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
            ORDER BY calls DESC LIMIT 40"#
    )
    .fetch_all(pool)
    .await
}

/// Audit records so far by stage and outcome, most first: where the audit
/// log's rows per answered mention come from.
pub async fn audit_records_by_step(pool: &sqlx::PgPool) -> sqlx::Result<Vec<(String, i64)>> {
    let rows = sqlx::query!(
        r#"SELECT stage || ':' || outcome AS "step!", count(*) AS "n!"
             FROM audit_log GROUP BY stage, outcome ORDER BY 2 DESC"#
    )
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().map(|r| (r.step, r.n)).collect())
}
