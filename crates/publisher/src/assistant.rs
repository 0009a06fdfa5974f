//! The assistant pane (a person's thread with the app in their DM): the
//! greeting when it opens (suggested prompts, a title), progress while the
//! model answers (`assistant.threads.setStatus`), and the progress cleared
//! on every outcome that posts nothing (stale, superseded, suppressed,
//! cancelled, held for review, rejected); a posted reply clears it in
//! Slack. All of it is shown on a best-effort basis: it never holds up or
//! repeats an answer.

use secrecy::ExposeSecret as _;
use serde_json::json;
use threadline_runtime::worker::Disposition;
use threadline_slack::WebError;
use uuid::Uuid;

use crate::handler::{Handler, defer, jitter};

/// The progress shown while the model answers.
pub const THINKING: &str = "is thinking…";

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

    /// Shows progress in the assistant thread while decision `decision`'s
    /// model call runs (nothing once it has settled).
    pub(crate) async fn show_progress(
        &self,
        inst: Uuid,
        decision: Uuid,
        channel: &str,
        thread_ts: &str,
    ) -> anyhow::Result<Disposition> {
        match threadline_store::assistant::outcome(&self.pool, decision).await? {
            Some(o) if o.status == "calling" && !o.replied => {}
            _ => return Ok(Disposition::Done),
        }
        self.set_status(inst, channel, thread_ts, THINKING).await;
        // Settled while it was being set (even answered: the reply may have
        // cleared it before this call put it back): cleared again, unless
        // another question of the thread is being answered.
        if let Ok(Some(o)) = threadline_store::assistant::outcome(&self.pool, decision).await
            && o.status != "calling"
            && !o.others_calling
        {
            self.set_status(inst, channel, thread_ts, "").await;
        }
        Ok(Disposition::Done)
    }

    /// Clears the progress of an assistant thread once decision `decision`
    /// came to something that posted nothing.
    pub(crate) async fn clear_progress(
        &self,
        inst: Uuid,
        decision: Uuid,
        channel: &str,
        thread_ts: &str,
    ) {
        let outcome = match threadline_store::assistant::outcome(&self.pool, decision).await {
            Ok(o) => o,
            Err(e) => {
                tracing::warn!(error = %e, "reading an assistant thread's outcome failed; its progress times out in Slack");
                return;
            }
        };
        match outcome {
            // Not an assistant thread; or answered (Slack cleared it); or
            // still being answered or posted; or another question of the
            // thread is being answered (the progress showing is its).
            None => {}
            Some(o) if o.replied || o.others_calling => {}
            // (held for an operator or failed for good: nothing comes)
            Some(o) if o.stopped => self.set_status(inst, channel, thread_ts, "").await,
            Some(o) if matches!(o.status.as_str(), "calling" | "proposed" | "approved") => {}
            Some(_) => self.set_status(inst, channel, thread_ts, "").await,
        }
    }

    async fn set_status(&self, inst: Uuid, channel: &str, thread_ts: &str, status: &str) {
        let Ok(Some(bot)) = self.bot(inst).await else {
            return;
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
        }
    }
}
