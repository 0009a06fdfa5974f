//! The agent messaging experience (`features.agent_view`): a person opened
//! the app's Messages tab (their DM with the app), and the publisher sets
//! the suggested prompts at the top of the tab
//! (`assistant.threads.setSuggestedPrompts` with the DM and no thread), the
//! same prompts and rules as the assistant pane's greeting: once per DM,
//! under the DM policy the context-builder checked, and without
//! `assistant:write` an `alert=missing_scope` and nothing shown. The tab has
//! no thread to name, so no title is set; a question's own thread shows
//! progress as a pane thread does ([`crate::pane`]). Best effort: it never
//! holds up an answer.

use secrecy::ExposeSecret as _;
use threadline_runtime::worker::Disposition;
use threadline_slack::WebError;
use uuid::Uuid;

use crate::handler::{Handler, defer, jitter};

/// The heading Slack shows above the prompts.
pub const PROMPTS_TITLE: &str = "How can threadline help?";

impl Handler {
    /// Shows the suggested prompts at the top of an agent's Messages tab.
    pub(crate) async fn greet_agent(
        &self,
        inst: Uuid,
        channel: &str,
    ) -> anyhow::Result<Disposition> {
        match threadline_store::agent_view::view(&self.pool, inst, channel).await? {
            Some(v) if !v.greeted => {}
            // (gone, or greeted already)
            _ => return Ok(Disposition::Done),
        }
        let Some(bot) = self.bot(inst).await? else {
            return Ok(Disposition::Done);
        };
        if !bot.scopes.is_empty() && !bot.scopes.iter().any(|s| s == "assistant:write") {
            metrics::counter!("threadline_scope_refusals_total", "feature" => "agent_view", "scope" => "assistant:write")
                .increment(1);
            tracing::warn!(
                alert = "missing_scope",
                installation_id = %inst,
                "the installation lacks assistant:write; the agent's Messages tab gets no prompts (reinstall with the scope)"
            );
            // Settled as a definite refusal is: each opening of the tab
            // would ask (and alert) again otherwise.
            threadline_store::agent_view::greeted(&self.pool, inst, channel).await?;
            return Ok(Disposition::Done);
        }
        let prompts = crate::pane::prompts().to_string();
        let form = [
            ("channel_id", channel),
            ("prompts", prompts.as_str()),
            ("title", PROMPTS_TITLE),
        ];
        match self
            .web
            .call(
                "assistant.threads.setSuggestedPrompts",
                bot.token.expose_secret(),
                &form,
            )
            .await
        {
            Ok(_) => {}
            Err(WebError::RateLimited { retry_after }) => {
                return Ok(defer(jitter(retry_after.as_secs_f64(), &inst)));
            }
            Err(WebError::Api { code }) => {
                // (a definite refusal: asking again would be refused again)
                tracing::warn!(code = %code, "Slack refused the agent's suggested prompts");
            }
            Err(e) => {
                tracing::warn!(error = %e, "greeting the agent's Messages tab failed; trying again");
                return Ok(defer(jitter(2.0, &inst)));
            }
        }
        threadline_store::agent_view::greeted(&self.pool, inst, channel).await?;
        metrics::counter!("threadline_agent_greetings_total").increment(1);
        Ok(Disposition::Done)
    }
}
