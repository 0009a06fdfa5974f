//! Per-installation admission and budgets (DESIGN invariant 11): answers a
//! minute, model calls a minute and model tokens a day per installation,
//! and each installation's share of the model's queue. A triggering
//! request is admitted (its context is built and queued for the model)
//! only while its installation is within every budget, has nothing parked
//! ahead of it, and holds fewer requests in the model's queue than its
//! share; otherwise it is parked, in order, and resumed when there is room
//! again. The rules are here; the counters live in Postgres, shared by
//! every replica (`threadline_store::budgets`).

use std::fmt;

/// A budget an installation can spend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Budget {
    /// Requests admitted for an answer, a minute.
    AnswersPerMinute,
    /// Contexts sent to the model (a request's first and every rebuild of
    /// it), a minute.
    ModelCallsPerMinute,
    /// Model tokens (prompt and completion) a UTC day.
    ModelTokensPerDay,
}

impl Budget {
    pub const ALL: [Budget; 3] = [
        Budget::AnswersPerMinute,
        Budget::ModelCallsPerMinute,
        Budget::ModelTokensPerDay,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            Budget::AnswersPerMinute => "answers_per_minute",
            Budget::ModelCallsPerMinute => "model_calls_per_minute",
            Budget::ModelTokensPerDay => "model_tokens_per_day",
        }
    }
}

/// Why a request waits parked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ParkReason {
    /// Its installation spent a budget.
    Over(Budget),
    /// Its installation holds its share of the model's queue (or has work
    /// parked ahead of it): it waits its turn, no budget is spent.
    TenantQueue,
}

impl ParkReason {
    pub const ALL: [ParkReason; 4] = [
        ParkReason::Over(Budget::AnswersPerMinute),
        ParkReason::Over(Budget::ModelCallsPerMinute),
        ParkReason::Over(Budget::ModelTokensPerDay),
        ParkReason::TenantQueue,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            ParkReason::Over(b) => b.as_str(),
            ParkReason::TenantQueue => "tenant_queue",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.as_str() == s)
    }

    /// Whether a budget is spent (what a person is told of, and what the
    /// over-budget alert counts).
    pub const fn over_budget(self) -> bool {
        matches!(self, ParkReason::Over(_))
    }
}

impl fmt::Display for ParkReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An installation's budgets; 0 is no limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Limits {
    pub answers_per_minute: u32,
    pub model_calls_per_minute: u32,
    pub model_tokens_per_day: u64,
}

impl Limits {
    /// These defaults with an installation's overrides (`None`: the
    /// default; 0: no limit).
    pub fn with_overrides(self, o: &Overrides) -> Self {
        Self {
            answers_per_minute: o
                .answers_per_minute
                .map_or(self.answers_per_minute, |v| v.max(0) as u32),
            model_calls_per_minute: o
                .model_calls_per_minute
                .map_or(self.model_calls_per_minute, |v| v.max(0) as u32),
            model_tokens_per_day: o
                .model_tokens_per_day
                .map_or(self.model_tokens_per_day, |v| v.max(0) as u64),
        }
    }
}

/// An installation's own budgets, as `threadline policy` sets them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Overrides {
    pub answers_per_minute: Option<i32>,
    pub model_calls_per_minute: Option<i32>,
    pub model_tokens_per_day: Option<i64>,
}

/// A per-minute budget as a token bucket of `size` units (its limit a
/// minute), refilling its whole size over a minute: what `left` units
/// `elapsed` seconds ago come to now, at most `size`. A bucket may be in
/// debt (a rebuild is charged whatever is left), at most `size` (a debt
/// left from a larger limit counts no further); it refills from there. A
/// bucket of no limit (`size` 0) holds nothing, and owes nothing.
pub fn refill(left: f64, size: u32, elapsed_secs: f64) -> f64 {
    let size = f64::from(size);
    (left.max(-size) + elapsed_secs.max(0.0) * size / 60.0).min(size)
}

/// What one admission round knows of an installation: its buckets as
/// refilled now, its tokens today, its requests in the model's queue, and
/// whether requests wait parked ahead (whose turn comes first).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Standing {
    pub answers: f64,
    pub model_calls: f64,
    pub tokens_today: i64,
    pub in_queue: u32,
    pub parked_ahead: bool,
    /// Why the request at the head of the line waits (`None`: nothing is
    /// parked ahead, or it gave no reason).
    pub head: Option<ParkReason>,
}

/// What becomes of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Its context is built and queued now; its units are taken.
    Admit,
    /// It waits parked, for this reason.
    Park(ParkReason),
}

impl Standing {
    /// What is short for one more request, budgets first: `None` when it
    /// may be admitted now (`share`: the most requests the installation may
    /// hold in the model's queue).
    pub fn short(&self, limits: &Limits, share: u32) -> Option<ParkReason> {
        if limits.model_tokens_per_day > 0
            && self.tokens_today >= i64::try_from(limits.model_tokens_per_day).unwrap_or(i64::MAX)
        {
            return Some(ParkReason::Over(Budget::ModelTokensPerDay));
        }
        if limits.answers_per_minute > 0 && self.answers < 1.0 {
            return Some(ParkReason::Over(Budget::AnswersPerMinute));
        }
        if limits.model_calls_per_minute > 0 && self.model_calls < 1.0 {
            return Some(ParkReason::Over(Budget::ModelCallsPerMinute));
        }
        (self.in_queue >= share).then_some(ParkReason::TenantQueue)
    }

    /// Decides `n` requests of the installation, oldest first: each is
    /// admitted while nothing is short and nothing waits ahead of it (its
    /// units taken), and once one is parked every later one parks behind it
    /// (first in, first out). A request parked only behind others is parked
    /// for what is short, or else for why the head of the line waits (so a
    /// request behind work parked for a budget waits for that budget, is
    /// told so and counted over budget, even when a unit is there at that
    /// instant), or else its turn (`tenant_queue`).
    pub fn decide(&mut self, limits: &Limits, share: u32, n: usize) -> Vec<Verdict> {
        (0..n)
            .map(|_| match (self.short(limits, share), self.parked_ahead) {
                (None, false) => {
                    self.take(limits);
                    Verdict::Admit
                }
                (short, _) => {
                    self.parked_ahead = true;
                    let why = short.or(self.head).unwrap_or(ParkReason::TenantQueue);
                    self.head.get_or_insert(why);
                    Verdict::Park(why)
                }
            })
            .collect()
    }

    /// How many of the oldest parked requests may resume now (at most
    /// `max`), their units taken.
    pub fn resumable(&mut self, limits: &Limits, share: u32, max: usize) -> usize {
        self.parked_ahead = false;
        let mut n = 0;
        while n < max && self.short(limits, share).is_none() {
            self.take(limits);
            n += 1;
        }
        n
    }

    fn take(&mut self, limits: &Limits) {
        if limits.answers_per_minute > 0 {
            self.answers -= 1.0;
        }
        if limits.model_calls_per_minute > 0 {
            self.model_calls -= 1.0;
        }
        self.in_queue += 1;
    }
}

/// What a person sees when their workspace is over budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Notice {
    /// A short note in the thread, once per thread ([`NOTE_TEXT`]).
    Note,
    /// Nothing: the answer comes when the budget refills.
    Nothing,
}

impl Notice {
    /// `note` or `none`.
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim() {
            "note" => Some(Notice::Note),
            "none" => Some(Notice::Nothing),
            _ => None,
        }
    }
}

/// The note, threadline's own words: honest about why nothing comes yet,
/// and what will happen.
pub const NOTE_TEXT: &str = "This workspace has used its threadline budget for the moment, so this question waits in line. It will be answered here, in order, when the budget refills.";

/// The action kind of the decision that posts the note: a reply intent of
/// its own (keyed by [`note_event_id`]), so the question's answer, which
/// comes later, is not taken for a second reply to it.
pub const NOTE_ACTION_KIND: &str = "budget_note";

/// The event id the note's decision and reply intent carry: the question's
/// own, marked, so that "one reply per source event" keeps holding for the
/// question.
pub fn note_event_id(event_id: &str) -> String {
    format!("{NOTE_ACTION_KIND}:{event_id}")
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        answers_per_minute: 3,
        model_calls_per_minute: 10,
        model_tokens_per_day: 1000,
    };

    fn full() -> Standing {
        Standing {
            answers: 3.0,
            model_calls: 10.0,
            ..Standing::default()
        }
    }

    #[test]
    fn a_bucket_refills_its_size_over_a_minute_and_holds_no_more() {
        assert_eq!(refill(0.0, 60, 30.0), 30.0);
        assert_eq!(refill(10.0, 60, 600.0), 60.0);
        assert_eq!(refill(-2.0, 60, 1.0), -1.0, "a debt refills too");
        assert_eq!(refill(5.0, 60, -3.0), 5.0, "a clock step back adds nothing");
        assert_eq!(refill(-5.0, 0, 0.0), 0.0, "no limit, no debt");
        assert_eq!(refill(-50.0, 2, 0.0), -2.0, "a debt is at most the size");
    }

    #[test]
    fn requests_are_admitted_while_the_budget_lasts_then_parked_in_order() {
        let mut s = full();
        let v = s.decide(&LIMITS, 16, 5);
        use Verdict::*;
        assert_eq!(
            v,
            [
                Admit,
                Admit,
                Admit,
                Park(ParkReason::Over(Budget::AnswersPerMinute)),
                Park(ParkReason::Over(Budget::AnswersPerMinute)),
            ]
        );
        assert_eq!(s.in_queue, 3);
        assert_eq!(s.model_calls, 7.0);
    }

    #[test]
    fn the_queue_share_parks_without_spending_a_budget() {
        let mut s = full();
        let v = s.decide(&LIMITS, 2, 3);
        assert_eq!(v[2], Verdict::Park(ParkReason::TenantQueue));
        assert_eq!(s.answers, 1.0, "only the admitted spend");
        assert!(!ParkReason::TenantQueue.over_budget());
    }

    #[test]
    fn nothing_overtakes_work_parked_ahead() {
        let mut s = Standing {
            parked_ahead: true,
            ..full()
        };
        assert_eq!(
            s.decide(&LIMITS, 16, 1),
            [Verdict::Park(ParkReason::TenantQueue)]
        );
        // The resumer takes the oldest first, as many as there is room for.
        assert_eq!(s.resumable(&LIMITS, 16, 10), 3);
        assert_eq!(s.resumable(&LIMITS, 16, 10), 0);
    }

    #[test]
    fn a_request_behind_work_parked_for_a_budget_waits_for_that_budget() {
        let over = ParkReason::Over(Budget::AnswersPerMinute);
        // A unit is there at this instant, but the head waits for it.
        let mut s = Standing {
            answers: 1.0,
            parked_ahead: true,
            head: Some(over),
            ..full()
        };
        assert_eq!(s.decide(&LIMITS, 16, 2), [Verdict::Park(over); 2]);
        // Parked in this round for a budget: those behind it wait for it too.
        let mut s = Standing {
            answers: 1.0,
            ..full()
        };
        assert_eq!(
            s.decide(&LIMITS, 16, 3),
            [Verdict::Admit, Verdict::Park(over), Verdict::Park(over)]
        );
    }

    #[test]
    fn tokens_a_day_and_no_limit() {
        let s = Standing {
            tokens_today: 1000,
            ..full()
        };
        assert_eq!(
            s.short(&LIMITS, 16),
            Some(ParkReason::Over(Budget::ModelTokensPerDay))
        );
        let none = Limits::default();
        let mut empty = Standing::default();
        assert_eq!(empty.decide(&none, 2, 2), [Verdict::Admit, Verdict::Admit]);
        assert_eq!(empty.answers, 0.0, "an unlimited budget is not counted");
    }

    #[test]
    fn overrides_replace_the_defaults_and_zero_lifts_a_limit() {
        let o = Overrides {
            answers_per_minute: Some(0),
            model_tokens_per_day: Some(5),
            ..Overrides::default()
        };
        assert_eq!(
            LIMITS.with_overrides(&o),
            Limits {
                answers_per_minute: 0,
                model_calls_per_minute: 10,
                model_tokens_per_day: 5,
            }
        );
    }

    #[test]
    fn reasons_and_notices_have_one_name_each() {
        for r in ParkReason::ALL {
            assert_eq!(ParkReason::parse(r.as_str()), Some(r));
        }
        assert_eq!(Notice::parse("note"), Some(Notice::Note));
        assert_eq!(Notice::parse("none"), Some(Notice::Nothing));
        assert_eq!(Notice::parse("loud"), None);
        assert_eq!(note_event_id("Ev1"), "budget_note:Ev1");
    }
}
