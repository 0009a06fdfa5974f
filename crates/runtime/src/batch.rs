//! Group commit for a worker's statements: the handlers of one worker run
//! concurrently, each on its own message, and each hands the statement it
//! needs (claim this decision, settle that one) to a [`Batcher`]; the
//! batcher runs whatever is waiting, up to a batch, as **one** statement
//! (arrays with `UNNEST`: one round trip, one transaction, one commit) and
//! answers each handler with its own row. A handler acknowledges its
//! message only after its answer came back, so only after the commit that
//! made its effect durable.
//!
//! Batching at the statement rather than at the message keeps everything
//! else per message: a message waits for nobody else's model call or Slack
//! read, the order of work inside a thread stays as the handlers make it,
//! and a message's span and failure stay its own. Nothing waits to fill a
//! batch: with one handler waiting, its statement runs at once; batches
//! form when statements arrive while the previous batch is in flight,
//! which is exactly when amortising the round trip and the commit pays.
//! Where a batch is a transaction of several statements (the
//! context-builder's applies), its items also share its lock waits: such a
//! batch bounds them with a lock timeout, and losing to it reruns the items
//! one by one.
//!
//! One bad item must not fail the others: a batch refused for a reason that
//! is not transient (a constraint, data the statement cannot take), or
//! that lost to a concurrent transaction (a deadlock, a lock timeout), is
//! run again item by item, so each handler gets its own outcome. Any other
//! transient failure (the database is down) is every waiting handler's,
//! and each sees it as such ([`crate::transient::is_transient`] finds the database
//! error through [`BatchError`]'s source).

use std::future::Future;
use std::sync::Arc;

use futures::FutureExt as _;
use tokio::sync::{Mutex, mpsc, oneshot};

/// Connections a service keeps for its batched statements (a pool of
/// their own, [`crate::db::generic_plan_pool`]), taken from its
/// `THREADLINE_DB_MAX_CONNECTIONS` so that the documented budget holds.
pub const CONNECTIONS: u32 = 2;

/// `cfg` with its pool size less the batched statements' [`CONNECTIONS`].
pub fn share_connections(cfg: &crate::config::CommonConfig) -> crate::config::CommonConfig {
    let mut cfg = cfg.clone();
    cfg.db_max_connections = cfg.db_max_connections.saturating_sub(CONNECTIONS).max(1);
    cfg
}

pub use crate::batch_error::{BatchError, Shared};

type Reply<O> = oneshot::Sender<Result<O, BatchError>>;

/// The queue a runner takes its items from (shared by all runners, or its
/// own when keyed).
type Queue<I, O> = Arc<Mutex<mpsc::Receiver<(I, Reply<O>)>>>;

/// Which runner an item goes to ([`Batcher::spawn_keyed`]).
type Key<I> = Arc<dyn Fn(&I) -> u64 + Send + Sync>;

/// Runs one statement for many waiting callers.
pub struct Batcher<I, O> {
    /// One queue all runners take from, or one per runner (keyed).
    tx: Vec<mpsc::Sender<(I, Reply<O>)>>,
    key: Option<Key<I>>,
}

impl<I, O> Clone for Batcher<I, O> {
    fn clone(&self) -> Self {
        Self {
            tx: self.tx.clone(),
            key: self.key.clone(),
        }
    }
}

impl<I: Clone + Send + 'static, O: Send + 'static> Batcher<I, O> {
    /// Starts `runners` tasks, each taking up to `max_batch` waiting items
    /// at a time and running `statement` on them. `statement` must answer
    /// each item, in order. The tasks stop once every clone is dropped.
    /// `name` labels the batch-size histogram.
    pub fn spawn<F, Fut>(name: &'static str, runners: usize, max_batch: usize, statement: F) -> Self
    where
        F: Fn(Vec<I>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = (Vec<I>, sqlx::Result<Vec<O>>)> + Send,
    {
        let max_batch = max_batch.max(1);
        let (tx, rx) = mpsc::channel::<(I, Reply<O>)>(runners.max(1) * max_batch * 2);
        let rx = Arc::new(Mutex::new(rx));
        let statement = Arc::new(statement);
        for _ in 0..runners.max(1) {
            spawn_runner(name, max_batch, rx.clone(), statement.clone());
        }
        Self {
            tx: vec![tx],
            key: None,
        }
    }

    /// [`Self::spawn`], with each item going to the runner its `key` names
    /// (`key % runners`): items of one key run on one runner, in the order
    /// submitted, in one batch or in batches one after another, never in
    /// two transactions at once. Items that lock the same rows (a thread's,
    /// a message's twin's claim) then never wait on each other's
    /// uncommitted transaction across runners; a key that carries most of
    /// the load is served by one runner.
    pub fn spawn_keyed<F, Fut, K>(
        name: &'static str,
        runners: usize,
        max_batch: usize,
        key: K,
        statement: F,
    ) -> Self
    where
        F: Fn(Vec<I>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = (Vec<I>, sqlx::Result<Vec<O>>)> + Send,
        K: Fn(&I) -> u64 + Send + Sync + 'static,
    {
        let max_batch = max_batch.max(1);
        let statement = Arc::new(statement);
        let tx = (0..runners.max(1))
            .map(|_| {
                let (tx, rx) = mpsc::channel::<(I, Reply<O>)>(max_batch * 2);
                spawn_runner(name, max_batch, Arc::new(Mutex::new(rx)), statement.clone());
                tx
            })
            .collect();
        Self {
            tx,
            key: Some(Arc::new(key)),
        }
    }

    /// Runs `item`'s statement with whatever else is waiting; returns its
    /// own answer once the statement has committed.
    pub async fn submit(&self, item: I) -> Result<O, BatchError> {
        let (reply, answer) = oneshot::channel();
        let runner = match &self.key {
            Some(key) => (key(&item) % self.tx.len() as u64) as usize,
            None => 0,
        };
        self.tx[runner]
            .send((item, reply))
            .await
            .map_err(|_| BatchError::Closed)?;
        answer.await.map_err(|_| BatchError::Closed)?
    }
}

/// A runner: takes up to `max_batch` waiting items from `rx` at a time and
/// runs `statement` on them, until every sender is dropped.
fn spawn_runner<I, O, F, Fut>(
    name: &'static str,
    max_batch: usize,
    rx: Queue<I, O>,
    statement: Arc<F>,
) where
    I: Clone + Send + 'static,
    O: Send + 'static,
    F: Fn(Vec<I>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = (Vec<I>, sqlx::Result<Vec<O>>)> + Send,
{
    tokio::spawn(async move {
        let mut waiting = Vec::with_capacity(max_batch);
        loop {
            if rx.lock().await.recv_many(&mut waiting, max_batch).await == 0 {
                break;
            }
            metrics::histogram!("threadline_statement_batch_size", "statement" => name)
                .record(waiting.len() as f64);
            run(&*statement, std::mem::take(&mut waiting)).await;
            waiting.reserve(max_batch);
        }
    });
}

/// Runs one batch and answers its callers; a batch refused for a reason
/// that is not transient, or whose statement panicked, is run again one
/// item at a time, so that one bad item fails alone.
async fn run<I, O, F, Fut>(statement: &F, waiting: Vec<(I, Reply<O>)>)
where
    I: Clone,
    F: Fn(Vec<I>) -> Fut,
    Fut: Future<Output = (Vec<I>, sqlx::Result<Vec<O>>)>,
{
    let (items, replies): (Vec<I>, Vec<Reply<O>>) = waiting.into_iter().unzip();
    let n = items.len();
    // (a panicking statement takes its items with it)
    let kept = (n > 1).then(|| items.clone());
    let Ok((items, result)) = std::panic::AssertUnwindSafe(statement(items))
        .catch_unwind()
        .await
    else {
        tracing::error!(items = n, "a batched statement panicked");
        match kept {
            Some(items) => one_by_one(statement, items, replies).await,
            None => {
                for reply in replies {
                    let _ = reply.send(Err(BatchError::Panicked));
                }
            }
        }
        return;
    };
    match result {
        Ok(rows) if rows.len() == n => {
            for (reply, row) in replies.into_iter().zip(rows) {
                let _ = reply.send(Ok(row));
            }
        }
        Ok(rows) => {
            // A statement that does not answer every item is a defect: say
            // so to every caller rather than pair rows with the wrong one.
            tracing::error!(
                items = n,
                rows = rows.len(),
                "a batched statement answered the wrong number of rows"
            );
            let e = Shared(Arc::new(wrong_rows(rows.len(), n)));
            for reply in replies {
                let _ = reply.send(Err(BatchError::Failed(e.clone())));
            }
        }
        Err(e) if n > 1 && !crate::transient::sql_is_transient(&e) => {
            tracing::warn!(error = %e, items = n, "a batched statement was refused; running its items one by one");
            one_by_one(statement, items, replies).await;
        }
        Err(e) if n > 1 && lost_to_concurrency(&e) => {
            // A deadlock, serialization failure or lock timeout of the
            // batch as a whole: the same items batched again could meet the
            // same cycle, so each runs alone (an item that still loses
            // fails as transient, its own).
            tracing::warn!(error = %e, items = n, "a batched statement lost to a concurrent one; running its items one by one");
            one_by_one(statement, items, replies).await;
        }
        Err(e) => {
            let e = Shared(Arc::new(e));
            for reply in replies {
                let _ = reply.send(Err(BatchError::Failed(e.clone())));
            }
        }
    }
}

/// Runs each item as a batch of its own and answers its caller.
async fn one_by_one<I, O, F, Fut>(statement: &F, items: Vec<I>, replies: Vec<Reply<O>>)
where
    F: Fn(Vec<I>) -> Fut,
    Fut: Future<Output = (Vec<I>, sqlx::Result<Vec<O>>)>,
{
    for (item, reply) in items.into_iter().zip(replies) {
        let answer = match std::panic::AssertUnwindSafe(statement(vec![item]))
            .catch_unwind()
            .await
        {
            Err(_) => Err(BatchError::Panicked),
            Ok((_, Ok(mut rows))) if rows.len() == 1 => Ok(rows.remove(0)),
            Ok((_, Ok(rows))) => Err(BatchError::Failed(Shared(Arc::new(wrong_rows(
                rows.len(),
                1,
            ))))),
            Ok((_, Err(e))) => Err(BatchError::Failed(Shared(Arc::new(e)))),
        };
        let _ = reply.send(answer);
    }
}

/// A failure of concurrency rather than of the database or the data:
/// deadlock (40P01), serialization failure (40001), lock not available
/// (55P03, a lock timeout).
fn lost_to_concurrency(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if db.code().is_some_and(|c| matches!(&*c, "40P01" | "40001" | "55P03")))
}

/// A statement that answered `rows` rows for `items` items: a defect, so
/// not transient (as `Protocol` would be).
fn wrong_rows(rows: usize, items: usize) -> sqlx::Error {
    sqlx::Error::Decode(format!("batched statement answered {rows} rows for {items} items").into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    /// A statement that doubles numbers, refuses 13 (as a constraint
    /// would), and records the size of every batch it ran.
    fn doubler(sizes: Arc<std::sync::Mutex<Vec<usize>>>, pause: Duration) -> Batcher<u32, u32> {
        Batcher::spawn("test", 1, 8, move |items: Vec<u32>| {
            let sizes = sizes.clone();
            async move {
                sizes.lock().unwrap().push(items.len());
                tokio::time::sleep(pause).await;
                let r = if items.contains(&13) {
                    Err(sqlx::Error::RowNotFound)
                } else {
                    Ok(items.iter().map(|i| i * 2).collect())
                };
                (items, r)
            }
        })
    }

    /// Items of one key never run in two batches at once, and keep the
    /// order they were submitted in; other keys run beside them.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn items_of_one_key_run_on_one_runner_in_order() {
        let running = Arc::new(std::sync::Mutex::new(
            std::collections::HashMap::<u64, usize>::new(),
        ));
        let seen = Arc::new(std::sync::Mutex::new(Vec::<(u64, u32)>::new()));
        let overlap = Arc::new(AtomicUsize::new(0));
        let (r, s, o) = (running.clone(), seen.clone(), overlap.clone());
        let b: Batcher<(u64, u32), u32> = Batcher::spawn_keyed(
            "test",
            4,
            3,
            |(key, _): &(u64, u32)| *key,
            move |items: Vec<(u64, u32)>| {
                let (r, s, o) = (r.clone(), s.clone(), o.clone());
                async move {
                    let keys: std::collections::BTreeSet<u64> =
                        items.iter().map(|(k, _)| *k).collect();
                    for k in &keys {
                        let mut r = r.lock().unwrap();
                        let n = r.entry(*k).or_default();
                        if *n > 0 {
                            o.fetch_add(1, Ordering::SeqCst);
                        }
                        *n += 1;
                    }
                    s.lock().unwrap().extend(items.iter().copied());
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    for k in &keys {
                        *r.lock().unwrap().get_mut(k).expect("counted") -= 1;
                    }
                    let out = items.iter().map(|(_, v)| *v).collect();
                    (items, Ok(out))
                }
            },
        );
        // Every item waiting at once, the keys interleaved (unkeyed, four
        // runners would run each key in several batches at once).
        let calls = (0..20u32).flat_map(|v| (0..8u64).map(move |key| (key, v)));
        let answers = futures::future::join_all(calls.map(|item| {
            let b = b.clone();
            async move { (item.1, b.submit(item).await.expect("answered")) }
        }))
        .await;
        assert!(
            answers.iter().all(|(v, got)| v == got),
            "each its own answer"
        );
        assert_eq!(
            overlap.load(Ordering::SeqCst),
            0,
            "a key ran in two batches at once"
        );
        let seen = seen.lock().unwrap().clone();
        for key in 0..8u64 {
            let order: Vec<u32> = seen
                .iter()
                .filter(|(k, _)| *k == key)
                .map(|(_, v)| *v)
                .collect();
            assert_eq!(order, (0..20).collect::<Vec<_>>(), "key {key} in order");
        }
    }

    #[tokio::test]
    async fn callers_waiting_together_share_one_statement_and_each_gets_its_own_row() {
        let sizes = Arc::new(std::sync::Mutex::new(Vec::new()));
        let b = doubler(sizes.clone(), Duration::from_millis(50));
        let calls: Vec<_> = (20..37u32)
            .map(|i| {
                let b = b.clone();
                tokio::spawn(async move { (i, b.submit(i).await.expect("answered")) })
            })
            .collect();
        for c in calls {
            let (i, doubled) = c.await.expect("join");
            assert_eq!(doubled, i * 2, "each caller gets its own row");
        }
        let sizes = sizes.lock().unwrap().clone();
        assert_eq!(sizes.iter().sum::<usize>(), 17);
        assert!(sizes.iter().all(|&s| s <= 8), "at most a batch: {sizes:?}");
        assert!(
            sizes.len() < 17,
            "callers that waited together shared a statement: {sizes:?}"
        );
    }

    #[tokio::test]
    async fn one_refused_item_does_not_fail_the_others_of_its_batch() {
        let sizes = Arc::new(std::sync::Mutex::new(Vec::new()));
        let b = doubler(sizes.clone(), Duration::from_millis(20));
        // Hold the runner so the next three arrive together.
        let first = {
            let b = b.clone();
            tokio::spawn(async move { b.submit(1).await })
        };
        tokio::time::sleep(Duration::from_millis(5)).await;
        let calls: Vec<_> = [12u32, 13, 14]
            .into_iter()
            .map(|i| {
                let b = b.clone();
                tokio::spawn(async move { (i, b.submit(i).await) })
            })
            .collect();
        assert_eq!(first.await.expect("join").expect("answered"), 2);
        for c in calls {
            match c.await.expect("join") {
                (13, Err(BatchError::Failed(e))) => {
                    assert!(matches!(*e.0, sqlx::Error::RowNotFound), "its own error")
                }
                (13, other) => panic!("13 is refused, got {other:?}"),
                (i, r) => assert_eq!(r.expect("the others are answered"), i * 2),
            }
        }
        assert!(
            sizes.lock().unwrap().contains(&3),
            "the three were tried as one batch first: {:?}",
            sizes.lock().unwrap()
        );
    }

    #[tokio::test]
    async fn a_transient_failure_is_every_callers_and_is_seen_as_transient() {
        let runs = Arc::new(AtomicUsize::new(0));
        let counted = runs.clone();
        let b: Batcher<u32, u32> = Batcher::spawn("test", 1, 8, move |items: Vec<u32>| {
            let counted = counted.clone();
            async move {
                counted.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(20)).await;
                (items, Err(sqlx::Error::PoolTimedOut))
            }
        });
        let calls: Vec<_> = (0..4u32)
            .map(|i| {
                let b = b.clone();
                tokio::spawn(async move { b.submit(i).await })
            })
            .collect();
        for c in calls {
            let e =
                anyhow::Error::new(c.await.expect("join").expect_err("failed")).context("claiming");
            assert!(
                crate::transient::is_transient(&e, crate::transient::infrastructure_only),
                "{e:#}"
            );
            assert_eq!(
                crate::worker::error_code(&e, crate::transient::infrastructure_only),
                "database"
            );
        }
        // Not split up: an outage is retried by the callers, not here.
        assert!(runs.load(Ordering::SeqCst) <= 2);
    }

    #[tokio::test]
    async fn a_statement_that_panics_on_one_item_fails_that_item_alone_and_the_runner_goes_on() {
        let b: Batcher<u32, u32> = Batcher::spawn("test", 1, 8, |items: Vec<u32>| async move {
            assert!(!items.contains(&0), "a defect in the statement");
            let r = Ok(items.iter().map(|i| i + 1).collect());
            (items, r)
        });
        // Alone, it fails as a defect (dead-lettered after its retries).
        let e = anyhow::Error::new(b.submit(0).await.expect_err("panicked"));
        assert!(
            !crate::transient::is_transient(&e, crate::transient::infrastructure_only),
            "{e:#}"
        );
        assert_eq!(b.submit(1).await.expect("the runner goes on"), 2);
        // In a batch, it fails alone and the others are answered.
        let calls: Vec<_> = [5u32, 0, 6]
            .into_iter()
            .map(|i| {
                let b = b.clone();
                tokio::spawn(async move { (i, b.submit(i).await) })
            })
            .collect();
        for c in calls {
            match c.await.expect("join") {
                (0, r) => assert!(matches!(r, Err(BatchError::Panicked)), "{r:?}"),
                (i, r) => assert_eq!(r.expect("answered"), i + 1),
            }
        }
    }

    #[test]
    fn a_statement_answering_the_wrong_number_of_rows_is_not_transient() {
        let rt = tokio::runtime::Runtime::new().expect("runtime");
        rt.block_on(async {
            let b: Batcher<u32, u32> = Batcher::spawn("test", 1, 8, |items: Vec<u32>| async move {
                (items, Ok(Vec::new()))
            });
            let e = anyhow::Error::new(b.submit(1).await.expect_err("no row"));
            assert!(
                !crate::transient::is_transient(&e, crate::transient::infrastructure_only),
                "{e:#}"
            );
        });
    }

    /// A deadlock as Postgres reports it.
    #[derive(Debug)]
    struct Deadlock;

    impl std::fmt::Display for Deadlock {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("deadlock detected")
        }
    }

    impl std::error::Error for Deadlock {}

    impl sqlx::error::DatabaseError for Deadlock {
        fn message(&self) -> &str {
            "deadlock detected"
        }
        fn code(&self) -> Option<std::borrow::Cow<'_, str>> {
            Some("40P01".into())
        }
        fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
            self
        }
        fn kind(&self) -> sqlx::error::ErrorKind {
            sqlx::error::ErrorKind::Other
        }
    }

    #[tokio::test]
    async fn a_batch_that_loses_a_deadlock_is_run_again_item_by_item() {
        let sizes = Arc::new(std::sync::Mutex::new(Vec::new()));
        let b: Batcher<u32, u32> = {
            let sizes = sizes.clone();
            Batcher::spawn("test", 1, 8, move |items: Vec<u32>| {
                let sizes = sizes.clone();
                async move {
                    sizes.lock().unwrap().push(items.len());
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    // Together they deadlock (with each other's locks
                    // elsewhere); alone each goes through.
                    let r = if items.len() > 1 {
                        Err(sqlx::Error::Database(Box::new(Deadlock)))
                    } else {
                        Ok(items.iter().map(|i| i * 2).collect())
                    };
                    (items, r)
                }
            })
        };
        let first = {
            let b = b.clone();
            tokio::spawn(async move { b.submit(1).await })
        };
        tokio::time::sleep(Duration::from_millis(5)).await;
        let calls: Vec<_> = [5u32, 6, 7]
            .into_iter()
            .map(|i| {
                let b = b.clone();
                tokio::spawn(async move { (i, b.submit(i).await) })
            })
            .collect();
        assert_eq!(first.await.expect("join").expect("answered"), 2);
        for c in calls {
            let (i, r) = c.await.expect("join");
            assert_eq!(r.expect("answered after the rerun"), i * 2);
        }
        assert_eq!(*sizes.lock().unwrap(), [1, 3, 1, 1, 1]);
    }
}
