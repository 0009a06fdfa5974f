//! What a batched statement's caller gets instead of its answer
//! ([`crate::batch`]), and how [`crate::transient`] tells whether to retry.

use std::sync::Arc;

/// Why a batched statement did not answer.
#[derive(Debug, thiserror::Error)]
pub enum BatchError {
    /// The statement failed (for a whole batch, the same error is every
    /// item's: shared, with the database error as its source).
    #[error("batched statement failed")]
    Failed(#[source] Shared),
    /// The batcher has stopped: transient for the caller (its message is
    /// retried, never dead-lettered for it).
    #[error("the statement batcher has stopped")]
    Closed,
    /// The statement panicked on this item, run alone: a defect, not
    /// transient.
    #[error("the batched statement panicked")]
    Panicked,
}

/// A database error shared by every item of the batch it failed.
#[derive(Debug, Clone)]
pub struct Shared(pub Arc<sqlx::Error>);

impl std::fmt::Display for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for Shared {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.0)
    }
}
