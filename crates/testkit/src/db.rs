//! One database per test, created from the admin connection, migrated with
//! the embedded migrator, and dropped when the test ends. Databases left by
//! killed test runs are dropped once they are a few hours old.

use std::time::{SystemTime, UNIX_EPOCH};

use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::{Connection, PgConnection};
use threadline_store::testing::server;

const PREFIX: &str = "tl_test_";
const STALE_AFTER_SECS: u64 = 6 * 3600;

/// Admin URL: `THREADLINE_TEST_ADMIN_URL`, else `DATABASE_URL` with its
/// database replaced by `postgres`, else the local default.
pub fn admin_url() -> String {
    if let Ok(u) = std::env::var("THREADLINE_TEST_ADMIN_URL") {
        return u;
    }
    let base = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| threadline_runtime::config::DEFAULT_DATABASE_URL.to_owned());
    with_database(&base, "postgres")
}

fn with_database(url: &str, db: &str) -> String {
    let (head, query) = match url.split_once('?') {
        Some((h, q)) => (h, Some(q)),
        None => (url, None),
    };
    let scheme_end = head.find("://").map(|i| i + 3).unwrap_or(0);
    let base = match head[scheme_end..].find('/') {
        Some(i) => &head[..scheme_end + i],
        None => head,
    };
    match query {
        Some(q) => format!("{base}/{db}?{q}"),
        None => format!("{base}/{db}"),
    }
}

pub struct TestDb {
    pub name: String,
    pub url: String,
    pub pool: PgPool,
}

impl TestDb {
    /// A fresh, migrated database.
    pub async fn new() -> Self {
        let db = Self::empty().await;
        threadline_runtime::db::migrate(&db.pool, &threadline_store::schema::MIGRATOR)
            .await
            .expect("migrating the test database");
        db
    }

    /// A fresh database with no schema (for testing `threadline migrate`).
    pub async fn empty() -> Self {
        let admin = admin_url();
        let mut conn = PgConnection::connect(&admin).await.unwrap_or_else(|e| {
            panic!("connecting to Postgres at {admin}: {e} (is it running? `make services`)")
        });
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        drop_stale(&mut conn, now).await;
        let name = format!(
            "{PREFIX}{now}_{}",
            &uuid::Uuid::new_v4().simple().to_string()[..10]
        );
        server::create_database(&mut conn, &name)
            .await
            .expect("creating the test database");
        let url = with_database(&admin, &name);
        let pool = PgPoolOptions::new()
            .max_connections(8)
            .connect(&url)
            .await
            .expect("connecting to the test database");
        Self { name, url, pool }
    }

    /// This database's URL logging in as `role` (a service's own role,
    /// `migrations/0029_service_roles.sql`), with the admin URL's password
    /// if it has one (a test cluster with password authentication gives the
    /// service roles the admin's password), else none (local trust).
    pub fn url_as(&self, role: &str) -> String {
        url_as(&self.url, role)
    }

    /// Makes the database refuse connections and cuts existing ones: from
    /// the application's point of view, Postgres is down.
    pub async fn take_down(&self) {
        self.set_connectable(false).await;
    }

    pub async fn bring_up(&self) {
        self.set_connectable(true).await;
    }

    async fn set_connectable(&self, allow: bool) {
        let mut conn = PgConnection::connect(&admin_url())
            .await
            .expect("admin connection");
        server::set_database_connectable(&mut conn, &self.name, allow)
            .await
            .expect("ALTER DATABASE");
        if !allow {
            server::terminate_connections(&mut conn, &self.name)
                .await
                .expect("terminating connections");
        }
    }
}

async fn drop_stale(conn: &mut PgConnection, now: u64) {
    let names = server::database_names_like(&mut *conn, "tl\\_test\\_%")
        .await
        .unwrap_or_default();
    for name in names {
        let created = name
            .strip_prefix(PREFIX)
            .and_then(|rest| rest.split('_').next())
            .and_then(|s| s.parse::<u64>().ok());
        if created.is_some_and(|t| t + STALE_AFTER_SECS < now) {
            let _ = server::drop_database(&mut *conn, &name).await;
        }
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        // THREADLINE_KEEP_TEST_DB=1 keeps it for diagnosis (a chaos soak's
        // violation is read from its tables); old ones go as above.
        if std::env::var("THREADLINE_KEEP_TEST_DB").is_ok_and(|v| v == "1") {
            eprintln!(
                "kept the test database {} (THREADLINE_KEEP_TEST_DB=1)",
                self.name
            );
            return;
        }
        // Drop the database from a separate thread with its own runtime: the
        // test's runtime may be shutting down.
        let name = self.name.clone();
        let pool = self.pool.clone();
        let _ = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async move {
                pool.close().await;
                if let Ok(mut conn) = PgConnection::connect(&admin_url()).await {
                    let _ = server::drop_database(&mut conn, &name).await;
                }
            });
        })
        .join();
    }
}

/// `url` logging in as `role`: the user swapped, the password kept.
fn url_as(url: &str, role: &str) -> String {
    let scheme_end = url.find("://").map(|i| i + 3).unwrap_or(0);
    let rest = &url[scheme_end..];
    let (userinfo, host) = match (rest.find('@'), rest.find('/')) {
        (Some(at), Some(slash)) if at < slash => (&rest[..at], &rest[at + 1..]),
        (Some(at), None) => (&rest[..at], &rest[at + 1..]),
        _ => ("", rest),
    };
    match userinfo.split_once(':') {
        Some((_, password)) => format!("{}{role}:{password}@{host}", &url[..scheme_end]),
        None => format!("{}{role}@{host}", &url[..scheme_end]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_role_logs_in_with_the_admin_urls_password_if_any() {
        assert_eq!(
            url_as(
                "postgres://postgres@127.0.0.1:5432/t1",
                "threadline_gateway"
            ),
            "postgres://threadline_gateway@127.0.0.1:5432/t1"
        );
        assert_eq!(
            url_as(
                "postgres://postgres:s%40cret@db:5432/t1?sslmode=disable",
                "r"
            ),
            "postgres://r:s%40cret@db:5432/t1?sslmode=disable"
        );
        assert_eq!(url_as("postgres://db/t1", "r"), "postgres://r@db/t1");
    }

    #[test]
    fn database_is_swapped_in_urls() {
        assert_eq!(
            with_database("postgres://u@h:5432/app", "postgres"),
            "postgres://u@h:5432/postgres"
        );
        assert_eq!(
            with_database("postgres://u@h:5432", "x"),
            "postgres://u@h:5432/x"
        );
        assert_eq!(
            with_database("postgres://u@h/app?sslmode=disable", "x"),
            "postgres://u@h/x?sslmode=disable"
        );
    }
}
