//! Publishing one proposal: settle an earlier unknown outcome first, run the
//! staleness checks, kill switches and the claim of the reply intent in one
//! short transaction, take a post slot, re-check right before the HTTP
//! call, post once what the decision row holds, and map the outcome. A post
//! Slack accepted is recorded whatever became of its intent meanwhile; a
//! human message that crossed it in flight is recorded and the thread
//! reconsidered. Waiting (a slot, `Retry-After`, a reconciliation read) is
//! handed back to the broker, never slept on in a worker slot.

use std::time::Duration;
use threadline_domain::state::{DecisionStatus, IntentState};

use async_nats::jetstream;
use prost::Message as _;
use secrecy::ExposeSecret as _;
use sqlx::PgPool;
use threadline_proto::v1::ProposalReady;
use threadline_runtime::batch::Batcher;
use threadline_runtime::bus::Topology;
use threadline_runtime::secrets::TokenCipher;
use threadline_runtime::worker::Disposition;
use threadline_slack::{WebClient, WebError};
use tracing::Instrument as _;
use uuid::Uuid;

use crate::intents::{self, Claimed, Fence, PostRecord, PostToRecord, Proposal, Recorded, Verdict};
use crate::proposals::{self, Decision};
use crate::reconcile::{self, Evidence};
use threadline_domain::reply::Found;

pub struct Handler {
    pub pool: PgPool,
    /// Records of posts Slack accepted, batched across the handlers
    /// ([`intents::record_posts`]).
    pub records: Batcher<PostToRecord, Recorded>,
    pub js: jetstream::Context,
    pub topology: Topology,
    pub web: WebClient,
    pub cipher: TokenCipher,
    /// Refreshes rotating tokens before they expire (when client credentials are set).
    pub refresher: Option<threadline_runtime::tokens::Refresher>,
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
    pub streams: Option<crate::stream::Streams>,
}

/// Codes after which Slack certainly did not post and never will.
const PERMANENT: &[&str] = &[
    "channel_not_found",
    "not_in_channel",
    "is_archived",
    "msg_too_long",
    "no_text",
    "invalid_auth",
    "token_revoked",
    "token_expired",
    "account_inactive",
    "missing_scope",
    "not_authed",
    "invalid_blocks",
    "invalid_blocks_format",
    "invalid_attachments",
    "invalid_metadata_format",
    "restricted_action",
    "too_many_attachments",
];

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
            Err(e) if threadline_runtime::transient::is_transient(&e) && tries < 1000 => {
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
    pub async fn handle(&self, payload: &[u8]) -> Disposition {
        let Ok(p) = ProposalReady::decode(payload) else {
            return Disposition::Poison("undecodable ProposalReady".into());
        };
        if p.assistant == "greet" {
            // An assistant thread opened (no decision).
            let Ok(inst) = Uuid::parse_str(&p.installation_id) else {
                return Disposition::Poison("greeting without an installation".into());
            };
            let span = tracing::info_span!("publisher.assistant_greet", event_id = %p.event_id);
            return match self
                .greet(inst, &p.channel_id, &p.root_ts)
                .instrument(span.clone())
                .await
            {
                Ok(d) => d,
                Err(e) => {
                    tracing::warn!(parent: &span, error = format!("{e:#}"), "greeting failed; retrying");
                    Disposition::of_error(&e)
                }
            };
        }
        let (Ok(inst), Ok(decision)) = (
            Uuid::parse_str(&p.installation_id),
            Uuid::parse_str(&p.decision_id),
        ) else {
            return Disposition::Poison("ProposalReady without ids".into());
        };
        if p.assistant == "status" {
            let span = tracing::info_span!("publisher.assistant_status", event_id = %p.event_id, decision_id = %decision);
            if !p.assistant_title.is_empty() {
                self.title_from_question(inst, &p.channel_id, &p.root_ts, &p.assistant_title)
                    .instrument(span.clone())
                    .await;
            }
            return match self
                .sync_progress(inst, &p.channel_id, &p.root_ts, false)
                .instrument(span.clone())
                .await
            {
                Ok(()) => Disposition::Done,
                Err(e) => {
                    tracing::warn!(parent: &span, error = format!("{e:#}"), "showing progress failed; retrying");
                    Disposition::of_error(&e)
                }
            };
        }
        if p.stream {
            let span = tracing::info_span!("publisher.stream", event_id = %p.event_id, decision_id = %decision, version = p.thread_version);
            return match self.stream(inst, decision).instrument(span.clone()).await {
                Ok(d) => {
                    // (a stream that discarded its decision in a pane)
                    if matches!(d, Disposition::Done) && p.channel_id.starts_with('D') {
                        self.after_pane_answer(inst, &p.channel_id, &p.root_ts)
                            .instrument(span.clone())
                            .await;
                    }
                    d
                }
                Err(e) => {
                    tracing::warn!(parent: &span, error = format!("{e:#}"), "streaming failed; retrying");
                    Disposition::of_error(&e)
                }
            };
        }
        let span = tracing::info_span!("publisher.publish", event_id = %p.event_id, decision_id = %decision, version = p.thread_version);
        let done = self.process(inst, decision).instrument(span.clone()).await;
        // A reviewed answer's review request shows what became of it (off
        // the path of answers that need no reviewer).
        let done = match done {
            Ok(Disposition::Done) if p.needs_review => {
                self.review_follow_up(decision)
                    .instrument(span.clone())
                    .await
            }
            other => other,
        };
        // In an assistant thread (a DM), the progress shown while the model
        // ran is cleared when the answer came to nothing posted.
        if matches!(done, Ok(Disposition::Done)) && p.channel_id.starts_with('D') {
            self.after_pane_answer(inst, &p.channel_id, &p.root_ts)
                .instrument(span.clone())
                .await;
        }
        match done {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(parent: &span, error = format!("{e:#}"), "publishing failed; retrying");
                Disposition::of_error(&e)
            }
        }
    }

    pub(crate) async fn bot(&self, inst: Uuid) -> anyhow::Result<Option<Bot>> {
        let Some((token, id)) = threadline_runtime::tokens::bot(
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

    async fn process(&self, inst: Uuid, decision: Uuid) -> anyhow::Result<Disposition> {
        // The decision and the channel's unfurl policy in one read, before
        // any claim, so that a failed read leaves nothing claimed behind.
        // (with an earlier attempt whose outcome is unknown: see below)
        let Some(proposals::ForPost {
            decision: d,
            unfurl,
            unsettled,
            intent,
            ..
        }) = proposals::load_for_post(&self.pool, decision, self.sending_stale).await?
        else {
            return Ok(Disposition::Poison("ProposalReady for no decision".into()));
        };
        if d.installation_id != inst {
            return Ok(Disposition::Poison(
                "ProposalReady names another installation than its decision".into(),
            ));
        }
        let job = Job {
            proposal: Proposal {
                installation: inst,
                receipt: d.receipt_id,
                decision,
                event_id: &d.event_id,
                action_kind: &d.action_kind,
                channel: &d.channel_id,
                root_ts: &d.root_ts,
                source_ts: &d.source_ts,
                version: d.thread_version,
                body_hash: d.output_hash.as_deref().unwrap_or_default(),
                channel_ref: threadline_runtime::audit::channel_ref(inst, &d.channel_id),
            },
            decision: &d,
            unfurl,
        };
        let bot = self.bot(inst).await?;
        // An earlier attempt whose outcome is unknown is settled first, from
        // evidence, whatever else changed since: reading is not posting.
        if let Some(id) = unsettled {
            let Some(bot) = &bot else {
                // No token to read Slack with any more (uninstalled,
                // revoked): held for an operator, never re-posted.
                intents::hold_unreadable(&self.pool, id, "installation_unavailable").await?;
                return Ok(Disposition::Done);
            };
            return self.reconcile(id, &job, bot).await;
        }
        // Only a decision that stands may be posted, and one that needs a
        // reviewer only once approved (the queue is the decisions table).
        match d.status.as_str() {
            "proposed" if d.review_reasons.is_empty() => {}
            "approved" => {}
            // Waiting for a reviewer: asked in the review channel, if any.
            "review" => return self.request_review(&d).await,
            _ => {
                // Discarded while an attempt was out (a 429, a refused
                // connection): nothing keeps its intent waiting.
                intents::withdraw_waiting(&self.pool, decision).await?;
                return Ok(Disposition::Done);
            }
        }
        let Some(bot) = bot else {
            intents::set_decision(
                &self.pool,
                decision,
                DecisionStatus::Cancelled,
                Some("installation_unavailable"),
            )
            .await?;
            return Ok(Disposition::Done);
        };
        // Posting needs chat:write: without it the answer is refused here,
        // with its reason, rather than sent to fail at Slack.
        if !bot.scopes.is_empty() && !bot.scopes.iter().any(|s| s == "chat:write") {
            metrics::counter!("threadline_scope_refusals_total", "feature" => "reply", "scope" => "chat:write")
                .increment(1);
            tracing::warn!(
                alert = "missing_scope",
                installation_id = %inst,
                "the installation lacks chat:write; answer refused (reinstall with the scope)"
            );
            intents::set_decision(
                &self.pool,
                decision,
                DecisionStatus::Cancelled,
                Some("missing_scope:chat:write"),
            )
            .await?;
            return Ok(Disposition::Done);
        }
        // A stream of this event whose publisher died is ended first (with
        // its closing line); the whole answer is then posted once.
        if intent
            .as_ref()
            .is_some_and(|(state, _)| state == "streaming")
        {
            self.end_orphaned_stream(&job.proposal, &bot).await?;
        }
        // The checks, the channel's post slot and the claim, in one
        // transaction: a slot is spent only by a claim, which a post follows.
        let verdict = intents::check_and_claim(
            &self.pool,
            &job.proposal,
            self.sending_stale,
            self.post_spacing,
        )
        .await?;
        let claim = match verdict {
            Verdict::Claimed(c) => c,
            // Another decision for this event already answered it (a
            // reconsideration raced the post, or another action kind), or
            // its intent was closed by an operator or for good: this
            // decision is settled as such, never left `proposed`.
            Verdict::AlreadySent => {
                intents::set_decision(
                    &self.pool,
                    decision,
                    DecisionStatus::Superseded,
                    Some("already_answered"),
                )
                .await?;
                return Ok(Disposition::Done);
            }
            Verdict::Closed => {
                intents::set_decision(
                    &self.pool,
                    decision,
                    DecisionStatus::Cancelled,
                    Some("intent_closed"),
                )
                .await?;
                return Ok(Disposition::Done);
            }
            Verdict::NotNow(wait) => return Ok(defer(jitter(wait.max(0.05), &decision))),
            Verdict::Reconcile(id) => return self.reconcile(id, &job, &bot).await,
            // Its stream is open: stopped first (if due), then the whole
            // answer is claimed once Slack confirmed the stop.
            Verdict::Ending(id) => {
                self.stop_if_due(id, &bot).await?;
                return Ok(defer(1.0));
            }
            Verdict::Suppressed(switch) => return self.suppressed(decision, &switch).await,
            Verdict::SourceDeleted => return self.source_deleted(&job).await,
            Verdict::Superseded => {
                metrics::counter!("threadline_superseded_proposals_total").increment(1);
                intents::set_decision(
                    &self.pool,
                    decision,
                    DecisionStatus::Superseded,
                    Some("newer_trigger"),
                )
                .await?;
                return Ok(Disposition::Done);
            }
            Verdict::Stale => return self.stale(&job).await,
        };
        self.post_claimed(&claim, &job, &bot).await
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
        if intents::set_decision_in(&mut tx, p.decision, status, Some(reason)).await? {
            threadline_store::outbox::enqueue_reconsider(&mut tx, job.decision, why).await?;
            metrics::counter!("threadline_reconsiderations_total").increment(1);
        }
        tx.commit().await?;
        Ok(())
    }

    /// A claimed intent: read Slack first when an earlier attempt's outcome
    /// was unknown, re-check right before the HTTP call, then post.
    async fn post_claimed(
        &self,
        claim: &Claimed,
        job: &Job<'_>,
        bot: &Bot,
    ) -> anyhow::Result<Disposition> {
        let p = &job.proposal;
        if claim.ever_unknown {
            // An earlier attempt may have landed after all (its intent was
            // held, then re-posted): one more read before a second post.
            let o = self.evidence_of(claim.id, p, bot, true).await?;
            match reconcile::read(&self.web, bot.token.expose_secret(), &o).await {
                Ok(seen) => {
                    if let Some(ts) = seen.read.post() {
                        // What Slack holds is an earlier attempt's text: its
                        // decision is the one published, and this one, if
                        // another, is settled as already answered.
                        let posted = intents::decision_for_post(
                            &self.pool,
                            claim.id,
                            seen.hashes.get(ts),
                            claim.previous_decision,
                        )
                        .await?;
                        let r =
                            intents::record_post(&self.pool, claim.id, posted, ts, true).await?;
                        if posted != p.decision {
                            intents::set_decision(
                                &self.pool,
                                p.decision,
                                DecisionStatus::Superseded,
                                Some("already_answered"),
                            )
                            .await?;
                        }
                        metrics::counter!("threadline_reconciliations_total", "result" => "sent_before_repost").increment(1);
                        self.after_record(&r, claim.id);
                        return Ok(Disposition::Done);
                    }
                    if seen.read.named.len() + seen.read.by_body.len() > 1 {
                        intents::transition(
                            &self.pool,
                            claim.id,
                            claim.attempt,
                            IntentState::Held,
                            Some("ambiguous_evidence"),
                            None,
                        )
                        .await?;
                        return Ok(Disposition::Done);
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "evidence read before a re-post failed; trying later");
                    intents::release(&self.pool, claim, "evidence_read_failed", 2.0).await?;
                    return Ok(defer(2.0));
                }
            }
        }
        let max_age = (self.sending_stale - self.slack_timeout).max(self.slack_timeout);
        match intents::fence(&self.pool, p, claim, max_age).await? {
            Fence::Go => {}
            Fence::Lost => {
                // Another delivery took the intent over while this one
                // stalled: it drives the intent now.
                tracing::warn!(intent_id = %claim.id, "claim lost before posting; nothing posted");
                return Ok(Disposition::Done);
            }
            Fence::Expired => {
                tracing::warn!(intent_id = %claim.id, "claim too old to post (this worker stalled); released unposted");
                intents::release(&self.pool, claim, "claim_expired_unposted", 0.0).await?;
                return Ok(defer(0.5));
            }
            Fence::Waiting(wait) => {
                intents::release(&self.pool, claim, "thread_event_pending", wait).await?;
                return Ok(defer(wait));
            }
            Fence::Suppressed(switch) => {
                intents::release(&self.pool, claim, "kill_switch", 0.0).await?;
                return self.suppressed(p.decision, &switch).await;
            }
            Fence::SourceDeleted => {
                intents::release(&self.pool, claim, "source_deleted", 0.0).await?;
                return self.source_deleted(job).await;
            }
            Fence::Discarded(status) => {
                intents::release(&self.pool, claim, "decision_discarded", 0.0).await?;
                tracing::info!(status = %status, "decision discarded before posting; nothing posted");
                // Withdraws the released intent with its decision.
                intents::withdraw_pending(&self.pool, claim.id, p.decision).await?;
                return Ok(Disposition::Done);
            }
            Fence::Stale => {
                intents::release(&self.pool, claim, "thread_changed", 0.0).await?;
                return self.stale(job).await;
            }
        }
        self.post(claim, job, bot).await
    }

    async fn post(&self, claim: &Claimed, job: &Job<'_>, bot: &Bot) -> anyhow::Result<Disposition> {
        let p = &job.proposal;
        let intent = claim.id;
        let metadata = serde_json::json!({
            "event_type": "threadline_reply",
            "event_payload": {"intent_id": intent.to_string(), "body_hash": p.body_hash, "source_ts": p.source_ts}
        })
        .to_string();
        let blocks = job
            .decision
            .body_blocks
            .as_ref()
            .map(|b| b.to_string())
            .unwrap_or_default();
        let started = std::time::Instant::now();
        let r = self
            .web
            .post_reply(
                bot.token.expose_secret(),
                p.channel,
                p.root_ts,
                job.decision.body_text.as_deref().unwrap_or_default(),
                &blocks,
                &metadata,
                job.unfurl,
            )
            .await;
        metrics::histogram!("threadline_slack_post_seconds")
            .record(started.elapsed().as_secs_f64());
        match r {
            Ok(ts) => {
                // Slack has the post: record it, trying for as long as the
                // database is away (a worker killed meanwhile leaves the
                // intent `sending`, and reconciliation finds the post).
                // (with the other handlers' records: one transaction)
                let post = PostToRecord {
                    intent,
                    decision: p.decision,
                    ts: ts.clone(),
                    reconciled: false,
                };
                let recorded = persist(|| self.records.submit(post.clone())).await?;
                metrics::counter!("threadline_reply_intents_total", "state" => "sent").increment(1);
                self.after_record(&recorded, intent);
                Ok(Disposition::Done)
            }
            Err(e) => self.failed(claim, p, e, "chat.postMessage").await,
        }
    }

    /// What a refused or uncertain post (or stream start) leaves: a
    /// 429 waits out `Retry-After`, a refused connection is tried again, a
    /// permanent refusal cancels the answer, anything else may have landed
    /// and is reconciled, never repeated.
    pub(crate) async fn failed(
        &self,
        claim: &Claimed,
        p: &Proposal<'_>,
        e: WebError,
        method: &'static str,
    ) -> anyhow::Result<Disposition> {
        let intent = claim.id;
        match e {
            WebError::RateLimited { retry_after } => {
                metrics::counter!("threadline_slack_rate_limited_total", "method" => method)
                    .increment(1);
                let wait = jitter(retry_after.as_secs_f64(), &intent);
                metrics::histogram!("threadline_slack_rate_limit_wait_seconds", "method" => method)
                    .record(wait);
                // Slack did not post: recorded even through a database blip,
                // or the intent would go stale and be held for lack of
                // evidence of a post that certainly never happened.
                let gave_up = persist(|| async {
                    intents::pause_channel(
                        &self.pool,
                        p.installation,
                        p.channel,
                        retry_after.as_secs_f64(),
                    )
                    .await?;
                    intents::rate_limited(
                        &self.pool,
                        intent,
                        claim.attempt,
                        wait,
                        self.max_attempts,
                    )
                    .await
                })
                .await?;
                match gave_up {
                    Some(true) => self.give_up_rate_limited(intent, p).await,
                    Some(false) => Ok(defer(wait)),
                    None => Ok(Disposition::Done),
                }
            }
            WebError::Transport(kind) if kind == "connect" => {
                // The request never left: safe to try again.
                persist(|| {
                    intents::transition(
                        &self.pool,
                        intent,
                        claim.attempt,
                        IntentState::FailedRetryable,
                        Some("connect"),
                        Some(2.0),
                    )
                })
                .await?;
                Ok(defer(2.0))
            }
            WebError::Api { code } if PERMANENT.contains(&code.as_str()) => {
                let code: &'static str = PERMANENT
                    .iter()
                    .find(|c| **c == code)
                    .copied()
                    .unwrap_or("api_error");
                persist(|| {
                    intents::transition(
                        &self.pool,
                        intent,
                        claim.attempt,
                        IntentState::FailedPermanent,
                        Some(code),
                        None,
                    )
                })
                .await?;
                intents::set_decision(
                    &self.pool,
                    p.decision,
                    DecisionStatus::Cancelled,
                    Some(code),
                )
                .await?;
                metrics::counter!("threadline_reply_intents_total", "state" => "failed_permanent")
                    .increment(1);
                tracing::warn!(alert = "reply_refused", code, "Slack refused the post");
                Ok(Disposition::Done)
            }
            e => {
                // Timeout, reset after sending, 5xx, fatal_error, internal_error,
                // an unexpected code: it may have landed. Reconcile, never re-post.
                let code = match &e {
                    _ if method == "chat.startStream" => "stream_start_unknown",
                    WebError::Api { .. } => "api_error_unknown_outcome",
                    WebError::Http(_) => "http_5xx",
                    WebError::Decode => "undecodable_answer",
                    _ => "transport",
                };
                // (should this fail, the intent goes stale and is taken for
                // unknown all the same)
                intents::transition(
                    &self.pool,
                    intent,
                    claim.attempt,
                    IntentState::Unknown,
                    Some(code),
                    None,
                )
                .await?;
                metrics::counter!("threadline_reply_intents_total", "state" => "unknown")
                    .increment(1);
                tracing::warn!(code, "post outcome unknown; reconciling");
                Ok(defer(1.0))
            }
        }
    }

    /// Slack kept answering 429 past the attempt limit: the answer is given
    /// up, and said so (decision cancelled with the reason, an alert, a
    /// count), never left `proposed` with nothing said to anyone.
    async fn give_up_rate_limited(
        &self,
        intent: Uuid,
        p: &Proposal<'_>,
    ) -> anyhow::Result<Disposition> {
        intents::set_decision(
            &self.pool,
            p.decision,
            DecisionStatus::Cancelled,
            Some("rate_limited_too_often"),
        )
        .await?;
        metrics::counter!("threadline_replies_abandoned_total", "reason" => "rate_limited_too_often")
            .increment(1);
        tracing::error!(
            alert = "reply_abandoned",
            reason = "rate_limited_too_often",
            intent_id = %intent,
            attempts = self.max_attempts,
            "Slack refused every attempt with 429; the answer is given up"
        );
        Ok(Disposition::Done)
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

    /// What reconciling `intent` reads Slack for (see [`reconcile::Owned`]).
    pub(crate) async fn evidence_of(
        &self,
        intent: Uuid,
        p: &Proposal<'_>,
        bot: &Bot,
        as_post: bool,
    ) -> anyhow::Result<reconcile::Owned> {
        reconcile::Owned::load(
            &self.pool,
            intent,
            reconcile::Thread {
                installation: p.installation,
                channel: p.channel,
                root_ts: p.root_ts,
            },
            &bot.bot_id,
            self.sending_stale,
            as_post,
        )
        .await
    }

    /// Settles an intent whose outcome is unknown from what Slack shows,
    /// whatever its form, before anything else is posted for its event.
    pub(crate) async fn reconcile(
        &self,
        intent: Uuid,
        job: &Job<'_>,
        bot: &Bot,
    ) -> anyhow::Result<Disposition> {
        let p = &job.proposal;
        let o = self.evidence_of(intent, p, bot, false).await?;
        let found = reconcile::run(
            &self.pool,
            &self.web,
            bot.token.expose_secret(),
            &o,
            self.evidence,
        )
        .await?;
        self.after_found(&found, intent, p.channel, bot).await?;
        match found {
            Found::Sent(_) => {
                // The event is answered. When this proposal is another
                // decision than the one posted (a reconsideration raced the
                // post), it is settled as superseded, not left `proposed`.
                intents::set_decision(
                    &self.pool,
                    p.decision,
                    DecisionStatus::Superseded,
                    Some("already_answered"),
                )
                .await?;
                Ok(Disposition::Done)
            }
            Found::Held(_) => {
                // Another decision for the event (a reconsideration) waits
                // on nothing now: the intent is the operator's to settle, and
                // what it posts, if anything, is its own decision.
                threadline_store::decisions::cancel_for_held_intent(&self.pool, p.decision, intent)
                    .await?;
                Ok(Disposition::Done)
            }
            // Its stream is stopped (or being stopped), or ended: the whole
            // answer is claimed next, once Slack confirmed the stop.
            Found::Open(_) | Found::Ended(_) | Found::Unclaimed(_) => Ok(defer(0.5)),
            Found::Repost => Ok(defer(1.0)),
            Found::Again => Ok(defer(self.evidence.pause())),
        }
    }
}
