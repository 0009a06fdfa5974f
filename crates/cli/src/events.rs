//! `threadline events …`: deliveries held as `unparsed` receipts — signed,
//! carrying an identity, but not parseable by the gateway that received
//! them. The listing shows identifiers, the reason and the body's size,
//! never the body (it holds message text). A replay re-parses the stored
//! body with this version's parser and, when it parses, commits the receipt
//! as `accepted` with its outbox row exactly as the gateway would have, and
//! deletes the body.

use clap::Subcommand;
use sqlx::PgPool;
use threadline_store::receipts::{Replay, replay};
use uuid::Uuid;

#[derive(Subcommand)]
pub enum EventsCommand {
    /// Receipts held as `unparsed`, oldest first, as JSON (never the body).
    Unparsed {
        /// At most this many.
        #[arg(long, default_value_t = 500)]
        limit: i64,
    },
    /// Re-parse held deliveries with this version's parser; those that now
    /// parse become accepted and go downstream, the others stay held.
    Replay {
        /// Receipt ids (from `events unparsed`).
        #[arg(required_unless_present = "all")]
        ids: Vec<Uuid>,
        /// Every unparsed receipt.
        #[arg(long, conflicts_with = "ids")]
        all: bool,
    },
}

pub async fn run(cmd: EventsCommand, pool: &PgPool) -> anyhow::Result<()> {
    match cmd {
        EventsCommand::Unparsed { limit } => {
            let rows = threadline_store::receipts::unparsed(pool, limit).await?;
            println!("{}", serde_json::to_string_pretty(&rows)?);
        }
        EventsCommand::Replay { ids, all } => {
            let ids = if all {
                threadline_store::receipts::unparsed_ids(pool).await?
            } else {
                let known = threadline_store::receipts::existing(pool, &ids).await?;
                let unknown: Vec<String> = ids
                    .iter()
                    .filter(|id| !known.contains(id))
                    .map(Uuid::to_string)
                    .collect();
                anyhow::ensure!(
                    unknown.is_empty(),
                    "no receipt with id {} (see `threadline events unparsed`); nothing was replayed",
                    unknown.join(", ")
                );
                ids
            };
            let (mut accepted, mut held) = (0usize, 0usize);
            for id in &ids {
                match replay(pool, *id).await? {
                    Replay::Accepted {
                        installation_id,
                        event_type,
                    } => {
                        accepted += 1;
                        println!(
                            "{id}: accepted ({event_type}, installation {installation_id}); queued for processing, stored body deleted"
                        );
                    }
                    Replay::StillUnparsed { parse_error } => {
                        held += 1;
                        println!("{id}: still does not parse ({parse_error}); left unparsed");
                    }
                    Replay::InstallationNotActive { installation } => {
                        held += 1;
                        println!(
                            "{id}: parses, but its installation is {installation}; left unparsed (install or re-enable the app, then replay again)"
                        );
                    }
                    Replay::NotFound => anyhow::bail!("{id}: no such receipt"),
                    Replay::NotUnparsed { state } => {
                        println!("{id}: not unparsed (state {state}); nothing to do");
                    }
                }
            }
            println!("replayed {accepted} of {}, {held} left unparsed", ids.len());
        }
    }
    Ok(())
}
