//! Backfilling a thread the store has never seen (a mention deep in an old
//! thread) through `conversations.replies`, page by page, within a read
//! budget shared by all replicas through Postgres. A backfill that stops
//! early (budget, page cap, rate limit, Slack error) is marked partial —
//! never silently partial.

use std::time::Duration;

use sqlx::PgPool;
use threadline_domain::classify::{Effect, Speaker, message_facts};
use threadline_slack::{WebClient, WebError};

use crate::store::{self, Installation};

#[derive(Debug, Clone, Copy)]
pub struct BackfillLimits {
    /// Most pages one backfill reads.
    pub max_pages: u32,
    /// Messages per page (Tier 3 apps; non-Marketplace apps get 15).
    pub page_size: u32,
    /// `conversations.replies` calls per minute per installation (Tier 3:
    /// 50; non-Marketplace apps: 1).
    pub per_minute: i32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Completeness {
    Complete,
    Partial,
}

const METHOD: &str = "conversations.replies";

/// Takes one call from the installation's shared budget.
async fn take_budget(pool: &PgPool, inst: &Installation, per_minute: i32) -> sqlx::Result<bool> {
    threadline_store::channels::take_read_budget(pool, inst.id, METHOD, per_minute).await
}

async fn pause(pool: &PgPool, inst: &Installation, wait: Duration) -> sqlx::Result<()> {
    threadline_store::channels::pause_read_budget(pool, inst.id, METHOD, wait.as_secs_f64()).await
}

/// Reads the thread from Slack into the store. `token` is the bot token,
/// opened only for the call.
pub async fn run(
    pool: &PgPool,
    web: &WebClient,
    inst: &Installation,
    token: &str,
    channel: &str,
    root: &str,
    limits: BackfillLimits,
) -> anyhow::Result<Completeness> {
    // A feature needs its scope: without the history scope for this kind of
    // conversation the thread cannot be read, and the context says so.
    let needed = match channel.chars().next() {
        Some('G') => "groups:history",
        Some('D') => "im:history",
        _ => "channels:history",
    };
    if !inst.scopes.is_empty() && !inst.scopes.iter().any(|s| s == needed) {
        tracing::warn!(
            needed,
            "backfill refused: the installation lacks the history scope"
        );
        metrics::counter!("threadline_scope_refusals_total", "feature" => "backfill", "scope" => needed).increment(1);
        store::set_backfill(pool, inst.id, channel, root, "partial").await?;
        return Ok(Completeness::Partial);
    }
    let (page_size, per_minute) = if inst.non_marketplace {
        (limits.page_size.min(15), 1)
    } else {
        (limits.page_size, limits.per_minute)
    };
    let mut cursor: Option<String> = None;
    let mut complete = false;
    for _ in 0..limits.max_pages.max(1) {
        if !take_budget(pool, inst, per_minute).await? {
            metrics::counter!("threadline_backfill_budget_exhausted_total").increment(1);
            break;
        }
        let page = match web
            .conversations_replies(token, channel, root, cursor.as_deref(), page_size)
            .await
        {
            Ok(p) => p,
            Err(WebError::RateLimited { retry_after }) => {
                metrics::counter!("threadline_slack_rate_limited_total", "method" => METHOD)
                    .increment(1);
                metrics::histogram!("threadline_slack_rate_limit_wait_seconds", "method" => METHOD)
                    .record(retry_after.as_secs_f64());
                pause(pool, inst, retry_after).await?;
                break;
            }
            Err(e) => {
                tracing::warn!(error = %e, channel, "backfill stopped early");
                break;
            }
        };
        for m in &page.messages {
            // (a root deleted while it has replies reads as its tombstone:
            // deleted)
            if threadline_domain::classify::is_tombstone(m) {
                if let Some(ts) = m.get("ts").and_then(serde_json::Value::as_str) {
                    let root_ts = m
                        .get("thread_ts")
                        .and_then(serde_json::Value::as_str)
                        .unwrap_or(ts);
                    let gone = Effect::Delete {
                        ts: ts.to_owned(),
                        root_ts: root_ts.to_owned(),
                    };
                    let mut tx = pool.begin().await?;
                    store::apply(&mut tx, inst.id, channel, &gone).await?;
                    tx.commit().await?;
                }
                continue;
            }
            let Some(f) = message_facts(m, &inst.identity) else {
                continue;
            };
            if f.speaker == Speaker::Bot
                && !f
                    .bot_id
                    .as_ref()
                    .is_some_and(|b| inst.approved_bots.contains(b))
            {
                continue;
            }
            // One fact per transaction, like live events: a transaction never
            // holds the thread's row while waiting for another fact, so
            // backfills and live events cannot deadlock.
            let edited = f.changed_ts.is_some();
            let mut tx = pool.begin().await?;
            store::apply(&mut tx, inst.id, channel, &Effect::Upsert(f.clone())).await?;
            tx.commit().await?;
            if edited {
                let mut tx = pool.begin().await?;
                store::apply(&mut tx, inst.id, channel, &Effect::Edit(f)).await?;
                tx.commit().await?;
            }
        }
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => {
                complete = true;
                break;
            }
        }
    }
    let state = if complete {
        Completeness::Complete
    } else {
        Completeness::Partial
    };
    store::set_backfill(
        pool,
        inst.id,
        channel,
        root,
        if complete { "complete" } else { "partial" },
    )
    .await?;
    metrics::counter!("threadline_backfills_total", "result" => if complete { "complete" } else { "partial" }).increment(1);
    Ok(state)
}
