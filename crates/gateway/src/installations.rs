//! Resolving the installation an event belongs to, from the verified
//! envelope only, with a short cache so that intake does not ask Postgres on
//! every delivery.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::PgPool;
use threadline_domain::InstallationKey;

use threadline_domain::classify::BotIdentity;
pub use threadline_store::installations::{Resolved, lookup};

/// What the cache holds of one installation: how it resolved, its bot.
type Found = (Resolved, Option<Arc<BotIdentity>>);

pub struct Resolver {
    pool: PgPool,
    ttl: Duration,
    cache: Mutex<HashMap<InstallationKey, (Found, Instant)>>,
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
        Ok(self.resolve_with_bot(key).await?.0)
    }

    /// [`Self::resolve`], with the installation's bot (cached alike: a bot
    /// that changed on a reinstall is learnt within the cache's lifetime,
    /// and until then its messages only take the full path).
    pub async fn resolve_with_bot(&self, key: &InstallationKey) -> Result<Found, sqlx::Error> {
        if let Some(hit) = self.cached(key) {
            return Ok(hit);
        }
        let (resolved, bot) =
            threadline_store::installations::lookup_with_bot(&self.pool, key).await?;
        let bot = bot.map(Arc::new);
        if !self.ttl.is_zero() {
            let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
            if cache.len() >= MAX_CACHED {
                cache.clear();
            }
            cache.insert(key.clone(), ((resolved, bot.clone()), Instant::now()));
        }
        Ok((resolved, bot))
    }

    /// The active installation `key` resolved to, from the cache alone
    /// (`None` on a miss: Postgres is not asked).
    pub fn cached_active(&self, key: &InstallationKey) -> Option<uuid::Uuid> {
        match self.cached(key)?.0 {
            Resolved::Active(id) => Some(id),
            _ => None,
        }
    }

    fn cached(&self, key: &InstallationKey) -> Option<Found> {
        let cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        cache
            .get(key)
            .filter(|(_, at)| at.elapsed() < self.ttl)
            .map(|(found, _)| found.clone())
    }
}
