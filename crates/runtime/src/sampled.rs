//! Log lines about refusals anyone on the internet can cause at will (a
//! bad signature, a spent budget for unverified bodies, a full connection
//! table, a rate limit) at a bounded rate: the first of each kind at once,
//! then at most one a period per kind, each saying how many of its kind
//! went unlogged since the last. The metrics count every one; the lines
//! tell an operator reading logs that it is happening without letting a
//! flood of requests become a flood of log lines.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

/// One line a minute per kind.
pub const REFUSAL_LOG_PERIOD: Duration = Duration::from_secs(60);

/// Which of a flood of events of each kind get a log line.
#[derive(Debug)]
pub struct Sampler {
    period: Duration,
    kinds: Mutex<HashMap<&'static str, Kind>>,
}

#[derive(Debug)]
struct Kind {
    logged_at: Instant,
    unlogged: u64,
}

impl Sampler {
    pub fn new(period: Duration) -> Self {
        Self {
            period,
            kinds: Mutex::new(HashMap::new()),
        }
    }

    /// Whether an event of `kind` gets a line now: `Some(n)`, with `n` the
    /// events of its kind that got none since its last line, or `None`
    /// (counted for the next line). Kinds are the caller's fixed codes, so
    /// the map stays as small as their list.
    pub fn admit(&self, kind: &'static str) -> Option<u64> {
        self.admit_at(kind, Instant::now())
    }

    fn admit_at(&self, kind: &'static str, now: Instant) -> Option<u64> {
        let mut kinds = self.kinds.lock().unwrap_or_else(|p| p.into_inner());
        match kinds.get_mut(kind) {
            Some(k) if now.saturating_duration_since(k.logged_at) < self.period => {
                k.unlogged += 1;
                None
            }
            Some(k) => {
                let unlogged = std::mem::take(&mut k.unlogged);
                k.logged_at = now;
                Some(unlogged)
            }
            None => {
                kinds.insert(
                    kind,
                    Kind {
                        logged_at: now,
                        unlogged: 0,
                    },
                );
                Some(0)
            }
        }
    }
}

/// The process's sampler for refusals ([`REFUSAL_LOG_PERIOD`] per kind).
pub fn refusals() -> &'static Sampler {
    static REFUSALS: LazyLock<Sampler> = LazyLock::new(|| Sampler::new(REFUSAL_LOG_PERIOD));
    &REFUSALS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_of_a_kind_is_logged_then_one_a_period_with_the_count_between() {
        let s = Sampler::new(Duration::from_secs(60));
        let t0 = Instant::now();
        assert_eq!(s.admit_at("bad_signature", t0), Some(0));
        for i in 1..=99 {
            assert_eq!(
                s.admit_at("bad_signature", t0 + Duration::from_millis(i * 100)),
                None
            );
        }
        // Another kind is not held back by the first.
        assert_eq!(s.admit_at("busy", t0 + Duration::from_secs(1)), Some(0));
        assert_eq!(
            s.admit_at("bad_signature", t0 + Duration::from_secs(60)),
            Some(99)
        );
        assert_eq!(
            s.admit_at("bad_signature", t0 + Duration::from_secs(61)),
            None
        );
        assert_eq!(
            s.admit_at("bad_signature", t0 + Duration::from_secs(200)),
            Some(1)
        );
    }

    #[test]
    fn a_clock_that_goes_back_holds_the_line_back_instead_of_panicking() {
        let s = Sampler::new(Duration::from_secs(60));
        let t0 = Instant::now() + Duration::from_secs(10);
        assert_eq!(s.admit_at("k", t0), Some(0));
        assert_eq!(s.admit_at("k", t0 - Duration::from_secs(5)), None);
    }
}
