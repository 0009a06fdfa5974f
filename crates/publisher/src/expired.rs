//! A stream Slack expired (its lifetime ran out before its stop; appends
//! and stops then answer `message_not_in_streaming_state`) is finished by
//! updating that same message, never by a second one beside it. The rules
//! are [`threadline_domain::reply`]'s: reconciliation finds the intent's
//! stream expired ([`Found::Expired`](threadline_domain::reply::Found)),
//! and so does a stop Slack answered that the stream was not open. Whoever
//! holds the intent then (a reconciliation, `reconciling`; a stop,
//! `ending`) runs the checks a stream's finishing stop runs
//! ([`crate::stream::step`] on one [`streams::tick_as`]: the thread not
//! moved on, no kill switch, the source not deleted, nothing unprocessed
//! in the thread, the decision standing, the output policy on the stored
//! body) and updates the message with the whole answer as a post shows it
//! (text, blocks with the AI label, [`reply::answer_metadata`]), recorded
//! like a post; or, when the answer may not be shown any more, with what
//! it showed and its closing line ([`reply::ending_metadata`]), and the
//! intent is `interrupted` as after any early stop. An update whose outcome
//! is unknown is reconciled like a post (the landed update names the
//! intent) and tried again while Slack still shows the stream expired: it
//! is idempotent.

use secrecy::ExposeSecret as _;
use serde_json::json;
use threadline_domain::reply::{self, Ending};
use threadline_domain::state::IntentState;
use threadline_runtime::worker::Disposition;
use threadline_slack::WebError;
use threadline_store::streams::{self, ToEnd};
use uuid::Uuid;

use crate::ending::FALLBACK_LABEL;
use crate::handler::{Bot, Handler, Job, defer, jitter, persist};
use crate::intents::PostToRecord;
use crate::stream::Step;

/// How long an expired stream being updated is kept from other stoppers.
const LEASE_SECS: f64 = 10.0;

/// The most characters a section block shows (Slack's limit is 3,000).
const MAX_SECTION_CHARS: usize = 2990;

/// Who holds the intent while its expired stream is finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Holder {
    /// A reconciliation (`reconciling`): the answer's own checks decide.
    Reconciling,
    /// A stop (`ending`) with its reason: an answer ended for a reason of
    /// its own (the thread moved on, a switch, a review) closes with it;
    /// one only interrupted (its publisher died, an append failed) is
    /// finished whole when its answer stands.
    Ending(Ending),
}

impl Holder {
    fn state(self) -> IntentState {
        match self {
            Self::Reconciling => IntentState::Reconciling,
            Self::Ending(_) => IntentState::Ending,
        }
    }
}

/// An expired stream: its intent, where it is, and what it shows.
pub(crate) struct Expired<'a> {
    pub(crate) intent: Uuid,
    pub(crate) ts: &'a str,
    /// The text it shows (what it streamed before Slack expired it).
    pub(crate) shown: &'a str,
    pub(crate) holder: Holder,
}

/// What an expired stream that ends without the answer is updated to: what
/// it showed (cut to fit one section), then its closing line.
pub(crate) fn closed_text(shown: &str, ending: Ending) -> String {
    let shown = shown.trim_end();
    let closing = ending.closing(!shown.is_empty());
    let room = MAX_SECTION_CHARS.saturating_sub(closing.chars().count());
    if shown.chars().count() <= room {
        return format!("{shown}{closing}");
    }
    let cut: String = shown.chars().take(room.saturating_sub(1)).collect();
    format!("{cut}…{closing}")
}

impl Handler {
    /// Finishes the expired stream `x` of `job`'s event: the whole answer
    /// when it stands and the thread did not move on, else its closing
    /// line; waits while the answer is not whole yet.
    pub(crate) async fn finish_expired(
        &self,
        x: &Expired<'_>,
        job: &Job<'_>,
        bot: &Bot,
    ) -> anyhow::Result<Disposition> {
        let t = persist(|| {
            streams::tick_as(&self.pool, &job.proposal, x.intent, None, x.holder.state())
        })
        .await?;
        // The decision as it is now, read after the checks: the job's copy
        // may be older (a job republished while the model still wrote), and
        // what the update shows must be what the checks passed.
        let Some(d) = crate::proposals::load(&self.pool, job.proposal.decision).await? else {
            return Ok(Disposition::Done);
        };
        let fresh = Job::of(&d, job.unfurl);
        let job = &fresh;
        let p = &job.proposal;
        // (a stop's own reason for ending the answer stands)
        let forced = match x.holder {
            Holder::Ending(e) if e != Ending::Interrupted => Some(e),
            _ => None,
        };
        let next = match (crate::stream::step(&t, p.version, ""), forced) {
            (s @ (Step::Lost | Step::End(_)), _) => s,
            (_, Some(e)) => Step::End(e),
            // The last checks of any whole answer: nothing waits in the
            // spool, and the stored body passes the output policy.
            (Step::Finish(_), None) if self.spool_waiting().await => Step::Wait,
            (Step::Finish(_), None) if crate::answer::refused(job.decision).is_some() => {
                Step::End(Ending::Interrupted)
            }
            // (settled, but not read back whole yet)
            (Step::Finish(_), None)
                if job
                    .decision
                    .body_text
                    .as_deref()
                    .unwrap_or_default()
                    .is_empty() =>
            {
                Step::Wait
            }
            (s, None) => s,
        };
        match next {
            // Another holder moved the intent on.
            Step::Lost => Ok(Disposition::Done),
            // Not whole yet (the model still writes, an event of the thread
            // is not processed): looked at again.
            Step::Wait | Step::Append(_) => {
                if let Holder::Ending(e) = x.holder {
                    persist(|| streams::to_ending(&self.pool, x.intent, e, 2.0)).await?;
                }
                Ok(defer(2.0))
            }
            Step::Finish(_) => self.update_whole(x, job, bot).await,
            Step::End(ending) => {
                self.close_expired(x, p.channel, ending, &t.label, bot)
                    .await?;
                match (x.holder, ending) {
                    // Found by a reconciliation of the answer's own job,
                    // ended for a reason that is not the thread's (the
                    // output policy, a review, an interruption): the whole
                    // answer, or its review request, follows on this job
                    // once the intent is settled, as after any stream
                    // ended without the answer.
                    (Holder::Reconciling, Ending::Interrupted | Ending::NeedsReview) => {
                        Ok(defer(0.5))
                    }
                    _ => self.after_ending(job, &t, ending).await,
                }
            }
        }
    }

    /// The expired stream updated to the whole answer, as a post shows it,
    /// and recorded like one (its crossing bound is now).
    async fn update_whole(
        &self,
        x: &Expired<'_>,
        job: &Job<'_>,
        bot: &Bot,
    ) -> anyhow::Result<Disposition> {
        let p = &job.proposal;
        let metadata =
            reply::answer_metadata(&x.intent.to_string(), p.body_hash, p.source_ts).to_string();
        // (as a post of the whole answer shows it: its blocks, its label and
        // its feedback buttons)
        let decision = p.decision.to_string();
        let blocks = reply::blocks_arg(reply::Shown::Posted {
            blocks: job.decision.body_blocks.as_ref(),
            decision: &decision,
        });
        let r = self
            .web
            .update_message(
                bot.token.expose_secret(),
                p.channel,
                x.ts,
                job.decision.body_text.as_deref().unwrap_or_default(),
                &blocks,
                &metadata,
            )
            .await;
        match r {
            Ok(()) => {
                let post = PostToRecord {
                    intent: x.intent,
                    decision: p.decision,
                    ts: x.ts.to_owned(),
                    reconciled: false,
                };
                let recorded = persist(|| self.records.submit(post.clone())).await?;
                metrics::counter!("threadline_streams_expired_total", "finished" => "answer")
                    .increment(1);
                metrics::counter!("threadline_reply_intents_total", "state" => IntentState::Sent.name())
                    .increment(1);
                tracing::info!(intent_id = %x.intent, "an expired stream was finished with the whole answer");
                self.after_record(&recorded, x.intent);
                Ok(Disposition::Done)
            }
            Err(e) => self.update_failed(x, e, Ending::Interrupted).await,
        }
    }

    /// The expired stream updated to what it showed and its closing line
    /// (metadata naming the intent as interrupted): the intent is
    /// `interrupted` once Slack took it (else it stays `ending`, due
    /// again).
    async fn close_expired(
        &self,
        x: &Expired<'_>,
        channel: &str,
        ending: Ending,
        label: &Option<String>,
        bot: &Bot,
    ) -> anyhow::Result<bool> {
        // (held as a stop holds it, so that no one else stops it meanwhile;
        // an intent another holder settled meanwhile is left as it is)
        if !persist(|| streams::to_ending(&self.pool, x.intent, ending, LEASE_SECS)).await? {
            return Ok(false);
        }
        let text = closed_text(x.shown, ending);
        let label = label.as_deref().unwrap_or(FALLBACK_LABEL);
        // (the closing line and the label; no answer, so nothing to rate)
        let blocks = json!([
            {"type": "section", "text": {"type": "mrkdwn", "text": text}},
            reply::label_block(label)
        ])
        .to_string();
        let metadata = reply::ending_metadata(Some(&x.intent.to_string()), ending).to_string();
        let r = self
            .web
            .update_message(
                bot.token.expose_secret(),
                channel,
                x.ts,
                &text,
                &blocks,
                &metadata,
            )
            .await;
        match r {
            Ok(()) => {
                persist(|| streams::interrupted(&self.pool, x.intent, ending)).await?;
                metrics::counter!("threadline_streams_expired_total", "finished" => "closing_line")
                    .increment(1);
                metrics::counter!("threadline_streams_interrupted_total", "reason" => ending.reason())
                    .increment(1);
                tracing::info!(
                    reason = ending.reason(),
                    "an expired stream was closed with its closing line"
                );
                Ok(true)
            }
            Err(e) => {
                let x = Expired {
                    holder: Holder::Ending(ending),
                    ..*x
                };
                self.update_failed(&x, e, ending).await?;
                Ok(false)
            }
        }
    }

    /// What an update Slack did not take leaves: a 429 waits out its
    /// `Retry-After`; an outcome not known is read again (the landed update
    /// names the intent); a refusal for good (the message gone, updates
    /// refused) ends the intent as interrupted, and the whole answer
    /// follows as a post.
    async fn update_failed(
        &self,
        x: &Expired<'_>,
        e: WebError,
        ending: Ending,
    ) -> anyhow::Result<Disposition> {
        let wait = match e {
            WebError::RateLimited { retry_after } => {
                metrics::counter!("threadline_slack_rate_limited_total", "method" => "chat.update")
                    .increment(1);
                jitter(retry_after.as_secs_f64(), &x.intent)
            }
            WebError::Api { code }
                if !matches!(code.as_str(), "internal_error" | "fatal_error") =>
            {
                tracing::warn!(code = %code, intent_id = %x.intent, "Slack refused to update an expired stream; the answer will be posted whole");
                metrics::counter!("threadline_streams_expired_total", "finished" => "refused")
                    .increment(1);
                persist(|| {
                    streams::ended_in_slack(&self.pool, x.intent, Some(x.ts), "expired_not_updated")
                })
                .await?;
                return Ok(defer(0.5));
            }
            e => {
                tracing::warn!(error = %e, intent_id = %x.intent, "updating an expired stream: outcome unknown");
                2.0
            }
        };
        match x.holder {
            Holder::Reconciling => {
                persist(|| streams::to_unknown(&self.pool, x.intent, "expired_update_unknown"))
                    .await?;
            }
            Holder::Ending(_) => {
                persist(|| streams::to_ending(&self.pool, x.intent, ending, wait)).await?;
            }
        }
        Ok(defer(wait))
    }

    /// A stop found `e`'s stream expired (Slack answered that it was not
    /// open, and shows it expired): finished by update with the answer of
    /// the intent's decision, or its closing line. True when Slack took it.
    pub(crate) async fn expired_at_stop(
        &self,
        e: &ToEnd,
        ts: &str,
        shown: &str,
        bot: &Bot,
    ) -> anyhow::Result<bool> {
        let decision = crate::intents::decision_of(&self.pool, e.intent).await?;
        let Some(d) = crate::proposals::load(&self.pool, decision).await? else {
            return Ok(false);
        };
        let job = Job::of(&d, false);
        let x = Expired {
            intent: e.intent,
            ts,
            shown,
            holder: Holder::Ending(e.ending),
        };
        let done = self.finish_expired(&x, &job, bot).await?;
        Ok(matches!(done, Disposition::Done))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_expired_stream_keeps_what_it_showed_within_one_section() {
        assert_eq!(
            closed_text("Restart the ", Ending::ThreadChanged),
            format!("Restart the{}", Ending::ThreadChanged.closing(true))
        );
        assert_eq!(
            closed_text("", Ending::SwitchedOff),
            Ending::SwitchedOff.closing(false)
        );
        let long = "x".repeat(2950);
        let t = closed_text(&long, Ending::NeedsReview);
        assert!(t.chars().count() <= MAX_SECTION_CHARS, "{}", t.len());
        assert!(t.ends_with(&Ending::NeedsReview.closing(true)));
        assert!(t.contains('…'));
    }
}
