//! Resolving the installation an event belongs to, from the verified
//! envelope only, with a short cache so that intake does not ask Postgres on
//! every delivery.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sqlx::PgPool;
use threadline_domain::InstallationKey;

pub use threadline_store::installations::{Resolved, lookup};

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
