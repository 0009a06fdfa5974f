//! `threadline intents …`: reply intents an operator must settle — posts
//! whose outcome stayed unknown (held) — and the others for inspection.

use clap::Subcommand;
use sqlx::PgPool;
use threadline_domain::state::{IntentState, Machine as _};
use uuid::Uuid;

#[derive(Subcommand)]
pub enum IntentsCommand {
    /// Intents, newest first (default: the held ones).
    List {
        /// pending, sending, sent, failed_retryable, failed_permanent, unknown, reconciling, held or withdrawn.
        #[arg(long, default_value = threadline_domain::state::IntentState::Held.name())]
        state: String,
    },
    /// Settle a held intent: the operator found the message in Slack.
    MarkSent {
        id: Uuid,
        /// The `ts` of the reply found in the thread.
        #[arg(long)]
        ts: String,
    },
    /// Settle a held intent: it never landed; allow one more post.
    Repost { id: Uuid },
    /// Settle a held intent: give up (nothing more is posted).
    Abandon { id: Uuid },
}

/// A transaction acting as the operator (`$USER`), whom the audit records
/// of its changes name.
async fn as_operator(pool: &PgPool) -> anyhow::Result<sqlx::Transaction<'static, sqlx::Postgres>> {
    let actor = crate::operator::current_user();
    Ok(threadline_store::operator::begin_as(pool, &format!("cli:{actor}")).await?)
}

/// The held intent `id` (locked) and its decision, or a clear error.
async fn held(tx: &mut sqlx::PgConnection, id: Uuid) -> anyhow::Result<Uuid> {
    match threadline_store::intents::lock_for_operator(tx, id).await? {
        None => anyhow::bail!("no reply intent {id}"),
        Some((IntentState::Held, decision)) => Ok(decision),
        Some((state, _)) => anyhow::bail!("intent {id} is not held (it is {})", state.as_str()),
    }
}

pub async fn run(
    cmd: IntentsCommand,
    _common: &threadline_runtime::config::CommonConfig,
    pool: &PgPool,
) -> anyhow::Result<()> {
    match cmd {
        IntentsCommand::List { state } => {
            let state = match state.parse::<IntentState>() {
                Ok(s) => s,
                Err(e) => {
                    let all: Vec<&str> = IntentState::ALL.iter().map(|s| s.as_str()).collect();
                    anyhow::bail!("--state: {e}; one of {}", all.join(", "));
                }
            };
            let rows = threadline_store::intents::list(pool, state).await?;
            println!("{}", serde_json::to_string_pretty(&rows)?);
        }
        IntentsCommand::MarkSent { id, ts } => {
            threadline_domain::Ts::parse(ts.clone()).map_err(|e| anyhow::anyhow!("--ts: {e}"))?;
            let mut tx = as_operator(pool).await?;
            let decision = held(&mut tx, id).await?;
            // Settled the way the publisher settles a post: the intent sent,
            // its decision published, its turn answered (and a human message
            // that crossed it recorded, its thread reconsidered).
            threadline_store::intents::record_post_in(&mut tx, id, decision, &ts, true).await?;
            tx.commit().await?;
            println!(
                "intent {id} marked sent ({ts}); its decision is published and its turn answered"
            );
        }
        IntentsCommand::Repost { id } => {
            let mut tx = as_operator(pool).await?;
            let decision = held(&mut tx, id).await?;
            let d = threadline_store::decisions::load(&mut *tx, decision)
                .await?
                .ok_or_else(|| {
                    anyhow::anyhow!("intent {id} names decision {decision}, which does not exist")
                })?;
            threadline_store::intents::operator_repost(&mut tx, id).await?;
            // Hand the proposal to the publisher again, in the same commit
            // (the gateway's relay publishes it): it reads the thread once
            // more for the earlier post, re-checks the thread, then claims
            // the pending intent and posts once.
            threadline_store::decisions::enqueue_proposal(
                &mut tx,
                &d,
                &format!("repost-{}", Uuid::now_v7()),
            )
            .await?;
            tx.commit().await?;
            println!(
                "intent {id} may be posted once more; its proposal is queued for the publisher, which reads the thread for the earlier post first"
            );
        }
        IntentsCommand::Abandon { id } => {
            let mut tx = as_operator(pool).await?;
            held(&mut tx, id).await?;
            threadline_store::intents::operator_abandon(&mut tx, id).await?;
            tx.commit().await?;
            println!("intent {id} abandoned");
        }
    }
    Ok(())
}
