//! Reconciling a post whose outcome is unknown: read the thread and look
//! for the intent's metadata; fall back to our bot + thread + time window +
//! exact text. One clear match is `sent`; ambiguity is `held`; no match is
//! checked again until the evidence threshold, then `held` (or, where policy
//! allows, `pending` for one re-post). Never a blind re-post.

use serde_json::Value;
use sqlx::PgPool;
use threadline_slack::WebClient;
use uuid::Uuid;

use crate::intents;

#[derive(Debug, Clone, Copy)]
pub struct Evidence {
    /// Reads of the thread that must find nothing…
    pub reads: i32,
    /// …over at least this many seconds since the outcome became unknown.
    pub window_secs: f64,
    /// After that: `false` holds for an operator (default); `true` allows
    /// one re-post.
    pub allow_repost: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    Sent(String),
    Held(&'static str),
    Repost,
    /// Not yet decided: read again after a pause.
    Again,
}

pub struct Subject<'a> {
    pub intent: Uuid,
    pub installation: Uuid,
    pub channel: &'a str,
    pub root_ts: &'a str,
    pub bot_id: &'a str,
    pub text: &'a str,
}

fn matches(m: &Value, s: &Subject<'_>) -> (bool, bool) {
    let by_metadata = m
        .pointer("/metadata/event_payload/intent_id")
        .and_then(Value::as_str)
        == Some(&s.intent.to_string());
    let by_identity = m.get("bot_id").and_then(Value::as_str) == Some(s.bot_id)
        && m.get("text").and_then(Value::as_str) == Some(s.text);
    (by_metadata, by_identity)
}

pub async fn run(
    pool: &PgPool,
    web: &WebClient,
    token: &str,
    s: &Subject<'_>,
    ev: Evidence,
) -> anyhow::Result<Found> {
    sqlx::query("UPDATE reply_intents SET state = 'reconciling', updated_at = now() WHERE id = $1 AND state = 'unknown'")
        .bind(s.intent)
        .execute(pool)
        .await?;
    let (sending_since, unknown_for): (Option<f64>, f64) = sqlx::query_as(
        "SELECT extract(epoch FROM sending_since)::float8, coalesce(extract(epoch FROM now() - unknown_since)::float8, 0)
           FROM reply_intents WHERE id = $1",
    )
    .bind(s.intent)
    .fetch_one(pool)
    .await?;
    let mut by_meta = Vec::new();
    let mut by_identity = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..20 {
        let page = match web
            .conversations_replies(token, s.channel, s.root_ts, cursor.as_deref(), 200)
            .await
        {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(error = %e, "reconciliation read failed; will read again");
                return Ok(Found::Again);
            }
        };
        for m in &page.messages {
            let ts = m
                .get("ts")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            // Only messages from around our attempt count as evidence.
            let after = sending_since.is_none_or(|t| {
                ts.split('.')
                    .next()
                    .and_then(|x| x.parse::<f64>().ok())
                    .unwrap_or(0.0)
                    >= t - 5.0
            });
            let (meta, ident) = matches(m, s);
            if meta {
                by_meta.push(ts.clone());
            } else if ident && after {
                by_identity.push(ts.clone());
            }
        }
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    sqlx::query("UPDATE reply_intents SET reconcile_reads = reconcile_reads + 1, updated_at = now() WHERE id = $1")
        .bind(s.intent)
        .execute(pool)
        .await?;
    if by_meta.len() > 1 {
        // Slack shows more than one post carrying this intent: the very
        // thing threadline exists to prevent. Counted and raised, and held
        // for an operator (nothing more is posted).
        metrics::counter!("threadline_duplicate_reply_incidents_total").increment(1);
        tracing::error!(
            alert = "duplicate_reply",
            intent_id = %s.intent,
            posts = by_meta.len(),
            "more than one reply in Slack for one intent"
        );
    }
    let found = match (by_meta.len(), by_identity.len()) {
        (n, _) if n > 1 => Found::Held("duplicate_posts_found"),
        (1, _) => Found::Sent(by_meta[0].clone()),
        (0, 1) => Found::Sent(by_identity[0].clone()),
        (0, 0) => {
            let reads: i32 =
                sqlx::query_scalar("SELECT reconcile_reads FROM reply_intents WHERE id = $1")
                    .bind(s.intent)
                    .fetch_one(pool)
                    .await?;
            if reads >= ev.reads && unknown_for >= ev.window_secs {
                if ev.allow_repost {
                    Found::Repost
                } else {
                    Found::Held("no_evidence_of_post")
                }
            } else {
                Found::Again
            }
        }
        _ => Found::Held("ambiguous_evidence"),
    };
    match &found {
        Found::Sent(ts) => {
            intents::mark_sent(pool, s.intent, ts, true).await?;
            metrics::counter!("threadline_reconciliations_total", "result" => "sent").increment(1);
        }
        Found::Held(why) => {
            sqlx::query("UPDATE reply_intents SET state = 'held', error_code = $2, updated_at = now() WHERE id = $1 AND state = 'reconciling'")
                .bind(s.intent)
                .bind(*why)
                .execute(pool)
                .await?;
            metrics::counter!("threadline_reconciliations_total", "result" => "held").increment(1);
            tracing::warn!(alert = "reply_held", reason = *why, intent_id = %s.intent, "reply held for an operator");
        }
        Found::Repost => {
            sqlx::query(
                "UPDATE reply_intents SET state = 'pending', reconcile_reads = 0, unknown_since = NULL, updated_at = now()
                  WHERE id = $1 AND state = 'reconciling'",
            )
            .bind(s.intent)
            .execute(pool)
            .await?;
            metrics::counter!("threadline_reconciliations_total", "result" => "repost")
                .increment(1);
        }
        Found::Again => {}
    }
    Ok(found)
}
