//! The service roles of `migrations/0029_service_roles.sql`, seen from the
//! tests: a statement tried as a role, and which tables no service role
//! holds any right on.

/// The roles the services log in as.
pub const SERVICE_ROLES: [&str; 4] = [
    "threadline_gateway",
    "threadline_context_builder",
    "threadline_inference",
    "threadline_publisher",
];

/// Runs `statement` on `pool` (a role's connection) in a transaction that
/// is rolled back: what the role may do, without changing anything. The
/// statements are the probes of a test, written out (they are meant to be
/// refused, so they cannot be checked at build time as a service's are).
pub async fn attempt(pool: &sqlx::PgPool, statement: &str) -> sqlx::Result<()> {
    let mut tx = pool.begin().await?;
    sqlx::raw_sql(statement).execute(&mut *tx).await?;
    tx.rollback().await
}

/// The tables and views of the `public` schema (but sqlx's own) on which
/// no service role holds any privilege, on the table or on a column.
pub async fn tables_no_service_may_touch(pool: &sqlx::PgPool) -> sqlx::Result<Vec<String>> {
    sqlx::query_scalar!(
        r#"SELECT c.relname AS "name!" FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
            WHERE n.nspname = 'public' AND c.relkind IN ('r', 'v') AND c.relname <> '_sqlx_migrations'
              AND NOT EXISTS (
                  SELECT 1 FROM unnest($1::text[]) r(role)
                   WHERE has_table_privilege(r.role, c.oid, 'SELECT, INSERT, UPDATE, DELETE')
                      OR has_any_column_privilege(r.role, c.oid, 'SELECT, INSERT, UPDATE'))
            ORDER BY 1"#,
        &SERVICE_ROLES.map(String::from)
    )
    .fetch_all(pool)
    .await
}
