//! Bodies not yet known to be Slack's: how many of their bytes may be in
//! memory at once, and reading one within its share.
//!
//! A delivery reserves its declared length (the largest allowed body when
//! it declares none) before its body is read, and gives it back once the
//! signature is checked. When the budget is spent the delivery is refused
//! unread with 503 (Slack retries), so a flood of unsigned bodies costs at
//! most the budget, never a copy of each.

use std::sync::Arc;

use axum::body::Body;
use bytes::{Bytes, BytesMut};
use futures::StreamExt as _;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

#[derive(Debug, Clone)]
pub struct Budget {
    bytes: Arc<Semaphore>,
    total: usize,
}

/// A share of the budget, given back when dropped.
#[derive(Debug)]
pub struct Share {
    permit: Option<OwnedSemaphorePermit>,
    budget: Budget,
}

impl Drop for Share {
    fn drop(&mut self) {
        drop(self.permit.take());
        self.budget.report();
    }
}

impl Budget {
    pub fn new(total: usize) -> Self {
        Self {
            bytes: Arc::new(Semaphore::new(total)),
            total,
        }
    }

    /// `bytes` of the budget, or `None` when that much is not free now.
    pub fn try_reserve(&self, bytes: usize) -> Option<Share> {
        let n = u32::try_from(bytes).ok()?;
        let permit = self.bytes.clone().try_acquire_many_owned(n).ok()?;
        self.report();
        Some(Share {
            permit: Some(permit),
            budget: self.clone(),
        })
    }

    fn report(&self) {
        let in_use = self.total.saturating_sub(self.bytes.available_permits());
        metrics::gauge!("threadline_gateway_unverified_bytes").set(in_use as f64);
    }
}

#[derive(Debug, PartialEq, Eq)]
pub enum ReadError {
    /// More than the limit arrived.
    TooLarge,
    /// The body ended early or the connection failed.
    Broken,
}

/// Reads `body` whole, stopping as soon as it exceeds `limit` bytes.
/// `expected` (the declared length) sizes the buffer once.
pub async fn read(body: Body, limit: usize, expected: Option<usize>) -> Result<Bytes, ReadError> {
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
                let mut buf = BytesMut::with_capacity(expected.unwrap_or(0).clamp(total, limit));
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
            read(chunked(&[b"ab", b"cd", b"e"]), 5, Some(5)).await,
            Ok(Bytes::from_static(b"abcde"))
        );
        assert_eq!(
            read(chunked(&[b"abc"]), 5, None).await,
            Ok(Bytes::from_static(b"abc"))
        );
        assert_eq!(read(chunked(&[]), 5, None).await, Ok(Bytes::new()));
        assert_eq!(
            read(chunked(&[b"abc", b"def"]), 5, Some(5)).await,
            Err(ReadError::TooLarge)
        );
    }

    #[test]
    fn the_budget_is_shared_and_given_back() {
        let b = Budget::new(10);
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
