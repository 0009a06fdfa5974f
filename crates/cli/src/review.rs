//! `threadline review …`: proposals routed to human review. Approval is
//! recorded with the reviewer and hands the proposal to the publisher, which
//! re-runs the staleness and kill-switch checks before it may post.

use clap::Subcommand;
use sqlx::PgPool;
use threadline_domain::state::{DecisionStatus, Machine as _};
use threadline_runtime::config::CommonConfig;
use threadline_store::review::{Decided, Verdict, decide};
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
    /// Review in Slack: the channel review requests are posted in (the bot
    /// must be a member), the Slack users whose Approve / Reject clicks
    /// count, and how much of a proposed answer a request shows. Only what
    /// is given changes. With a channel, answers already waiting for review
    /// without a request there (from before, or refused by Slack) are asked
    /// about in it.
    Setup {
        #[arg(long)]
        installation: Uuid,
        /// The review channel (`C…`).
        #[arg(long, conflicts_with = "no_channel")]
        channel: Option<String>,
        /// No review channel: proposals are reviewed with this CLI only.
        #[arg(long)]
        no_channel: bool,
        /// Reviewers' Slack user ids (`U…`); replaces the list.
        #[arg(long, value_delimiter = ',')]
        reviewers: Option<Vec<String>>,
        /// Characters of the proposed answer a request shows (0: none; default 600).
        #[arg(long)]
        preview_chars: Option<i32>,
    },
    /// The installation's review settings.
    Settings {
        #[arg(long)]
        installation: Uuid,
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
            // leave an approved answer that nobody posts. A click on the
            // review request in Slack takes the same path.
            match decide(pool, id, Verdict::Approve, &by, None).await? {
                Decided::Recorded(_) => println!(
                    "approved {id} by {by}; the publisher re-checks the thread before posting"
                ),
                Decided::NotWaiting {
                    status: DecisionStatus::Approved,
                    reviewed_by,
                } => anyhow::bail!(
                    "decision {id} is already approved{}; its proposal was queued for the publisher with the approval",
                    by_whom(reviewed_by.as_deref())
                ),
                other => not_decided(id, other)?,
            }
        }
        ReviewCommand::Reject { id, by } => {
            match decide(pool, id, Verdict::Reject, &by, None).await? {
                Decided::Recorded(_) => println!("rejected {id} by {by}"),
                other => not_decided(id, other)?,
            }
        }
        ReviewCommand::Setup {
            installation,
            channel,
            no_channel,
            reviewers,
            preview_chars,
        } => {
            if !threadline_store::installations::exists(pool, installation).await? {
                anyhow::bail!("no installation {installation} (see `threadline install list`)");
            }
            if let Some(c) = &channel {
                threadline_domain::ChannelId::parse(c.clone())
                    .map_err(|e| anyhow::anyhow!("--channel: {e}"))?;
            }
            let reviewers = reviewers.map(|mut users| {
                // (`--reviewers ''` empties the list)
                users.retain(|u| !u.trim().is_empty());
                users
            });
            if let Some(users) = &reviewers {
                for u in users {
                    threadline_domain::UserId::parse(u.clone())
                        .map_err(|e| anyhow::anyhow!("--reviewers: {e}"))?;
                }
            }
            if preview_chars.is_some_and(|n| !(0..=2500).contains(&n)) {
                anyhow::bail!("--preview-chars must be between 0 and 2500");
            }
            threadline_store::review::set_settings(
                pool,
                installation,
                &threadline_store::review::Changes {
                    channel_id: if no_channel {
                        Some(None)
                    } else {
                        channel.map(Some)
                    },
                    reviewers,
                    preview_chars,
                },
            )
            .await?;
            let now = threadline_store::review::settings(pool, installation).await?;
            // With a channel, answers already waiting are asked about there.
            let asked = match &now.channel_id {
                Some(_) => threadline_store::review::ask_waiting(pool, installation).await?,
                None => 0,
            };
            if asked > 0 {
                eprintln!(
                    "{asked} answer(s) waiting for review will be asked about in the review channel"
                );
            }
            println!("{}", serde_json::to_string_pretty(&now)?);
        }
        ReviewCommand::Settings { installation } => {
            let now = threadline_store::review::settings(pool, installation).await?;
            println!("{}", serde_json::to_string_pretty(&now)?);
        }
    }
    Ok(())
}

fn by_whom(by: Option<&str>) -> String {
    by.map(|b| format!(" (by {b})")).unwrap_or_default()
}

fn not_decided(id: Uuid, d: Decided) -> anyhow::Result<()> {
    match d {
        Decided::NotFound => anyhow::bail!("no decision {id}"),
        Decided::NotWaiting {
            status,
            reviewed_by,
        } => anyhow::bail!(
            "decision {id} is not waiting for review (it is {}{})",
            status.as_str(),
            by_whom(reviewed_by.as_deref())
        ),
        Decided::Recorded(_) => Ok(()),
        // (only a click is checked against the reviewer list)
        Decided::Refused(r) => anyhow::bail!("decision {id}: refused ({})", r.as_str()),
    }
}
