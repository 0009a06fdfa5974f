//! Context-builder settings. Shared ones (database, NATS, bus prefix,
//! `SLACK_API_URL`, telemetry) are documented in `threadline_runtime::config`.

use std::time::Duration;

use threadline_runtime::config::{CommonConfig, ConfigError, Source};
use threadline_tenancy::secrets::TokenKeys;

use crate::backfill::BackfillLimits;
use crate::context::Limits;
use crate::store::AdmitRules;

pub struct ContextConfig {
    pub common: CommonConfig,
    /// `THREADLINE_CONTEXT_BUILDER_ADDR`, default `127.0.0.1:3001`: health,
    /// readiness and metrics.
    pub addr: std::net::SocketAddr,
    /// `THREADLINE_TOKEN_KEYS` (required): opens bot tokens for backfills.
    pub cipher: TokenKeys,
    /// `THREADLINE_CONTEXT_CONCURRENCY`, default 8: events handled at once.
    pub concurrency: usize,
    /// `THREADLINE_CONTEXT_MAX_MESSAGES` (50), `…_MAX_BYTES` (32768),
    /// `…_MAX_AGE_HOURS` (720): truncation limits.
    pub limits: Limits,
    /// `THREADLINE_BACKFILL_MAX_PAGES` (10), `…_PAGE_SIZE` (200),
    /// `…_PER_MINUTE` (50, Slack's Tier 3).
    pub backfill: BackfillLimits,
    /// `THREADLINE_SLACK_TIMEOUT_MS`, default 10000.
    pub slack_timeout: Duration,
    /// `SLACK_CLIENT_ID` / `SLACK_CLIENT_SECRET`: refresh rotating tokens.
    pub refresher: Option<threadline_tenancy::tokens::Refresher>,
    /// `THREADLINE_LATE_EVENT_MS`, default 300000 (five minutes): an event
    /// that reaches the gateway this long after it happened is late,
    /// recorded, and a request handled by its installation's late-event
    /// policy.
    pub late_after: Duration,
    /// Admission to the model's queue (DESIGN invariant 11): the budgets
    /// of an installation without its own (`threadline policy set`):
    /// `THREADLINE_BUDGET_ANSWERS_PER_MINUTE` (0),
    /// `THREADLINE_BUDGET_MODEL_CALLS_PER_MINUTE` (0) and
    /// `THREADLINE_BUDGET_MODEL_TOKENS_PER_DAY` (0), 0 being no limit;
    /// `THREADLINE_TENANT_QUEUE_SHARE` (64), the most requests one
    /// installation holds in the model's queue at once;
    /// `THREADLINE_BUDGET_NOTICE` (`note`), what a person sees when their
    /// workspace is over budget: a note once per thread, or `none`.
    pub admission: AdmitRules,
    /// `THREADLINE_PARKED_RESUME_MS`, default 250: how often parked
    /// requests are looked at for room while none resume (after a round
    /// that resumed some, within a sixteenth of it (at least 5 ms), doubling
    /// back).
    pub resume_every: Duration,
}

impl ContextConfig {
    pub fn from_source(src: &Source) -> Result<Self, ConfigError> {
        Ok(Self {
            common: CommonConfig::from_source(src)?,
            addr: src.socket_addr("THREADLINE_CONTEXT_BUILDER_ADDR", "127.0.0.1:3001")?,
            cipher: TokenKeys::from_source(src)?,
            concurrency: src.bounded("THREADLINE_CONTEXT_CONCURRENCY", 8, 1..=256)? as usize,
            limits: Limits {
                max_messages: src.bounded("THREADLINE_CONTEXT_MAX_MESSAGES", 50, 2..=1000)?
                    as usize,
                max_bytes: src.bounded(
                    "THREADLINE_CONTEXT_MAX_BYTES",
                    32 * 1024,
                    256..=(512 * 1024),
                )? as usize,
                max_age_secs: src.bounded("THREADLINE_CONTEXT_MAX_AGE_HOURS", 720, 1..=87_600)?
                    * 3600,
            },
            backfill: BackfillLimits {
                max_pages: src.bounded("THREADLINE_BACKFILL_MAX_PAGES", 10, 1..=100)? as u32,
                page_size: src.bounded("THREADLINE_BACKFILL_PAGE_SIZE", 200, 1..=1000)? as u32,
                per_minute: src.bounded("THREADLINE_BACKFILL_PER_MINUTE", 50, 1..=1000)? as i32,
            },
            slack_timeout: src.millis("THREADLINE_SLACK_TIMEOUT_MS", 10_000, 100..=120_000)?,
            late_after: src.millis("THREADLINE_LATE_EVENT_MS", 300_000, 1_000..=604_800_000)?,
            refresher: threadline_tenancy::tokens::Refresher::from_source(
                src,
                &CommonConfig::from_source(src)?.slack_api_url,
            )?,
            admission: admission(src)?,
            resume_every: src.millis("THREADLINE_PARKED_RESUME_MS", 250, 10..=60_000)?,
        })
    }
}

fn admission(src: &Source) -> Result<AdmitRules, ConfigError> {
    let notice = src.string("THREADLINE_BUDGET_NOTICE", "note");
    Ok(AdmitRules {
        limits: threadline_domain::budget::Limits {
            answers_per_minute: src.bounded(
                "THREADLINE_BUDGET_ANSWERS_PER_MINUTE",
                0,
                0..=1_000_000,
            )? as u32,
            model_calls_per_minute: src.bounded(
                "THREADLINE_BUDGET_MODEL_CALLS_PER_MINUTE",
                0,
                0..=1_000_000,
            )? as u32,
            model_tokens_per_day: src.bounded(
                "THREADLINE_BUDGET_MODEL_TOKENS_PER_DAY",
                0,
                0..=1_000_000_000_000,
            )?,
        },
        share: src.bounded("THREADLINE_TENANT_QUEUE_SHARE", 64, 1..=100_000)? as u32,
        notice: threadline_domain::budget::Notice::parse(&notice).ok_or_else(|| {
            ConfigError::Invalid {
                key: "THREADLINE_BUDGET_NOTICE".into(),
                message: format!("expected note or none, got {notice:?}"),
            }
        })?,
    })
}
