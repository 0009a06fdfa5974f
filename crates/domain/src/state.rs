//! The ledger's state machines (DESIGN §4) as types: every state of an
//! event receipt, a decision and a reply intent, and the moves between
//! them as code. A statement that changes a state asks
//! [`Machine::from_states`] which states the move may start from and puts
//! exactly those in its compare-and-set, so an illegal move matches no row;
//! [`Machine::check`] says why a move is refused to a caller holding a
//! state. The database's check constraints list the same states (a test
//! keeps them equal). Every state the store writes to a receipt, a
//! decision or a reply intent is bound from these types (a test of the
//! store refuses a literal one).

use std::fmt;

/// A state machine over `Self`: its states and its allowed moves.
pub trait Machine: Copy + Eq + fmt::Debug + 'static {
    /// Every state, in a fixed order.
    const ALL: &'static [Self];
    /// What this machine is called in errors.
    const NAME: &'static str;

    /// The state as the database stores it.
    fn as_str(self) -> &'static str;

    /// Whether `self → to` is an allowed move.
    fn can_become(self, to: Self) -> bool;

    /// The state the database stored.
    fn parse(s: &str) -> Result<Self, UnknownState> {
        Self::ALL
            .iter()
            .copied()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| UnknownState {
                machine: Self::NAME,
                state: s.to_owned(),
            })
    }

    /// The states a move to `to` may start from (what a compare-and-set
    /// into `to` must match).
    fn from_states(to: Self) -> Vec<&'static str> {
        Self::ALL
            .iter()
            .filter(|from| from.can_become(to))
            .map(|from| from.as_str())
            .collect()
    }

    /// `from → to`, or why not.
    fn check(from: Self, to: Self) -> Result<(), IllegalMove> {
        if from.can_become(to) {
            Ok(())
        } else {
            Err(IllegalMove {
                machine: Self::NAME,
                from: from.as_str(),
                to: to.as_str(),
            })
        }
    }
}

/// A state name the machine does not have.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownState {
    pub machine: &'static str,
    pub state: String,
}

impl fmt::Display for UnknownState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} has no state {:?}", self.machine, self.state)
    }
}

impl std::error::Error for UnknownState {}

/// A move the machine does not allow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IllegalMove {
    pub machine: &'static str,
    pub from: &'static str,
    pub to: &'static str,
}

impl fmt::Display for IllegalMove {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} may not move from {} to {}",
            self.machine, self.from, self.to
        )
    }
}

impl std::error::Error for IllegalMove {}

macro_rules! states {
    ($(#[$doc:meta])* $name:ident, $label:literal { $($variant:ident = $s:literal),+ $(,)? }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $($variant),+
        }

        impl $name {
            pub const fn name(self) -> &'static str {
                match self {
                    $(Self::$variant => $s),+
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.name())
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.name())
            }
        }

        impl std::str::FromStr for $name {
            type Err = UnknownState;
            fn from_str(s: &str) -> Result<Self, UnknownState> {
                <Self as Machine>::parse(s)
            }
        }

        impl Machine for $name {
            const ALL: &'static [Self] = &[$(Self::$variant),+];
            const NAME: &'static str = $label;

            fn as_str(self) -> &'static str {
                self.name()
            }

            fn can_become(self, to: Self) -> bool {
                self.allows(to)
            }
        }
    };
}

states! {
    /// An event receipt: `accepted → processing → done | ignored | failed`;
    /// `unparsed` waits for its installation to be known (then `accepted`,
    /// or `failed` when it expires).
    ReceiptState, "receipt" {
        Accepted = "accepted",
        Processing = "processing",
        Done = "done",
        Ignored = "ignored",
        Failed = "failed",
        Unparsed = "unparsed",
    }
}

impl ReceiptState {
    /// Whether `self → to` is an allowed move ([`Machine::can_become`]).
    fn allows(self, to: Self) -> bool {
        use ReceiptState::*;
        matches!(
            (self, to),
            (Unparsed, Accepted | Failed)
                | (Accepted, Processing)
                // A redelivery takes over a receipt left processing by a
                // worker that died or timed out.
                | (Processing, Processing)
                // An event may end without being worked on (its work was
                // cancelled, or it was never going to be).
                | (Accepted | Processing, Done | Ignored | Failed)
                // A handler error is retried: the receipt is opened again.
                | (Failed, Processing)
        )
    }
}

states! {
    /// A decision: `calling` (inference holds the model call) → `proposed`
    /// → `approved` → `published`, or `review → approved | rejected`, or
    /// discarded: `stale | superseded | cancelled | suppressed`.
    DecisionStatus, "decision" {
        Calling = "calling",
        Proposed = "proposed",
        Review = "review",
        Suppressed = "suppressed",
        Approved = "approved",
        Rejected = "rejected",
        Published = "published",
        Stale = "stale",
        Superseded = "superseded",
        Cancelled = "cancelled",
    }
}

impl DecisionStatus {
    /// A decision discarded without a post.
    pub fn is_discard(self) -> bool {
        matches!(
            self,
            Self::Stale | Self::Superseded | Self::Cancelled | Self::Suppressed
        )
    }
}

impl DecisionStatus {
    /// Whether `self → to` is an allowed move ([`Machine::can_become`]).
    fn allows(self, to: Self) -> bool {
        use DecisionStatus::*;
        match (self, to) {
            // A redelivery of the holding message takes the lease over.
            (Calling, Calling) => true,
            (Calling, Proposed | Review) => true,
            (Calling | Proposed | Approved | Review, t) if t.is_discard() => true,
            (Proposed | Review, Approved) | (Review, Rejected) => true,
            // What Slack shows wins: a post found for a decision publishes
            // it, whatever was thought of it meanwhile (never a rejected
            // one, which nothing may post).
            (from, Published) => !matches!(from, Published | Rejected),
            _ => false,
        }
    }
}

states! {
    /// A reply intent: `pending → sending → sent`; `sending →
    /// failed_retryable → sending`; `sending → failed_permanent`; `sending →
    /// unknown → reconciling → sent | held | pending`; `pending |
    /// failed_retryable → withdrawn → sending`; an operator moves `held` to
    /// `pending` (repost) or `failed_permanent` (abandon). A stream: `sending
    /// → streaming → sent`, or `→ ending → interrupted` once Slack confirmed
    /// its early stop (`interrupted → sending` for the whole answer).
    IntentState, "reply intent" {
        Pending = "pending",
        Sending = "sending",
        Sent = "sent",
        FailedRetryable = "failed_retryable",
        FailedPermanent = "failed_permanent",
        Unknown = "unknown",
        Reconciling = "reconciling",
        Held = "held",
        Withdrawn = "withdrawn",
        Streaming = "streaming",
        Interrupted = "interrupted",
        Ending = "ending",
    }
}

impl IntentState {
    /// States in which an attempt owns the intent (a post may be in Slack).
    pub const IN_FLIGHT: [Self; 3] = [Self::Sending, Self::Unknown, Self::Reconciling];
}

impl IntentState {
    /// Whether `self → to` is an allowed move ([`Machine::can_become`]).
    fn allows(self, to: Self) -> bool {
        use IntentState::*;
        match (self, to) {
            (Pending | FailedRetryable | Withdrawn, Sending) => true,
            // A streamed answer: the start is the claimed side effect; once
            // Slack gave the stream's ts it is `streaming` until it stops
            // with the whole answer (`sent`) or is ended early with a
            // closing line (`interrupted`). An interrupted intent answered
            // nothing, so the one complete answer that may follow claims it
            // again (the publisher never streams it a second time).
            (Sending, Streaming) => true,
            // A stream that must stop before the whole answer (the thread
            // moved on, a switch, its publisher died, a stop Slack refused),
            // or one reconciliation found still open (an unknown start's, a
            // stop's whose answer was lost): `ending` until Slack confirms
            // it stopped; a refused stop keeps it `ending`, due again after
            // Slack's Retry-After.
            (Streaming | Unknown | Reconciling | Ending, Ending) => true,
            // Interrupted only once Slack confirmed the stream ended: its
            // stop with the closing line answered ok, or Slack shows it
            // ended without the answer (a stop whose answer was lost, a
            // stream expired or deleted, an unknown start found nowhere).
            (Streaming | Ending | Unknown | Reconciling, Interrupted) => true,
            (Interrupted, Sending) => true,
            // The attempt that owns it ends it one way or another.
            (
                Sending | Unknown | Reconciling,
                FailedRetryable | FailedPermanent | Pending | Held,
            ) => true,
            // A late answer of the attempt that owns it may find it already
            // marked unknown (by the sweeper): its code is recorded again.
            (Sending | Unknown | Reconciling, Unknown) => true,
            // A stream whose finishing stop's outcome is not known (it may
            // show the whole answer): reconciled from what Slack shows.
            (Streaming, Unknown) => true,
            (Unknown, Reconciling) => true,
            (Pending | FailedRetryable, Withdrawn) => true,
            (Held, Pending | FailedPermanent) => true,
            // A post seen in Slack is recorded whatever the intent's state
            // (a late answer to an attempt given up on, a reconciliation,
            // the whole answer of an intent whose stream was interrupted).
            // (the interrupted stream itself is never recorded as an
            // answer: its metadata names the intent as interrupted)
            (from, Sent) => from != Sent,
            _ => false,
        }
    }
}

states! {
    /// An installation: `active` while the app is installed and its token
    /// works; `disabled` once the workspace removed the app, revoked its
    /// token, or a refresh was refused for good (tokens purged); installed
    /// again, it is `active`.
    InstallationStatus, "installation" {
        Active = "active",
        Disabled = "disabled",
    }
}

impl InstallationStatus {
    /// Whether `self → to` is an allowed move ([`Machine::can_become`]).
    fn allows(self, to: Self) -> bool {
        self != to
    }
}

states! {
    /// A review request (the message a reviewer clicks, DESIGN §4 beside
    /// the reply intent): claimed like a reply, `posting → posted` with its
    /// ts, `posting → unknown` when Slack's answer was lost (the review
    /// channel's history is read before another attempt), `posting →
    /// failed` when Slack refused it for good. An attempt certainly not
    /// posted gives its claim back (the row goes).
    ReviewRequestState, "review request" {
        Posting = "posting",
        Posted = "posted",
        Unknown = "unknown",
        Failed = "failed",
    }
}

impl ReviewRequestState {
    /// Whether `self → to` is an allowed move ([`Machine::can_become`]).
    fn allows(self, to: Self) -> bool {
        use ReviewRequestState::*;
        match (self, to) {
            (Posting, Unknown | Failed) => true,
            // Another attempt: after an unknown outcome, or over an attempt
            // whose publisher died while posting.
            (Unknown | Posting, Posting) => true,
            // A request seen in Slack is recorded, whichever attempt posted
            // it and whatever a later attempt concluded.
            (from, Posted) => from != Posted,
            _ => false,
        }
    }
}

states! {
    /// A triggering request's place in its installation's line (DESIGN
    /// invariant 11): `parked` (over a budget, or its installation holds its
    /// share of the model's queue) `→ admitted` (its context is in the
    /// model's queue) when there is room again; a request with room is
    /// admitted at once. The row goes once inference settled its decision.
    WorkState, "tenant work" {
        Parked = "parked",
        Admitted = "admitted",
    }
}

impl WorkState {
    /// Whether `self → to` is an allowed move ([`Machine::can_become`]).
    fn allows(self, to: Self) -> bool {
        matches!((self, to), (WorkState::Parked, WorkState::Admitted))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip<M: Machine + std::str::FromStr<Err = UnknownState>>() {
        for s in M::ALL {
            assert_eq!(M::parse(s.as_str()), Ok(*s));
            assert_eq!(s.as_str().parse::<M>(), Ok(*s));
        }
        let err = M::parse("no_such_state").unwrap_err();
        assert_eq!(err.machine, M::NAME);
        assert!(err.to_string().contains("no_such_state"));
        let names: std::collections::HashSet<_> = M::ALL.iter().map(|s| s.as_str()).collect();
        assert_eq!(names.len(), M::ALL.len(), "{} has a name twice", M::NAME);
    }

    #[test]
    fn every_state_round_trips_through_its_name() {
        roundtrip::<ReceiptState>();
        roundtrip::<DecisionStatus>();
        roundtrip::<IntentState>();
        roundtrip::<ReviewRequestState>();
        roundtrip::<WorkState>();
        assert_eq!(WorkState::from_states(WorkState::Admitted), ["parked"]);
        assert!(WorkState::from_states(WorkState::Parked).is_empty());
    }

    #[test]
    fn a_review_request_is_posted_once_and_never_unposted() {
        use ReviewRequestState::*;
        for (from, to) in [
            (Posting, Posted),
            (Posting, Unknown),
            (Posting, Failed),
            (Unknown, Posting),
            (Posting, Posting),
            (Unknown, Posted),
            (Failed, Posted),
        ] {
            assert_eq!(ReviewRequestState::check(from, to), Ok(()), "{from} → {to}");
        }
        for (from, to) in [
            (Posted, Posting),
            (Posted, Unknown),
            (Posted, Failed),
            (Posted, Posted),
            (Failed, Posting),
            (Unknown, Failed),
        ] {
            assert!(
                ReviewRequestState::check(from, to).is_err(),
                "{from} → {to}"
            );
        }
    }

    #[test]
    fn design_section_4_moves_are_allowed() {
        use IntentState::*;
        for (from, to) in [
            (Pending, Sending),
            (Sending, Sent),
            (Sending, FailedRetryable),
            (FailedRetryable, Sending),
            (Sending, FailedPermanent),
            (Sending, Unknown),
            (Unknown, Reconciling),
            (Reconciling, Sent),
            (Reconciling, Held),
            (Reconciling, Pending),
            (Pending, Withdrawn),
            (FailedRetryable, Withdrawn),
            (Withdrawn, Sending),
            (Sending, Streaming),
            (Streaming, Sent),
            (Streaming, Ending),
            (Ending, Ending),
            (Ending, Interrupted),
            (Ending, Sent),
            (Unknown, Ending),
            (Interrupted, Sending),
            (Interrupted, Sent),
        ] {
            assert_eq!(IntentState::check(from, to), Ok(()), "{from} → {to}");
        }
        use DecisionStatus as D;
        for (from, to) in [
            (D::Calling, D::Proposed),
            (D::Proposed, D::Approved),
            (D::Approved, D::Published),
            (D::Proposed, D::Stale),
            (D::Proposed, D::Superseded),
            (D::Proposed, D::Cancelled),
            (D::Calling, D::Suppressed),
            (D::Calling, D::Review),
            (D::Review, D::Approved),
            (D::Review, D::Rejected),
        ] {
            assert_eq!(DecisionStatus::check(from, to), Ok(()), "{from} → {to}");
        }
        use ReceiptState as R;
        for (from, to) in [
            (R::Accepted, R::Processing),
            (R::Processing, R::Done),
            (R::Processing, R::Ignored),
            (R::Processing, R::Failed),
        ] {
            assert_eq!(ReceiptState::check(from, to), Ok(()), "{from} → {to}");
        }
    }

    #[test]
    fn moves_that_would_break_an_invariant_are_refused() {
        use IntentState::*;
        // Posting twice: nothing leaves `sent`, and only a claim enters `sending`.
        for to in IntentState::ALL {
            assert!(!Sent.can_become(*to), "sent → {to}");
        }
        assert_eq!(
            IntentState::from_states(Sending),
            ["pending", "failed_retryable", "withdrawn", "interrupted"]
        );
        // A stream is never started again for an intent, nor ended twice;
        // it is interrupted only once Slack confirmed it ended (from
        // `ending`, or as reconciliation read it).
        assert_eq!(IntentState::from_states(Streaming), ["sending"]);
        assert_eq!(
            IntentState::from_states(Interrupted),
            ["unknown", "reconciling", "streaming", "ending"]
        );
        assert!(!Interrupted.can_become(Ending));
        assert!(
            !Ending.can_become(Sending),
            "an open stream is never posted beside"
        );
        assert!(!Ending.can_become(Pending));
        assert!(!Streaming.can_become(Pending));
        assert!(Streaming.can_become(Unknown));
        // An unknown outcome is never simply retried: it is read first.
        assert!(!Unknown.can_become(Sending));
        assert!(!Held.can_become(Sending));
        assert!(!FailedPermanent.can_become(Pending));
        // A rejected answer is never published; a published one never discarded.
        use DecisionStatus as D;
        assert!(!D::Rejected.can_become(D::Published));
        assert!(!D::Published.can_become(D::Stale));
        assert!(!D::Published.can_become(D::Published));
        assert!(!D::Review.can_become(D::Proposed));
        let err = DecisionStatus::check(D::Rejected, D::Published).unwrap_err();
        assert_eq!(
            err.to_string(),
            "decision may not move from rejected to published"
        );
        // A finished receipt is never reopened, except a failure to retry.
        use ReceiptState as R;
        assert!(!R::Done.can_become(R::Processing));
        assert!(!R::Processing.can_become(R::Accepted));
        assert!(!R::Ignored.can_become(R::Processing));
        assert!(R::Failed.can_become(R::Processing));
    }

    /// Whether some move from another state leads to `to` (a state only
    /// ever created is not).
    fn is_reachable<M: Machine>(to: M) -> bool {
        M::ALL.iter().any(|from| *from != to && from.can_become(to))
    }

    #[test]
    fn every_state_but_the_first_can_be_reached() {
        for s in ReceiptState::ALL {
            assert_eq!(
                is_reachable(*s),
                !matches!(s, ReceiptState::Unparsed),
                "{s}"
            );
        }
        for s in DecisionStatus::ALL {
            assert_eq!(is_reachable(*s), *s != DecisionStatus::Calling, "{s}");
        }
        for s in IntentState::ALL {
            assert!(is_reachable(*s), "{s}");
        }
    }
}
