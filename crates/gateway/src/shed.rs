//! Shedding new work before it is acknowledged. Above what the pipeline
//! serves, every acknowledged delivery is written (receipt, outbox, apply)
//! whatever becomes of it, and that writing takes Postgres from the work
//! already taken: answered mentions a second fell to a fraction of what
//! the machine serves, and every answer waited. So while at least
//! `THREADLINE_SHED_EVENTS_BACKLOG` events wait in the events stream (read
//! every [`WATCH_EVERY`]; unacknowledged ones, a worker's read-ahead among
//! them), a delivery over HTTP that would start new work — a person's
//! top-level message or mention in a channel — is answered 503 before
//! anything is written, on its first try and on Slack's first retry
//! (which comes at once). Slack keeps it and tries again after a minute,
//! then after five; those two tries are always taken: a burst delays a new
//! question by about a minute. The price is margin: such a question has
//! two of Slack's tries left, not four, and its last one comes about six
//! minutes after it was asked (a late event by the default
//! `THREADLINE_LATE_EVENT_MS`). Under overload that lasts beyond a minute,
//! the tries a minute later arrive at the offered rate: shedding eases
//! bursts, capacity must meet the rest.
//!
//! Nothing that concerns a thread already asked in is held back: a reply
//! in a thread, an edit, a deletion, a direct message, a bot's message and
//! every other event are always taken, so the staleness rules see every
//! change Slack sent. Shedding stops once the backlog is below half the
//! bound. A backlog that cannot be read sheds nothing, nor does a gateway
//! without a broker connection (neither spool nor relay).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_nats::jetstream;
use threadline_domain::envelope::EventCallback;
use threadline_domain::event::{EventKind, MessageSubtype};
use threadline_runtime::bus::{Topic, Topology};
use tokio_util::sync::CancellationToken;

/// How often the backlog is read.
pub const WATCH_EVERY: Duration = Duration::from_millis(250);

/// Slack's retries after this one come a minute and more later: taken.
const LAST_SHED_RETRY: i32 = 1;

pub struct Shedder {
    /// Events waiting above which new work is shed (0: never).
    bound: u64,
    shedding: AtomicBool,
}

impl Shedder {
    pub fn new(bound: u64) -> Arc<Self> {
        Arc::new(Self {
            bound,
            shedding: AtomicBool::new(false),
        })
    }

    /// Reads the backlog from the events stream until `shutdown`.
    pub async fn watch(
        self: Arc<Self>,
        js: jetstream::Context,
        topology: Topology,
        shutdown: CancellationToken,
    ) {
        if self.bound == 0 {
            return;
        }
        let mut every = tokio::time::interval(WATCH_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = every.tick() => {}
            }
            let n = topology.depth(&js, Topic::Events).await;
            self.observe(n.map(|(n, _)| n));
        }
    }

    /// Takes a reading of the backlog (`None`: unreadable, nothing shed).
    fn observe(&self, backlog: Option<u64>) {
        let was = self.shedding.load(Ordering::Acquire);
        let now = match backlog.filter(|_| self.bound > 0) {
            Some(n) => {
                metrics::gauge!("threadline_gateway_events_backlog").set(n as f64);
                if was {
                    // (until below half the bound)
                    n.saturating_mul(2) >= self.bound
                } else {
                    n >= self.bound
                }
            }
            None => false,
        };
        if now == was {
            return;
        }
        self.shedding.store(now, Ordering::Release);
        metrics::gauge!("threadline_gateway_shedding").set(f64::from(u8::from(now)));
        match backlog {
            Some(n) if now => tracing::warn!(
                alert = "gateway_shedding",
                backlog = n,
                bound = self.bound,
                "more events wait than the pipeline serves: new top-level questions get 503 until the backlog halves (Slack retries them after 1 and 5 minutes)"
            ),
            Some(n) => tracing::info!(backlog = n, "the backlog halved: shedding stopped"),
            None => tracing::warn!("the events' backlog cannot be read: shedding stopped"),
        }
    }

    /// Whether shedding is on (cheap: read before any parsing).
    pub fn active(&self) -> bool {
        self.shedding.load(Ordering::Acquire)
    }

    /// Whether this delivery, Slack's try `retry_num`, is shed now.
    pub fn sheds(&self, cb: &EventCallback, retry_num: i32) -> bool {
        let shed = self.active() && retry_num <= LAST_SHED_RETRY && starts_new_work(cb);
        if shed {
            metrics::counter!("threadline_gateway_shed_total", "retry" => if retry_num == 0 { "first" } else { "retry" })
                .increment(1);
        }
        shed
    }
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

    #[test]
    fn shedding_starts_at_the_bound_and_stops_below_half_of_it() {
        let s = Shedder::new(100);
        let mention = cb(
            json!({"type": "app_mention", "user": "U0ANA", "channel": "C0GEN",
                                "ts": "1700000000.000100"}),
        );
        s.observe(Some(99));
        assert!(!s.sheds(&mention, 0));
        s.observe(Some(100));
        assert!(s.sheds(&mention, 0));
        assert!(s.sheds(&mention, 1), "Slack's first retry comes at once");
        assert!(!s.sheds(&mention, 2), "a retry a minute later is taken");
        assert!(!s.sheds(&mention, 3));
        s.observe(Some(50));
        assert!(s.sheds(&mention, 0), "still at half");
        s.observe(Some(49));
        assert!(!s.sheds(&mention, 0));
        s.observe(Some(99));
        assert!(!s.sheds(&mention, 0), "off until the bound again");
        let one = Shedder::new(1);
        one.observe(Some(1));
        assert!(one.sheds(&mention, 0));
        one.observe(Some(0));
        assert!(!one.sheds(&mention, 0), "a bound of 1 stops when empty");
        s.observe(Some(500));
        s.observe(None);
        assert!(!s.sheds(&mention, 0), "an unreadable backlog sheds nothing");
        let never = Shedder::new(0);
        never.observe(Some(1_000_000));
        assert!(!never.sheds(&mention, 0), "a bound of 0 never sheds");
    }

    #[test]
    fn only_a_persons_new_top_level_message_in_a_channel_starts_new_work() {
        let mention = json!({"type": "app_mention", "user": "U0ANA", "channel": "C0GEN",
                             "ts": "1700000000.000100", "event_ts": "1700000000.000100"});
        assert!(starts_new_work(&cb(mention.clone())));
        let message = json!({"type": "message", "user": "U0ANA", "channel": "C0GEN",
                             "channel_type": "channel", "ts": "1700000000.000100"});
        assert!(starts_new_work(&cb(message.clone())));
        let mut reply = mention.clone();
        reply["thread_ts"] = json!("1700000000.000050");
        assert!(!starts_new_work(&cb(reply)), "a reply in a thread");
        let mut dm = message.clone();
        dm["channel"] = json!("D0DM");
        assert!(!starts_new_work(&cb(dm)), "a direct message");
        let mut bot = message.clone();
        bot["bot_id"] = json!("B0OTHER");
        assert!(!starts_new_work(&cb(bot)), "a bot's message");
        let edit = json!({"type": "message", "subtype": "message_changed", "channel": "C0GEN",
                          "ts": "1700000000.000200",
                          "message": {"type": "message", "user": "U0ANA", "ts": "1700000000.000100"}});
        assert!(!starts_new_work(&cb(edit)), "an edit");
        let deleted = json!({"type": "message", "subtype": "message_deleted", "channel": "C0GEN",
                             "ts": "1700000000.000200", "deleted_ts": "1700000000.000100"});
        assert!(!starts_new_work(&cb(deleted)), "a deletion");
    }
}
