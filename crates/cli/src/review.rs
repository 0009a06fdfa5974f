//! `threadline review …`: proposals routed to human review. Approval is
//! recorded with the reviewer and hands the proposal to the publisher, which
//! re-runs the staleness and kill-switch checks before it may post.

use clap::Subcommand;
use sqlx::PgPool;
use threadline_domain::state::{DecisionStatus, Machine as _};
use threadline_runtime::config::CommonConfig;
use uuid::Uuid;

#[derive(Subcommand)]
pub enum ReviewCommand {
    /// Proposals waiting for a reviewer (ids and reasons, no text).
    List,
    /// One proposal, with the reply text a reviewer decides on.
    Show { id: Uuid },
    /// Approve: the publisher re-checks the thread and kill switches, then posts once.
    Approve {
        id: Uuid,
        /// Reviewer identity (recorded); defaults to $USER.
        #[arg(long, env = "USER", default_value = "operator", value_parser = crate::operator::operator_id)]
        by: String,
    },
    /// Reject: never posted.
    Reject {
        id: Uuid,
        #[arg(long, env = "USER", default_value = "operator", value_parser = crate::operator::operator_id)]
        by: String,
    },
}

pub async fn run(cmd: ReviewCommand, _common: &CommonConfig, pool: &PgPool) -> anyhow::Result<()> {
    match cmd {
        ReviewCommand::List => {
            let rows = threadline_store::decisions::waiting_for_review(pool).await?;
            println!("{}", serde_json::to_string_pretty(&rows)?);
        }
        ReviewCommand::Show { id } => {
            let d = threadline_store::decisions::load(pool, id)
                .await?
                .ok_or_else(|| anyhow::anyhow!("no decision {id}"))?;
            println!(
                "{}",
                serde_json::to_string_pretty(&serde_json::json!({
                    "id": d.id, "event_id": d.event_id, "channel_id": d.channel_id, "thread_version": d.thread_version,
                    "action_kind": d.action_kind, "review_reasons": d.review_reasons, "text": d.body_text,
                }))?
            );
        }
        ReviewCommand::Approve { id, by } => {
            // The approval and the request to post commit together (the
            // gateway's relay publishes it): a failure between them cannot
            // leave an approved answer that nobody posts.
            let mut tx = pool.begin().await?;
            match threadline_store::decisions::lock_status(&mut tx, id).await? {
                None => anyhow::bail!("no decision {id}"),
                Some(DecisionStatus::Review) => {}
                Some(DecisionStatus::Approved) => anyhow::bail!(
                    "decision {id} is already approved; its proposal was queued for the publisher with the approval"
                ),
                Some(other) => {
                    anyhow::bail!(
                        "decision {id} is not waiting for review (it is {})",
                        other.as_str()
                    )
                }
            }
            threadline_store::decisions::review(&mut *tx, id, DecisionStatus::Approved, &by)
                .await?;
            let d = threadline_store::decisions::load(&mut *tx, id)
                .await?
                .ok_or_else(|| anyhow::anyhow!("no decision {id}"))?;
            threadline_store::decisions::enqueue_proposal(&mut tx, &d, "approved").await?;
            tx.commit().await?;
            println!("approved {id} by {by}; the publisher re-checks the thread before posting");
        }
        ReviewCommand::Reject { id, by } => {
            if !threadline_store::decisions::review(pool, id, DecisionStatus::Rejected, &by).await?
            {
                anyhow::bail!("decision {id} is not waiting for review");
            }
            println!("rejected {id} by {by}");
        }
    }
    Ok(())
}
