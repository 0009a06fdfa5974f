//! The assistant pane (a person's thread with the app in their DM): the
//! greeting when it opens (suggested prompts, a title), progress while the
//! model answers (`assistant.threads.setStatus`), and the progress cleared
//! on every outcome that posts nothing (stale, superseded, suppressed,
//! cancelled, held for review, rejected, failed, dead-lettered); a posted
//! reply clears it in Slack. The progress is state derived from the
//! thread's decisions, brought to Slack one call at a time per thread
//! ([`Handler::sync_progress`]). All of it is best effort: it never holds
//! up or repeats an answer.

use secrecy::ExposeSecret as _;
use serde_json::json;
use threadline_runtime::worker::Disposition;
use threadline_slack::WebError;
use uuid::Uuid;

use crate::handler::{Handler, defer, jitter};

/// The progress shown while the model answers.
pub const THINKING: &str = "is thinking…";

/// Progress still wanted after this long is set again (Slack ends a status
/// after two minutes without a reply).
const REFRESH_SECS: f64 = 90.0;

/// Progress is left to the answer's own publish this long before the
/// sweeper looks at it.
const SETTLE_SECS: f64 = 5.0;

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
        match threadline_store::assistant::thread(&self.pool, inst, channel, thread_ts).await? {
            None | Some(true) => return Ok(Disposition::Done),
            Some(false) => {}
        }
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

    /// Brings the progress of an assistant thread to what its decisions
    /// say: "is thinking…" while one of them is being answered, nothing once
    /// none is (stale, superseded, suppressed, cancelled, held for review,
    /// rejected, failed, or answered: a reply clears it in Slack). Under
    /// the thread row's lock, so two questions of one thread set and clear
    /// it one call at a time, in the order of what they read; the lock is
    /// held for one `setStatus` call at most. Best effort: a call that fails
    /// is left to the sweeper (a progress it set) or to Slack's own
    /// two-minute limit.
    pub(crate) async fn sync_progress(
        &self,
        inst: Uuid,
        channel: &str,
        thread_ts: &str,
    ) -> anyhow::Result<()> {
        let mut tx = self.pool.begin().await?;
        let Some(p) =
            threadline_store::assistant::lock_progress(&mut tx, inst, channel, thread_ts).await?
        else {
            return Ok(());
        };
        // (what the app's reply cleared in Slack shows nothing)
        let shown = p.shown.filter(|_| !p.cleared_by_reply);
        let set = match (p.live, shown) {
            // Set again before Slack's limit ends it while the model runs.
            (Some(live), Some(s)) if s == live && p.shown_for < REFRESH_SECS => None,
            (Some(live), _) => Some((THINKING, Some(live))),
            (None, Some(_)) => Some(("", None)),
            (None, None) if p.shown.is_some() => {
                threadline_store::assistant::set_shown(&mut tx, inst, channel, thread_ts, None)
                    .await?;
                None
            }
            (None, None) => None,
        };
        if let Some((status, decision)) = set
            && self.set_status(inst, channel, thread_ts, status).await
        {
            threadline_store::assistant::set_shown(&mut tx, inst, channel, thread_ts, decision)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// After an answer of a DM thread came to something (posted or not):
    /// its progress follows (a failure here is left to the sweeper).
    pub(crate) async fn after_pane_answer(&self, inst: Uuid, channel: &str, thread_ts: &str) {
        if let Err(e) = self.sync_progress(inst, channel, thread_ts).await {
            tracing::warn!(
                error = format!("{e:#}"),
                "updating an assistant thread's progress failed; the sweeper looks again"
            );
        }
    }

    /// Looks again at the progress of assistant threads that nothing else
    /// will: an answer dead-lettered or lost with its worker left it
    /// showing, or a model call outlives Slack's two-minute limit.
    pub(crate) async fn sweep_progress(&self) -> anyhow::Result<()> {
        let due =
            threadline_store::assistant::showing_due(&self.pool, SETTLE_SECS, REFRESH_SECS, 100)
                .await?;
        for t in due {
            if let Err(e) = self
                .sync_progress(t.installation, &t.channel, &t.thread_ts)
                .await
            {
                tracing::warn!(
                    error = format!("{e:#}"),
                    "looking at an assistant thread's progress failed; next round"
                );
            }
        }
        Ok(())
    }

    /// Sets the thread's status (`""` clears it); true when Slack took it.
    async fn set_status(&self, inst: Uuid, channel: &str, thread_ts: &str, status: &str) -> bool {
        let Ok(Some(bot)) = self.bot(inst).await else {
            return false;
        };
        let form = [
            ("channel_id", channel),
            ("thread_ts", thread_ts),
            ("status", status),
        ];
        if let Err(e) = self
            .web
            .call(
                "assistant.threads.setStatus",
                bot.token.expose_secret(),
                &form,
            )
            .await
        {
            // (Slack clears a status by itself after two minutes)
            tracing::warn!(error = %e, cleared = status.is_empty(), "setting the assistant thread's status failed");
            return false;
        }
        true
    }
}
