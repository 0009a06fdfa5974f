//! Shedding an installation's new work before it is acknowledged. Above
//! what the pipeline serves, the context-builder parks an installation's
//! requests beyond its share of the model's queue (DESIGN invariant 11),
//! and every one of them was still written first (receipt, outbox, apply,
//! its place in the line) and later leased, built and marked: work taken
//! that could not be served, paid for in Postgres by the work already
//! taken. Answered mentions a second fell to a fraction of what the
//! machine serves, and every answer waited.
//!
//! So each gateway counts, every [`WATCH_EVERY`], the requests of each
//! installation parked for their turn (`tenant_queue`; not those waiting
//! for a spent budget, which a retry would park all the same). While at
//! least `THREADLINE_SHED_PARKED` of an installation's wait, a delivery
//! over HTTP that would start new work in it — a person's top-level
//! message or mention in a channel — is answered 503 before anything is
//! written, on its first try and on Slack's first retry (which comes at
//! once). Slack keeps it and tries again after a minute, then after five;
//! those two tries are always taken: a burst delays a new question by
//! about a minute. The price is margin: such a question has two of
//! Slack's tries left, not four, and its last one comes about six minutes
//! after it was asked (a late event by the default
//! `THREADLINE_LATE_EVENT_MS`). Under overload that lasts beyond a minute,
//! the tries a minute later arrive at the offered rate: shedding eases
//! bursts, capacity must meet the rest. Another installation's questions
//! are taken as usual.
//!
//! Nothing that concerns a thread already asked in is held back: a reply
//! in a thread, an edit, a deletion, a direct message, a bot's message and
//! every other event are always taken, so the staleness rules see every
//! change Slack sent. Shedding for an installation stops once fewer than
//! half the bound wait. Counts that cannot be read shed nothing.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use sqlx::PgPool;
use threadline_domain::envelope::EventCallback;
use threadline_domain::event::{EventKind, MessageSubtype};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// How often the parked requests are counted.
pub const WATCH_EVERY: Duration = Duration::from_millis(250);

/// Slack's retries after this one come a minute and more later: taken.
const LAST_SHED_RETRY: i32 = 1;

pub struct Shedder {
    /// Parked requests of one installation from which its new work is
    /// shed (0: never).
    bound: u64,
    /// The installations shed now.
    over: RwLock<HashSet<Uuid>>,
    /// Whether `over` names any (read before taking its lock).
    any: AtomicBool,
}

impl Shedder {
    pub fn new(bound: u64) -> Arc<Self> {
        metrics::gauge!("threadline_gateway_shedding").set(0.0);
        metrics::gauge!("threadline_gateway_shedding_installations").set(0.0);
        Arc::new(Self {
            bound,
            over: RwLock::new(HashSet::new()),
            any: AtomicBool::new(false),
        })
    }

    /// Counts the parked requests until `shutdown`.
    pub async fn watch(self: Arc<Self>, pool: PgPool, shutdown: CancellationToken) {
        if self.bound == 0 {
            return;
        }
        // (those at half the bound or more: the ones shed now stay shed
        // until below half)
        let half = i64::try_from(self.bound.div_ceil(2)).unwrap_or(i64::MAX);
        let mut every = tokio::time::interval(WATCH_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failing = false;
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = every.tick() => {}
            }
            // (bounded: a count that hangs must not keep an old verdict)
            let counted = tokio::time::timeout(
                4 * WATCH_EVERY,
                threadline_store::budgets::parked_for_turn_at_least(&pool, half),
            )
            .await;
            match counted {
                Ok(Ok(counts)) => {
                    if failing {
                        tracing::info!("the parked requests are counted again");
                    }
                    failing = false;
                    self.observe(Some(&counts.into_iter().collect()));
                }
                failed => {
                    if !failing {
                        let error = match failed {
                            Ok(Err(e)) => e.to_string(),
                            _ => "timed out".to_owned(),
                        };
                        tracing::warn!(
                            error,
                            "the parked requests cannot be counted: nothing is shed until they can"
                        );
                    }
                    failing = true;
                    self.observe(None);
                }
            }
        }
    }

    /// Takes a count of the parked requests of the installations with at
    /// least half the bound (`None`: unreadable, nothing shed).
    fn observe(&self, counts: Option<&HashMap<Uuid, i64>>) {
        let bound = self.bound;
        let was = self.over.read().unwrap_or_else(|p| p.into_inner()).clone();
        let now: HashSet<Uuid> = match counts.filter(|_| bound > 0) {
            Some(counts) => counts
                .iter()
                .filter(|(inst, n)| {
                    over(was.contains(*inst), u64::try_from(**n).unwrap_or(0), bound)
                })
                .map(|(inst, _)| *inst)
                .collect(),
            None => HashSet::new(),
        };
        if now != was {
            *self.over.write().unwrap_or_else(|p| p.into_inner()) = now.clone();
            self.any.store(!now.is_empty(), Ordering::Release);
        }
        metrics::gauge!("threadline_gateway_shedding").set(f64::from(u8::from(!now.is_empty())));
        metrics::gauge!("threadline_gateway_shedding_installations").set(now.len() as f64);
        for inst in now.difference(&was) {
            tracing::warn!(
                alert = "gateway_shedding",
                installation_id = %inst,
                parked = counts.and_then(|c| c.get(inst)).copied().unwrap_or_default(),
                bound,
                "an installation's requests wait parked beyond the bound: its new top-level questions get 503 until fewer than half wait (Slack retries them after 1 and 5 minutes)"
            );
        }
        for inst in was.difference(&now) {
            tracing::info!(installation_id = %inst, "an installation's parked requests are below half the bound: its new questions are taken again");
        }
    }

    /// Whether any installation's new work is shed now (cheap: read before
    /// any parsing).
    pub fn active(&self) -> bool {
        self.any.load(Ordering::Acquire)
    }

    /// Whether new work of `installation`, on Slack's try `retry_num` (see
    /// [`may_shed`]), is shed now.
    pub fn sheds(&self, installation: Uuid, retry_num: i32) -> bool {
        let shed = self.active()
            && self
                .over
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .contains(&installation);
        if shed {
            metrics::counter!("threadline_gateway_shed_total", "retry" => if retry_num == 0 { "first" } else { "retry" })
                .increment(1);
        }
        shed
    }
}

/// With hysteresis: over from `bound` on, and, once over, until below half
/// of it.
fn over(was: bool, n: u64, bound: u64) -> bool {
    if was {
        n.saturating_mul(2) >= bound
    } else {
        n >= bound
    }
}

/// Whether Slack's try `retry_num` may be shed: its first try or its
/// immediate retry (checked before the body is parsed).
pub fn early_try(retry_num: i32) -> bool {
    retry_num <= LAST_SHED_RETRY
}

/// Whether this delivery, Slack's try `retry_num`, may be shed at all: new
/// work (see [`starts_new_work`]) on an [`early_try`]. Checked before its
/// installation is looked up.
pub fn may_shed(cb: &EventCallback, retry_num: i32) -> bool {
    early_try(retry_num) && starts_new_work(cb)
}

/// A person's new top-level message or mention in a channel: it starts a
/// thread of its own, so holding it back changes nothing another answer is
/// checked against. (A DM's messages are one conversation: never shed.)
fn starts_new_work(cb: &EventCallback) -> bool {
    let e = &cb.event;
    let plain = matches!(
        e.kind,
        EventKind::AppMention
            | EventKind::Message(MessageSubtype::Plain | MessageSubtype::FileShare)
    );
    plain
        && e.thread_ts.is_none()
        && e.bot_id.is_none()
        && e.user.is_some()
        && e.channel.as_ref().is_some_and(|c| !c.is_dm())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};
    use threadline_domain::envelope::Envelope;

    fn cb(event: Value) -> EventCallback {
        let body = json!({
            "type": "event_callback", "token": "x", "team_id": "T0TEAM", "api_app_id": "A0APP",
            "event_id": "Ev0SHED", "event_time": 1_700_000_000,
            "authorizations": [{"team_id": "T0TEAM", "user_id": "U0BOT", "is_bot": true,
                                "is_enterprise_install": false}],
            "event": event,
        });
        match Envelope::parse(&serde_json::to_vec(&body).expect("json")).expect("parses") {
            Envelope::EventCallback(cb) => *cb,
            other => panic!("not an event callback: {other:?}"),
        }
    }

    fn read(pairs: &[(Uuid, i64)]) -> HashMap<Uuid, i64> {
        pairs.iter().copied().collect()
    }

    #[test]
    fn an_installation_is_shed_from_the_bound_until_below_half_of_it() {
        let s = Shedder::new(10);
        let (busy, quiet) = (Uuid::now_v7(), Uuid::now_v7());
        s.observe(Some(&read(&[(busy, 9), (quiet, 5)])));
        assert!(!s.active());
        assert!(!s.sheds(busy, 0));
        s.observe(Some(&read(&[(busy, 10), (quiet, 5)])));
        assert!(s.active());
        assert!(s.sheds(busy, 0));
        assert!(
            !s.sheds(quiet, 0),
            "another installation's question is taken"
        );
        s.observe(Some(&read(&[(busy, 5), (quiet, 9)])));
        assert!(s.sheds(busy, 0), "still at half");
        assert!(!s.sheds(quiet, 0), "below its bound");
        // (the count returns only those at half the bound or more)
        s.observe(Some(&read(&[(quiet, 9)])));
        assert!(!s.sheds(busy, 0), "below half: taken again");
        assert!(!s.active());
        s.observe(Some(&read(&[(busy, 9)])));
        assert!(!s.sheds(busy, 0), "off until the bound again");
        s.observe(Some(&read(&[(busy, 12)])));
        assert!(s.sheds(busy, 0));
        s.observe(None);
        assert!(!s.sheds(busy, 0), "unreadable: nothing shed");
        let one = Shedder::new(1);
        one.observe(Some(&read(&[(busy, 1)])));
        assert!(one.sheds(busy, 0));
        one.observe(Some(&read(&[])));
        assert!(!one.sheds(busy, 0), "a bound of 1 stops when none waits");
        let never = Shedder::new(0);
        never.observe(Some(&read(&[(busy, 1_000_000)])));
        assert!(!never.sheds(busy, 0), "a bound of 0 never sheds");
    }

    #[test]
    fn only_a_persons_new_top_level_message_in_a_channel_on_an_early_try_may_be_shed() {
        let mention = json!({"type": "app_mention", "user": "U0ANA", "channel": "C0GEN",
                             "ts": "1700000000.000100", "event_ts": "1700000000.000100"});
        assert!(may_shed(&cb(mention.clone()), 0));
        assert!(
            may_shed(&cb(mention.clone()), 1),
            "Slack's first retry comes at once"
        );
        assert!(
            !may_shed(&cb(mention.clone()), 2),
            "a retry a minute later is taken"
        );
        assert!(!may_shed(&cb(mention.clone()), 3));
        let message = json!({"type": "message", "user": "U0ANA", "channel": "C0GEN",
                             "channel_type": "channel", "ts": "1700000000.000100"});
        assert!(may_shed(&cb(message.clone()), 0));
        let mut reply = mention.clone();
        reply["thread_ts"] = json!("1700000000.000050");
        assert!(!may_shed(&cb(reply), 0), "a reply in a thread");
        let mut dm = message.clone();
        dm["channel"] = json!("D0DM");
        assert!(!may_shed(&cb(dm), 0), "a direct message");
        let mut bot = message.clone();
        bot["bot_id"] = json!("B0OTHER");
        assert!(!may_shed(&cb(bot), 0), "a bot's message");
        let edit = json!({"type": "message", "subtype": "message_changed", "channel": "C0GEN",
                          "ts": "1700000000.000200",
                          "message": {"type": "message", "user": "U0ANA", "ts": "1700000000.000100"}});
        assert!(!may_shed(&cb(edit), 0), "an edit");
        let deleted = json!({"type": "message", "subtype": "message_deleted", "channel": "C0GEN",
                             "ts": "1700000000.000200", "deleted_ts": "1700000000.000100"});
        assert!(!may_shed(&cb(deleted), 0), "a deletion");
    }
}
