//! A settled decision's answer, posted whole through the one reply
//! mechanism: settle an earlier unknown outcome first, then the decision
//! must stand (approved, when it needs a reviewer), then the staleness
//! checks, kill switches and the claim of the reply intent in one short
//! transaction with the channel's post slot, a re-check right before the
//! HTTP call, and one post of what the decision row holds. Waiting (a slot,
//! `Retry-After`, a reconciliation read, a stream being stopped) is handed
//! back to the broker, never slept on in a worker slot.

use secrecy::ExposeSecret as _;
use threadline_domain::budget::NOTE_ACTION_KIND;
use threadline_domain::output;
use threadline_domain::reply;
use threadline_domain::state::{DecisionStatus, IntentState};
use threadline_runtime::worker::Disposition;
use uuid::Uuid;

use crate::handler::{Bot, Handler, Job, defer, jitter, persist};
use crate::intents::{self, Claimed, Fence, PostToRecord, Proposal, Verdict};
use crate::proposals::{self, Decision};

/// What a decision may lead to before any claim.
enum Standing {
    /// It stands: claim its intent and post it.
    Post,
    /// It waits for a reviewer (asked in the review channel, if any).
    Review,
    /// It was discarded or published meanwhile: nothing to do.
    Settled,
}

fn standing(d: &Decision) -> Standing {
    match d.status {
        DecisionStatus::Proposed if d.review_reasons.is_empty() => Standing::Post,
        DecisionStatus::Approved => Standing::Post,
        DecisionStatus::Review | DecisionStatus::Proposed => Standing::Review,
        _ => Standing::Settled,
    }
}

impl Handler {
    /// Handles a settled decision's answer (`ProposalReady` of kind answer).
    pub(crate) async fn answer(&self, inst: Uuid, decision: Uuid) -> anyhow::Result<Disposition> {
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
        let job = Job::of(&d, unfurl);
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
        match standing(&d) {
            Standing::Post => {}
            Standing::Review => return self.request_review(&d).await,
            Standing::Settled => {
                // Discarded while an attempt was out (a 429, a refused
                // connection): nothing keeps its intent waiting.
                intents::withdraw_waiting(&self.pool, decision).await?;
                return Ok(Disposition::Done);
            }
        }
        let Some(bot) = self.may_post(inst, decision, bot).await? else {
            return Ok(Disposition::Done);
        };
        // A stream of this event whose publisher died is taken over and
        // stopped first; the whole answer is then claimed once Slack
        // confirmed the stop.
        if intent.is_some_and(|(state, _)| state == IntentState::Streaming) {
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
        match verdict {
            Verdict::Claimed(claim) => self.post_claimed(&claim, &job, &bot).await,
            other => self.not_claimed(other, &job, &bot).await,
        }
    }

    /// The installation's bot, when it may post at all: a token that works
    /// and `chat:write` (without it the answer is refused here, with its
    /// reason, rather than sent to fail at Slack). `None`: the decision was
    /// cancelled with why.
    async fn may_post(
        &self,
        inst: Uuid,
        decision: Uuid,
        bot: Option<Bot>,
    ) -> anyhow::Result<Option<Bot>> {
        let why = match &bot {
            None => "installation_unavailable",
            Some(b) if !b.scopes.is_empty() && !b.scopes.iter().any(|s| s == "chat:write") => {
                metrics::counter!("threadline_scope_refusals_total", "feature" => "reply", "scope" => "chat:write")
                    .increment(1);
                tracing::warn!(
                    alert = "missing_scope",
                    installation_id = %inst,
                    "the installation lacks chat:write; answer refused (reinstall with the scope)"
                );
                "missing_scope:chat:write"
            }
            Some(_) => return Ok(bot),
        };
        intents::set_decision(&self.pool, decision, DecisionStatus::Cancelled, Some(why)).await?;
        Ok(None)
    }

    /// What a claim that did not happen leaves: the decision settled as the
    /// checks say (never left `proposed`), or a wait.
    async fn not_claimed(
        &self,
        verdict: Verdict,
        job: &Job<'_>,
        bot: &Bot,
    ) -> anyhow::Result<Disposition> {
        let decision = job.proposal.decision;
        let settle = |status: DecisionStatus, why: &'static str| async move {
            intents::set_decision(&self.pool, decision, status, Some(why)).await?;
            anyhow::Ok(Disposition::Done)
        };
        match verdict {
            Verdict::Claimed(_) => unreachable!("a claim is posted"),
            // Another decision for this event already answered it (a
            // reconsideration raced the post, or another action kind).
            Verdict::AlreadySent => settle(DecisionStatus::Superseded, "already_answered").await,
            // Its intent was closed by an operator or for good.
            Verdict::Closed => settle(DecisionStatus::Cancelled, "intent_closed").await,
            Verdict::NotNow(wait) => Ok(defer(jitter(wait.max(0.05), &decision))),
            Verdict::Reconcile(id) => self.reconcile(id, job, bot).await,
            // Its stream is open: stopped first (if due), then the whole
            // answer is claimed once Slack confirmed the stop.
            Verdict::Ending(id) => {
                self.stop_if_due(id, bot).await?;
                Ok(defer(1.0))
            }
            Verdict::Suppressed(switch) => self.suppressed(decision, &switch).await,
            Verdict::SourceDeleted => self.source_deleted(job).await,
            Verdict::Superseded => {
                metrics::counter!("threadline_superseded_proposals_total").increment(1);
                settle(DecisionStatus::Superseded, "newer_trigger").await
            }
            Verdict::Stale => self.stale(job).await,
        }
    }

    /// A claimed intent: read Slack first when an earlier attempt's outcome
    /// was unknown, re-check right before the HTTP call, then post.
    async fn post_claimed(
        &self,
        claim: &Claimed,
        job: &Job<'_>,
        bot: &Bot,
    ) -> anyhow::Result<Disposition> {
        if claim.ever_unknown
            && let Some(done) = self.found_before_repost(claim, job, bot).await?
        {
            return Ok(done);
        }
        let p = &job.proposal;
        if let Some(risk) = refused(job.decision) {
            return self.refuse_body(claim, job, risk).await;
        }
        let max_age = (self.sending_stale - self.slack_timeout).max(self.slack_timeout);
        match self.fence(p, claim, max_age, intents::Claim::Post).await? {
            Fence::Go => self.post(claim, job, bot).await,
            fence => self.fenced(fence, claim, job).await,
        }
    }

    /// An earlier attempt may have landed after all (its intent was held,
    /// then re-posted): one more read before a second post. `Some` when
    /// nothing is to be posted.
    async fn found_before_repost(
        &self,
        claim: &Claimed,
        job: &Job<'_>,
        bot: &Bot,
    ) -> anyhow::Result<Option<Disposition>> {
        let p = &job.proposal;
        let o = self.evidence_of(claim.id, p, bot, true).await?;
        let seen = match crate::reconcile::read(&self.web, bot.token.expose_secret(), &o).await {
            Ok(seen) => seen,
            Err(e) => {
                tracing::warn!(error = %e, "evidence read before a re-post failed; trying later");
                let wait = crate::reconcile::wait_after(&e, 2.0);
                intents::release(&self.pool, claim, "evidence_read_failed", wait).await?;
                return Ok(Some(defer(wait)));
            }
        };
        if let Some(ts) = seen.read.post() {
            // What Slack holds is an earlier attempt's text: its decision is
            // the one published, and this one, if another, is settled as
            // already answered.
            let posted = intents::decision_for_post(
                &self.pool,
                claim.id,
                seen.hashes.get(ts),
                claim.previous_decision,
            )
            .await?;
            let r = intents::record_post(&self.pool, claim.id, posted, ts, true).await?;
            if posted != p.decision {
                intents::set_decision(
                    &self.pool,
                    p.decision,
                    DecisionStatus::Superseded,
                    Some("already_answered"),
                )
                .await?;
            }
            metrics::counter!("threadline_reconciliations_total", "result" => "sent_before_repost")
                .increment(1);
            self.after_record(&r, claim.id);
            return Ok(Some(Disposition::Done));
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
            return Ok(Some(Disposition::Done));
        }
        Ok(None)
    }

    /// A stored body the output policy would not have let through: nothing
    /// is posted, the claim is given back and the decision cancelled, and
    /// it is raised (whoever wrote the row went past the policy).
    async fn refuse_body(
        &self,
        claim: &Claimed,
        job: &Job<'_>,
        risk: output::Risk,
    ) -> anyhow::Result<Disposition> {
        metrics::counter!("threadline_bodies_refused_total", "reason" => risk.as_str())
            .increment(1);
        tracing::error!(
            alert = "body_refused",
            reason = risk.as_str(),
            decision_id = %job.proposal.decision,
            "a stored answer fails the output policy: not posted"
        );
        intents::release(&self.pool, claim, "body_refused", 0.0).await?;
        intents::set_decision(
            &self.pool,
            job.proposal.decision,
            DecisionStatus::Cancelled,
            Some("body_refused"),
        )
        .await?;
        intents::withdraw_pending(&self.pool, claim.id, job.proposal.decision).await?;
        Ok(Disposition::Done)
    }

    /// What the re-check right before the HTTP call stopped: the claim is
    /// given back unposted, and the decision settled as the check says.
    async fn fenced(
        &self,
        fence: Fence,
        claim: &Claimed,
        job: &Job<'_>,
    ) -> anyhow::Result<Disposition> {
        let p = &job.proposal;
        match fence {
            Fence::Go => unreachable!("a post goes"),
            Fence::Lost => {
                // Another delivery took the intent over while this one
                // stalled: it drives the intent now.
                tracing::warn!(intent_id = %claim.id, "claim lost before posting; nothing posted");
                Ok(Disposition::Done)
            }
            Fence::Expired => {
                tracing::warn!(intent_id = %claim.id, "claim too old to post (this worker stalled); released unposted");
                intents::release(&self.pool, claim, "claim_expired_unposted", 0.0).await?;
                Ok(defer(0.5))
            }
            Fence::Waiting(wait) => {
                intents::release(&self.pool, claim, "thread_event_pending", wait).await?;
                Ok(defer(wait))
            }
            Fence::Suppressed(switch) => {
                intents::release(&self.pool, claim, "kill_switch", 0.0).await?;
                self.suppressed(p.decision, &switch).await
            }
            Fence::SourceDeleted => {
                intents::release(&self.pool, claim, "source_deleted", 0.0).await?;
                self.source_deleted(job).await
            }
            Fence::Discarded(status) => {
                intents::release(&self.pool, claim, "decision_discarded", 0.0).await?;
                tracing::info!(status = %status, "decision discarded before posting; nothing posted");
                // Withdraws the released intent with its decision.
                intents::withdraw_pending(&self.pool, claim.id, p.decision).await?;
                Ok(Disposition::Done)
            }
            Fence::Stale => {
                intents::release(&self.pool, claim, "thread_changed", 0.0).await?;
                self.stale(job).await
            }
        }
    }

    /// The post: what the decision row holds, labelled, with the metadata
    /// that names the intent and, for an answer, its feedback buttons;
    /// recorded once Slack has it.
    async fn post(&self, claim: &Claimed, job: &Job<'_>, bot: &Bot) -> anyhow::Result<Disposition> {
        let p = &job.proposal;
        let intent = claim.id;
        let metadata =
            reply::answer_metadata(&intent.to_string(), p.body_hash, p.source_ts).to_string();
        let stored = job.decision.body_blocks.as_ref();
        let decision = p.decision.to_string();
        let blocks = reply::blocks_arg(if job.decision.action_kind == NOTE_ACTION_KIND {
            // threadline's own note: no answer, nothing to rate
            reply::Shown::Note { blocks: stored }
        } else {
            reply::Shown::Posted {
                blocks: stored,
                decision: &decision,
            }
        });
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
                metrics::counter!("threadline_reply_intents_total", "state" => IntentState::Sent.name())
                    .increment(1);
                self.after_record(&recorded, intent);
                Ok(Disposition::Done)
            }
            Err(e) => self.failed(claim, p, e, "chat.postMessage").await,
        }
    }
}

impl<'a> Job<'a> {
    /// What posting decision `d` needs: the ids from its row (never from
    /// the bus message), and whether links may unfurl.
    pub(crate) fn of(d: &'a Decision, unfurl: bool) -> Self {
        Job {
            proposal: Proposal {
                installation: d.installation_id,
                receipt: d.receipt_id,
                decision: d.id,
                event_id: &d.event_id,
                action_kind: &d.action_kind,
                channel: &d.channel_id,
                root_ts: &d.root_ts,
                source_ts: &d.source_ts,
                version: d.thread_version,
                body_hash: d.output_hash.as_deref().unwrap_or_default(),
                channel_ref: threadline_runtime::audit::channel_ref(
                    d.installation_id,
                    &d.channel_id,
                ),
            },
            decision: d,
            unfurl,
        }
    }
}

/// The output policy again on what the decision row holds, unless a
/// reviewer approved it (they saw what is stored).
pub(crate) fn refused(d: &Decision) -> Option<output::Risk> {
    if d.status == DecisionStatus::Approved {
        return None;
    }
    output::refused(
        d.body_text.as_deref().unwrap_or_default(),
        d.body_blocks.as_ref(),
        d.fallback,
    )
}
