//! Durable intake with group commit.
//!
//! Each accepted delivery becomes a [`NewReceipt`] handed to a small pool of
//! writer tasks. A writer takes whatever deliveries are waiting (up to the
//! batch size) and, in one statement (so one transaction and one commit),
//! inserts their receipts with `ON CONFLICT (api_app_id, event_id) DO
//! NOTHING` and an outbox row for each receipt that was new — or, for a
//! delivery that did not parse, its raw body in `unparsed_events` and no
//! outbox row (nothing goes downstream until it is replayed), or, for the
//! bot's own new reply, the reply kept in the thread store and no outbox
//! row (`threadline_store::receipts::OwnReply`). Duplicates are
//! then counted on their receipts by a second statement. Only after both have
//! committed does each waiting request learn its outcome and answer Slack, so
//! a 2xx always follows the commit of its receipt and outbox row (invariant
//! 1) while one fsync serves many deliveries.

use crate::relay::Wake;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::{Mutex, mpsc, oneshot};
use tokio::task::JoinSet;
use uuid::Uuid;

pub use threadline_store::receipts::{NewReceipt, Unparsed};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The receipt and its outbox row (or, unparsed, its body) were
    /// committed by this delivery.
    New,
    /// Our own new reply's receipt was committed by this delivery, settled
    /// with it (`receipts::OwnReply`): no outbox row.
    Settled,
    /// The event already had a receipt; nothing new was created.
    Duplicate,
}

#[derive(Debug, thiserror::Error)]
pub enum IntakeError {
    /// Postgres is away, overloaded or restarting: another try may work.
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
    /// Postgres refused this delivery itself (a constraint, a value it
    /// cannot store): trying it again changes nothing.
    #[error("database refused the delivery: {0}")]
    Refused(String),
    #[error("intake is shutting down")]
    Closed,
    #[error("receipt was not committed in time")]
    Timeout,
}

struct Pending {
    receipt: NewReceipt,
    reply: oneshot::Sender<Result<Outcome, Arc<sqlx::Error>>>,
}

#[derive(Clone)]
pub struct Intake {
    tx: mpsc::Sender<Pending>,
    timeout: Duration,
}

/// How many times a batch is retried after a deadlock or serialization
/// failure before its deliveries get 503.
const MAX_BATCH_ATTEMPTS: usize = 3;

impl Intake {
    /// Starts `writers` writer tasks. They stop once every `Intake` clone is
    /// dropped and the queue is drained.
    /// `wake` wakes the outbox relays after each commit that wrote rows
    /// (the pool's inserts do not NOTIFY:
    /// `pool_waking_after_commit` in lib.rs).
    pub fn spawn(
        pool: PgPool,
        writers: usize,
        max_batch: usize,
        timeout: Duration,
        wake: Wake,
    ) -> (Self, JoinSet<()>) {
        let (tx, rx) = mpsc::channel::<Pending>(writers * max_batch * 2);
        let rx = Arc::new(Mutex::new(rx));
        let mut set = JoinSet::new();
        for _ in 0..writers {
            let (pool, rx, wake) = (pool.clone(), rx.clone(), wake.clone());
            set.spawn(async move {
                let mut batch = Vec::with_capacity(max_batch);
                loop {
                    let n = rx.lock().await.recv_many(&mut batch, max_batch).await;
                    if n == 0 {
                        break;
                    }
                    if commit_and_reply(&pool, std::mem::take(&mut batch)).await > 0 {
                        wake.wake();
                    }
                    batch.reserve(max_batch);
                }
            });
        }
        (Self { tx, timeout }, set)
    }

    /// Records one delivery durably; returns once it is committed.
    pub async fn submit(&self, receipt: NewReceipt) -> Result<Outcome, IntakeError> {
        let (reply, rx) = oneshot::channel();
        let work = async {
            self.tx
                .send(Pending { receipt, reply })
                .await
                .map_err(|_| IntakeError::Closed)?;
            match rx.await {
                Ok(Ok(outcome)) => Ok(outcome),
                Ok(Err(e)) if threadline_runtime::transient::sql_is_transient(&e) => {
                    Err(IntakeError::Db(clone_db_error(&e)))
                }
                Ok(Err(e)) => Err(IntakeError::Refused(e.to_string())),
                Err(_) => Err(IntakeError::Closed),
            }
        };
        tokio::time::timeout(self.timeout, work)
            .await
            .map_err(|_| IntakeError::Timeout)?
    }
}

fn clone_db_error(e: &sqlx::Error) -> sqlx::Error {
    sqlx::Error::Protocol(e.to_string())
}

/// Commits and answers a batch; returns how many receipts it created that
/// go downstream (what wakes the relays).
async fn commit_and_reply(pool: &PgPool, mut batch: Vec<Pending>) -> u64 {
    // A delivery whose request gave up waiting (answered 503, or spooled)
    // is not committed late: a later commit could overtake what another
    // replica spooled before it. Slack's retry or the drainer brings it.
    batch.retain(|p| !p.reply.is_closed());
    if batch.is_empty() {
        return 0;
    }
    let mut settle = batch.iter().any(|p| p.receipt.own_reply.is_some());
    match insert_with_retry(pool, &batch, &mut settle).await {
        Ok(outcomes) => reply(pool, batch, outcomes).await,
        // One delivery Postgres refuses must not fail the others with it:
        // commit them one by one, so only the bad one gets a 503.
        Err(e) if batch.len() > 1 && e.as_database_error().is_some() && !is_transient(&e) => {
            tracing::warn!(error = %e, deliveries = batch.len(), "intake batch refused; committing one by one");
            let mut new = 0;
            for p in batch {
                // (nor is one whose request gave up meanwhile)
                if p.reply.is_closed() {
                    continue;
                }
                let one = vec![p];
                let mut settle_one = settle && one[0].receipt.own_reply.is_some();
                match insert_with_retry(pool, &one, &mut settle_one).await {
                    Ok(outcomes) => new += reply(pool, one, outcomes).await,
                    Err(e) => fail(one, e),
                }
            }
            new
        }
        Err(e) => {
            fail(batch, e);
            0
        }
    }
}

/// Inserts the batch, trying again after a deadlock or serialization
/// failure. `settle`: our own replies are kept at intake; it turns false
/// (for the caller's later tries too) once that failed, by a lock wait past
/// its bound or a refusal Postgres would not give without it, and they go
/// downstream like any event: keeping them at intake is a saving, never a
/// reason to refuse a delivery.
async fn insert_with_retry(
    pool: &PgPool,
    batch: &[Pending],
    settle: &mut bool,
) -> Result<Vec<Outcome>, sqlx::Error> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        match insert_batch(pool, batch, *settle).await {
            // Once more, without keeping them (not an attempt of the
            // batch's own).
            Err(e)
                if *settle
                    && (threadline_store::receipts::is_lock_wait(&e)
                        || (e.as_database_error().is_some() && !is_transient(&e))) =>
            {
                let own = batch
                    .iter()
                    .filter(|p| p.receipt.own_reply.is_some())
                    .count();
                tracing::warn!(error = %e, own_replies = own, "keeping our own replies at intake failed; they go downstream");
                metrics::counter!("threadline_gateway_own_replies_sent_downstream_total")
                    .increment(own as u64);
                *settle = false;
                attempt -= 1;
            }
            Err(e) if attempt < MAX_BATCH_ATTEMPTS && is_transient(&e) => {
                tracing::warn!(error = %e, attempt, "intake batch retried");
            }
            other => return other,
        }
    }
}

/// Answers every delivery of a committed batch, after counting duplicates
/// on their receipts. The count is bookkeeping: if it cannot be written,
/// the deliveries are still answered from the committed outcome.
async fn reply(pool: &PgPool, batch: Vec<Pending>, outcomes: Vec<Outcome>) -> u64 {
    if let Err(e) = count_duplicates(pool, &batch, &outcomes).await {
        tracing::warn!(error = %e, "could not count duplicate deliveries");
    }
    let (mut new, mut dup, mut settled) = (0u64, 0u64, 0u64);
    for (p, outcome) in batch.into_iter().zip(outcomes) {
        match outcome {
            Outcome::New => new += 1,
            Outcome::Settled => settled += 1,
            Outcome::Duplicate => dup += 1,
        }
        let _ = p.reply.send(Ok(outcome));
    }
    // (what the context-builder counts of the events it ignores, for our
    // own replies it no longer sees)
    metrics::counter!("threadline_events_ignored_total", "reason" => threadline_store::receipts::OWN_REPLY)
        .increment(settled);
    metrics::counter!("threadline_gateway_receipts_total").increment(new + settled);
    metrics::counter!("threadline_gateway_duplicate_deliveries_total").increment(dup);
    metrics::histogram!("threadline_gateway_group_commit_size")
        .record((new + settled + dup) as f64);
    new
}

fn fail(batch: Vec<Pending>, e: sqlx::Error) {
    tracing::error!(error = %e, deliveries = batch.len(), "intake batch failed; answering 503");
    let e = Arc::new(e);
    for p in batch {
        let _ = p.reply.send(Err(e.clone()));
    }
}

fn is_transient(e: &sqlx::Error) -> bool {
    matches!(
        e.as_database_error().and_then(|d| d.code()).as_deref(),
        Some("40P01" | "40001")
    )
}

/// The positions of `batch` sorted by identity (then arrival).
fn sorted_order(batch: &[Pending]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..batch.len()).collect();
    order.sort_by(|&a, &b| {
        let (ra, rb) = (&batch[a].receipt, &batch[b].receipt);
        (&ra.api_app_id, &ra.event_id, a).cmp(&(&rb.api_app_id, &rb.event_id, b))
    });
    order
}

/// One statement for the whole batch: receipts and their outbox rows (or
/// unparsed bodies) commit together. Rows are sorted by identity so
/// concurrent batches (other writers, other replicas) lock in the same order
/// and cannot deadlock.
async fn insert_batch(
    pool: &PgPool,
    batch: &[Pending],
    settle: bool,
) -> Result<Vec<Outcome>, sqlx::Error> {
    // First delivery of each identity in the batch is the candidate; later
    // ones in the same batch are duplicates of it.
    let order = sorted_order(batch);
    let mut candidates: Vec<usize> = Vec::with_capacity(batch.len());
    for &i in &order {
        let r = &batch[i].receipt;
        let same = candidates.last().is_some_and(|&c| {
            let c = &batch[c].receipt;
            c.api_app_id == r.api_app_id && c.event_id == r.event_id
        });
        if !same {
            candidates.push(i);
        }
    }

    let rs: Vec<&NewReceipt> = candidates.iter().map(|&i| &batch[i].receipt).collect();
    let inserted = threadline_store::receipts::insert_batch(pool, &rs, settle).await?;

    let inserted: std::collections::HashSet<Uuid> = inserted.into_iter().collect();
    let mut outcomes = vec![Outcome::Duplicate; batch.len()];
    for &i in &candidates {
        let r = &batch[i].receipt;
        if inserted.contains(&r.id) {
            outcomes[i] = if settle && r.own_reply.is_some() {
                Outcome::Settled
            } else {
                Outcome::New
            };
        }
    }
    Ok(outcomes)
}

/// Adds each duplicate delivery to its receipt's count (sorted: the same
/// lock order as the inserts).
async fn count_duplicates(
    pool: &PgPool,
    batch: &[Pending],
    outcomes: &[Outcome],
) -> Result<(), sqlx::Error> {
    let order = sorted_order(batch);
    // Count every duplicate delivery on its receipt (sorted: same lock order).
    let mut dups: Vec<(&str, &str, i32)> = Vec::new();
    let mut index: HashMap<(&str, &str), usize> = HashMap::new();
    for &i in &order {
        if outcomes[i] == Outcome::Duplicate {
            let r = &batch[i].receipt;
            let key = (r.api_app_id.as_str(), r.event_id.as_str());
            match index.get(&key) {
                Some(&k) => dups[k].2 += 1,
                None => {
                    index.insert(key, dups.len());
                    dups.push((key.0, key.1, 1));
                }
            }
        }
    }
    if !dups.is_empty() {
        threadline_store::receipts::count_duplicates(pool, &dups).await?;
    }
    Ok(())
}
