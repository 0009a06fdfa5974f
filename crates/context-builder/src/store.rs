//! The thread store as the context-builder uses it: `threadline_store`'s
//! statements (threads, channels), with the channel's audit pseudonym
//! under this process's key.

use sqlx::PgConnection;
use threadline_domain::state::ReceiptState;
use threadline_runtime::audit;
pub use threadline_store::channels::{channel_kind, learn_channel_kind};
pub use threadline_store::threads::*;
use uuid::Uuid;

/// Ends a receipt: `processing → done | ignored(reason)`, compare-and-set,
/// with its audit record written by the same statement. `at` is the
/// installation and channel the event named.
pub async fn finish(
    conn: &mut PgConnection,
    receipt: Uuid,
    state: ReceiptState,
    reason: Option<&str>,
    at: (Uuid, &str),
) -> sqlx::Result<bool> {
    let pseudonym = audit::channel_ref(at.0, at.1);
    threadline_store::threads::finish(
        conn,
        receipt,
        state,
        reason,
        (at.0, at.1, pseudonym.as_deref()),
    )
    .await
}

/// Counts a failure of the context-builder on this receipt that was not
/// transient; at the worker's limit the receipt is failed.
pub async fn note_failure(pool: &sqlx::PgPool, receipt: Uuid) -> sqlx::Result<Option<i32>> {
    threadline_store::threads::note_failure(
        pool,
        receipt,
        threadline_runtime::worker::FAILURE_LIMIT as i32,
    )
    .await
}
