//! Publishing one proposal: re-check kill switches, run the staleness
//! checks and claim the reply intent in one short transaction, take a post
//! slot, post once, and map the outcome; reconcile unknown outcomes.

use std::time::Duration;

use async_nats::jetstream::{self, message::PublishMessage};
use bytes::Bytes;
use prost::Message as _;
use secrecy::ExposeSecret as _;
use sqlx::PgPool;
use threadline_proto::v1::{ProposalReady, Reconsider, SCHEMA_VERSION};
use threadline_runtime::bus::{Topic, Topology};
use threadline_runtime::killswitch::{self, FEATURE_REPLIES};
use threadline_runtime::secrets::TokenCipher;
use threadline_runtime::worker::Disposition;
use threadline_slack::{WebClient, WebError};
use tracing::Instrument as _;
use uuid::Uuid;

use crate::intents::{self, Proposal, Verdict};
use crate::reconcile::{self, Evidence, Found, Subject};

pub struct Handler {
    pub pool: PgPool,
    pub js: jetstream::Context,
    pub topology: Topology,
    pub web: WebClient,
    pub cipher: TokenCipher,
    /// Refreshes rotating tokens before they expire (when client credentials are set).
    pub refresher: Option<threadline_runtime::tokens::Refresher>,
    pub evidence: Evidence,
    /// Seconds between posts in one channel.
    pub post_spacing: f64,
    /// Attempts before a rate-limited post fails for good.
    pub max_attempts: i32,
    /// Seconds after which a `sending` intent whose worker is gone counts
    /// as unknown (`THREADLINE_SENDING_STALE_MS`).
    pub sending_stale: f64,
}

/// Codes after which Slack certainly did not post and never will.
const PERMANENT: &[&str] = &[
    "channel_not_found",
    "not_in_channel",
    "is_archived",
    "msg_too_long",
    "no_text",
    "invalid_auth",
    "token_revoked",
    "token_expired",
    "account_inactive",
    "missing_scope",
    "not_authed",
    "invalid_blocks",
    "invalid_metadata_format",
    "restricted_action",
    "too_many_attachments",
];

fn jitter(secs: f64, seed: &Uuid) -> f64 {
    secs + (seed.as_u128() % 1000) as f64 / 1000.0
}

struct Bot {
    token: secrecy::SecretString,
    bot_id: String,
    /// Granted bot scopes; empty when never recorded (a manual install).
    scopes: Vec<String>,
}

impl Handler {
    pub async fn handle(&self, payload: &[u8]) -> Disposition {
        let Ok(p) = ProposalReady::decode(payload) else {
            return Disposition::Poison("undecodable ProposalReady".into());
        };
        let ids = (
            Uuid::parse_str(&p.installation_id),
            Uuid::parse_str(&p.receipt_id),
            Uuid::parse_str(&p.decision_id),
        );
        let (Ok(inst), Ok(receipt), Ok(decision)) = ids else {
            return Disposition::Poison("ProposalReady without ids".into());
        };
        let span = tracing::info_span!("publisher.publish", event_id = %p.event_id, decision_id = %decision, version = p.thread_version);
        match self
            .process(&p, inst, receipt, decision)
            .instrument(span.clone())
            .await
        {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(parent: &span, error = format!("{e:#}"), "publishing failed; retrying");
                Disposition::Retry(Duration::from_secs(5))
            }
        }
    }

    async fn bot(&self, inst: Uuid) -> anyhow::Result<Option<Bot>> {
        let Some(token) = threadline_runtime::tokens::bot_token(
            &self.pool,
            &self.cipher,
            self.refresher.as_ref(),
            inst,
        )
        .await?
        else {
            return Ok(None);
        };
        let (bot_id, scopes): (String, Vec<String>) =
            sqlx::query_as("SELECT bot_id, scopes FROM installations WHERE id = $1")
                .bind(inst)
                .fetch_one(&self.pool)
                .await?;
        Ok(Some(Bot {
            token,
            bot_id,
            scopes,
        }))
    }

    async fn process(
        &self,
        p: &ProposalReady,
        inst: Uuid,
        receipt: Uuid,
        decision: Uuid,
    ) -> anyhow::Result<Disposition> {
        if p.needs_review {
            // Only an approved decision may be posted; the queue is the decisions table.
            let status: Option<String> =
                sqlx::query_scalar("SELECT status FROM decisions WHERE id = $1")
                    .bind(decision)
                    .fetch_optional(&self.pool)
                    .await?;
            if status.as_deref() != Some("approved") {
                return Ok(Disposition::Done);
            }
        }
        let bot = self.bot(inst).await?;
        // An earlier attempt whose outcome is unknown is settled first, from
        // evidence, whatever else changed since: reading is not posting.
        if let (Some(id), Some(bot)) = (
            intents::unsettled(
                &self.pool,
                inst,
                &p.event_id,
                &p.action_kind,
                self.sending_stale,
            )
            .await?,
            &bot,
        ) {
            return self.reconcile(id, p, inst, bot).await;
        }
        if let Some(switch) = killswitch::engaged(&self.pool, inst, FEATURE_REPLIES).await? {
            metrics::counter!("threadline_kill_switch_suppressions_total", "stage" => "publisher")
                .increment(1);
            intents::set_decision(&self.pool, decision, "suppressed", Some(&switch)).await?;
            tracing::warn!(switch = %switch, "kill switch engaged; nothing posted");
            return Ok(Disposition::Done);
        }
        let Some(bot) = bot else {
            intents::set_decision(
                &self.pool,
                decision,
                "cancelled",
                Some("installation_unavailable"),
            )
            .await?;
            return Ok(Disposition::Done);
        };
        // Posting needs chat:write: without it the answer is refused here,
        // with its reason, rather than sent to fail at Slack.
        if !bot.scopes.is_empty() && !bot.scopes.iter().any(|s| s == "chat:write") {
            metrics::counter!("threadline_scope_refusals_total", "feature" => "reply", "scope" => "chat:write")
                .increment(1);
            tracing::warn!(
                alert = "missing_scope",
                installation_id = %inst,
                "the installation lacks chat:write; answer refused (reinstall with the scope)"
            );
            intents::set_decision(
                &self.pool,
                decision,
                "cancelled",
                Some("missing_scope:chat:write"),
            )
            .await?;
            return Ok(Disposition::Done);
        }
        let proposal = Proposal {
            installation: inst,
            receipt,
            decision,
            event_id: &p.event_id,
            action_kind: &p.action_kind,
            channel: &p.channel_id,
            root_ts: &p.root_ts,
            source_ts: &p.source_ts,
            version: p.thread_version,
            body_hash: &p.body_hash,
        };
        // Take a post slot before claiming, so a claim is followed by a post.
        if let Some(wait) =
            intents::reserve_slot(&self.pool, inst, &p.channel_id, self.post_spacing).await?
        {
            return Ok(Disposition::Defer(Duration::from_secs_f64(
                jitter(wait, &decision).min(900.0),
            )));
        }
        let verdict = intents::check_and_claim(&self.pool, &proposal, self.sending_stale).await?;
        let intent = match verdict {
            Verdict::Claimed(id) => id,
            // Another decision for this event already answered it (a
            // reconsideration raced the post), or its intent was closed by
            // an operator or for good: this decision is settled as such,
            // never left `proposed`.
            Verdict::AlreadySent => {
                intents::set_decision(&self.pool, decision, "superseded", Some("already_answered"))
                    .await?;
                return Ok(Disposition::Done);
            }
            Verdict::Closed => {
                intents::set_decision(&self.pool, decision, "cancelled", Some("intent_closed"))
                    .await?;
                return Ok(Disposition::Done);
            }
            Verdict::NotNow(wait) => {
                return Ok(Disposition::Defer(Duration::from_secs_f64(
                    wait.clamp(0.5, 900.0),
                )));
            }
            Verdict::Reconcile(id) => return self.reconcile(id, p, inst, &bot).await,
            Verdict::SourceDeleted => {
                intents::set_decision(&self.pool, decision, "cancelled", Some("source_deleted"))
                    .await?;
                return Ok(Disposition::Done);
            }
            Verdict::Superseded => {
                metrics::counter!("threadline_superseded_proposals_total").increment(1);
                intents::set_decision(&self.pool, decision, "superseded", Some("newer_trigger"))
                    .await?;
                return Ok(Disposition::Done);
            }
            Verdict::Stale => {
                metrics::counter!("threadline_stale_proposals_total").increment(1);
                intents::set_decision(&self.pool, decision, "stale", Some("thread_changed"))
                    .await?;
                self.reconsider(p, receipt, "version_changed").await?;
                return Ok(Disposition::Done);
            }
        };
        self.post(intent, p, inst, &bot).await
    }

    async fn post(
        &self,
        intent: Uuid,
        p: &ProposalReady,
        inst: Uuid,
        bot: &Bot,
    ) -> anyhow::Result<Disposition> {
        let metadata = serde_json::json!({
            "event_type": "threadline_reply",
            "event_payload": {"intent_id": intent.to_string(), "body_hash": p.body_hash, "source_ts": p.source_ts}
        })
        .to_string();
        let started = std::time::Instant::now();
        let r = self
            .web
            .post_reply(
                bot.token.expose_secret(),
                &p.channel_id,
                &p.root_ts,
                &p.text,
                &p.blocks_json,
                &metadata,
            )
            .await;
        metrics::histogram!("threadline_slack_post_seconds")
            .record(started.elapsed().as_secs_f64());
        // One connection at a time per handler, taken only when needed (a
        // connection held while asking the pool for another starves the
        // pool under load).
        match r {
            Ok(ts) => {
                // Slack has the post: record it, trying hard, since a failure
                // here leaves the intent `sending` until it is reconciled.
                let mut tries = 0;
                while let Err(e) = intents::mark_sent(&self.pool, intent, &ts, false).await {
                    tries += 1;
                    if tries >= 5 {
                        return Err(e.into());
                    }
                    tokio::time::sleep(Duration::from_millis(200 * tries)).await;
                }
                metrics::counter!("threadline_reply_intents_total", "state" => "sent").increment(1);
                Ok(Disposition::Done)
            }
            Err(WebError::RateLimited { retry_after }) => {
                metrics::counter!("threadline_slack_rate_limited_total", "method" => "chat.postMessage").increment(1);
                let wait = jitter(retry_after.as_secs_f64(), &intent);
                metrics::histogram!("threadline_slack_rate_limit_wait_seconds", "method" => "chat.postMessage")
                    .record(wait);
                intents::pause_workspace(&self.pool, inst, retry_after.as_secs_f64()).await?;
                let attempts: i32 =
                    sqlx::query_scalar("SELECT attempts FROM reply_intents WHERE id = $1")
                        .bind(intent)
                        .fetch_one(&self.pool)
                        .await?;
                if attempts >= self.max_attempts {
                    intents::transition(
                        &mut *self.pool.acquire().await?,
                        intent,
                        "failed_permanent",
                        Some("rate_limited_too_often"),
                        None,
                    )
                    .await?;
                    return Ok(Disposition::Done);
                }
                intents::transition(
                    &mut *self.pool.acquire().await?,
                    intent,
                    "failed_retryable",
                    Some("ratelimited"),
                    Some(wait),
                )
                .await?;
                Ok(Disposition::Defer(Duration::from_secs_f64(wait)))
            }
            Err(WebError::Transport(kind)) if kind == "connect" => {
                // The request never left: safe to try again.
                intents::transition(
                    &mut *self.pool.acquire().await?,
                    intent,
                    "failed_retryable",
                    Some("connect"),
                    Some(2.0),
                )
                .await?;
                Ok(Disposition::Defer(Duration::from_secs(2)))
            }
            Err(WebError::Api { code }) if PERMANENT.contains(&code.as_str()) => {
                let code: &'static str = PERMANENT
                    .iter()
                    .find(|c| **c == code)
                    .copied()
                    .unwrap_or("api_error");
                intents::transition(
                    &mut *self.pool.acquire().await?,
                    intent,
                    "failed_permanent",
                    Some(code),
                    None,
                )
                .await?;
                metrics::counter!("threadline_reply_intents_total", "state" => "failed_permanent")
                    .increment(1);
                tracing::warn!(code, "Slack refused the post");
                Ok(Disposition::Done)
            }
            Err(e) => {
                // Timeout, reset after sending, 5xx, fatal_error, internal_error,
                // an unexpected code: it may have landed. Reconcile, never re-post.
                let code = match &e {
                    WebError::Api { .. } => "api_error_unknown_outcome",
                    WebError::Http(_) => "http_5xx",
                    WebError::Decode => "undecodable_answer",
                    _ => "transport",
                };
                intents::transition(
                    &mut *self.pool.acquire().await?,
                    intent,
                    "unknown",
                    Some(code),
                    None,
                )
                .await?;
                metrics::counter!("threadline_reply_intents_total", "state" => "unknown")
                    .increment(1);
                tracing::warn!(code, "post outcome unknown; reconciling");
                Ok(Disposition::Defer(Duration::from_secs(1)))
            }
        }
    }

    async fn reconcile(
        &self,
        intent: Uuid,
        p: &ProposalReady,
        inst: Uuid,
        bot: &Bot,
    ) -> anyhow::Result<Disposition> {
        let subject = Subject {
            intent,
            installation: inst,
            channel: &p.channel_id,
            root_ts: &p.root_ts,
            bot_id: &bot.bot_id,
            text: &p.text,
        };
        match reconcile::run(
            &self.pool,
            &self.web,
            bot.token.expose_secret(),
            &subject,
            self.evidence,
        )
        .await?
        {
            Found::Sent(_) => {
                // The event is answered. When this proposal is another
                // decision than the one posted (a reconsideration raced the
                // post), it is settled as superseded, not left `proposed`.
                if let Ok(decision) = Uuid::parse_str(&p.decision_id) {
                    intents::set_decision(
                        &self.pool,
                        decision,
                        "superseded",
                        Some("already_answered"),
                    )
                    .await?;
                }
                Ok(Disposition::Done)
            }
            Found::Held(_) => Ok(Disposition::Done),
            Found::Repost => Ok(Disposition::Defer(Duration::from_secs(1))),
            Found::Again => Ok(Disposition::Defer(Duration::from_secs_f64(
                (self.evidence.window_secs / self.evidence.reads.max(1) as f64).clamp(0.5, 60.0),
            ))),
        }
    }

    /// Asks the context-builder to look at the thread again. Coalesced: one
    /// message per (thread, stale version) within the duplicate window.
    async fn reconsider(
        &self,
        p: &ProposalReady,
        receipt: Uuid,
        reason: &str,
    ) -> anyhow::Result<()> {
        let msg = Reconsider {
            schema_version: SCHEMA_VERSION,
            installation_id: p.installation_id.clone(),
            channel_id: p.channel_id.clone(),
            root_ts: p.root_ts.clone(),
            stale_version: p.thread_version,
            receipt_id: receipt.to_string(),
            reason: reason.to_owned(),
        };
        let mut headers = async_nats::HeaderMap::new();
        threadline_runtime::telemetry::inject_current(&mut headers);
        let id = format!(
            "recon:{}:{}:{}:{}",
            p.installation_id, p.channel_id, p.root_ts, p.thread_version
        );
        let publish = PublishMessage::build()
            .payload(Bytes::from(msg.encode_to_vec()))
            .headers(headers)
            .message_id(id);
        self.js
            .send_publish(self.topology.subject(Topic::Reconsider), publish)
            .await?
            .await?;
        metrics::counter!("threadline_reconsiderations_total").increment(1);
        Ok(())
    }
}
