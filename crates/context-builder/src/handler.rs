//! Handling one accepted event: classify it, apply it to the thread store,
//! and for a trigger build the versioned context and publish it.

use std::ops::ControlFlow;

use async_nats::jetstream;
use futures::FutureExt as _;
use prost::Message as _;
use secrecy::ExposeSecret as _;
use sqlx::PgPool;
use threadline_domain::agent_view;
use threadline_domain::assistant;
use threadline_domain::budget::ParkReason;
use threadline_domain::classify::{self, Outcome};
use threadline_domain::late::{self, LateOutcome};
use threadline_domain::state::{ReceiptState, WorkState};
use threadline_proto::v1::{ContextMessage, ContextReady, EventAccepted, SCHEMA_VERSION};
use threadline_runtime::bus::{Topic, Topology};
use threadline_runtime::worker::Disposition;
use threadline_slack::{WebClient, WebError};
use threadline_tenancy::secrets::TokenKeys;
use tracing::Instrument as _;
use uuid::Uuid;

use crate::backfill::{self, BackfillLimits, Completeness};
use crate::context::Limits;
use crate::store::{self, Installation};

pub struct Handler {
    pub pool: PgPool,
    pub js: jetstream::Context,
    pub topology: Topology,
    pub web: WebClient,
    pub cipher: TokenKeys,
    /// Refreshes rotating tokens before they expire (when client credentials are set).
    pub refresher: Option<threadline_tenancy::tokens::Refresher>,
    pub limits: Limits,
    pub backfill: BackfillLimits,
    /// Opens events of concurrent handlers, one statement per batch.
    pub opens: Opens,
    /// Applies events of concurrent handlers, one transaction per batch.
    pub applies: Applies,
    /// Builds contexts of concurrent handlers, one transaction per batch.
    pub builds: Builds,
    /// Finishes receipts as done once their contexts are published, one
    /// statement per batch.
    pub finishes: Finishes,
    /// An event that reaches the gateway this long after it happened is
    /// late (`THREADLINE_LATE_EVENT_MS`).
    pub late_after: std::time::Duration,
    /// How requests are admitted: the budgets of an installation without
    /// its own and its share of the model's queue, for a rebuild's place
    /// and charge (`THREADLINE_BUDGET_*`, `THREADLINE_TENANT_QUEUE_SHARE`).
    pub admission: store::AdmitRules,
}

/// A request whose context is built: its event, receipt and message, and
/// how late Slack delivered it when its answer says so.
struct Asked<'a> {
    event_id: &'a str,
    receipt: Uuid,
    source_ts: &'a str,
    noted_late: Option<std::time::Duration>,
}

/// The batcher of [`store::open_many`]: `(installation, receipt, channel)`.
pub type Opens = threadline_runtime::batch::Batcher<(Uuid, Uuid, String), store::Opened>;

/// The pool of the single-statement batches (opens and finishes), their
/// share of the process's connections.
pub fn statement_pool(pool: &PgPool) -> PgPool {
    threadline_runtime::db::generic_plan_pool(pool, threadline_runtime::batch::CONNECTIONS)
}

/// Starts the batcher that opens events (at most `max_batch` in one
/// statement), on [`statement_pool`].
pub fn opens(pool: &PgPool, max_batch: usize) -> Opens {
    let pool = pool.clone();
    threadline_runtime::batch::Batcher::spawn(
        "receipt_open",
        2,
        max_batch,
        move |events: Vec<_>| {
            let pool = pool.clone();
            async move {
                let r = store::open_many(&pool, &events).await;
                (events, r)
            }
        },
    )
}

/// The batcher of [`store::apply_many`].
pub type Applies = threadline_runtime::batch::Batcher<store::ApplyJob, store::ApplyOutcome>;

/// Batches of applies in flight at once in one process, each runner
/// serving the installations keyed to it ([`applies`]): one
/// installation's applies run on one runner, one batch at a time, and
/// four let four installations' batches go on side by side. (A batch's
/// events run one after another on its connection; one runner for every
/// installation made each event wait for the round trips of all before
/// it, measured before the budget buckets' lock serialised an
/// installation's batches anyway.)
pub const APPLY_RUNNERS: usize = 4;

/// Starts the batcher that applies events (at most `max_batch` in one
/// transaction, [`APPLY_RUNNERS`] transactions at once). An installation's
/// events go to one runner ([`Batcher::spawn_keyed`]), in batches:
/// * every batch that admits a request locks its installation's budget
///   bucket until it commits, so an installation's batches on four runners
///   waited for each other's commits one by one (measured: that lock was
///   the longest wait of an apply at 100 mentions a second, 6.4 ms a
///   call); on one runner they wait as a batch instead;
/// * an `app_mention` and its `message` twin claim one person's action,
///   and a thread's events lock its row: split across two runners, the
///   second waited for the first's whole batch to commit.
///
/// That holds within one process: two replicas' batches of one
/// installation still meet at its bucket, as before. The price: an
/// installation's applies in one process run one batch at a time; a runner
/// whose batch reruns event by event (after a lock timeout, each event
/// waiting at most [`store::APPLY_LOCK_TIMEOUT`]) holds up the
/// installations keyed to it while the others go on; and an installation
/// that shares a busy one's runner waits a batch or two. Batches take
/// threads in key order, so two of them (in this process or another)
/// rarely wait on each other crosswise; a cycle that remains is a deadlock
/// Postgres breaks, and the batcher reruns those events one by one.
///
/// [`Batcher::spawn_keyed`]: threadline_runtime::batch::Batcher::spawn_keyed
pub fn applies(pool: &PgPool, max_batch: usize, rules: store::AdmitRules) -> Applies {
    let pool = pool.clone();
    let rules = std::sync::Arc::new(rules);
    threadline_runtime::batch::Batcher::spawn_keyed(
        "event_apply",
        APPLY_RUNNERS,
        max_batch,
        |job: &store::ApplyJob| {
            use std::hash::{Hash as _, Hasher as _};
            let mut h = std::hash::DefaultHasher::new();
            job.installation.hash(&mut h);
            h.finish()
        },
        move |jobs: Vec<_>| {
            let (pool, rules) = (pool.clone(), rules.clone());
            async move {
                let r = store::apply_many(&pool, &jobs, &rules).await;
                (jobs, r)
            }
        },
    )
}

/// The batcher of [`store::build_many`].
pub type Builds = threadline_runtime::batch::Batcher<store::BuildJob, store::BuildOutcome>;

/// Batches of builds in flight at once in one process. A batch takes about
/// five statements whatever its size; only a long thread's further pages
/// of replies are read one thread after another, so two runners keep a
/// second batch going while one waits, within the process's connections.
pub const BUILD_RUNNERS: usize = 2;

/// Starts the batcher that builds contexts (at most `max_batch` in one
/// transaction, [`BUILD_RUNNERS`] transactions at once).
pub fn builds(pool: &PgPool, max_batch: usize) -> Builds {
    let pool = pool.clone();
    threadline_runtime::batch::Batcher::spawn(
        "context_build",
        BUILD_RUNNERS,
        max_batch,
        move |jobs: Vec<_>| {
            let pool = pool.clone();
            async move {
                let r = store::build_many(&pool, &jobs).await;
                (jobs, r)
            }
        },
    )
}

/// The batcher of [`store::finish_done_many`].
pub type Finishes = threadline_runtime::batch::Batcher<store::Ending, bool>;

/// Starts the batcher that finishes receipts as done (at most `max_batch`
/// in one statement), on [`statement_pool`].
pub fn finishes(pool: &PgPool, max_batch: usize) -> Finishes {
    let pool = pool.clone();
    threadline_runtime::batch::Batcher::spawn(
        "receipt_done",
        2,
        max_batch,
        move |endings: Vec<_>| {
            let pool = pool.clone();
            async move {
                let r = store::finish_done_many(&pool, &endings).await;
                (endings, r)
            }
        },
    )
}

/// `app_uninstalled`, or `tokens_revoked` naming our bot user.
fn lifecycle_reason(
    event_type: &str,
    event: &serde_json::Value,
    inst: &Installation,
) -> Option<&'static str> {
    match event_type {
        "app_uninstalled" => Some("app_uninstalled"),
        "tokens_revoked" => {
            let bots = event
                .pointer("/tokens/bot")
                .and_then(serde_json::Value::as_array)?;
            bots.iter()
                .any(|u| u.as_str() == Some(inst.identity.bot_user_id.as_str()))
                .then_some("tokens_revoked")
        }
        _ => None,
    }
}

fn ignored(reason: &'static str) -> Result<Step, anyhow::Error> {
    Ok(Step::Ignored(reason))
}

/// What resuming a parked request came to ([`Handler::resume`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resumption {
    /// Its context was built and published: it is admitted.
    Built,
    /// It will never be answered (its installation gone, its question
    /// deleted): its place was dropped.
    Dropped,
    /// An answer of its thread is on its way ([`Step::AnswerOnItsWay`]):
    /// it stays leased for this long, and is resumed again after.
    NotYet(std::time::Duration),
}

pub(crate) enum Step {
    Ignored(&'static str),
    Done,
    /// Waiting out its asker's quiet period (double texting): handed back
    /// and built after this long.
    Quiet(std::time::Duration),
    /// A reply whose burst reading waits for an answer of its thread on
    /// its way (it decides whether the reply reads the burst before its
    /// thread's root): handed back and built after this long.
    AnswerOnItsWay(std::time::Duration),
    /// A question in an agent's Messages tab whose tab's earlier event is
    /// still being handled: handed back and built after this long.
    TabEventPending(std::time::Duration),
    /// Parked for its installation's budget or share (DESIGN invariant 11).
    Parked(ParkReason),
}

/// How long a question waits for its tab's earlier event before it asks
/// again ([`Step::TabEventPending`]).
const TAB_EVENT_WAIT: std::time::Duration = std::time::Duration::from_millis(200);

impl Handler {
    /// Decodes and handles one bus message.
    pub async fn handle(&self, payload: &[u8]) -> Disposition {
        let Ok(ev) = EventAccepted::decode(payload) else {
            return Disposition::Poison("undecodable EventAccepted".into());
        };
        let Ok(receipt) = Uuid::parse_str(&ev.receipt_id) else {
            return Disposition::Poison("EventAccepted without a receipt id".into());
        };
        let span = tracing::info_span!("context.build", event_id = %ev.event_id, receipt_id = %receipt, outcome = tracing::field::Empty);
        // A panic on this event is a failure of it like any other: counted
        // on its receipt, which is failed visibly at the limit.
        let processed =
            std::panic::AssertUnwindSafe(self.process(&ev, receipt).instrument(span.clone()))
                .catch_unwind()
                .await
                .unwrap_or_else(|_| Err(anyhow::anyhow!("the handler panicked")));
        match processed {
            Ok(Step::Done) => {
                span.record("outcome", "context");
                Disposition::Done
            }
            Ok(Step::Quiet(wait)) => {
                span.record("outcome", "quiet");
                Disposition::Defer(wait)
            }
            Ok(Step::AnswerOnItsWay(wait)) => {
                span.record("outcome", "answer_on_its_way");
                Disposition::Defer(wait)
            }
            Ok(Step::TabEventPending(wait)) => {
                span.record("outcome", "tab_event_pending");
                metrics::counter!("threadline_agent_tab_waits_total").increment(1);
                Disposition::Defer(wait)
            }
            Ok(Step::Parked(reason)) => {
                span.record("outcome", WorkState::Parked.name());
                metrics::counter!("threadline_requests_parked_total", "reason" => reason.as_str())
                    .increment(1);
                Disposition::Done
            }
            Ok(Step::Ignored(reason)) => {
                span.record("outcome", reason);
                metrics::counter!("threadline_events_ignored_total", "reason" => reason)
                    .increment(1);
                Disposition::Done
            }
            Err(e) => {
                tracing::warn!(parent: &span, error = format!("{e:#}"), "event handling failed; retrying");
                match threadline_tenancy::fault::disposition(&e) {
                    Disposition::Fail(reason) => self.failed(receipt, reason).await,
                    other => other,
                }
            }
        }
    }

    /// A failure that is not transient, counted on the receipt (whichever
    /// replica saw it): after [`FAILURE_LIMIT`] the receipt is failed with
    /// its reason — the answers of its thread stop waiting for it, and an
    /// operator sees why — and the message is dead-lettered (a replay
    /// reopens it).
    async fn failed(&self, receipt: Uuid, reason: String) -> Disposition {
        match store::note_failure(&self.pool, receipt).await {
            Ok(Some(n)) if n >= threadline_runtime::worker::FAILURE_LIMIT as i32 => {
                tracing::error!(alert = "event_failed", receipt_id = %receipt, failures = n, "event failed for good; dead-lettered");
                Disposition::Poison(format!("failed {n} times: {reason}"))
            }
            Ok(_) => Disposition::Fail(reason),
            // Counting needs the database: retried like any outage.
            Err(_) => Disposition::Transient,
        }
    }

    /// One event: opened (its installation and policy read, its receipt
    /// begun), routed (a lifecycle or pane event), classified under the
    /// channel's policy, applied to the thread store, and for a trigger its
    /// context built and published.
    async fn process(&self, ev: &EventAccepted, receipt: Uuid) -> anyhow::Result<Step> {
        let inst_id = Uuid::parse_str(&ev.installation_id)?;
        let opened = self
            .opens
            .submit((inst_id, receipt, ev.channel_id.clone()))
            .await?;
        // (the batch's statement runs outside this span)
        tracing::debug!(
            known = opened.installation.is_some(),
            begun = opened.begun,
            "event opened"
        );
        let Some((inst, policy)) = opened.installation.clone() else {
            return self
                .end(ev, receipt, ReceiptState::Ignored, "unknown_installation")
                .await;
        };
        if !inst.active {
            return self
                .end(ev, receipt, ReceiptState::Ignored, "installation_disabled")
                .await;
        }
        if !opened.begun {
            // Finished before (a redelivery after the ack was lost).
            return Ok(Step::Done);
        }
        let event: serde_json::Value = match serde_json::from_slice(&ev.event_json) {
            Ok(v) => v,
            Err(_) => {
                return self
                    .end(ev, receipt, ReceiptState::Failed, "undecodable_event")
                    .await;
            }
        };
        if let Some(step) = self.route(ev, receipt, &inst, &policy, &event).await? {
            return Ok(step);
        }
        let c = self.classified(ev, &inst, &policy, &opened, &event).await?;
        let (c, late) = self.timed(ev, &inst, c).await?;
        let (source_ts, root) = match self.apply(ev, receipt, &inst, c, late).await? {
            store::Next::Ignored(reason) => return ignored(reason),
            store::Next::Parked(reason) => return Ok(Step::Parked(reason)),
            store::Next::Build {
                source_ts, root, ..
            } => (source_ts, root),
        };
        if let Some(wait) = self.quiet_wait(&inst, ev.received_at_unix_ms) {
            // (its change is applied; a redelivery finds it so)
            return Ok(Step::Quiet(wait));
        }
        let channel = ev.channel_id.as_str();
        // A question in an agent's Messages tab waits while the tab's
        // events before it are handled (opened, what the person looks
        // at): it is answered with what they looked at when they asked.
        if threadline_domain::ids::is_dm(channel)
            && threadline_store::agent_view::tab_event_pending(
                &self.pool, inst.id, channel, &source_ts,
            )
            .await?
        {
            return Ok(Step::TabEventPending(TAB_EVENT_WAIT));
        }
        // A reply in a thread never seen: read the thread from Slack first
        // (no transaction is open during the call).
        if root != source_ts && !store::has_message(&self.pool, inst.id, channel, &root).await? {
            self.backfill(&inst, channel, &root).await?;
        }
        let asked = Asked {
            event_id: &ev.event_id,
            receipt,
            source_ts: &source_ts,
            noted_late: late
                .filter(|l| l.outcome == LateOutcome::Noted)
                .map(|l| l.age),
        };
        self.build_and_publish(asked, &inst, channel, &root).await
    }

    /// How late Slack delivered the event, when past the configured age
    /// (from its own time to the gateway's receipt), and what that makes
    /// of it: a request as its installation's policy says (skipped, it is
    /// no request any more), anything else only recorded.
    async fn timed(
        &self,
        ev: &EventAccepted,
        inst: &Installation,
        c: classify::Classification,
    ) -> anyhow::Result<(classify::Classification, Option<store::Late>)> {
        let age = late::age(ev.event_time, &ev.message_ts, ev.received_at_unix_ms);
        let Some(age) = late::late_by(age, self.late_after) else {
            return Ok((c, None));
        };
        let outcome = match c.outcome {
            Outcome::Trigger(_) => threadline_store::late::action(&self.pool, inst.id)
                .await?
                .outcome(),
            Outcome::Ignore(_) => LateOutcome::Recorded,
        };
        tracing::info!(
            age_ms = age.as_millis() as u64,
            outcome = outcome.as_str(),
            "event delivered late"
        );
        let c = match outcome {
            LateOutcome::Skipped => classify::Classification {
                outcome: Outcome::Ignore(classify::IgnoreReason::Late),
                ..c
            },
            _ => c,
        };
        Ok((c, Some(store::Late { age, outcome })))
    }

    /// Events that are not a thread's: the app removed or its token revoked
    /// (all outbound work of the installation stops, its tokens dropped),
    /// the assistant pane's, and the agent messaging experience's
    /// ([`crate::agent`]). `None`: a thread's event.
    async fn route(
        &self,
        ev: &EventAccepted,
        receipt: Uuid,
        inst: &Installation,
        policy: &classify::TriggerPolicy,
        event: &serde_json::Value,
    ) -> anyhow::Result<Option<Step>> {
        let kind = event
            .get("type")
            .and_then(serde_json::Value::as_str)
            .unwrap_or("");
        if let Some(reason) = lifecycle_reason(kind, event, inst) {
            store::disable(&self.pool, inst.id, reason).await?;
            metrics::counter!("threadline_installations_disabled_total", "reason" => reason)
                .increment(1);
            tracing::warn!(alert = "installation_disabled", reason, installation_id = %inst.id, "installation disabled; tokens purged");
            return Ok(Some(
                self.end(ev, receipt, ReceiptState::Done, reason).await?,
            ));
        }
        if matches!(kind, assistant::STARTED | assistant::CONTEXT_CHANGED) {
            return Ok(Some(
                self.assistant_event(ev, receipt, inst, policy, event)
                    .await?,
            ));
        }
        if matches!(kind, agent_view::HOME_OPENED | agent_view::CONTEXT_CHANGED) {
            return Ok(Some(
                self.agent_event(ev, receipt, inst, policy, event).await?,
            ));
        }
        Ok(None)
    }

    /// The event classified (trigger, state change, ignored) under the
    /// channel's policy, with the channel's kind learned or looked up when
    /// a trigger needs it.
    async fn classified(
        &self,
        ev: &EventAccepted,
        inst: &Installation,
        policy: &classify::TriggerPolicy,
        opened: &store::Opened,
        event: &serde_json::Value,
    ) -> anyhow::Result<classify::Classification> {
        let channel = ev.channel_id.as_str();
        let c = classify::classify(event, &inst.identity, policy);
        let mut facts = classify::ChannelFacts::of(event, ev.is_ext_shared_channel);
        if let (Some(private), Some(_)) = (facts.private, event.get("channel_type")) {
            // What `open` read is current: the write would change nothing.
            if !(opened.kind_fresh && opened.channel_private == Some(private)) {
                store::learn_channel_kind(&self.pool, inst.id, channel, private, "event").await?;
            }
        }
        if matches!(c.outcome, Outcome::Trigger(_)) && facts.needs_lookup(policy) {
            facts.private = match opened.channel_private {
                Some(known) => Some(known),
                None => self.channel_kind(inst, channel).await?,
            };
        }
        let c = classify::apply_channel_policy(c, facts, policy);

        Ok(c)
    }

    /// The event applied to the thread store (with the other handlers'
    /// events, in one transaction): what it crossed, cancelled or changed
    /// is counted; what comes next for it.
    async fn apply(
        &self,
        ev: &EventAccepted,
        receipt: Uuid,
        inst: &Installation,
        c: classify::Classification,
        late: Option<store::Late>,
    ) -> anyhow::Result<store::Next> {
        let channel = ev.channel_id.as_str();
        // (with the other handlers' events: one transaction)
        let applied = self
            .applies
            .submit(store::ApplyJob {
                installation: inst.id,
                channel: channel.to_owned(),
                receipt,
                event_id: ev.event_id.clone(),
                classified: c,
                late,
            })
            .await?;
        if let (Some(l), true) = (late, applied.late_recorded) {
            metrics::counter!("threadline_late_events_total", "outcome" => l.outcome.as_str())
                .increment(1);
        }
        if applied.doubled {
            // One person's action delivered as another message: recorded,
            // never answered (the message it repeats is).
            metrics::counter!("threadline_doubled_messages_total").increment(1);
            tracing::info!(
                channel,
                "a message repeating a person's action was recorded"
            );
        }
        if let Some(s) = applied.stood_in.as_ref().filter(|s| s.shown || s.asked) {
            // The message kept for an action was deleted while a copy of
            // it still shows: the copy took its place.
            metrics::counter!("threadline_doubled_stand_ins_total", "asked" => if s.asked { "yes" } else { "no" })
                .increment(1);
        }
        if applied.released_asked > 0 {
            // (copies that had taken the place of requests the deletion
            // released of its burst, asked in their place)
            metrics::counter!("threadline_doubled_stand_ins_total", "asked" => "yes")
                .increment(applied.released_asked as u64);
        }
        if applied.crossed > 0 {
            // (its reconsideration was queued in the same transaction)
            threadline_runtime::outbox::crossed_in_flight(applied.crossed, "context-builder");
        }
        if applied.cancelled > 0 {
            tracing::info!(
                cancelled = applied.cancelled,
                "deleted source cancelled pending work"
            );
        }
        if applied.noted {
            metrics::counter!("threadline_budget_notes_total").increment(1);
        }
        if applied.answered_source_changed {
            // Policy: record and notify; never a second automatic answer.
            metrics::counter!("threadline_answered_source_changed_total").increment(1);
            tracing::warn!(
                alert = "answered_source_changed",
                channel,
                "a message was edited after it was answered"
            );
        }
        Ok(applied.next)
    }

    /// A proposal went stale: look at the thread again and, if its latest
    /// request still has no answer, build a fresh context for it (a new
    /// version, so a new decision). The old answer is never posted.
    pub async fn reconsider(&self, payload: &[u8]) -> Disposition {
        let Ok(r) = threadline_proto::v1::Reconsider::decode(payload) else {
            return Disposition::Poison("undecodable Reconsider".into());
        };
        let Ok(inst_id) = Uuid::parse_str(&r.installation_id) else {
            return Disposition::Poison("Reconsider without an installation".into());
        };
        // (`Some`: the rebuild waits for an answer of the thread on its
        // way, handed back after this long)
        let result: anyhow::Result<Option<std::time::Duration>> = async {
            // Crossings recorded from here on wait for the next
            // reconsideration: this one may read the thread before them.
            let started = store::clock(&self.pool).await?;
            // Gone or disabled: nothing to rebuild.
            let active = store::installation(&self.pool, inst_id)
                .await?
                .filter(|i| i.active);
            let Some(inst) = active else {
                store::crossed_reconsidered(
                    &self.pool,
                    inst_id,
                    &r.channel_id,
                    &r.root_ts,
                    "installation_inactive",
                    started,
                )
                .await?;
                return Ok(None);
            };
            let latest = store::latest_turn(&self.pool, inst.id, &r.channel_id, &r.root_ts).await?;
            let result = match latest {
                Some(t) if !t.answered => match self.rebuild(&inst, &r, &t).await? {
                    ControlFlow::Continue(result) => result,
                    ControlFlow::Break(wait) => {
                        metrics::counter!("threadline_reconsiderations_handled_total", "result" => "answer_on_its_way")
                            .increment(1);
                        return Ok(Some(wait));
                    }
                },
                _ => "no_reply_needed",
            };
            metrics::counter!("threadline_reconsiderations_handled_total", "result" => result)
                .increment(1);
            // Answers crossed in flight in this thread: what was decided.
            store::crossed_reconsidered(
                &self.pool,
                inst.id,
                &r.channel_id,
                &r.root_ts,
                result,
                started,
            )
            .await?;
            Ok(None)
        }
        .await;
        match result {
            Ok(None) => Disposition::Done,
            Ok(Some(wait)) => Disposition::Defer(wait),
            Err(e) => {
                tracing::warn!(error = format!("{e:#}"), "reconsideration failed; retrying");
                threadline_tenancy::fault::disposition(&e)
            }
        }
    }

    /// The thread's latest request rebuilt, unless it waits parked (the
    /// resumer builds it, from the thread as it is then); a place it took
    /// for a build that came to nothing goes again. `Break`: an answer of
    /// the thread is on its way ([`Step::AnswerOnItsWay`]); the rebuild is
    /// handed back after this long, asked before it takes a place (one
    /// that came on its way meanwhile frees the place it took).
    async fn rebuild(
        &self,
        inst: &Installation,
        r: &threadline_proto::v1::Reconsider,
        t: &store::LatestTurn,
    ) -> anyhow::Result<ControlFlow<std::time::Duration, &'static str>> {
        // (waiting before it takes a place: each hand-back would be
        // charged a model call)
        if let Some(wait) = self
            .waits_for_thread_answer(inst, &r.channel_id, &r.root_ts, &t.ts)
            .await?
        {
            return Ok(ControlFlow::Break(wait));
        }
        let placed = self.placed(inst, r, t).await?;
        if placed == Some(WorkState::Parked) {
            return Ok(ControlFlow::Continue(WorkState::Parked.name()));
        }
        // (a late request's answer says so again)
        let noted = threadline_store::late::noted_age_ms(&self.pool, t.receipt_id)
            .await?
            .map(|ms| std::time::Duration::from_millis(ms.max(0) as u64));
        let asked = Asked {
            event_id: &t.event_id,
            receipt: t.receipt_id,
            source_ts: &t.ts,
            noted_late: noted,
        };
        let step = self
            .build_and_publish(asked, inst, &r.channel_id, &r.root_ts)
            .await?;
        if placed.is_none() && matches!(step, Step::Ignored(_) | Step::AnswerOnItsWay(_)) {
            threadline_store::budgets::free(&self.pool, t.receipt_id).await?;
        }
        Ok(match step {
            Step::AnswerOnItsWay(wait) => ControlFlow::Break(wait),
            _ => ControlFlow::Continue("rebuilt"),
        })
    }

    /// The place of the thread's latest request for its rebuild:
    /// `Some(Parked)` when it waits parked (the resumer builds it);
    /// otherwise it keeps its place in the model's queue (`None`: it took
    /// one now) and is charged a model call.
    async fn placed(
        &self,
        inst: &Installation,
        r: &threadline_proto::v1::Reconsider,
        t: &store::LatestTurn,
    ) -> anyhow::Result<Option<WorkState>> {
        let request = threadline_store::budgets::Request {
            installation: inst.id,
            receipt: t.receipt_id,
            event_id: t.event_id.clone(),
            channel: r.channel_id.clone(),
            root_ts: r.root_ts.clone(),
            source_ts: t.ts.clone(),
            channel_ref: threadline_runtime::audit::channel_ref(inst.id, &r.channel_id),
        };
        Ok(threadline_store::budgets::rebuild(
            &self.pool,
            &request,
            &self.admission.limits,
            self.admission.share,
        )
        .await?)
    }

    /// A parked request whose turn came (the resumer leased it and took its
    /// units): its thread read from Slack first if it was never seen, its
    /// context built from the thread as it is now and published.
    pub async fn resume(
        &self,
        r: &threadline_store::budgets::Request,
    ) -> anyhow::Result<Resumption> {
        let active = store::installation(&self.pool, r.installation)
            .await?
            .filter(|i| i.active);
        let Some(inst) = active else {
            threadline_store::budgets::drop_parked(&self.pool, r.receipt).await?;
            return Ok(Resumption::Dropped);
        };
        let (channel, root) = (r.channel.as_str(), r.root_ts.as_str());
        if root != r.source_ts && !store::has_message(&self.pool, inst.id, channel, root).await? {
            self.backfill(&inst, channel, root).await?;
        }
        // (a late request's answer says so when it resumes too)
        let noted = threadline_store::late::noted_age_ms(&self.pool, r.receipt)
            .await?
            .map(|ms| std::time::Duration::from_millis(ms.max(0) as u64));
        let asked = Asked {
            event_id: &r.event_id,
            receipt: r.receipt,
            source_ts: &r.source_ts,
            noted_late: noted,
        };
        match self.build_and_publish(asked, &inst, channel, root).await? {
            Step::Ignored(_) => {
                threadline_store::budgets::drop_parked(&self.pool, r.receipt).await?;
                Ok(Resumption::Dropped)
            }
            Step::AnswerOnItsWay(wait) => Ok(Resumption::NotYet(wait)),
            _ => Ok(Resumption::Built),
        }
    }

    /// Whether `channel` is private, for a trigger whose event cannot tell
    /// and whose kind was not known when the event was opened: what the
    /// installation learned within the hour (another worker may have just
    /// learned it), else `conversations.info`. `None` (denied while private channels are not
    /// allowed) when Slack will not say; an error (retried) when Slack could
    /// not be asked.
    async fn channel_kind(
        &self,
        inst: &Installation,
        channel: &str,
    ) -> anyhow::Result<Option<bool>> {
        if let Some(private) = store::channel_kind(&self.pool, inst.id, channel).await? {
            return Ok(Some(private));
        }
        if !inst.scopes.is_empty()
            && !inst
                .scopes
                .iter()
                .any(|s| s == "channels:read" || s == "groups:read")
        {
            tracing::warn!(
                channel,
                "channel kind unknown: the installation lacks channels:read/groups:read; denied"
            );
            metrics::counter!("threadline_scope_refusals_total", "feature" => "channel_kind", "scope" => "channels:read").increment(1);
            return Ok(None);
        }
        let Some(token) = self.bot_token(inst).await? else {
            return Ok(None);
        };
        match self
            .web
            .channel_is_private(token.expose_secret(), channel)
            .await
        {
            Ok(private) => {
                store::learn_channel_kind(
                    &self.pool,
                    inst.id,
                    channel,
                    private,
                    "conversations.info",
                )
                .await?;
                Ok(Some(private))
            }
            Err(WebError::Api { code }) => {
                tracing::warn!(channel, error = %code, "conversations.info refused; channel kind unknown, denied");
                Ok(None)
            }
            Err(e) => Err(anyhow::Error::new(e).context("conversations.info")),
        }
    }

    /// The installation's bot token (refreshed first when it is about to
    /// expire); `None` when it has none that works.
    async fn bot_token(
        &self,
        inst: &Installation,
    ) -> anyhow::Result<Option<secrecy::SecretString>> {
        threadline_tenancy::tokens::bot_token(
            &self.pool,
            &self.cipher,
            self.refresher.as_ref(),
            inst.id,
        )
        .await
    }

    async fn backfill(&self, inst: &Installation, channel: &str, root: &str) -> anyhow::Result<()> {
        let Some(token) = self.bot_token(inst).await? else {
            store::set_backfill(&self.pool, inst.id, channel, root, "partial").await?;
            tracing::warn!("no usable bot token; thread context is partial");
            return Ok(());
        };
        let done = backfill::run(
            &self.pool,
            &self.web,
            inst,
            token.expose_secret(),
            channel,
            root,
            self.backfill,
        )
        .await?;
        if done == Completeness::Partial {
            tracing::warn!(channel, "thread backfill is partial");
        }
        Ok(())
    }

    async fn build_and_publish(
        &self,
        asked: Asked<'_>,
        inst: &Installation,
        channel: &str,
        root: &str,
    ) -> anyhow::Result<Step> {
        let Asked {
            event_id,
            receipt,
            source_ts,
            noted_late,
        } = asked;
        // A request a later one of its burst answers builds nothing; a reply
        // whose thread has an answer on its way waits for it.
        let earlier = match self.burst(inst, channel, root, source_ts, receipt).await? {
            ControlFlow::Continue(earlier) => earlier,
            ControlFlow::Break(step) => return Ok(step),
        };
        // A question in the assistant pane, or in an agent's Messages tab
        // (its own thread, recorded as the pane's are): its status shows
        // the thread being read from now on.
        let dm = threadline_domain::ids::is_dm(channel);
        if dm {
            self.agent_question(inst, channel, root).await?;
            self.reading(inst.id, channel, root, receipt, event_id)
                .await;
        }
        // One snapshot for the version and the messages it numbers (with
        // the other handlers' builds: one transaction).
        let channel_ref = threadline_runtime::audit::channel_ref(inst.id, channel);
        let outcome = self
            .builds
            .submit(store::BuildJob {
                snapshot: store::SnapshotJob {
                    inst: inst.id,
                    approved_bots: inst.approved_bots.clone(),
                    channel: channel.to_owned(),
                    root: root.to_owned(),
                    source_ts: source_ts.to_owned(),
                    limits: self.limits,
                },
                receipt,
                event_id: event_id.to_owned(),
                channel_ref: channel_ref.clone(),
            })
            .await?;
        let snap = match outcome {
            store::BuildOutcome::SourceDeleted => {
                if dm {
                    threadline_store::assistant::not_reading(
                        &self.pool, inst.id, channel, root, receipt,
                    )
                    .await?;
                }
                return ignored("source_deleted");
            }
            store::BuildOutcome::Recorded(snap) => snap,
        };
        let built = &snap.built;
        // In a pane or tab thread: the latest messages of the channel the
        // person is looking at, where the policy allows it.
        let (context_channel_id, channel_context) = if dm {
            self.viewed_channel(inst, channel, root).await
        } else {
            (String::new(), Vec::new())
        };
        let msg = ContextReady {
            schema_version: SCHEMA_VERSION,
            receipt_id: receipt.to_string(),
            installation_id: inst.id.to_string(),
            event_id: event_id.to_owned(),
            channel_id: channel.to_owned(),
            root_ts: root.to_owned(),
            source_ts: source_ts.to_owned(),
            thread_version: snap.version,
            messages: built
                .messages
                .iter()
                .map(|m| ContextMessage {
                    ts: m.ts.clone(),
                    user_id: m.user_id.clone(),
                    role: m.speaker.clone(),
                    text: m.text.clone(),
                })
                .collect(),
            truncated: built.omitted > 0,
            backfill_partial: snap.backfill_partial,
            omitted_messages: built.omitted as u32,
            content_hash: built.content_hash.clone(),
            captured_at_unix_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis() as i64)
                .unwrap_or(0),
            context_channel_id,
            channel_context,
            late_by_ms: noted_late.map_or(0, |d| d.as_millis() as i64),
            earlier,
        };
        threadline_runtime::bus::publish(
            &self.js,
            &self.topology,
            Topic::Contexts,
            &format!("ctx:{receipt}:{}", snap.version),
            msg.encode_to_vec(),
        )
        .await?;
        // (with the other handlers' receipts: one statement)
        self.finishes
            .submit(store::Ending {
                receipt,
                installation: inst.id,
                channel: channel.to_owned(),
                pseudonym: channel_ref,
            })
            .await?;
        metrics::counter!("threadline_contexts_built_total", "truncated" => if built.omitted > 0 { "true" } else { "false" })
            .increment(1);
        Ok(Step::Done)
    }

    /// The status of an assistant thread shows its question being read
    /// (its context built) from now on, through the publisher. Best
    /// effort: a failure only leaves that stage unshown.
    async fn reading(&self, inst: Uuid, channel: &str, root: &str, receipt: Uuid, event_id: &str) {
        if let Err(e) =
            threadline_store::assistant::reading(&self.pool, inst, channel, root, receipt, event_id)
                .await
        {
            tracing::warn!(error = %e, "marking the pane's question as being read failed; that stage is not shown");
        }
    }

    /// How many of the viewed channel's latest messages a pane question
    /// reads.
    const VIEWED_MESSAGES: usize = 10;

    /// The channel the person is looking at and its latest messages by
    /// people (oldest first), when the thread is an assistant thread and the
    /// channel policy, as it is now, would answer in that channel (decided
    /// for each question, from the allow-list and a fresh
    /// `conversations.info`: private, Slack Connect); nothing otherwise, or
    /// when Slack does not answer (the question is answered without them).
    async fn viewed_channel(
        &self,
        inst: &Installation,
        channel: &str,
        root: &str,
    ) -> (String, Vec<ContextMessage>) {
        let none = (String::new(), Vec::new());
        let viewed = match threadline_store::assistant::context_channel(
            &self.pool, inst.id, channel, root,
        )
        .await
        {
            // (never another DM)
            Ok(Some(c)) if !threadline_domain::ids::is_dm(&c) => c,
            Ok(_) => return none,
            Err(e) => {
                tracing::warn!(error = %e, "reading the pane's context failed; answered without it");
                return none;
            }
        };
        let Ok(Some(token)) = self.bot_token(inst).await else {
            return none;
        };
        let readable = match self.viewable(inst, token.expose_secret(), &viewed).await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "the policy of the channel the person looks at is unknown; not read");
                false
            }
        };
        if let Err(e) = threadline_store::assistant::set_context_readable(
            &self.pool, inst.id, channel, root, readable,
        )
        .await
        {
            tracing::warn!(error = %e, "recording the pane context's readability failed");
        }
        if !readable {
            return none;
        }
        let limit = Self::VIEWED_MESSAGES.to_string();
        let read = self
            .budgeted(
                inst,
                token.expose_secret(),
                "conversations.history",
                &[("channel", viewed.as_str()), ("limit", limit.as_str())],
            )
            .await;
        let v = match read {
            Ok(Some(v)) => v,
            Ok(None) => return none,
            Err(e) => {
                tracing::warn!(error = %e, "reading the channel the person looks at failed; answered without it");
                return none;
            }
        };
        let mut messages: Vec<ContextMessage> = v
            .get("messages")
            .and_then(serde_json::Value::as_array)
            .into_iter()
            .flatten()
            .filter(|m| m.get("bot_id").is_none() && m.get("subtype").is_none())
            .filter_map(|m| {
                let s = |k: &str| m.get(k).and_then(serde_json::Value::as_str);
                let text = s("text").filter(|t| !t.trim().is_empty())?;
                Some(ContextMessage {
                    ts: s("ts")?.to_owned(),
                    user_id: s("user")?.to_owned(),
                    role: "user".to_owned(),
                    text: text.to_owned(),
                })
            })
            .take(Self::VIEWED_MESSAGES)
            .collect();
        // (Slack answers newest first)
        messages.reverse();
        metrics::counter!("threadline_assistant_context_reads_total").increment(1);
        (viewed, messages)
    }

    /// One read for a pane question's viewed channel, drawn from the
    /// installation's read budget for `method` that every replica shares
    /// (Tier 3, as backfills' reads; one history read a minute for an app
    /// outside the Marketplace): `None` when it is spent, or when
    /// Slack asked to slow down (the budget then pauses for as long as Slack
    /// said). The question is then answered without the channel.
    async fn budgeted(
        &self,
        inst: &Installation,
        token: &str,
        method: &'static str,
        form: &[(&str, &str)],
    ) -> anyhow::Result<Option<serde_json::Value>> {
        // (Slack's limit for apps outside the Marketplace: one history read
        // a minute; conversations.info keeps Tier 3)
        let per_minute = if inst.non_marketplace && method == "conversations.history" {
            1
        } else {
            self.backfill.per_minute
        };
        if !threadline_store::channels::take_read_budget(&self.pool, inst.id, method, per_minute)
            .await?
        {
            metrics::counter!("threadline_assistant_context_skipped_total", "reason" => "read_budget")
                .increment(1);
            tracing::info!(
                method,
                "the read budget is spent; the viewed channel is not read for this question"
            );
            return Ok(None);
        }
        match self.web.call(method, token, form).await {
            Ok(v) => Ok(Some(v)),
            Err(WebError::RateLimited { retry_after }) => {
                threadline_store::channels::pause_read_budget(
                    &self.pool,
                    inst.id,
                    method,
                    retry_after.as_secs_f64(),
                )
                .await?;
                metrics::counter!("threadline_assistant_context_skipped_total", "reason" => "rate_limited")
                    .increment(1);
                Ok(None)
            }
            Err(e) => Err(anyhow::Error::new(e).context(method)),
        }
    }

    /// Whether the channel policy, as it is now, would answer in `viewed`.
    async fn viewable(
        &self,
        inst: &Installation,
        token: &str,
        viewed: &str,
    ) -> anyhow::Result<bool> {
        if threadline_store::assistant::channel_allowed(&self.pool, inst.id, viewed).await? {
            return Ok(true);
        }
        let Some(v) = self
            .budgeted(inst, token, "conversations.info", &[("channel", viewed)])
            .await?
        else {
            return Ok(false);
        };
        let c = v.get("channel");
        let flag = |k: &str| {
            c.and_then(|c| c.get(k))
                .and_then(serde_json::Value::as_bool)
        };
        let private = match (flag("is_private"), flag("is_im"), flag("is_mpim")) {
            (None, None, None) => None,
            (p, im, mpim) => {
                Some(p.unwrap_or(false) || im.unwrap_or(false) || mpim.unwrap_or(false))
            }
        };
        // (Slack leaves `is_ext_shared` out of a channel that is not)
        let ext_shared = flag("is_ext_shared").or(private.map(|_| false));
        Ok(assistant::context_readable(
            false,
            inst.allowlist_only,
            inst.private_allowed,
            inst.shared_allowed,
            private,
            ext_shared,
        ))
    }

    /// The assistant pane opened (`assistant_thread_started`) or its
    /// context changed: recorded under the DM policy (the pane is a DM with
    /// the app), and a new thread greeted by the publisher (suggested
    /// prompts, a title) through the outbox. The context channel is kept as
    /// identifiers only.
    async fn assistant_event(
        &self,
        ev: &EventAccepted,
        receipt: Uuid,
        inst: &Installation,
        policy: &classify::TriggerPolicy,
        event: &serde_json::Value,
    ) -> anyhow::Result<Step> {
        let Some(t) = assistant::parse(event) else {
            return self
                .end(
                    ev,
                    receipt,
                    ReceiptState::Failed,
                    "malformed_assistant_event",
                )
                .await;
        };
        if !policy.dms_allowed {
            return self
                .end(ev, receipt, ReceiptState::Ignored, "dm_not_allowed")
                .await;
        }
        let started =
            event.get("type").and_then(serde_json::Value::as_str) == Some(assistant::STARTED);
        threadline_store::assistant::record(
            &self.pool,
            &threadline_store::assistant::Thread {
                installation: inst.id,
                channel: t.channel.as_str(),
                thread_ts: t.thread_ts.as_str(),
                user: t.user.as_str(),
                context_channel: t.context_channel.as_ref().map(|c| c.as_str()),
                context_team: t.context_team.as_ref().map(|c| c.as_str()),
            },
            receipt,
            &ev.event_id,
            started,
        )
        .await?;
        metrics::counter!("threadline_assistant_events_total", "type" => if started { "started" } else { "context_changed" })
            .increment(1);
        self.end(
            ev,
            receipt,
            ReceiptState::Done,
            if started {
                "assistant_thread_started"
            } else {
                "assistant_context_changed"
            },
        )
        .await
    }

    pub(crate) async fn end(
        &self,
        ev: &EventAccepted,
        receipt: Uuid,
        state: ReceiptState,
        reason: &'static str,
    ) -> anyhow::Result<Step> {
        let at = Uuid::parse_str(&ev.installation_id).unwrap_or_default();
        let mut conn = self.pool.acquire().await?;
        store::finish(
            &mut conn,
            receipt,
            state,
            Some(reason),
            (at, &ev.channel_id),
        )
        .await?;
        Ok(Step::Ignored(reason))
    }
}
