//! The one reply mechanism's steps that every form of answer shares: what
//! a refused or uncertain creating call (a post, a stream's start) leaves,
//! and reconciling an intent whose outcome is unknown from what Slack
//! shows (the rules are [`threadline_domain::reply`]'s). A form brings only
//! its Slack calls: the answer posts ([`crate::answer`]), a stream starts,
//! appends and stops ([`crate::stream`]), and an early end is stopped until
//! Slack confirms it ([`crate::ending`]).

use secrecy::ExposeSecret as _;
use threadline_domain::reply::Found;
use threadline_domain::state::{DecisionStatus, IntentState};
use threadline_runtime::worker::Disposition;
use threadline_slack::WebError;
use uuid::Uuid;

use crate::handler::{Bot, Handler, Job, defer, jitter, persist};
use crate::intents::{self, Claimed, Proposal};
use crate::reconcile;

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

impl Handler {
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
                metrics::counter!("threadline_reply_intents_total", "state" => IntentState::FailedPermanent.name())
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
                metrics::counter!("threadline_reply_intents_total", "state" => IntentState::Unknown.name())
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
        let (found, wait, seen) = reconcile::run(
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
            // Its stream expired in Slack: finished by updating it, never
            // by a second message.
            Found::Expired(ts) => {
                let x = crate::expired::Expired {
                    intent,
                    ts: &ts,
                    shown: seen.expired_text.get(&ts).map_or("", String::as_str),
                    holder: crate::expired::Holder::Reconciling,
                };
                self.finish_expired(&x, job, bot).await
            }
            // Its stream is stopped (or being stopped), or ended: the whole
            // answer is claimed next, once Slack confirmed the stop.
            Found::Open(_) | Found::Ended(_) | Found::Unclaimed(_) => Ok(defer(0.5)),
            Found::Repost => Ok(defer(1.0)),
            Found::Again => Ok(defer(wait)),
        }
    }
}
