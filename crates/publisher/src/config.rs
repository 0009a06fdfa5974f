//! Publisher settings. Shared ones are documented in `threadline_runtime::config`.

use std::time::Duration;

use threadline_runtime::config::{CommonConfig, ConfigError, Source};
use threadline_tenancy::secrets::TokenKeys;

use crate::reconcile::Evidence;

/// Streaming settings (see `PublisherConfig::streams`).
#[derive(Debug, Clone, Copy)]
pub struct Streams {
    pub append_every: Duration,
    pub stale: f64,
    /// The longest a stream may stay open (Slack ends streams after five
    /// minutes): longer, it ends with its closing line.
    pub max_open: Duration,
}

/// How the sweeper runs (`PublisherConfig::sweep`).
#[derive(Debug, Clone, Copy)]
pub struct Sweep {
    /// How often a round runs (`THREADLINE_SWEEP_MS`).
    pub every: Duration,
    /// How long an intent may sit past its due time, or mid-reconciliation
    /// without progress, before it counts as undriven
    /// (`THREADLINE_SWEEP_IDLE_MS`).
    pub idle: Duration,
}

pub struct PublisherConfig {
    pub common: CommonConfig,
    /// `THREADLINE_PUBLISHER_ADDR`, default `127.0.0.1:3003`.
    pub addr: std::net::SocketAddr,
    /// `THREADLINE_TOKEN_KEYS` (required): opens bot tokens for posting.
    pub cipher: TokenKeys,
    /// `THREADLINE_PUBLISHER_CONCURRENCY`, default 8.
    pub concurrency: usize,
    /// `THREADLINE_RECONCILE_READS` (3) over `THREADLINE_RECONCILE_WINDOW_MS`
    /// (10000): evidence that an unknown post did not land; then the intent
    /// is held, or re-posted once if `THREADLINE_RECONCILE_ALLOW_REPOST=true`.
    /// A held intent's thread is read again after `THREADLINE_LATE_CHECK_MS`
    /// (30000), then after 4, 20, 120 … times that, for about a week.
    pub evidence: Evidence,
    /// `THREADLINE_POST_SPACING_MS`, default 1000: per channel, shared.
    pub post_spacing: f64,
    /// `THREADLINE_POST_MAX_ATTEMPTS`, default 5 (rate-limited attempts).
    pub max_attempts: i32,
    /// `THREADLINE_SLACK_TIMEOUT_MS`, default 10000: a post slower than
    /// this has an unknown outcome.
    pub slack_timeout: Duration,
    /// `THREADLINE_SENDING_STALE_MS`, default 300000: a post claimed this
    /// long ago whose worker never recorded the outcome is unknown, and
    /// reconciled. More than twice the Slack timeout.
    pub sending_stale: Duration,
    /// `SLACK_CLIENT_ID` / `SLACK_CLIENT_SECRET`: refresh rotating tokens.
    pub refresher: Option<threadline_tenancy::tokens::Refresher>,
    /// `THREADLINE_SWEEP_MS` (5000) / `THREADLINE_SWEEP_IDLE_MS` (60000):
    /// how often the sweeper looks for reply intents no delivery is driving,
    /// and how long past due (or without progress) an intent must be to count.
    pub sweep: Sweep,
    /// `THREADLINE_STREAMING`, default true: answers inference streams are
    /// streamed into Slack where the installation's and channel's policy
    /// allow it (false: every answer is posted whole). With it:
    /// `THREADLINE_STREAM_APPEND_MS` (1000), the time between two appends
    /// of one stream (`chat.appendStream` is Tier 4, shared by the
    /// workspace's streams); `THREADLINE_STREAM_STALE_MS` (45000), how
    /// long a stream may go without a step before another publisher takes
    /// its publisher for dead and ends it (more than three times the Slack
    /// timeout plus the append time: an append and two tries of a stop); `THREADLINE_STREAM_MAX_MS` (240000),
    /// the longest a stream stays open before it ends with its closing line
    /// (Slack ends streams after five minutes).
    pub streams: Option<Streams>,
}

impl PublisherConfig {
    pub fn from_source(src: &Source) -> Result<Self, ConfigError> {
        Ok(Self {
            common: CommonConfig::from_source(src)?,
            addr: src.socket_addr("THREADLINE_PUBLISHER_ADDR", "127.0.0.1:3003")?,
            cipher: TokenKeys::from_source(src)?,
            concurrency: src.bounded("THREADLINE_PUBLISHER_CONCURRENCY", 8, 1..=256)? as usize,
            evidence: Evidence {
                reads: src.bounded("THREADLINE_RECONCILE_READS", 3, 1..=100)? as i32,
                window_secs: src
                    .millis("THREADLINE_RECONCILE_WINDOW_MS", 10_000, 0..=3_600_000)?
                    .as_secs_f64(),
                allow_repost: src.flag("THREADLINE_RECONCILE_ALLOW_REPOST", false)?,
                late_check_secs: src
                    .millis("THREADLINE_LATE_CHECK_MS", 30_000, 100..=3_600_000)?
                    .as_secs_f64(),
            },
            post_spacing: src
                .millis("THREADLINE_POST_SPACING_MS", 1000, 0..=60_000)?
                .as_secs_f64(),
            max_attempts: src.bounded("THREADLINE_POST_MAX_ATTEMPTS", 5, 1..=100)? as i32,
            slack_timeout: src.millis("THREADLINE_SLACK_TIMEOUT_MS", 10_000, 100..=120_000)?,
            sending_stale: {
                let stale =
                    src.millis("THREADLINE_SENDING_STALE_MS", 300_000, 1_000..=3_600_000)?;
                let timeout = src.millis("THREADLINE_SLACK_TIMEOUT_MS", 10_000, 100..=120_000)?;
                if stale <= timeout * 2 {
                    return Err(ConfigError::Invalid {
                        key: "THREADLINE_SENDING_STALE_MS".into(),
                        message: format!(
                            "must be more than twice THREADLINE_SLACK_TIMEOUT_MS ({} ms), or a post still in flight could be taken for lost",
                            timeout.as_millis()
                        ),
                    });
                }
                stale
            },
            streams: if src.flag("THREADLINE_STREAMING", true)? {
                let append_every = src.millis("THREADLINE_STREAM_APPEND_MS", 1000, 50..=60_000)?;
                let stale = src.millis("THREADLINE_STREAM_STALE_MS", 45_000, 1_000..=600_000)?;
                let timeout = src.millis("THREADLINE_SLACK_TIMEOUT_MS", 10_000, 100..=120_000)?;
                // A live publisher goes this long without a step at most:
                // an append that times out, then two tries of a stop, and
                // the wait before the next step.
                if stale <= timeout * 3 + append_every {
                    return Err(ConfigError::Invalid {
                        key: "THREADLINE_STREAM_STALE_MS".into(),
                        message: format!(
                            "must be more than three times THREADLINE_SLACK_TIMEOUT_MS plus THREADLINE_STREAM_APPEND_MS ({} ms), or a stream still driven could be taken for orphaned",
                            (timeout * 3 + append_every).as_millis()
                        ),
                    });
                }
                Some(Streams {
                    append_every,
                    stale: stale.as_secs_f64(),
                    max_open: src.millis("THREADLINE_STREAM_MAX_MS", 240_000, 1_000..=290_000)?,
                })
            } else {
                None
            },
            sweep: Sweep {
                every: src.millis("THREADLINE_SWEEP_MS", 5_000, 100..=600_000)?,
                idle: src.millis("THREADLINE_SWEEP_IDLE_MS", 60_000, 1_000..=3_600_000)?,
            },
            refresher: threadline_tenancy::tokens::Refresher::from_source(
                src,
                &CommonConfig::from_source(src)?.slack_api_url,
            )?,
        })
    }
}
