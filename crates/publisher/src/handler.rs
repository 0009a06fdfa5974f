//! The publisher's handler: what every kind of work shares (the database,
//! the bus, the Slack client, the settings), the installation's bot, and
//! the settlements every form of answer uses (a kill switch, a stale or
//! deleted question, a post recorded). One kind of work per module:
//! [`crate::dispatch`] hands each message to its own.

use std::time::Duration;
use threadline_domain::state::DecisionStatus;

use async_nats::jetstream;
use sqlx::PgPool;
use threadline_runtime::batch::Batcher;
use threadline_runtime::bus::Topology;
use threadline_runtime::worker::Disposition;
use threadline_slack::WebClient;
use threadline_tenancy::secrets::TokenKeys;
use uuid::Uuid;

use crate::intents::{self, PostRecord, PostToRecord, Proposal, Recorded};
use crate::proposals::Decision;
use crate::reconcile::Evidence;

pub struct Handler {
    pub pool: PgPool,
    /// Records of posts Slack accepted, batched across the handlers
    /// ([`intents::record_posts`]).
    pub records: Batcher<PostToRecord, Recorded>,
    pub js: jetstream::Context,
    pub topology: Topology,
    pub web: WebClient,
    pub cipher: TokenKeys,
    /// Refreshes rotating tokens before they expire (when client credentials are set).
    pub refresher: Option<threadline_tenancy::tokens::Refresher>,
    pub evidence: Evidence,
    /// Seconds between posts in one channel.
    pub post_spacing: f64,
    /// Attempts before a rate-limited post fails for good.
    pub max_attempts: i32,
    /// Seconds after which a `sending` intent whose worker is gone counts
    /// as unknown (`THREADLINE_SENDING_STALE_MS`).
    pub sending_stale: f64,
    /// The Slack request timeout in seconds: a claim older than
    /// `sending_stale - slack_timeout` is too old to start a post (another
    /// worker may take it for lost before the post could finish).
    pub slack_timeout: f64,
    /// Streamed answers (`None`: every answer is posted whole).
    pub streams: Option<crate::config::Streams>,
}

/// How long a reply waits while acknowledged deliveries wait in the spool.
const SPOOL_WAIT: f64 = 1.0;

impl Handler {
    /// The last check before a reply's side effect (a post, a stream's
    /// start): no acknowledged delivery waits in the spool (one may change
    /// this thread, and the store cannot see it yet; a spool that cannot be
    /// read counts as waiting), then the store's fence.
    pub(crate) async fn fence(
        &self,
        p: &Proposal<'_>,
        claim: &intents::Claimed,
        max_claim_age: f64,
        what: intents::Claim,
    ) -> anyhow::Result<intents::Fence> {
        if self.spool_waiting().await {
            return Ok(intents::Fence::Waiting(SPOOL_WAIT));
        }
        Ok(intents::fence_for(&self.pool, p, claim, max_claim_age, what).await?)
    }

    /// Whether acknowledged deliveries wait in the spool (one that cannot
    /// be read counts as waiting), counted by why.
    pub(crate) async fn spool_waiting(&self) -> bool {
        let why = match self.topology.spool_depth(&self.js).await {
            Some((0, _)) => return false,
            Some(_) => "waiting",
            None => "unreadable",
        };
        metrics::counter!("threadline_replies_behind_spool_total", "reason" => why).increment(1);
        true
    }
}

pub(crate) fn jitter(secs: f64, seed: &Uuid) -> f64 {
    secs + (seed.as_u128() % 1000) as f64 / 1000.0
}

/// Runs a database write that records what Slack did, again and again
/// while the database is away (transient errors only): what happened in
/// Slack must not be lost to a blip.
pub(crate) async fn persist<T, E, F, Fut>(mut write: F) -> anyhow::Result<T>
where
    E: Into<anyhow::Error>,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let mut tries = 0u32;
    loop {
        match write().await.map_err(Into::into) {
            Err(e) if threadline_tenancy::fault::is_transient(&e) && tries < 1000 => {
                tries += 1;
                tracing::warn!(error = %e, tries, "recording what Slack did failed; trying again");
                // (jittered: records that failed together, a batch that
                // lost a deadlock, do not all come back at once)
                let wait = jitter(
                    threadline_runtime::worker::backoff(tries).as_secs_f64(),
                    &Uuid::now_v7(),
                );
                tokio::time::sleep(Duration::from_secs_f64(wait)).await;
            }
            r => return r,
        }
    }
}

pub(crate) fn defer(secs: f64) -> Disposition {
    Disposition::Defer(Duration::from_secs_f64(secs.clamp(0.05, 900.0)))
}

pub(crate) struct Bot {
    pub(crate) token: secrecy::SecretString,
    pub(crate) bot_id: String,
    /// Granted bot scopes; empty when never recorded (a manual install).
    pub(crate) scopes: Vec<String>,
}

/// What is being posted: the ids from the bus message, everything else
/// from the decision row.
pub(crate) struct Job<'a> {
    pub(crate) proposal: Proposal<'a>,
    pub(crate) decision: &'a Decision,
    /// Whether the policy lets Slack unfurl the reply's links and media.
    pub(crate) unfurl: bool,
}

impl Handler {
    pub(crate) async fn bot(&self, inst: Uuid) -> anyhow::Result<Option<Bot>> {
        let Some((token, id)) = threadline_tenancy::tokens::bot(
            &self.pool,
            &self.cipher,
            self.refresher.as_ref(),
            inst,
        )
        .await?
        else {
            return Ok(None);
        };
        Ok(Some(Bot {
            token,
            bot_id: id.bot_id,
            scopes: id.scopes,
        }))
    }

    pub(crate) async fn suppressed(
        &self,
        decision: Uuid,
        switch: &str,
    ) -> anyhow::Result<Disposition> {
        metrics::counter!("threadline_kill_switch_suppressions_total", "stage" => "publisher")
            .increment(1);
        intents::set_decision(
            &self.pool,
            decision,
            DecisionStatus::Suppressed,
            Some(switch),
        )
        .await?;
        tracing::warn!(switch = %switch, "kill switch engaged; nothing posted");
        Ok(Disposition::Done)
    }

    /// The thread changed since the proposal's version: the decision is
    /// stale and the thread reconsidered, in one transaction (the
    /// reconsideration goes through the outbox, so a broker that is away
    /// cannot lose it).
    pub(crate) async fn stale(&self, job: &Job<'_>) -> anyhow::Result<Disposition> {
        metrics::counter!("threadline_stale_proposals_total").increment(1);
        self.discard_and_reconsider(
            job,
            DecisionStatus::Stale,
            "thread_changed",
            "version_changed",
        )
        .await?;
        Ok(Disposition::Done)
    }

    /// The source was deleted: its decision is cancelled and the thread
    /// reconsidered (an older request a deleted newer one had superseded is
    /// decided again).
    pub(crate) async fn source_deleted(&self, job: &Job<'_>) -> anyhow::Result<Disposition> {
        self.discard_and_reconsider(
            job,
            DecisionStatus::Cancelled,
            "source_deleted",
            "source_deleted",
        )
        .await?;
        Ok(Disposition::Done)
    }

    pub(crate) async fn discard_and_reconsider(
        &self,
        job: &Job<'_>,
        status: DecisionStatus,
        reason: &str,
        why: &str,
    ) -> anyhow::Result<()> {
        let p = &job.proposal;
        let mut tx = self.pool.begin().await?;
        let mut asked = Vec::new();
        if intents::set_decision_in(&mut tx, p.decision, status, Some(reason)).await? {
            threadline_store::decisions::enqueue_reconsider(&mut tx, job.decision, why).await?;
            metrics::counter!("threadline_reconsiderations_total").increment(1);
            // (a deleted request's answer will not show: what it absorbed
            // of its burst is answered after all, and a copy of it Slack
            // delivered too, standing in for it, is asked now; nothing for
            // a request still there. An answer to a reply answers its
            // thread's root too: once none of the thread shows, a deleted
            // root's burst is released the same way.)
            asked = threadline_store::decisions::discarded(&mut tx, job.decision).await?;
        }
        tx.commit().await?;
        stand_ins_asked(job.decision.id, &asked);
        Ok(())
    }

    /// After a post is recorded: a late or duplicate post is raised, and a
    /// human message that crossed the answer in flight is counted and its
    /// thread reconsidered.
    pub(crate) fn after_record(&self, r: &Recorded, intent: Uuid) {
        match r.outcome {
            PostRecord::Late => {
                metrics::counter!("threadline_reconciliations_total", "result" => "late_post_recorded").increment(1);
                tracing::warn!(
                    alert = "late_post_recorded",
                    intent_id = %intent,
                    "a post landed after its intent was given up on; recorded as sent"
                );
            }
            PostRecord::Duplicate => {
                metrics::counter!("threadline_duplicate_reply_incidents_total").increment(1);
                tracing::error!(
                    alert = "duplicate_reply",
                    intent_id = %intent,
                    "a second post of one intent landed in Slack; recorded as an incident"
                );
            }
            _ => {}
        }
        if !r.crossed.is_empty() {
            // (the reconsideration was queued with the record)
            threadline_runtime::outbox::crossed_in_flight(r.crossed.len(), "publisher");
        }
    }
}

/// Copies of deleted requests asked in their place as an answer was
/// discarded (`decisions::discarded`): logged and counted.
pub(crate) fn stand_ins_asked(decision: Uuid, asked: &[threadline_store::actions::StoodIn]) {
    for s in asked {
        tracing::info!(decision_id = %decision, copy_ts = %s.ts, "a copy of a deleted request is asked in its place");
        metrics::counter!("threadline_doubled_stand_ins_total", "asked" => "yes").increment(1);
    }
}
