//! How a writer whose inserts do not NOTIFY wakes the outbox relays once
//! its commit is done: the relay in this process directly, relays in other
//! processes by a NOTIFY of its own. Apart from the relay's module because
//! the public gateway, which does not relay, runs it too (its statement is
//! the gateway role's, as `scripts/check-grants.py` reads it).

use std::sync::Arc;

use sqlx::PgPool;
use threadline_store::outbox;
use tokio::sync::Notify;

/// How a writer whose inserts do not NOTIFY
/// (`pool_waking_after_commit` in lib.rs) wakes the relays
/// once its commit is done.
#[derive(Clone)]
pub enum Wake {
    /// The relay running in this process.
    Local(Arc<Notify>),
    /// Relays in other processes, by a task that sends a NOTIFY of its own.
    Remote(Arc<Notify>),
}

impl Wake {
    /// Wakes relays in other processes with a NOTIFY of its own, sent by a
    /// task of its own: a writer never waits for it, and wake-ups that come
    /// while one is on its way make one more, not one each.
    pub fn remote(pool: PgPool) -> Self {
        let asked = Arc::new(Notify::new());
        let waiting = asked.clone();
        tokio::spawn(async move {
            loop {
                waiting.notified().await;
                if let Err(e) = outbox::wake(&pool).await {
                    // The relays' sweep finds the rows all the same.
                    tracing::debug!(error = %e, "waking the outbox relays failed");
                }
            }
        });
        Wake::Remote(asked)
    }

    pub fn wake(&self) {
        match self {
            Wake::Local(n) | Wake::Remote(n) => n.notify_one(),
        }
    }
}
