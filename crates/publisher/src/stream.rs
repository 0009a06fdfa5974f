//! Streamed answers, through the one reply mechanism: the start of a
//! stream is the claimed side effect of the reply intent (the same checks,
//! budget and claim as a post), the text inference releases is appended as
//! it comes, and the stream stops with the AI label and the metadata
//! reconciliation reads. Between two appends the staleness check of a post
//! runs again: a new human message, an edit or deletion in the context, a
//! kill switch or an uninstall ends the stream at once with a short closing
//! line that says why (stopped until Slack confirms, see [`crate::ending`]),
//! and (for a thread that moved on) hands the thread to reconsideration. An
//! interrupted intent answered nothing: the one complete answer that may
//! follow claims it again and is posted whole, never streamed a second
//! time. A stream whose publisher died is taken over and ended by whoever
//! next handles its event or by the sweeper.

use std::time::Duration;

use secrecy::ExposeSecret as _;
use threadline_domain::output::{self, markup};
use threadline_domain::reply::{self, Ending};
use threadline_domain::state::{DecisionStatus, IntentState};
use threadline_domain::thinking;
use threadline_runtime::worker::Disposition;
use threadline_slack::{StreamContent, WebError};
use threadline_store::streams::{self, Tick, ToEnd};
use uuid::Uuid;

use crate::ending::{FALLBACK_LABEL, Stop, Stopped};
use crate::handler::{Bot, Handler, Job, defer, persist};
use crate::intents::{self, Claim, Claimed, Fence, PostToRecord, Proposal, Verdict};
use crate::proposals;
use threadline_domain::reply::blocks_arg;

pub use crate::config::Streams;

/// How long a stream may go without a step when streaming is off here (a
/// stream started before the switch is still ended in time).
const DEFAULT_STALE: f64 = 45.0;

/// What the next step of a stream does, from what the tick read.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Append this text.
    Append(String),
    /// Nothing new yet.
    Wait,
    /// Stop with the rest of the whole answer.
    Finish(String),
    /// End early.
    End(Ending),
    /// The stream is not this publisher's any more.
    Lost,
}

/// Decides the next step of a stream that has shown `shown` (a pure rule:
/// the thread first, then the decision).
pub fn step(t: &Tick, version: i64, shown: &str) -> Step {
    if !t.mine {
        return Step::Lost;
    }
    if t.switch.is_some() || !t.installation_active {
        return Step::End(Ending::SwitchedOff);
    }
    if t.source_deleted {
        return Step::End(Ending::SourceDeleted);
    }
    if t.version != Some(version) {
        return Step::End(Ending::ThreadChanged);
    }
    use DecisionStatus as D;
    // What a stream shows is Markdown, where a link hides its target: text
    // that would make one is never sent in a stream, whoever stored it
    // (the whole answer is posted instead, as mrkdwn, where it shows as
    // written).
    // Nor anything the output policy would not have let through (the row
    // may have been written past it), unless a reviewer approved it.
    let approved = t.decision_status == DecisionStatus::Approved;
    let hides_a_link = |whole: &str| {
        markup::markdown_link(whole) || (!approved && output::refused(whole, None, false).is_some())
    };
    match t.decision_status {
        D::Calling => match &t.released {
            Some(r) if r.len() > shown.len() && r.starts_with(shown) => {
                if hides_a_link(r) {
                    Step::Wait
                } else {
                    Step::Append(r[shown.len()..].to_owned())
                }
            }
            _ => Step::Wait,
        },
        D::Proposed | D::Approved
            if t.review_reasons.is_empty() || t.decision_status == D::Approved =>
        {
            match &t.body {
                // (an event of the thread not processed yet may change it)
                Some(_) if t.pending => Step::Wait,
                Some(b) if b.starts_with(shown) && !hides_a_link(b) => {
                    Step::Finish(b[shown.len()..].to_owned())
                }
                _ => Step::End(Ending::Interrupted),
            }
        }
        D::Review | D::Proposed => Step::End(Ending::NeedsReview),
        D::Suppressed => Step::End(Ending::SwitchedOff),
        D::Stale | D::Superseded => Step::End(Ending::ThreadChanged),
        D::Approved | D::Rejected | D::Published | D::Cancelled => Step::End(Ending::Interrupted),
    }
}

impl Handler {
    pub(crate) fn stream_stale(&self) -> f64 {
        self.streams.map(|s| s.stale).unwrap_or(DEFAULT_STALE)
    }

    /// A stream to start for a decision still being called (work of kind
    /// stream start). Anything that is not a clean start is left to the
    /// settled decision's own answer, which posts it whole.
    pub(crate) async fn stream_start(
        &self,
        inst: Uuid,
        decision: Uuid,
    ) -> anyhow::Result<Disposition> {
        let Some(cfg) = self.streams else {
            return Ok(Disposition::Done);
        };
        let Some(proposals::ForPost {
            decision: d,
            unfurl,
            streaming_allowed,
            intent,
            action_streamed,
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
        // Settled already (the model was quicker than this message), not
        // allowed here, this event's intent was ever started or unknown, or
        // the person's action was streamed already (through the deleted
        // message this copy stands in for; one action streams once at
        // most): the settled answer is posted whole.
        let fresh_intent = match intent {
            None => true,
            Some((state, ever_unknown)) => {
                !ever_unknown
                    && matches!(
                        state,
                        IntentState::Pending
                            | IntentState::Withdrawn
                            | IntentState::FailedRetryable
                    )
            }
        };
        if d.status != DecisionStatus::Calling
            || !streaming_allowed
            || !fresh_intent
            || action_streamed
        {
            return Ok(Disposition::Done);
        }
        let Some(bot) = self.bot(inst).await? else {
            return Ok(Disposition::Done);
        };
        if !bot.scopes.is_empty() && !bot.scopes.iter().any(|s| s == "chat:write") {
            return Ok(Disposition::Done);
        }
        let job = Job::of(&d, unfurl);
        let claim = match self.claim_stream(&job).await? {
            Ok(claim) => claim,
            Err(done) => return Ok(done),
        };
        match self.start(&claim, &job, &bot).await? {
            Ok(ts) => self.drive(&claim, &job, &bot, &ts, cfg).await,
            Err(done) => Ok(done),
        }
    }

    /// The claim of the stream's start: the same checks, slot and claim as
    /// a post's (a stream is started once per intent), and the re-check.
    /// `Err`: what the message comes to instead.
    async fn claim_stream(&self, job: &Job<'_>) -> anyhow::Result<Result<Claimed, Disposition>> {
        let p = &job.proposal;
        let claim = match intents::claim_for(
            &self.pool,
            p,
            self.sending_stale,
            self.post_spacing,
            Claim::Stream,
        )
        .await?
        {
            Verdict::Claimed(c) => c,
            // The thread already moved on: the same as for a post, at once
            // (a decision still being called settles itself and finds the
            // thread changed).
            Verdict::Stale => return Ok(Err(self.stale(job).await?)),
            Verdict::SourceDeleted => return Ok(Err(self.source_deleted(job).await?)),
            Verdict::Suppressed(switch) => {
                return Ok(Err(self.suppressed(p.decision, &switch).await?));
            }
            // A slot or an event of the thread to wait for: try again while
            // the model runs (once it settled, the answer is posted whole).
            Verdict::NotNow(wait) => return Ok(Err(defer(wait.clamp(0.05, 2.0)))),
            _ => return Ok(Err(Disposition::Done)),
        };
        if claim.ever_unknown {
            intents::release(&self.pool, &claim, "stream_not_restarted", 0.0).await?;
            return Ok(Err(Disposition::Done));
        }
        let max_age = (self.sending_stale - self.slack_timeout).max(self.slack_timeout);
        match self.fence(p, &claim, max_age, Claim::Stream).await? {
            Fence::Go => Ok(Ok(claim)),
            Fence::Lost => Ok(Err(Disposition::Done)),
            _ => {
                // Whatever stopped it is the settled answer's to handle.
                intents::release(&self.pool, &claim, "stream_not_started", 0.0).await?;
                Ok(Err(Disposition::Done))
            }
        }
    }

    /// `chat.startStream`, the claimed side effect: the stream's ts, or what
    /// the message comes to (a start Slack refused posts the answer whole;
    /// one whose outcome is unknown is reconciled, never started again).
    async fn start(
        &self,
        claim: &Claimed,
        job: &Job<'_>,
        bot: &Bot,
    ) -> anyhow::Result<Result<String, Disposition>> {
        let p = &job.proposal;
        let to = streams::recipient(&self.pool, p.installation, p.channel, p.source_ts).await?;
        if !streams::starting(&self.pool, claim).await? {
            return Ok(Err(Disposition::Done));
        }
        let started = std::time::Instant::now();
        let r = self
            .web
            .start_stream(
                bot.token.expose_secret(),
                p.channel,
                p.root_ts,
                (to.user.as_deref(), to.team.as_deref()),
                &thinking::arg(&thinking::start()),
            )
            .await;
        metrics::histogram!("threadline_slack_post_seconds")
            .record(started.elapsed().as_secs_f64());
        let ts = match r {
            Ok(ts) => ts,
            // Slack said no (a recipient it does not know, an argument it
            // refuses): no stream exists; the claim goes back and the
            // answer is posted whole (the intent never streams again).
            Err(WebError::Api { code })
                if !matches!(code.as_str(), "internal_error" | "fatal_error") =>
            {
                tracing::warn!(code = %code, "Slack refused the stream's start; the answer will be posted whole");
                metrics::counter!("threadline_streams_refused_total").increment(1);
                intents::release(&self.pool, claim, "stream_refused", 0.0).await?;
                return Ok(Err(Disposition::Done));
            }
            Err(e) => return Ok(Err(self.failed(claim, p, e, "chat.startStream").await?)),
        };
        metrics::counter!("threadline_streams_started_total").increment(1);
        if !persist(|| streams::started(&self.pool, claim, &ts)).await? {
            // (cannot happen while the claim is young: a stream no intent
            // holds is ended unclaimed all the same)
            self.end_unclaimed(bot, p.channel, std::slice::from_ref(&ts))
                .await?;
            return Ok(Err(Disposition::Done));
        }
        Ok(Ok(ts))
    }

    /// Appends what inference releases, checking the thread between two
    /// appends, until the answer is whole or the stream must end.
    async fn drive(
        &self,
        claim: &Claimed,
        job: &Job<'_>,
        bot: &Bot,
        ts: &str,
        cfg: Streams,
    ) -> anyhow::Result<Disposition> {
        let p = &job.proposal;
        let token = bot.token.expose_secret();
        let mut shown = String::new();
        let mut pause = Duration::ZERO;
        let opened = std::time::Instant::now();
        loop {
            // (a pause never outlasts a third of the stale time: the steps
            // keep the stream's intent fresh)
            let most = Duration::from_secs_f64(cfg.stale / 3.0);
            tokio::time::sleep(cfg.append_every.max(pause.min(most))).await;
            pause = Duration::ZERO;
            let t = persist(|| streams::tick(&self.pool, p, claim)).await?;
            let next = match step(&t, p.version, &shown) {
                Step::Append(_) | Step::Wait if opened.elapsed() > cfg.max_open => {
                    Step::End(Ending::Interrupted)
                }
                // The answer becomes whole only when no acknowledged
                // delivery waits in the spool (one may change the thread),
                // as a post's last check.
                Step::Finish(_) if self.spool_waiting().await => Step::Wait,
                s => s,
            };
            match next {
                Step::Lost => return Ok(Disposition::Done),
                Step::Wait => {}
                Step::Append(more) => {
                    let chunks = thinking::arg(&thinking::append(&more));
                    let content = StreamContent::Chunks(&chunks);
                    match self.web.append_stream(token, p.channel, ts, content).await {
                        Ok(()) => shown.push_str(&more),
                        Err(WebError::RateLimited { retry_after }) => {
                            metrics::counter!("threadline_slack_rate_limited_total", "method" => "chat.appendStream").increment(1);
                            pause = retry_after;
                        }
                        Err(WebError::Api { code }) if code == "stopped_by_user" => {
                            // The person pressed Stop: what it shows is
                            // the answer they wanted.
                            return self.record_stream(claim, p, ts).await;
                        }
                        Err(WebError::Api { code }) if code == "message_not_in_streaming_state" => {
                            // Slack ended it (its lifetime ran out, or an
                            // earlier stop landed): what it shows decides,
                            // read by reconciliation once the answer is
                            // settled. One Slack expired is finished by
                            // updating it with the whole answer.
                            tracing::warn!(
                                "the stream is not open any more; reconciled from what Slack shows"
                            );
                            persist(|| {
                                streams::to_unknown(&self.pool, claim.id, "stream_not_open")
                            })
                            .await?;
                            return Ok(Disposition::Done);
                        }
                        Err(e) => {
                            // Ended elsewhere (its lifetime, a deletion), or
                            // it may or may not have landed: what the stream
                            // shows is no longer known, so it ends (what
                            // Slack shows then decides) and the whole answer
                            // follows.
                            tracing::warn!(error = %e, "append failed; ending the stream");
                            return self
                                .end_early(claim, job, bot, ts, &t, Ending::Interrupted, &shown)
                                .await;
                        }
                    }
                }
                Step::Finish(rest) => {
                    let blocks = blocks_arg(reply::Shown::Stopped {
                        label: t.label.as_deref().unwrap_or(FALLBACK_LABEL),
                        decision: &p.decision.to_string(),
                    });
                    let metadata = reply::answer_metadata(
                        &claim.id.to_string(),
                        t.output_hash.as_deref().unwrap_or_default(),
                        p.source_ts,
                    )
                    .to_string();
                    let chunks = thinking::arg(&thinking::finished(&rest, &t.sources));
                    let stop = Stop {
                        text: &rest,
                        chunks: &chunks,
                        blocks: &blocks,
                        metadata: &metadata,
                    };
                    return match self.stop_call(token, p.channel, ts, &stop).await {
                        Stopped::Yes => self.record_stream(claim, p, ts).await,
                        Stopped::RateLimited(wait) if opened.elapsed() < cfg.max_open => {
                            pause = wait;
                            continue;
                        }
                        Stopped::RateLimited(_)
                        | Stopped::AlreadyEnded
                        | Stopped::Refused
                        | Stopped::Unknown => {
                            // Whether this stop landed (an earlier try whose
                            // answer was lost) or the stream was ended
                            // elsewhere, Slack shows: reconciled from the
                            // stream's ts, never posted again blindly.
                            persist(|| {
                                streams::to_unknown(&self.pool, claim.id, "stream_stop_unknown")
                            })
                            .await?;
                            Ok(defer(1.0))
                        }
                    };
                }
                Step::End(ending) => {
                    return self
                        .end_early(claim, job, bot, ts, &t, ending, &shown)
                        .await;
                }
            }
        }
    }

    /// Ends the stream before the whole answer (`ending`, stopped now; a
    /// stop Slack refuses is tried again by whoever finds it due), then
    /// settles its decision as the ending says.
    #[allow(clippy::too_many_arguments)]
    async fn end_early(
        &self,
        claim: &Claimed,
        job: &Job<'_>,
        bot: &Bot,
        ts: &str,
        t: &Tick,
        ending: Ending,
        shown: &str,
    ) -> anyhow::Result<Disposition> {
        let p = &job.proposal;
        persist(|| streams::to_ending(&self.pool, claim.id, ending, 0.0)).await?;
        let e = ToEnd {
            intent: claim.id,
            installation: p.installation,
            channel: p.channel.to_owned(),
            root_ts: p.root_ts.to_owned(),
            stream_ts: ts.to_owned(),
            ending,
            shown: !shown.is_empty(),
            label: t.label.clone(),
        };
        self.stop_early(&e, bot).await?;
        self.after_ending(job, t, ending).await
    }

    /// What an ended stream leaves for its decision: a thread that moved on
    /// is reconsidered, a switch or deletion settles it; a decision that
    /// needs review waits for its reviewer (the approved answer is posted
    /// whole); anything else is posted whole by its settled proposal.
    pub(crate) async fn after_ending(
        &self,
        job: &Job<'_>,
        t: &Tick,
        ending: Ending,
    ) -> anyhow::Result<Disposition> {
        let calling = t.decision_status == DecisionStatus::Calling;
        let proposed = matches!(
            t.decision_status,
            DecisionStatus::Proposed | DecisionStatus::Approved
        );
        match ending {
            Ending::ThreadChanged if calling || proposed => self.stale(job).await,
            Ending::SourceDeleted if calling || proposed => self.source_deleted(job).await,
            Ending::SwitchedOff if calling || proposed => match &t.switch {
                Some(s) => self.suppressed(job.proposal.decision, s).await,
                None => {
                    intents::set_decision(
                        &self.pool,
                        job.proposal.decision,
                        DecisionStatus::Cancelled,
                        Some("installation_unavailable"),
                    )
                    .await?;
                    Ok(Disposition::Done)
                }
            },
            _ => Ok(Disposition::Done),
        }
    }

    /// The stream stopped with the whole answer (or the person stopped it):
    /// recorded like a post Slack accepted.
    async fn record_stream(
        &self,
        claim: &Claimed,
        p: &Proposal<'_>,
        ts: &str,
    ) -> anyhow::Result<Disposition> {
        let post = PostToRecord {
            intent: claim.id,
            decision: p.decision,
            ts: ts.to_owned(),
            reconciled: false,
        };
        let recorded = persist(|| self.records.submit(post.clone())).await?;
        metrics::counter!("threadline_reply_intents_total", "state" => IntentState::Sent.name())
            .increment(1);
        metrics::counter!("threadline_streams_finished_total").increment(1);
        self.after_record(&recorded, claim.id);
        Ok(Disposition::Done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tick(status: &str) -> Tick {
        use threadline_domain::state::Machine as _;
        Tick {
            mine: true,
            version: Some(3),
            source_deleted: false,
            switch: None,
            installation_active: true,
            decision_status: DecisionStatus::parse(status).expect("a status"),
            released: None,
            body: None,
            label: Some("AI".into()),
            output_hash: None,
            sources: Vec::new(),
            review_reasons: Vec::new(),
            pending: false,
        }
    }

    #[test]
    fn a_stream_appends_what_is_new_and_finishes_with_the_rest() {
        let mut t = tick("calling");
        assert_eq!(step(&t, 3, ""), Step::Wait);
        t.released = Some("Restart the".into());
        assert_eq!(step(&t, 3, ""), Step::Append("Restart the".into()));
        assert_eq!(step(&t, 3, "Restart the"), Step::Wait);
        // Text that no longer extends what was shown is not appended.
        t.released = Some("Something else".into());
        assert_eq!(step(&t, 3, "Restart the"), Step::Wait);
        let mut t = tick("proposed");
        t.body = Some("Restart the pod.".into());
        assert_eq!(step(&t, 3, "Restart the"), Step::Finish(" pod.".into()));
        t.pending = true;
        assert_eq!(
            step(&t, 3, "Restart the"),
            Step::Wait,
            "an unprocessed event first"
        );
        t.pending = false;
        t.body = Some("threadline could not process this request.".into());
        assert_eq!(step(&t, 3, "Restart the"), Step::End(Ending::Interrupted));
    }

    #[test]
    fn stored_text_past_the_output_policy_is_never_sent_in_a_stream() {
        let mut t = tick("calling");
        t.released = Some("Hello <!here> all".into());
        assert_eq!(step(&t, 3, "Hello"), Step::Wait);
        let mut t = tick("proposed");
        t.body = Some("Hello <!here> all\n\n_AI_".into());
        assert_eq!(step(&t, 3, "Hello"), Step::End(Ending::Interrupted));
    }

    #[test]
    fn a_markdown_link_is_never_sent_in_a_stream() {
        let mut t = tick("calling");
        t.released = Some("Read [the docs](https://evil.example)".into());
        assert_eq!(step(&t, 3, "Read"), Step::Wait, "not appended");
        let mut t = tick("proposed");
        t.body = Some("Read [the docs](https://evil.example) first.".into());
        assert_eq!(
            step(&t, 3, "Read"),
            Step::End(Ending::Interrupted),
            "the whole answer is posted instead"
        );
    }

    #[test]
    fn the_thread_moving_on_ends_a_stream_before_anything_else() {
        let mut t = tick("calling");
        t.released = Some("more".into());
        t.version = Some(4);
        assert_eq!(step(&t, 3, ""), Step::End(Ending::ThreadChanged));
        t.source_deleted = true;
        assert_eq!(step(&t, 3, ""), Step::End(Ending::SourceDeleted));
        t.switch = Some("global".into());
        assert_eq!(step(&t, 3, ""), Step::End(Ending::SwitchedOff));
        let mut t = tick("calling");
        t.installation_active = false;
        assert_eq!(step(&t, 3, ""), Step::End(Ending::SwitchedOff));
        let mut t = tick("proposed");
        t.mine = false;
        assert_eq!(step(&t, 3, ""), Step::Lost);
    }

    #[test]
    fn an_answer_that_needs_review_ends_the_stream_until_approved() {
        let mut t = tick("review");
        t.body = Some("ask <@U1>".into());
        assert_eq!(step(&t, 3, "ask"), Step::End(Ending::NeedsReview));
        let mut t = tick("proposed");
        t.review_reasons = vec!["mention".into()];
        assert_eq!(step(&t, 3, ""), Step::End(Ending::NeedsReview));
        assert_eq!(
            step(&tick("suppressed"), 3, ""),
            Step::End(Ending::SwitchedOff)
        );
        assert_eq!(
            step(&tick("stale"), 3, ""),
            Step::End(Ending::ThreadChanged)
        );
        assert_eq!(
            step(&tick("cancelled"), 3, ""),
            Step::End(Ending::Interrupted)
        );
    }
}
