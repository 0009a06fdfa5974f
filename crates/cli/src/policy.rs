//! `threadline policy …`: what may trigger an answer, per installation and
//! per channel. DMs, private channels and Slack Connect channels are denied
//! until allowed here; so is unfurling the links and media of a reply.
//! An installation's budgets (answers and model calls a minute, model
//! tokens a day) override the services' defaults here.

use clap::{Subcommand, ValueEnum};
use sqlx::PgPool;
use uuid::Uuid;

#[derive(Clone, Copy, ValueEnum)]
pub enum Toggle {
    On,
    Off,
}

impl Toggle {
    fn on(self) -> bool {
        matches!(self, Toggle::On)
    }
}

/// A channel setting that can also follow the installation's.
#[derive(Clone, Copy, ValueEnum)]
pub enum ChannelToggle {
    On,
    Off,
    /// As the installation says.
    Inherit,
}

/// A budget as typed: a number (0: no limit), or `default` (the
/// services' setting).
#[derive(Clone, Copy, Debug)]
pub enum Limit {
    Default,
    Value(i64),
}

impl std::str::FromStr for Limit {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "default" => Ok(Limit::Default),
            n => n
                .parse::<i64>()
                .ok()
                .filter(|n| *n >= 0)
                .map(Limit::Value)
                .ok_or_else(|| format!("expected a number (0: no limit) or `default`, got {n:?}")),
        }
    }
}

impl Limit {
    fn per_minute(self) -> anyhow::Result<Option<i32>> {
        match self {
            Limit::Default => Ok(None),
            Limit::Value(n) => {
                Ok(Some(i32::try_from(n).map_err(|_| {
                    anyhow::anyhow!("{n} a minute is more than a budget can be")
                })?))
            }
        }
    }

    fn per_day(self) -> Option<i64> {
        match self {
            Limit::Default => None,
            Limit::Value(n) => Some(n),
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
pub enum Mode {
    Mentions,
    Keywords,
    EveryMessage,
}

#[derive(Subcommand)]
pub enum PolicyCommand {
    /// The installation's policy and its channel rules.
    Show {
        #[arg(long)]
        installation: Uuid,
    },
    /// Change installation-wide switches (only those given change).
    Set {
        #[arg(long)]
        installation: Uuid,
        #[arg(long, value_enum)]
        dms: Option<Toggle>,
        #[arg(long, value_enum)]
        private_channels: Option<Toggle>,
        #[arg(long, value_enum)]
        shared_channels: Option<Toggle>,
        /// Bots (by bot id) whose messages are context; replaces the list.
        #[arg(long, value_delimiter = ',')]
        approved_bots: Option<Vec<String>>,
        /// `non_marketplace` for apps under Slack's 1-per-minute replies limit.
        #[arg(long, value_parser = ["tier3", "non_marketplace"])]
        read_limits: Option<String>,
        /// Answer only in allow-listed channels (`policy channel --allow on`);
        /// DMs stay governed by `--dms`.
        #[arg(long, value_enum)]
        allowlist_only: Option<Toggle>,
        /// Let Slack unfurl the links and media of replies (default off:
        /// an unfurl fetches a link nobody clicked).
        #[arg(long, value_enum)]
        unfurl: Option<Toggle>,
        /// Stream answers into Slack as the model writes them (default on;
        /// takes effect where inference streams, `THREADLINE_STREAMING`).
        #[arg(long, value_enum)]
        streaming: Option<Toggle>,
        /// Requests admitted for an answer a minute (0: no limit;
        /// `default`: `THREADLINE_BUDGET_ANSWERS_PER_MINUTE`).
        #[arg(long)]
        answers_per_minute: Option<Limit>,
        /// Contexts sent to the model a minute (0: no limit; `default`:
        /// `THREADLINE_BUDGET_MODEL_CALLS_PER_MINUTE`).
        #[arg(long)]
        model_calls_per_minute: Option<Limit>,
        /// Model tokens a UTC day (0: no limit; `default`:
        /// `THREADLINE_BUDGET_MODEL_TOKENS_PER_DAY`).
        #[arg(long)]
        model_tokens_per_day: Option<Limit>,
    },
    /// How one channel triggers answers (default: mentions only), and
    /// whether it is on the allow-list (which also admits it when it is
    /// private or a Slack Connect channel).
    Channel {
        #[arg(long)]
        installation: Uuid,
        #[arg(long)]
        channel: String,
        // not a state: flag names
        #[arg(long, value_enum, required_unless_present_any = ["allow", "unfurl", "streaming"])]
        mode: Option<Mode>,
        #[arg(long, value_enum)]
        allow: Option<Toggle>,
        /// Unfurling of replies' links and media in this channel
        /// (`inherit`: as the installation says).
        #[arg(long, value_enum)]
        unfurl: Option<ChannelToggle>,
        /// Streamed answers in this channel (`inherit`: as the
        /// installation says).
        #[arg(long, value_enum)]
        streaming: Option<ChannelToggle>,
        /// Words that trigger in `keywords` mode.
        #[arg(long, value_delimiter = ',')]
        keywords: Vec<String>,
    },
    /// What the installation does with a request Slack delivered late
    /// (older than the context-builder's `THREADLINE_LATE_EVENT_MS` when it
    /// arrived, as after an outage): every late event is recorded and
    /// counted either way.
    LateEvents {
        #[arg(long)]
        installation: Uuid,
        #[arg(long, value_enum)]
        action: LateEventAction,
    },
    /// What a person's quick messages come to: each answered as it comes
    /// (the default), or the latest of a burst answered once they were
    /// quiet for a while, the earlier ones read with it.
    DoubleTexting {
        #[arg(long)]
        installation: Uuid,
        #[arg(long, value_enum)]
        action: DoubleTextingAction,
        /// How long the person must be quiet before `latest` answers, in
        /// milliseconds (500–30000; the last chosen, else 2000).
        #[arg(long, requires = "action")]
        quiet_ms: Option<u32>,
    },
}

/// What a person's quick messages come to.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DoubleTextingAction {
    /// Each request answered as it comes (the default).
    Each,
    /// The latest request of a burst answered, after a quiet period.
    Latest,
}

/// `policy double-texting`: the installation's double-texting policy.
async fn set_double_texting(
    pool: &PgPool,
    installation: Uuid,
    action: DoubleTextingAction,
    quiet_ms: Option<u32>,
) -> anyhow::Result<()> {
    use threadline_domain::double_text::{DoubleTexting, QUIET_DEFAULT_MS, QUIET_RANGE_MS};
    if !threadline_store::installations::exists(pool, installation).await? {
        anyhow::bail!("no installation {installation} (see `threadline install list`)");
    }
    let policy = match (action, quiet_ms) {
        (DoubleTextingAction::Each, Some(_)) => {
            anyhow::bail!("--quiet-ms goes with --action latest")
        }
        (DoubleTextingAction::Each, None) => DoubleTexting::Each,
        (DoubleTextingAction::Latest, q) => {
            let kept = threadline_store::policies::double_texting(pool, installation).await?;
            let ms = q.unwrap_or_else(|| {
                kept.quiet()
                    .map_or(QUIET_DEFAULT_MS, |d| d.as_millis() as u32)
            });
            DoubleTexting::parse("latest", ms).ok_or_else(|| {
                anyhow::anyhow!(
                    "--quiet-ms {ms} is out of range ({}–{} ms)",
                    QUIET_RANGE_MS.start(),
                    QUIET_RANGE_MS.end()
                )
            })?
        }
    };
    threadline_store::policies::set_double_texting(pool, installation, policy).await?;
    match policy.quiet() {
        None => println!("requests of {installation}: each answered as it comes"),
        Some(q) => println!(
            "requests of {installation}: the latest of a person's burst answered once they were quiet for {} ms",
            q.as_millis()
        ),
    }
    Ok(())
}

/// What happens to a request that arrived late.
#[derive(Clone, Copy, ValueEnum)]
pub enum LateEventAction {
    /// Not answered (recorded as a change of its thread).
    Skip,
    /// Answered, saying beside its AI label how late Slack delivered it
    /// (the default).
    Note,
    /// Answered as if it had arrived in time.
    Answer,
}

impl LateEventAction {
    fn domain(self) -> threadline_domain::late::LateAction {
        use threadline_domain::late::LateAction;
        match self {
            Self::Skip => LateAction::Skip,
            Self::Note => LateAction::Note,
            Self::Answer => LateAction::Answer,
        }
    }
}

/// `policy late-events`: the installation's policy for late requests.
async fn set_late_events(
    pool: &PgPool,
    installation: Uuid,
    action: LateEventAction,
) -> anyhow::Result<()> {
    if !threadline_store::installations::exists(pool, installation).await? {
        anyhow::bail!("no installation {installation} (see `threadline install list`)");
    }
    let action = action.domain();
    threadline_store::late::set_action(pool, installation, action).await?;
    println!(
        "late requests of {installation}: {}",
        match action {
            threadline_domain::late::LateAction::Skip => "skipped",
            threadline_domain::late::LateAction::Note => "answered with a note of their lateness",
            threadline_domain::late::LateAction::Answer => "answered as if in time",
        }
    );
    Ok(())
}

pub async fn run(cmd: PolicyCommand, pool: &PgPool) -> anyhow::Result<()> {
    match cmd {
        PolicyCommand::Show { installation } => {
            let p = threadline_store::policies::installation_policy(pool, installation)
                .await?
                .unwrap_or_default();
            let channels = threadline_store::policies::channel_policies(pool, installation).await?;
            let late = threadline_store::late::action(pool, installation).await?;
            let doubled = threadline_store::policies::double_texting(pool, installation).await?;
            let own = threadline_store::policies::budget_overrides(pool, installation).await?;
            let used = threadline_store::policies::budget_use(pool, installation).await?;
            println!(
                "{}",
                serde_json::to_string_pretty(&serde_json::json!({
                    "installation_id": installation, "dms": p.dms_allowed,
                    "private_channels": p.private_channels_allowed, "shared_channels": p.shared_channels_allowed,
                    "approved_bots": p.approved_bots, "read_limits": p.read_limits,
                    "allowlist_only": p.allowlist_only, "unfurl": p.unfurl_allowed,
                    "streaming": p.streaming_allowed, // not a state: a setting's name
                    "late_events": late.as_str(),
                    "double_texting": doubled.as_str(),
                    // null: each request answered as it comes
                    "double_texting_quiet_ms": doubled.quiet().map(|q| q.as_millis() as u64),
                    // null: the services' default (THREADLINE_BUDGET_*); 0: no limit
                    "budgets": {
                        "answers_per_minute": own.answers_per_minute,
                        "model_calls_per_minute": own.model_calls_per_minute,
                        "model_tokens_per_day": own.model_tokens_per_day,
                        // units left in the per-minute buckets when last
                        // stored, and how long ago (they refill since)
                        "answers_left": used.answers_left,
                        "model_calls_left": used.model_calls_left,
                        "left_as_of_seconds_ago": used.seconds_since,
                        "model_tokens_today": used.tokens_today,
                        "requests_parked": used.parked,
                        "requests_in_model_queue": used.in_queue,
                    },
                    "channels": channels.into_iter().map(|c| serde_json::json!({
                        "channel": c.channel_id, "mode": c.mode, "keywords": c.keywords, "allowed": c.allowed,
                        // null: as the installation says
                        "unfurl": c.unfurl_allowed,
                        "streaming": c.streaming_allowed, // not a state: a setting's name
                    })).collect::<Vec<_>>(),
                }))?
            );
        }
        PolicyCommand::Set {
            installation,
            dms,
            private_channels,
            shared_channels,
            approved_bots,
            read_limits,
            allowlist_only,
            unfurl,
            streaming,
            answers_per_minute,
            model_calls_per_minute,
            model_tokens_per_day,
        } => {
            let exists = threadline_store::installations::exists(pool, installation).await?;
            if !exists {
                anyhow::bail!("no installation {installation} (see `threadline install list`)");
            }
            if let Some(bots) = &approved_bots {
                for b in bots {
                    threadline_domain::BotId::parse(b.clone())
                        .map_err(|e| anyhow::anyhow!("--approved-bots: {e}"))?;
                }
            }
            threadline_store::policies::set_installation_policy(
                pool,
                installation,
                &threadline_store::policies::InstallationChanges {
                    dms_allowed: dms.map(Toggle::on),
                    private_channels_allowed: private_channels.map(Toggle::on),
                    shared_channels_allowed: shared_channels.map(Toggle::on),
                    approved_bots,
                    read_limits,
                    allowlist_only: allowlist_only.map(Toggle::on),
                    unfurl_allowed: unfurl.map(Toggle::on),
                    streaming_allowed: streaming.map(Toggle::on),
                },
            )
            .await?;
            let budgets = threadline_store::policies::BudgetChanges {
                answers_per_minute: answers_per_minute.map(Limit::per_minute).transpose()?,
                model_calls_per_minute: model_calls_per_minute
                    .map(Limit::per_minute)
                    .transpose()?,
                model_tokens_per_day: model_tokens_per_day.map(Limit::per_day),
            };
            if !budgets.is_empty() {
                threadline_store::policies::set_budget_overrides(pool, installation, &budgets)
                    .await?;
            }
            println!("policy of {installation} updated");
        }
        PolicyCommand::Channel {
            installation,
            channel,
            mode,
            allow,
            unfurl,
            streaming,
            keywords,
        } => {
            threadline_domain::ChannelId::parse(channel.clone())
                .map_err(|e| anyhow::anyhow!("--channel: {e}"))?;
            let mode = match mode {
                None => None,
                Some(Mode::Mentions) => Some("mentions"),
                Some(Mode::Keywords) if keywords.is_empty() => {
                    anyhow::bail!("keywords mode needs --keywords")
                }
                Some(Mode::Keywords) => Some("keywords"),
                Some(Mode::EveryMessage) => Some("every_message"),
            };
            let exists = threadline_store::installations::exists(pool, installation).await?;
            if !exists {
                anyhow::bail!("no installation {installation} (see `threadline install list`)");
            }
            // Only what is given changes; a new row starts as mentions only,
            // not allow-listed, unfurling as the installation says.
            let given = |t: Option<ChannelToggle>| match t {
                None => None,
                Some(ChannelToggle::On) => Some(Some(true)),
                Some(ChannelToggle::Off) => Some(Some(false)),
                Some(ChannelToggle::Inherit) => Some(None),
            };
            let now = threadline_store::policies::set_channel_policy(
                pool,
                installation,
                &channel,
                &threadline_store::policies::ChannelChanges {
                    mode,
                    keywords: &keywords,
                    allowed: allow.map(Toggle::on),
                    unfurl_allowed: given(unfurl),
                    streaming_allowed: given(streaming),
                },
            )
            .await?;
            let (mode, allowed, unfurl) = (now.mode, now.allowed, now.unfurl_allowed);
            println!(
                "channel {channel}: {mode}{}{}{}",
                if allowed { ", allow-listed" } else { "" },
                match unfurl {
                    None => "",
                    Some(true) => ", unfurls links and media",
                    Some(false) => ", never unfurls",
                },
                match now.streaming_allowed {
                    None => "",
                    Some(true) => ", streams answers",
                    Some(false) => ", never streams",
                }
            );
        }
        PolicyCommand::LateEvents {
            installation,
            action,
        } => set_late_events(pool, installation, action).await?,
        PolicyCommand::DoubleTexting {
            installation,
            action,
            quiet_ms,
        } => set_double_texting(pool, installation, action, quiet_ms).await?,
    }
    Ok(())
}
