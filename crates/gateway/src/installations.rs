//! Resolving the installation an event belongs to, from the verified
//! envelope only, with a short cache so that intake does not ask Postgres on
//! every delivery.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sqlx::PgPool;
use threadline_domain::InstallationKey;
use uuid::Uuid;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolved {
    Active(Uuid),
    Disabled(Uuid),
    Unknown,
}

pub struct Resolver {
    pool: PgPool,
    ttl: Duration,
    cache: Mutex<HashMap<InstallationKey, (Resolved, Instant)>>,
}

/// Bound on cached keys, so unknown teams cannot grow memory without limit.
const MAX_CACHED: usize = 10_000;

impl Resolver {
    pub fn new(pool: PgPool, ttl: Duration) -> Self {
        Self {
            pool,
            ttl,
            cache: Mutex::new(HashMap::new()),
        }
    }

    pub async fn resolve(&self, key: &InstallationKey) -> Result<Resolved, sqlx::Error> {
        if let Some(hit) = self.cached(key) {
            return Ok(hit);
        }
        let resolved = lookup(&self.pool, key).await?;
        if !self.ttl.is_zero() {
            let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
            if cache.len() >= MAX_CACHED {
                cache.clear();
            }
            cache.insert(key.clone(), (resolved, Instant::now()));
        }
        Ok(resolved)
    }

    fn cached(&self, key: &InstallationKey) -> Option<Resolved> {
        let cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        cache
            .get(key)
            .filter(|(_, at)| at.elapsed() < self.ttl)
            .map(|(r, _)| *r)
    }
}

/// A workspace install matches on (app, team); an org-wide install on
/// (app, enterprise). A workspace install wins when both exist.
pub async fn lookup(pool: &PgPool, key: &InstallationKey) -> Result<Resolved, sqlx::Error> {
    let team = if key.is_enterprise_install {
        None
    } else {
        key.team_id.as_ref().map(|t| t.as_str())
    };
    let row: Option<(Uuid, String)> = sqlx::query_as(
        "SELECT id, status FROM installations
          WHERE app_id = $1
            AND ((NOT is_enterprise_install AND team_id = $2)
              OR (is_enterprise_install AND enterprise_id = $3))
          ORDER BY is_enterprise_install
          LIMIT 1",
    )
    .bind(key.app_id.as_str())
    .bind(team)
    .bind(key.enterprise_id.as_ref().map(|e| e.as_str()))
    .fetch_optional(pool)
    .await?;
    Ok(match row {
        None => Resolved::Unknown,
        Some((id, status)) if status == "active" => Resolved::Active(id),
        Some((id, _)) => Resolved::Disabled(id),
    })
}
