//! The service roles of `migrations/0029_service_roles.sql`, seen from the
//! tests: a statement tried as a role, and which tables no service role
//! holds any right on.

/// The roles the services log in as.
pub const SERVICE_ROLES: [&str; 5] = [
    "threadline_gateway",
    "threadline_relay",
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

/// Everything the service roles hold, one line each, sorted: their
/// attributes and the roles they are members of (cluster-wide), and every
/// privilege granted to one of them in this database: on the database,
/// the schema, each table, view and sequence, each column granted on its
/// own, and each function. What PUBLIC holds is not listed.
pub async fn privileges(pool: &sqlx::PgPool) -> sqlx::Result<Vec<String>> {
    sqlx::query_scalar!(
        r#"WITH r AS (SELECT oid, rolname FROM pg_roles WHERE rolname = ANY($1::text[]))
        SELECT format('role %s: login=%s superuser=%s createrole=%s createdb=%s bypassrls=%s replication=%s inherit=%s',
                      r.rolname, a.rolcanlogin, a.rolsuper, a.rolcreaterole, a.rolcreatedb, a.rolbypassrls,
                      a.rolreplication, a.rolinherit) AS "line!"
          FROM r JOIN pg_roles a ON a.oid = r.oid
        UNION ALL
        SELECT format('role %s: member of %s', r.rolname, g.rolname)
          FROM r JOIN pg_auth_members m ON m.member = r.oid JOIN pg_roles g ON g.oid = m.roleid
        UNION ALL
        SELECT format('database: %s %s', r.rolname, x.privilege_type)
          FROM pg_database d, aclexplode(d.datacl) x JOIN r ON r.oid = x.grantee
         WHERE d.datname = current_database()
        UNION ALL
        SELECT format('schema %s: %s %s', n.nspname, r.rolname, x.privilege_type)
          FROM pg_namespace n, aclexplode(n.nspacl) x JOIN r ON r.oid = x.grantee
        UNION ALL
        SELECT format('%s %s: %s %s', CASE c.relkind WHEN 'S' THEN 'sequence' WHEN 'v' THEN 'view' ELSE 'table' END,
                      c.relname, r.rolname, x.privilege_type)
          FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace, aclexplode(c.relacl) x JOIN r ON r.oid = x.grantee
         WHERE n.nspname = 'public'
        UNION ALL
        SELECT format('column %s.%s: %s %s', c.relname, t.attname, r.rolname, x.privilege_type)
          FROM pg_attribute t JOIN pg_class c ON c.oid = t.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace,
               aclexplode(t.attacl) x JOIN r ON r.oid = x.grantee
         WHERE n.nspname = 'public' AND NOT t.attisdropped
        UNION ALL
        SELECT format('function %s: %s %s', p.oid::regprocedure, r.rolname, x.privilege_type)
          FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace, aclexplode(p.proacl) x JOIN r ON r.oid = x.grantee
         WHERE n.nspname = 'public'
        ORDER BY 1"#,
        &SERVICE_ROLES.map(String::from)
    )
    .fetch_all(pool)
    .await
}
