//! The assistant pane (a person's thread with the app in their DM): the
//! greeting when it opens (suggested prompts, a title), progress while a
//! question is answered (`assistant.threads.setStatus`: the stage it is
//! at, in the thinking steps' words, as its loading message: the thread
//! read, the answer written, the thread checked before the post), and the
//! progress cleared on every outcome that posts nothing (stale,
//! superseded, suppressed, cancelled, held for review, rejected, failed,
//! dead-lettered); a posted reply clears it in Slack. The progress is
//! state derived from the thread's question being read and its
//! decisions, brought to Slack one call at a time per thread
//! ([`Handler::sync_progress`]). All of it is best effort: it never holds
//! up or repeats an answer.

use secrecy::ExposeSecret as _;
use serde_json::json;
use threadline_domain::thinking::Stage;
use threadline_runtime::worker::Disposition;
use threadline_slack::WebError;
use threadline_store::assistant::Target;
use uuid::Uuid;

use crate::handler::{Bot, Handler, defer, jitter};

/// The status shown while a question is answered; its loading message
/// names the stage ([`Stage::title`]).
pub const THINKING: &str = "is thinking…";

/// Progress still wanted after this long is set again (Slack ends a status
/// after two minutes without a reply).
const REFRESH_SECS: f64 = 90.0;

/// Progress is left to the answer's own publish this long before the
/// sweeper looks at it.
const SETTLE_SECS: f64 = 5.0;

/// Slack ends a status by itself after this long (two minutes).
const SLACK_LIMIT_SECS: f64 = 120.0;

/// The suggested prompts of a new assistant thread.
pub fn prompts() -> serde_json::Value {
    json!([
        {"title": "Explain an error", "message": "Explain this error and what usually causes it: "},
        {"title": "Draft a reply", "message": "Help me draft a reply to: "},
        {"title": "Check a step", "message": "What should I check before I run this: "},
    ])
}

impl Handler {
    /// Shows the suggested prompts and a title in a new assistant thread.
    pub(crate) async fn greet(
        &self,
        inst: Uuid,
        channel: &str,
        thread_ts: &str,
    ) -> anyhow::Result<Disposition> {
        let titled = match threadline_store::assistant::thread(&self.pool, inst, channel, thread_ts)
            .await?
        {
            None => return Ok(Disposition::Done),
            Some(t) if t.greeted => return Ok(Disposition::Done),
            Some(t) => t.titled,
        };
        let Some(bot) = self.bot(inst).await? else {
            return Ok(Disposition::Done);
        };
        if !bot.scopes.is_empty() && !bot.scopes.iter().any(|s| s == "assistant:write") {
            metrics::counter!("threadline_scope_refusals_total", "feature" => "assistant_pane", "scope" => "assistant:write")
                .increment(1);
            tracing::warn!(
                alert = "missing_scope",
                installation_id = %inst,
                "the installation lacks assistant:write; the pane gets no prompts or title (reinstall with the scope)"
            );
            return Ok(Disposition::Done);
        }
        let token = bot.token.expose_secret();
        let prompts = prompts().to_string();
        let now = time::OffsetDateTime::now_utc();
        let title = format!(
            "threadline · {:04}-{:02}-{:02} {:02}:{:02} UTC",
            now.year(),
            u8::from(now.month()),
            now.day(),
            now.hour(),
            now.minute()
        );
        let calls: [(&str, Vec<(&str, &str)>); 2] = [
            (
                "assistant.threads.setSuggestedPrompts",
                vec![
                    ("channel_id", channel),
                    ("thread_ts", thread_ts),
                    ("prompts", prompts.as_str()),
                ],
            ),
            (
                "assistant.threads.setTitle",
                vec![
                    ("channel_id", channel),
                    ("thread_ts", thread_ts),
                    ("title", title.as_str()),
                ],
            ),
        ];
        for (method, form) in calls {
            // (a title set from the first question already is kept: looked
            // at again right before, the prompts' call may have been slow)
            if method == "assistant.threads.setTitle"
                && (titled
                    || threadline_store::assistant::thread(&self.pool, inst, channel, thread_ts)
                        .await?
                        .is_some_and(|t| t.titled))
            {
                continue;
            }
            match self.web.call(method, token, &form).await {
                Ok(_) => {}
                // (setting them again is harmless: Slack replaces them)
                Err(WebError::RateLimited { retry_after }) => {
                    return Ok(defer(jitter(retry_after.as_secs_f64(), &inst)));
                }
                Err(WebError::Api { code }) => {
                    // (the other part may still be shown)
                    tracing::warn!(method, code = %code, "the assistant pane refused part of the greeting");
                }
                Err(e) => {
                    tracing::warn!(method, error = %e, "greeting the assistant pane failed; trying again");
                    return Ok(defer(jitter(2.0, &inst)));
                }
            }
        }
        threadline_store::assistant::greeted(&self.pool, inst, channel, thread_ts).await?;
        Ok(Disposition::Done)
    }

    /// Brings the progress of an assistant thread to what its question and
    /// decisions say: "is thinking…" with the stage as its loading message
    /// while a question is being read, or one of its decisions answered
    /// (written, then checked before its post), nothing once none is
    /// (stale, superseded, suppressed, cancelled, held for review,
    /// rejected, failed, or answered: a reply clears it in Slack). No lock
    /// is held across the Slack call: every call that may have reached
    /// Slack is followed by a compare-and-set of the thread's record on its
    /// generation, and a publisher whose record lost (another's call may
    /// have reached Slack after its own) calls again with what the thread
    /// should show then, unless both calls carried the same status, so the
    /// last call Slack applies is the right one. A call Slack did not take
    /// now (a 429, a timeout) is recorded as possibly applied and looked at
    /// again by the sweeper after Slack's `Retry-After`. `replied`: the app
    /// may just have replied in the thread, which ends any status in Slack,
    /// so Slack is called whatever the record says.
    pub(crate) async fn sync_progress(
        &self,
        inst: Uuid,
        channel: &str,
        thread_ts: &str,
        replied: bool,
    ) -> anyhow::Result<()> {
        // (the token is looked up only when Slack is to be called)
        let mut bot: Option<Option<Bot>> = None;
        let mut again = replied;
        // The target of this publisher's last call, once it made one.
        let mut sent: Option<Option<Target>> = None;
        for _ in 0..4 {
            let Some(p) =
                threadline_store::assistant::progress(&self.pool, inst, channel, thread_ts).await?
            else {
                return Ok(());
            };
            // What the record says is what Slack got, unless a call may
            // still land or the app's reply ended it.
            let known = p.confirmed && !again;
            let no_call = match (p.live, p.shown) {
                // Set again before Slack's limit ends it while the model runs.
                (Some(live), Some(s)) if s == live && p.shown_for < REFRESH_SECS && known => {
                    return Ok(());
                }
                (None, None) if known => return Ok(()),
                // This call and the one recorded since carried the same
                // status: whichever Slack applied last shows the right one.
                // The record is taken again without a call, so that a third
                // publisher whose call crossed both learns it.
                _ if sent == Some(p.live) && p.shown == p.live => true,
                // (Slack ended it by itself already)
                (None, _) => p.shown_for >= SLACK_LIMIT_SECS,
                _ => false,
            };
            let call = if no_call {
                Call::Taken
            } else {
                if bot.is_none() {
                    match self.bot(inst).await {
                        Ok(b) => bot = Some(b),
                        Err(e) => tracing::warn!(
                            error = format!("{e:#}"),
                            "no token to show the pane's progress with; looked at again later"
                        ),
                    }
                }
                match &bot {
                    Some(b) => {
                        let stage = p.live.map(|t| t.stage);
                        self.set_status(b.as_ref(), channel, thread_ts, stage).await
                    }
                    // (the token could not be opened: tried again in a while)
                    None => Call::Later(30.0),
                }
            };
            sent = Some(p.live);
            let recorded = match call {
                Call::Taken => {
                    threadline_store::assistant::set_shown(
                        &self.pool,
                        inst,
                        channel,
                        thread_ts,
                        p.generation,
                        p.live,
                        SETTLE_SECS,
                    )
                    .await?
                }
                Call::Later(after) => {
                    threadline_store::assistant::not_taken(
                        &self.pool,
                        inst,
                        channel,
                        thread_ts,
                        p.generation,
                        p.live,
                        after,
                    )
                    .await?
                }
            };
            if recorded {
                return Ok(());
            }
            again = true;
        }
        // Its last call may have landed after the one recorded: looked at
        // again soon, calling Slack whatever the record says.
        tracing::warn!("an assistant thread's progress kept changing; it is looked at again");
        threadline_store::assistant::look_again(&self.pool, inst, channel, thread_ts, 2.0).await?;
        Ok(())
    }

    /// After an answer of a DM thread came to something (posted or not):
    /// its progress follows (a failure here is left to the sweeper).
    pub(crate) async fn after_pane_answer(&self, inst: Uuid, channel: &str, thread_ts: &str) {
        if let Err(e) = self.sync_progress(inst, channel, thread_ts, true).await {
            tracing::warn!(
                error = format!("{e:#}"),
                "updating an assistant thread's progress failed; the sweeper looks again"
            );
        }
    }

    /// Looks again at the progress of assistant threads that nothing else
    /// will: a model call whose worker died or froze past its lease (or was
    /// dead-lettered) left it showing, a call Slack did not take, or a model
    /// call that outlives Slack's two-minute limit. Rows are taken with a
    /// short lease (`SKIP LOCKED`), at most [`SWEEP_THREADS`] a round, and
    /// the round is bounded in time so that it never holds up the rest of
    /// the sweep.
    pub(crate) async fn sweep_progress(&self) -> anyhow::Result<()> {
        let due =
            threadline_store::assistant::take_due(&self.pool, SWEEP_THREADS, SWEEP_LEASE_SECS)
                .await?;
        let round = async {
            for t in due {
                if let Err(e) = self
                    .sync_progress(t.installation, &t.channel, &t.thread_ts, false)
                    .await
                {
                    tracing::warn!(
                        error = format!("{e:#}"),
                        "looking at an assistant thread's progress failed; next round"
                    );
                }
            }
        };
        // (what is left is due again once its lease ends)
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), round).await;
        Ok(())
    }

    /// Names the thread after its first question (`title`, plain text from
    /// inference): once, by whichever publisher takes it first. Best
    /// effort: the opening title stays if Slack does not take it.
    pub(crate) async fn title_from_question(
        &self,
        inst: Uuid,
        channel: &str,
        thread_ts: &str,
        title: &str,
    ) {
        let title: String = title
            .chars()
            .take(threadline_domain::assistant::TITLE_CHARS)
            .collect();
        match threadline_store::assistant::take_title(&self.pool, inst, channel, thread_ts).await {
            Ok(true) => {}
            Ok(false) => return,
            Err(e) => {
                tracing::warn!(error = %e, "taking the pane's title failed; it keeps the opening one");
                return;
            }
        }
        let Ok(Some(bot)) = self.bot(inst).await else {
            return;
        };
        let form = [
            ("channel_id", channel),
            ("thread_ts", thread_ts),
            ("title", title.as_str()),
        ];
        if let Err(e) = self
            .web
            .call(
                "assistant.threads.setTitle",
                bot.token.expose_secret(),
                &form,
            )
            .await
        {
            tracing::warn!(error = %e, "Slack did not take the pane's title; it keeps the opening one");
        }
    }

    /// Sets the thread's status at `stage` (none: clears it).
    async fn set_status(
        &self,
        bot: Option<&Bot>,
        channel: &str,
        thread_ts: &str,
        stage: Option<Stage>,
    ) -> Call {
        let Some(bot) = bot else {
            // (no token any more: nothing can be shown or cleared)
            return Call::Taken;
        };
        let loading = stage.map(|s| json!([s.title()]).to_string());
        let mut form = vec![
            ("channel_id", channel),
            ("thread_ts", thread_ts),
            ("status", if stage.is_some() { THINKING } else { "" }),
        ];
        if let Some(l) = &loading {
            form.push(("loading_messages", l.as_str()));
        }
        match self
            .web
            .call(
                "assistant.threads.setStatus",
                bot.token.expose_secret(),
                &form,
            )
            .await
        {
            Ok(_) => Call::Taken,
            Err(WebError::RateLimited { retry_after }) => {
                Call::Later(retry_after.as_secs_f64().max(1.0))
            }
            // Slack's own trouble: it may have applied the call.
            Err(WebError::Api { code }) if UNKNOWN_CODES.contains(&code.as_str()) => {
                Call::Later(2.0)
            }
            // Refused for good (the thread gone, the scope missing): asking
            // again changes nothing.
            Err(WebError::Api { code }) => {
                tracing::warn!(code = %code, cleared = stage.is_none(), "Slack refused the assistant thread's status");
                Call::Taken
            }
            Err(e) => {
                // (Slack clears a status by itself after two minutes)
                tracing::warn!(error = %e, cleared = stage.is_none(), "setting the assistant thread's status failed; looked at again later");
                Call::Later(2.0)
            }
        }
    }
}

/// What became of a `setStatus` call.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Call {
    /// Done, or refused for good: recorded as done.
    Taken,
    /// Not taken now (a 429, a timeout, Slack's own error), though Slack
    /// may still apply it: looked at again after this many seconds.
    Later(f64),
}

/// Slack's codes after which a call may or may not have been applied.
const UNKNOWN_CODES: &[&str] = &["fatal_error", "internal_error", "service_unavailable"];

/// Threads the sweeper looks at in one round, and how long it holds each.
const SWEEP_THREADS: i64 = 100;
const SWEEP_LEASE_SECS: f64 = 30.0;
