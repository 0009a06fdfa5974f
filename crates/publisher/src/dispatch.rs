//! One handler per kind of work on the proposals topic: a message is
//! decoded once into its typed [`Work`] (ids parsed, kind named), and each
//! kind goes to its own handler: an answer ([`crate::answer`]), a stream to
//! start ([`crate::stream`]), progress to show or a thread to greet in the
//! assistant pane ([`crate::pane`]), an agent's Messages tab to greet
//! ([`crate::agent`]). What every kind shares (a reviewed
//! answer's request, the pane's progress after an answer) follows here.

use prost::Message as _;
use threadline_domain::ids::is_dm;
use threadline_proto::v1::{ProposalReady, proposal_ready};
use threadline_runtime::worker::Disposition;
use tracing::Instrument as _;
use uuid::Uuid;

use crate::handler::Handler;

/// Where a piece of work happens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place {
    pub installation: Uuid,
    pub channel: String,
    pub root_ts: String,
}

/// What a proposals-topic message asks the publisher to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Work {
    /// A settled (or reviewed) decision's answer.
    Answer {
        place: Place,
        decision: Uuid,
        needs_review: bool,
    },
    /// A stream to start for a decision still being called.
    StreamStart { place: Place, decision: Uuid },
    /// Progress to show in an assistant thread (and its title, for its
    /// first question): a decision being called, or (none) a question
    /// being read.
    PaneStatus {
        place: Place,
        decision: Option<Uuid>,
        title: String,
    },
    /// An assistant thread opened: greet it.
    PaneGreeting { place: Place },
    /// An agent's Messages tab opened (the DM `place.channel`, no thread):
    /// greet it.
    AgentGreeting { place: Place },
}

impl Work {
    /// The typed work of message `p`, or why it is poison. A message of a
    /// sender older than `work` is read from its `stream` and `assistant`
    /// fields (the only place those are read).
    pub fn of(p: &ProposalReady) -> Result<Work, &'static str> {
        use proposal_ready::Work as W;
        let kind = match &p.work {
            Some(w) => w.clone(),
            None if p.assistant == "greet" => W::PaneGreeting(Default::default()),
            None if p.assistant == "status" => W::PaneStatus(threadline_proto::v1::PaneStatus {
                title: p.assistant_title.clone(),
            }),
            None if p.stream => W::StreamStart(Default::default()),
            None => W::Answer(Default::default()),
        };
        let installation = Uuid::parse_str(&p.installation_id)
            .map_err(|_| "ProposalReady without an installation")?;
        let place = Place {
            installation,
            channel: p.channel_id.clone(),
            root_ts: p.root_ts.clone(),
        };
        let decision =
            || Uuid::parse_str(&p.decision_id).map_err(|_| "ProposalReady without a decision");
        match kind {
            W::PaneGreeting(_) => return Ok(Work::PaneGreeting { place }),
            W::AgentGreeting(_) => return Ok(Work::AgentGreeting { place }),
            W::PaneStatus(s) => {
                let decision = (!p.decision_id.is_empty()).then(decision).transpose()?;
                return Ok(Work::PaneStatus {
                    place,
                    decision,
                    title: s.title,
                });
            }
            _ => {}
        }
        let decision = decision()?;
        Ok(match kind {
            W::Answer(_) => Work::Answer {
                place,
                decision,
                needs_review: p.needs_review,
            },
            W::StreamStart(_) => Work::StreamStart { place, decision },
            W::PaneStatus(_) | W::PaneGreeting(_) | W::AgentGreeting(_) => {
                unreachable!("handled above")
            }
        })
    }
}

impl Handler {
    /// Decodes one message of the proposals topic and hands its work to
    /// the handler of its kind.
    pub async fn handle(&self, payload: &[u8]) -> Disposition {
        let Ok(p) = ProposalReady::decode(payload) else {
            return Disposition::Poison("undecodable ProposalReady".into());
        };
        let work = match Work::of(&p) {
            Ok(w) => w,
            Err(why) => return Disposition::Poison(why.into()),
        };
        let span = match &work {
            Work::Answer { decision, .. } => {
                tracing::info_span!("publisher.publish", event_id = %p.event_id, decision_id = %decision, version = p.thread_version)
            }
            Work::StreamStart { decision, .. } => {
                tracing::info_span!("publisher.stream", event_id = %p.event_id, decision_id = %decision, version = p.thread_version)
            }
            Work::PaneStatus { decision, .. } => {
                tracing::info_span!("publisher.assistant_status", event_id = %p.event_id, decision_id = ?decision)
            }
            Work::PaneGreeting { .. } => {
                tracing::info_span!("publisher.assistant_greet", event_id = %p.event_id)
            }
            Work::AgentGreeting { .. } => {
                tracing::info_span!("publisher.agent_greet", event_id = %p.event_id)
            }
        };
        match self.work(&work).instrument(span.clone()).await {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(parent: &span, error = format!("{e:#}"), "handling failed; retrying");
                threadline_tenancy::fault::disposition(&e)
            }
        }
    }

    async fn work(&self, work: &Work) -> anyhow::Result<Disposition> {
        match work {
            Work::Answer {
                place,
                decision,
                needs_review,
            } => {
                // In a pane or tab thread, its status shows the thread
                // being checked before the post.
                self.pane_before(place).await;
                let done = self.answer(place.installation, *decision).await?;
                // A reviewed answer's review request shows what became of it
                // (off the path of answers that need no reviewer).
                let done = match done {
                    Disposition::Done if *needs_review => self.review_follow_up(*decision).await?,
                    other => other,
                };
                self.pane_after(place, &done).await;
                Ok(done)
            }
            Work::StreamStart { place, decision } => {
                let done = self.stream_start(place.installation, *decision).await?;
                // (a stream that discarded its decision in a pane)
                self.pane_after(place, &done).await;
                Ok(done)
            }
            Work::PaneStatus { place, title, .. } => {
                if !title.is_empty() {
                    self.title_from_question(
                        place.installation,
                        &place.channel,
                        &place.root_ts,
                        title,
                    )
                    .await;
                }
                self.sync_progress(place.installation, &place.channel, &place.root_ts, false)
                    .await?;
                Ok(Disposition::Done)
            }
            Work::PaneGreeting { place } => {
                self.greet(place.installation, &place.channel, &place.root_ts)
                    .await
            }
            Work::AgentGreeting { place } => {
                self.greet_agent(place.installation, &place.channel).await
            }
        }
    }

    /// In an assistant thread (a DM), the progress follows the answer
    /// about to be checked and posted.
    async fn pane_before(&self, place: &Place) {
        if is_dm(&place.channel)
            && let Err(e) = self
                .sync_progress(place.installation, &place.channel, &place.root_ts, false)
                .await
        {
            tracing::warn!(
                error = format!("{e:#}"),
                "showing an assistant thread's check failed; the answer goes on"
            );
        }
    }

    /// In an assistant thread (a DM), the progress shown while the model
    /// ran is cleared once the work came to nothing more to do.
    async fn pane_after(&self, place: &Place, done: &Disposition) {
        if matches!(done, Disposition::Done) && is_dm(&place.channel) {
            self.after_pane_answer(place.installation, &place.channel, &place.root_ts)
                .await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use threadline_proto::v1::{PaneStatus, StreamStart};

    fn message(work: Option<proposal_ready::Work>) -> ProposalReady {
        ProposalReady {
            installation_id: Uuid::nil().to_string(),
            decision_id: Uuid::max().to_string(),
            channel_id: "D1".into(),
            root_ts: "1.1".into(),
            work,
            ..Default::default()
        }
    }

    #[test]
    fn each_kind_of_work_is_typed_once_and_old_senders_are_read_too() {
        let place = Place {
            installation: Uuid::nil(),
            channel: "D1".into(),
            root_ts: "1.1".into(),
        };
        let d = Uuid::max();
        let status = Some(proposal_ready::Work::PaneStatus(PaneStatus {
            title: "Deploys".into(),
        }));
        assert_eq!(
            Work::of(&message(status.clone())),
            Ok(Work::PaneStatus {
                place: place.clone(),
                decision: Some(d),
                title: "Deploys".into()
            })
        );
        // A question being read: no decision yet.
        let mut reading = message(status);
        reading.decision_id.clear();
        assert_eq!(
            Work::of(&reading),
            Ok(Work::PaneStatus {
                place: place.clone(),
                decision: None,
                title: "Deploys".into()
            })
        );
        let start = Some(proposal_ready::Work::StreamStart(StreamStart {}));
        assert_eq!(
            Work::of(&message(start)),
            Ok(Work::StreamStart {
                place: place.clone(),
                decision: d
            })
        );
        // An older sender's flags.
        let mut old = message(None);
        old.stream = true;
        assert_eq!(
            Work::of(&old),
            Ok(Work::StreamStart {
                place: place.clone(),
                decision: d
            })
        );
        let mut old = message(None);
        old.assistant = "greet".into();
        old.decision_id.clear();
        assert_eq!(
            Work::of(&old),
            Ok(Work::PaneGreeting {
                place: place.clone()
            })
        );
        let mut agent = message(Some(
            proposal_ready::Work::AgentGreeting(Default::default()),
        ));
        agent.decision_id.clear();
        assert_eq!(Work::of(&agent), Ok(Work::AgentGreeting { place }));
        // Without ids: poison.
        let mut bad = message(None);
        bad.decision_id = "not a uuid".into();
        assert!(Work::of(&bad).is_err());
    }
}
