//! The agent messaging experience (`features.agent_view`): the person's
//! DM with the app is its Messages tab. `app_home_opened` on that tab is
//! recorded and greeted (where the assistant pane had
//! `assistant_thread_started`); `app_context_changed` records what the
//! person looks at, as the pane's context channel is: the most relevant
//! channel-like entity (a channel, or a message's channel), identifiers
//! only, read with a question only where the channel policy would answer
//! there and within the shared read budget (`Handler::viewed_channel`);
//! canvases, lists, other DMs and less relevant entities are counted and not
//! kept. Each top-level message in the tab is a thread of its own (the
//! answer goes in it); its thread is recorded as an assistant thread, so
//! the pane's progress and viewed-context rules apply to it.

use threadline_domain::agent_view::{self, AgentEvent, Kind};
use threadline_domain::classify;
use threadline_domain::state::ReceiptState;
use threadline_proto::v1::EventAccepted;
use uuid::Uuid;

use crate::handler::{Handler, Step};
use crate::store::Installation;

impl Handler {
    /// An agent-view event: the Messages tab opened (greeted through the
    /// outbox, once per DM) or what the person looks at changed, recorded
    /// under the DM policy (the tab is a DM with the app). The Home tab's
    /// `app_home_opened` is not the agent's: ignored.
    pub(crate) async fn agent_event(
        &self,
        ev: &EventAccepted,
        receipt: Uuid,
        inst: &Installation,
        policy: &classify::TriggerPolicy,
        event: &serde_json::Value,
    ) -> anyhow::Result<Step> {
        let (opened, e) = match agent_view::parse(event) {
            Some(Kind::Opened(e)) => (true, e),
            Some(Kind::ContextChanged(e)) => (false, e),
            Some(Kind::OtherTab) => {
                return self
                    .end(ev, receipt, ReceiptState::Ignored, "app_home_tab")
                    .await;
            }
            Some(Kind::Unaddressed) => {
                return self
                    .end(
                        ev,
                        receipt,
                        ReceiptState::Ignored,
                        "agent_context_unaddressed",
                    )
                    .await;
            }
            None => {
                return self
                    .end(ev, receipt, ReceiptState::Failed, "malformed_agent_event")
                    .await;
            }
        };
        if !policy.dms_allowed {
            return self
                .end(ev, receipt, ReceiptState::Ignored, "dm_not_allowed")
                .await;
        }
        // (a context change that names no DM is the person's recorded tab;
        // none yet: their tab's opening will carry the context)
        let channel = match &e.channel {
            Some(c) => c.as_str().to_owned(),
            None => {
                match threadline_store::agent_view::tab_of(&self.pool, inst.id, e.user.as_str())
                    .await?
                {
                    Some(c) => c,
                    None => {
                        return self
                            .end(ev, receipt, ReceiptState::Ignored, "agent_context_no_tab")
                            .await;
                    }
                }
            }
        };
        self.record_tab(ev, receipt, inst, &e, &channel, opened)
            .await?;
        metrics::counter!("threadline_agent_events_total", "type" => if opened { "opened" } else { "context_changed" })
            .increment(1);
        // (recorded, not ignored: the step is done)
        self.end(
            ev,
            receipt,
            ReceiptState::Done,
            if opened {
                "agent_view_opened"
            } else {
                "agent_context_changed"
            },
        )
        .await?;
        Ok(Step::Done)
    }

    /// Records the tab and what the person looks at (ids only), counting
    /// each entity by whether it became the viewed context.
    async fn record_tab(
        &self,
        ev: &EventAccepted,
        receipt: Uuid,
        inst: &Installation,
        e: &AgentEvent,
        channel: &str,
        greet: bool,
    ) -> anyhow::Result<()> {
        let viewed = e.context.as_deref().map(agent_view::viewed);
        if let Some(v) = &viewed {
            if let Some(from) = v.from {
                metrics::counter!("threadline_agent_context_entities_total", "kind" => from, "outcome" => "viewed")
                    .increment(1);
            }
            for reason in &v.ignored {
                metrics::counter!("threadline_agent_context_entities_total", "kind" => *reason, "outcome" => "not_kept")
                    .increment(1);
            }
        }
        threadline_store::agent_view::record(
            &self.pool,
            &threadline_store::agent_view::Tab {
                installation: inst.id,
                channel,
                user: e.user.as_str(),
                context: viewed.as_ref().map(|v| {
                    (
                        v.channel.as_ref().map(|c| c.as_str()),
                        v.team.as_ref().map(|t| t.as_str()),
                    )
                }),
                at: e.at.as_deref(),
            },
            receipt,
            &ev.event_id,
            greet,
        )
        .await?;
        Ok(())
    }

    /// A question in a DM: when the DM is an agent's Messages tab, its
    /// thread is recorded as an assistant thread with the tab's viewed
    /// context as it is now (progress shows there, and the viewed channel
    /// is read under the pane's rules).
    pub(crate) async fn agent_question(
        &self,
        inst: &Installation,
        channel: &str,
        root: &str,
    ) -> anyhow::Result<()> {
        threadline_store::agent_view::question_thread(&self.pool, inst.id, channel, root).await?;
        Ok(())
    }
}
