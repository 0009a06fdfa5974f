//! Double texting: people send one question as two or three quick
//! messages. An installation answers each message as it comes
//! ([`DoubleTexting::Each`]), or answers the latest message of a person's
//! burst with the earlier ones read with it ([`DoubleTexting::Latest`]).
//!
//! A *burst* is a person's requests in one conversation (the same thread;
//! top-level messages of a channel or DM count as one conversation, as in
//! an agent's Messages tab, where each message is a thread of its own),
//! each sent (by Slack's `ts`) within the quiet period of the one before.
//! Under `Latest` a request is built only once its asker could have been
//! quiet for the quiet period since it reached threadline; a request with a
//! later one of its burst is *absorbed*: not answered on its own, read by
//! the later one's answer. Which way each request went is decided once, by
//! whichever comes first of its own build and a later request's that reads
//! it, so the two never disagree.

use std::time::Duration;

/// An installation's double-texting policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DoubleTexting {
    /// Every request answered as it comes (a newer request in a thread
    /// still supersedes an older unanswered one there).
    Each,
    /// The latest request of a person's burst answered, after they were
    /// quiet for `quiet`.
    Latest { quiet: Duration },
}

/// What became of one request of a burst under [`DoubleTexting::Latest`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BurstPart {
    /// Answered by its own answer.
    Alone,
    /// Read by the answer to the later request sent at `later_ts`.
    Absorbed { later_ts: String },
}

impl BurstPart {
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Alone => "alone",
            Self::Absorbed { .. } => "absorbed",
        }
    }

    /// From its stored outcome and later request.
    pub fn parse(outcome: &str, later_ts: Option<String>) -> Option<Self> {
        match (outcome, later_ts) {
            ("alone", None) => Some(Self::Alone),
            ("absorbed", Some(later_ts)) => Some(Self::Absorbed { later_ts }),
            _ => None,
        }
    }
}

/// The reason a request's receipt ends with when a later request of its
/// burst answers it.
pub const ABSORBED: &str = "double_texted";

/// The quiet period of an installation that chose `latest` without one.
pub const QUIET_DEFAULT_MS: u32 = 2_000;
/// The quiet periods an installation may choose.
pub const QUIET_RANGE_MS: std::ops::RangeInclusive<u32> = 500..=30_000;
/// The most earlier messages of a burst one answer reads.
pub const EARLIER_MAX: usize = 10;

impl DoubleTexting {
    /// An installation that never chose.
    pub const DEFAULT: Self = Self::Each;

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Each => "each",
            Self::Latest { .. } => "latest",
        }
    }

    /// From the stored action and quiet period; `None` for an unknown
    /// action or a quiet period out of range.
    pub fn parse(action: &str, quiet_ms: u32) -> Option<Self> {
        match action {
            "each" => Some(Self::Each),
            "latest" if QUIET_RANGE_MS.contains(&quiet_ms) => Some(Self::Latest {
                quiet: Duration::from_millis(u64::from(quiet_ms)),
            }),
            _ => None,
        }
    }

    /// The quiet period, under `Latest`.
    pub fn quiet(self) -> Option<Duration> {
        match self {
            Self::Each => None,
            Self::Latest { quiet } => Some(quiet),
        }
    }

    /// How much longer a request that reached threadline at `received_ms`
    /// waits before it is built, at `now_ms` (milliseconds since the
    /// epoch): `None` when it may be built now. A later message of the
    /// burst was sent within the quiet period of this one, so it reached
    /// threadline by then too, give or take Slack's delivery.
    pub fn wait(self, received_ms: i64, now_ms: i64) -> Option<Duration> {
        let quiet = self.quiet()?;
        let due = received_ms.saturating_add(quiet.as_millis() as i64);
        (now_ms < due).then(|| Duration::from_millis((due - now_ms) as u64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_never_waits_and_latest_waits_out_its_quiet_period() {
        assert_eq!(DoubleTexting::Each.wait(1_000, 1_000), None);
        let latest = DoubleTexting::parse("latest", 2_000).unwrap();
        assert_eq!(
            latest.wait(1_000, 1_500),
            Some(Duration::from_millis(1_500))
        );
        assert_eq!(latest.wait(1_000, 3_000), None);
        assert_eq!(latest.wait(1_000, 9_000), None);
    }

    #[test]
    fn only_known_actions_and_quiet_periods_in_range_parse() {
        assert_eq!(DoubleTexting::parse("each", 0), Some(DoubleTexting::Each));
        assert_eq!(DoubleTexting::parse("latest", 499), None);
        assert_eq!(DoubleTexting::parse("latest", 30_001), None);
        assert_eq!(DoubleTexting::parse("debounce", 2_000), None);
        for p in [
            DoubleTexting::Each,
            DoubleTexting::parse("latest", 700).unwrap(),
        ] {
            let ms = p.quiet().map_or(QUIET_DEFAULT_MS, |q| q.as_millis() as u32);
            assert_eq!(DoubleTexting::parse(p.as_str(), ms), Some(p));
        }
    }

    #[test]
    fn a_burst_part_round_trips_and_an_absorbed_one_names_its_later_request() {
        let a = BurstPart::Absorbed {
            later_ts: "2.000002".into(),
        };
        assert_eq!(
            BurstPart::parse(a.as_str(), Some("2.000002".into())),
            Some(a)
        );
        assert_eq!(BurstPart::parse("absorbed", None), None);
        assert_eq!(BurstPart::parse("alone", Some("2.1".into())), None);
        assert_eq!(BurstPart::parse("alone", None), Some(BurstPart::Alone));
    }
}
