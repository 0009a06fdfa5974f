//! Bodies not yet known to be Slack's: how many of their bytes may be in
//! memory at once, and reading one within its share.
//!
//! A delivery reserves its declared length (the largest allowed body when
//! it declares none) before its body is read, and gives it back once the
//! signature is checked. When the budget is spent the delivery is refused
//! unread with 503 (Slack retries), so a flood of unsigned bodies costs at
//! most the budget, never a copy of each. A quarter of the budget (at most
//! what the largest body leaves) is kept for bodies of at most
//! [`SMALL_BODY`] bytes, which Slack's deliveries are: bodies that declare
//! themselves large cannot spend it. A body must arrive within a deadline,
//! so a stalled one holds its share only that long.
//!
//! Every body holds at least [`MIN_SHARE`] (a head declaring one byte
//! cannot hold a connection for almost nothing), and when the budget is
//! spent a new body takes the place of the one that has waited longest:
//! that one is cut (408) once it has waited [`CUTTABLE_AFTER`]. Slack sends
//! a body with its head, so a body that waits is not Slack's, and a flood
//! of stalled bodies cannot keep a signed delivery out.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use bytes::{Bytes, BytesMut};
use futures::StreamExt as _;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

/// Bodies up to this size may use the part of the budget kept for them.
pub const SMALL_BODY: usize = 64 << 10;

/// The least share a body holds, whatever it declares.
pub const MIN_SHARE: usize = 16 << 10;

/// A body still arriving after this long may be cut for a new one.
pub const CUTTABLE_AFTER: Duration = Duration::from_secs(1);

/// How long a new body waits for the shares of the bodies cut for it.
const MAKE_ROOM_WITHIN: Duration = Duration::from_millis(500);

#[derive(Debug, Clone)]
pub struct Budget {
    /// For bodies of at most [`SMALL_BODY`] bytes only.
    small: Arc<Semaphore>,
    /// For any body.
    any: Arc<Semaphore>,
    total: usize,
    /// The bodies holding a share: when each began, and how to cut it.
    held: Arc<Mutex<HashMap<u64, (Instant, CancellationToken)>>>,
    next: Arc<AtomicU64>,
}

/// A share of the budget, given back when dropped.
#[derive(Debug)]
pub struct Share {
    permit: Option<OwnedSemaphorePermit>,
    budget: Budget,
    id: u64,
    cut: CancellationToken,
}

impl Share {
    /// Cancelled when this body is cut to make room for another.
    pub fn cut(&self) -> CancellationToken {
        self.cut.clone()
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        self.budget.held().remove(&self.id);
        drop(self.permit.take());
        self.budget.report();
    }
}

impl Budget {
    /// `total` bytes, of which a part that still leaves room for one body
    /// of `largest` bytes (at most a quarter) is kept for small bodies.
    pub fn new(total: usize, largest: usize) -> Self {
        let small = (total / 4).min(total.saturating_sub(largest));
        Self {
            small: Arc::new(Semaphore::new(small)),
            any: Arc::new(Semaphore::new(total - small)),
            total,
            held: Arc::default(),
            next: Arc::default(),
        }
    }

    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<u64, (Instant, CancellationToken)>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A share for a body of `bytes` (at least [`MIN_SHARE`]): at once when
    /// free, else by cutting the bodies that have waited longest (past
    /// [`CUTTABLE_AFTER`]) and taking their place; `None` when no body can
    /// be cut or their shares did not come back in time.
    pub async fn reserve(&self, bytes: usize) -> Option<Share> {
        let bytes = bytes.max(MIN_SHARE);
        if let Some(s) = self.try_reserve(bytes) {
            return Some(s);
        }
        let give_up = tokio::time::Instant::now() + MAKE_ROOM_WITHIN;
        let mut freed = 0usize;
        loop {
            // (cut enough for this body, as far as the shares held tell)
            while freed < bytes {
                let Some(n) = self.cut_oldest() else { break };
                freed += n;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
            if let Some(s) = self.try_reserve(bytes) {
                return Some(s);
            }
            if freed == 0 || tokio::time::Instant::now() >= give_up {
                return None;
            }
            freed = 0;
        }
    }

    /// Cuts the body that has waited longest, if it has waited past
    /// [`CUTTABLE_AFTER`]: the least share it frees.
    fn cut_oldest(&self) -> Option<usize> {
        let mut held = self.held();
        let (id, token) = held
            .iter()
            .filter(|(_, (since, t))| since.elapsed() >= CUTTABLE_AFTER && !t.is_cancelled())
            .min_by_key(|(_, (since, _))| *since)
            .map(|(id, (_, t))| (*id, t.clone()))?;
        token.cancel();
        held.remove(&id);
        metrics::counter!("threadline_gateway_unverified_bodies_cut_total").increment(1);
        Some(MIN_SHARE)
    }

    /// `bytes` of the budget, or `None` when that much is not free now.
    pub fn try_reserve(&self, bytes: usize) -> Option<Share> {
        let n = u32::try_from(bytes).ok()?;
        let small = (bytes <= SMALL_BODY)
            .then(|| self.small.clone().try_acquire_many_owned(n).ok())
            .flatten();
        let permit = match small {
            Some(p) => p,
            None => self.any.clone().try_acquire_many_owned(n).ok()?,
        };
        self.report();
        let (id, cut) = (
            self.next.fetch_add(1, Ordering::Relaxed),
            CancellationToken::new(),
        );
        self.held().insert(id, (Instant::now(), cut.clone()));
        Some(Share {
            permit: Some(permit),
            budget: self.clone(),
            id,
            cut,
        })
    }

    fn report(&self) {
        let free = self.small.available_permits() + self.any.available_permits();
        let in_use = self.total.saturating_sub(free);
        metrics::gauge!("threadline_gateway_unverified_bytes").set(in_use as f64);
    }
}

#[derive(Debug, PartialEq, Eq)]
pub enum ReadError {
    /// More than the limit arrived.
    TooLarge,
    /// The body ended early or the connection failed.
    Broken,
    /// The body did not arrive within its deadline.
    Slow,
}

/// Reads `body` whole within `deadline`, stopping as soon as it exceeds
/// `limit` bytes, or when `cut` (its share was taken for another body).
/// `expected` (the declared length) sizes the buffer once.
pub async fn read(
    body: Body,
    limit: usize,
    expected: Option<usize>,
    deadline: std::time::Duration,
    cut: CancellationToken,
) -> Result<Bytes, ReadError> {
    tokio::select! {
        r = tokio::time::timeout(deadline, read_all(body, limit, expected)) => {
            r.unwrap_or(Err(ReadError::Slow))
        }
        () = cut.cancelled() => Err(ReadError::Slow),
    }
}

async fn read_all(body: Body, limit: usize, expected: Option<usize>) -> Result<Bytes, ReadError> {
    let mut chunks = body.into_data_stream();
    let mut first: Option<Bytes> = None;
    let mut joined: Option<BytesMut> = None;
    let mut total = 0usize;
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk.map_err(|_| ReadError::Broken)?;
        total += chunk.len();
        if total > limit {
            return Err(ReadError::TooLarge);
        }
        match (&mut joined, first.take()) {
            (Some(buf), _) => buf.extend_from_slice(&chunk),
            (None, None) => first = Some(chunk),
            (None, Some(head)) => {
                // Sized once to the share reserved for it (the declared
                // length, else the limit), so it never grows past it.
                let mut buf =
                    BytesMut::with_capacity(expected.unwrap_or(limit).clamp(total, limit));
                buf.extend_from_slice(&head);
                buf.extend_from_slice(&chunk);
                joined = Some(buf);
            }
        }
    }
    Ok(match joined {
        Some(buf) => buf.freeze(),
        None => first.unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunked(parts: &[&'static [u8]]) -> Body {
        let parts: Vec<Result<Bytes, std::io::Error>> =
            parts.iter().map(|p| Ok(Bytes::from_static(p))).collect();
        Body::from_stream(futures::stream::iter(parts))
    }

    #[tokio::test]
    async fn a_body_is_read_whole_within_its_limit() {
        assert_eq!(
            read(chunked(&[b"ab", b"cd", b"e"]), 5, Some(5), SECOND, never()).await,
            Ok(Bytes::from_static(b"abcde"))
        );
        assert_eq!(
            read(chunked(&[b"abc"]), 5, None, SECOND, never()).await,
            Ok(Bytes::from_static(b"abc"))
        );
        assert_eq!(
            read(chunked(&[]), 5, None, SECOND, never()).await,
            Ok(Bytes::new())
        );
        assert_eq!(
            read(chunked(&[b"abc", b"def"]), 5, Some(5), SECOND, never()).await,
            Err(ReadError::TooLarge)
        );
    }

    const SECOND: std::time::Duration = std::time::Duration::from_secs(1);

    fn never() -> CancellationToken {
        CancellationToken::new()
    }

    #[tokio::test]
    async fn a_new_body_takes_the_place_of_the_one_that_waited_longest() {
        // Room for four bodies of the least share.
        let b = Budget::new(4 * MIN_SHARE, MIN_SHARE);
        let old = b.reserve(1).await.expect("fits");
        let cut_old = old.cut();
        tokio::time::sleep(CUTTABLE_AFTER).await;
        let young: Vec<Share> = futures::future::join_all((0..3).map(|_| b.reserve(1)))
            .await
            .into_iter()
            .map(|s| s.expect("fits"))
            .collect();
        // Spent: the next body cuts the oldest (a head declaring one byte
        // still holds the least share), never one too young to cut.
        let held = tokio::spawn(async move {
            cut_old.cancelled().await;
            drop(old);
        });
        let new = b.reserve(1).await.expect("the oldest was cut for it");
        held.await.expect("cut");
        assert!(
            young.iter().all(|y| !y.cut().is_cancelled()),
            "the young ones go on"
        );
        assert!(
            b.reserve(1).await.is_none(),
            "none left that waited long enough"
        );
        drop((young, new));
    }

    #[tokio::test]
    async fn a_body_that_stalls_is_cut_at_its_deadline() {
        let stalled = Body::from_stream(
            futures::stream::iter([Ok::<_, std::io::Error>(Bytes::from_static(b"ab"))])
                .chain(futures::stream::pending()),
        );
        assert_eq!(
            read(
                stalled,
                5,
                Some(5),
                std::time::Duration::from_millis(50),
                never()
            )
            .await,
            Err(ReadError::Slow)
        );
    }

    #[test]
    fn large_bodies_cannot_spend_the_part_kept_for_small_ones() {
        // 8 MiB with bodies up to 1 MiB: 2 MiB kept for small bodies.
        let b = Budget::new(8 << 20, 1 << 20);
        let large: Vec<Share> = (0..6)
            .map(|_| b.try_reserve(1 << 20).expect("fits"))
            .collect();
        assert!(b.try_reserve(1 << 20).is_none(), "no seventh large body");
        let small: Vec<Share> = (0..32)
            .map(|_| b.try_reserve(64 << 10).expect("kept for small"))
            .collect();
        assert!(b.try_reserve(4 << 10).is_none(), "all spent now");
        drop(large);
        drop(small);
        // A budget of exactly one largest body keeps nothing aside.
        let tight = Budget::new(1 << 20, 1 << 20);
        assert!(tight.try_reserve(1 << 20).is_some());
    }

    #[test]
    fn the_budget_is_shared_and_given_back() {
        let b = Budget::new(10, 10);
        let six = b.try_reserve(6).expect("fits");
        assert!(b.try_reserve(5).is_none(), "only 4 left");
        let four = b.try_reserve(4).expect("fits");
        assert!(b.try_reserve(1).is_none());
        drop(six);
        assert!(b.try_reserve(6).is_some());
        drop(four);
        assert!(b.try_reserve(11).is_none(), "never more than the whole");
    }
}
