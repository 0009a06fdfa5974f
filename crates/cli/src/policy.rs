//! `threadline policy …`: what may trigger an answer, per installation and
//! per channel. DMs, private channels and Slack Connect channels are denied
//! until allowed here.

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
    },
    /// How one channel triggers answers (default: mentions only).
    Channel {
        #[arg(long)]
        installation: Uuid,
        #[arg(long)]
        channel: String,
        #[arg(long, value_enum)]
        mode: Mode,
        /// Words that trigger in `keywords` mode.
        #[arg(long, value_delimiter = ',')]
        keywords: Vec<String>,
    },
}

pub async fn run(cmd: PolicyCommand, pool: &PgPool) -> anyhow::Result<()> {
    match cmd {
        PolicyCommand::Show { installation } => {
            let p: Option<(bool, bool, bool, Vec<String>, String)> = sqlx::query_as(
                "SELECT dms_allowed, private_channels_allowed, shared_channels_allowed, approved_bots, read_limits
                   FROM installation_policies WHERE installation_id = $1",
            )
            .bind(installation)
            .fetch_optional(pool)
            .await?;
            let (dms, private, shared, bots, limits) =
                p.unwrap_or((false, false, false, Vec::new(), "tier3".into()));
            let channels: Vec<(String, String, Vec<String>)> =
                sqlx::query_as("SELECT channel_id, mode, keywords FROM channel_policies WHERE installation_id = $1 ORDER BY channel_id")
                    .bind(installation)
                    .fetch_all(pool)
                    .await?;
            println!(
                "{}",
                serde_json::to_string_pretty(&serde_json::json!({
                    "installation_id": installation, "dms": dms, "private_channels": private, "shared_channels": shared,
                    "approved_bots": bots, "read_limits": limits,
                    "channels": channels.into_iter().map(|(c, m, k)| serde_json::json!({"channel": c, "mode": m, "keywords": k})).collect::<Vec<_>>(),
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
        } => {
            let exists: bool =
                sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM installations WHERE id = $1)")
                    .bind(installation)
                    .fetch_one(pool)
                    .await?;
            if !exists {
                anyhow::bail!("no installation {installation} (see `threadline install list`)");
            }
            if let Some(bots) = &approved_bots {
                for b in bots {
                    threadline_domain::BotId::parse(b.clone())
                        .map_err(|e| anyhow::anyhow!("--approved-bots: {e}"))?;
                }
            }
            sqlx::query(
                "INSERT INTO installation_policies (installation_id) VALUES ($1) ON CONFLICT DO NOTHING",
            )
            .bind(installation)
            .execute(pool)
            .await?;
            sqlx::query(
                "UPDATE installation_policies
                    SET dms_allowed = coalesce($2, dms_allowed),
                        private_channels_allowed = coalesce($3, private_channels_allowed),
                        shared_channels_allowed = coalesce($4, shared_channels_allowed),
                        approved_bots = coalesce($5, approved_bots),
                        read_limits = coalesce($6, read_limits),
                        updated_at = now()
                  WHERE installation_id = $1",
            )
            .bind(installation)
            .bind(dms.map(Toggle::on))
            .bind(private_channels.map(Toggle::on))
            .bind(shared_channels.map(Toggle::on))
            .bind(approved_bots)
            .bind(read_limits)
            .execute(pool)
            .await?;
            println!("policy of {installation} updated");
        }
        PolicyCommand::Channel {
            installation,
            channel,
            mode,
            keywords,
        } => {
            threadline_domain::ChannelId::parse(channel.clone())
                .map_err(|e| anyhow::anyhow!("--channel: {e}"))?;
            let mode = match mode {
                Mode::Mentions => "mentions",
                Mode::Keywords if keywords.is_empty() => {
                    anyhow::bail!("keywords mode needs --keywords")
                }
                Mode::Keywords => "keywords",
                Mode::EveryMessage => "every_message",
            };
            sqlx::query(
                "INSERT INTO channel_policies (installation_id, channel_id, mode, keywords) VALUES ($1, $2, $3, $4)
                 ON CONFLICT (installation_id, channel_id) DO UPDATE
                    SET mode = EXCLUDED.mode, keywords = EXCLUDED.keywords, updated_at = now()",
            )
            .bind(installation)
            .bind(&channel)
            .bind(mode)
            .bind(&keywords)
            .execute(pool)
            .await?;
            println!("channel {channel}: {mode}");
        }
    }
    Ok(())
}
