//! `threadline intents …`: reply intents an operator must settle — posts
//! whose outcome stayed unknown (held) — and the others for inspection.

use clap::Subcommand;
use sqlx::PgPool;
use uuid::Uuid;

#[derive(Subcommand)]
pub enum IntentsCommand {
    /// Intents, newest first (default: the held ones).
    List {
        /// pending, sending, sent, failed_retryable, failed_permanent, unknown, reconciling, held or withdrawn.
        #[arg(long, default_value = "held")]
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

#[derive(sqlx::FromRow, serde::Serialize)]
struct Row {
    id: Uuid,
    installation_id: Uuid,
    event_id: String,
    channel_id: String,
    root_ts: String,
    state: String,
    attempts: i32,
    error_code: Option<String>,
    slack_ts: Option<String>,
    reconciled: bool,
}

/// Runs one settling statement as the operator (`$USER`), whom the audit
/// record of the change names.
async fn settle(
    pool: &PgPool,
    sql: &'static str,
    id: Uuid,
    ts: Option<&str>,
) -> anyhow::Result<()> {
    let mut tx = pool.begin().await?;
    let actor = crate::operator::current_user();
    sqlx::query("SELECT set_config('threadline.actor', $1, true)")
        .bind(format!("cli:{actor}"))
        .execute(&mut *tx)
        .await?;
    let r = sqlx::query(sql).bind(id).bind(ts).execute(&mut *tx).await?;
    if r.rows_affected() != 1 {
        anyhow::bail!("intent {id} is not held");
    }
    tx.commit().await?;
    Ok(())
}

pub async fn run(
    cmd: IntentsCommand,
    common: &threadline_runtime::config::CommonConfig,
    pool: &PgPool,
) -> anyhow::Result<()> {
    match cmd {
        IntentsCommand::List { state } => {
            let rows: Vec<Row> = sqlx::query_as(
                "SELECT id, installation_id, event_id, channel_id, root_ts, state, attempts, error_code, slack_ts, reconciled
                   FROM reply_intents WHERE state = $1 ORDER BY updated_at DESC LIMIT 500",
            )
            .bind(&state)
            .fetch_all(pool)
            .await?;
            println!("{}", serde_json::to_string_pretty(&rows)?);
        }
        IntentsCommand::MarkSent { id, ts } => {
            threadline_domain::Ts::parse(ts.clone()).map_err(|e| anyhow::anyhow!("--ts: {e}"))?;
            settle(
                pool,
                "UPDATE reply_intents SET state = 'sent', slack_ts = $2, reconciled = true, updated_at = now()
                  WHERE id = $1 AND state = 'held'",
                id,
                Some(&ts),
            )
            .await?;
            println!("intent {id} marked sent ({ts})");
        }
        IntentsCommand::Repost { id } => {
            settle(
                pool,
                "UPDATE reply_intents SET state = 'pending', reconcile_reads = 0, unknown_since = NULL, updated_at = now()
                  WHERE id = $1 AND state = 'held' AND $2::text IS NULL",
                id,
                None,
            )
            .await?;
            // Hand the proposal to the publisher again: it re-checks the
            // thread, then claims the pending intent and posts once.
            let decision: Uuid =
                sqlx::query_scalar("SELECT decision_id FROM reply_intents WHERE id = $1")
                    .bind(id)
                    .fetch_one(pool)
                    .await?;
            let nats = threadline_runtime::bus::connect(&common.nats_url, "threadline-cli").await?;
            let js = async_nats::jetstream::new(nats.clone());
            let d = threadline_inference::decisions::load(pool, decision).await?;
            let topology = threadline_runtime::bus::Topology::from_config(common);
            threadline_inference::handler::publish_proposal(
                &js,
                &topology,
                d,
                Some(&format!("repost-{}", Uuid::now_v7())),
            )
            .await?;
            nats.flush().await?;
            println!(
                "intent {id} may be posted once more; its proposal went back to the publisher"
            );
        }
        IntentsCommand::Abandon { id } => {
            settle(
                pool,
                "UPDATE reply_intents SET state = 'failed_permanent', error_code = 'abandoned_by_operator', updated_at = now()
                  WHERE id = $1 AND state = 'held' AND $2::text IS NULL",
                id,
                None,
            )
            .await?;
            println!("intent {id} abandoned");
        }
    }
    Ok(())
}
