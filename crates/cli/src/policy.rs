//! `threadline policy …`: what may trigger an answer, per installation and
//! per channel. DMs, private channels and Slack Connect channels are denied
//! until allowed here; so is unfurling the links and media of a reply.

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
    },
    /// How one channel triggers answers (default: mentions only), and
    /// whether it is on the allow-list (which also admits it when it is
    /// private or a Slack Connect channel).
    Channel {
        #[arg(long)]
        installation: Uuid,
        #[arg(long)]
        channel: String,
        #[arg(long, value_enum, required_unless_present_any = ["allow", "unfurl"])]
        mode: Option<Mode>,
        #[arg(long, value_enum)]
        allow: Option<Toggle>,
        /// Unfurling of replies' links and media in this channel
        /// (`inherit`: as the installation says).
        #[arg(long, value_enum)]
        unfurl: Option<ChannelToggle>,
        /// Words that trigger in `keywords` mode.
        #[arg(long, value_delimiter = ',')]
        keywords: Vec<String>,
    },
}

pub async fn run(cmd: PolicyCommand, pool: &PgPool) -> anyhow::Result<()> {
    match cmd {
        PolicyCommand::Show { installation } => {
            type PolicyRow = (bool, bool, bool, Vec<String>, String, bool, bool);
            let p: Option<PolicyRow> = sqlx::query_as(
                "SELECT dms_allowed, private_channels_allowed, shared_channels_allowed, approved_bots, read_limits,
                        allowlist_only, unfurl_allowed
                   FROM installation_policies WHERE installation_id = $1",
            )
            .bind(installation)
            .fetch_optional(pool)
            .await?;
            let (dms, private, shared, bots, limits, allowlist_only, unfurl) = p.unwrap_or((
                false,
                false,
                false,
                Vec::new(),
                "tier3".into(),
                false,
                false,
            ));
            type ChannelRow = (String, String, Vec<String>, bool, Option<bool>);
            let channels: Vec<ChannelRow> =
                sqlx::query_as("SELECT channel_id, mode, keywords, allowed, unfurl_allowed FROM channel_policies WHERE installation_id = $1 ORDER BY channel_id")
                    .bind(installation)
                    .fetch_all(pool)
                    .await?;
            println!(
                "{}",
                serde_json::to_string_pretty(&serde_json::json!({
                    "installation_id": installation, "dms": dms, "private_channels": private, "shared_channels": shared,
                    "approved_bots": bots, "read_limits": limits, "allowlist_only": allowlist_only, "unfurl": unfurl,
                    "channels": channels.into_iter().map(|(c, m, k, a, u)| serde_json::json!({
                        "channel": c, "mode": m, "keywords": k, "allowed": a,
                        // null: as the installation says
                        "unfurl": u,
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
                        allowlist_only = coalesce($7, allowlist_only),
                        unfurl_allowed = coalesce($8, unfurl_allowed),
                        updated_at = now()
                  WHERE installation_id = $1",
            )
            .bind(installation)
            .bind(dms.map(Toggle::on))
            .bind(private_channels.map(Toggle::on))
            .bind(shared_channels.map(Toggle::on))
            .bind(approved_bots)
            .bind(read_limits)
            .bind(allowlist_only.map(Toggle::on))
            .bind(unfurl.map(Toggle::on))
            .execute(pool)
            .await?;
            println!("policy of {installation} updated");
        }
        PolicyCommand::Channel {
            installation,
            channel,
            mode,
            allow,
            unfurl,
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
            let exists: bool =
                sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM installations WHERE id = $1)")
                    .bind(installation)
                    .fetch_one(pool)
                    .await?;
            if !exists {
                anyhow::bail!("no installation {installation} (see `threadline install list`)");
            }
            // Only what is given changes; a new row starts as mentions only,
            // not allow-listed, unfurling as the installation says.
            let (unfurl_given, unfurl_value) = match unfurl {
                None => (false, None),
                Some(ChannelToggle::On) => (true, Some(true)),
                Some(ChannelToggle::Off) => (true, Some(false)),
                Some(ChannelToggle::Inherit) => (true, None),
            };
            let (mode, allowed, unfurl): (String, bool, Option<bool>) = sqlx::query_as(
                "INSERT INTO channel_policies (installation_id, channel_id, mode, keywords, allowed, unfurl_allowed)
                 VALUES ($1, $2, coalesce($3, 'mentions'), $4, coalesce($5, false), $7)
                 ON CONFLICT (installation_id, channel_id) DO UPDATE
                    SET mode = coalesce($3, channel_policies.mode),
                        keywords = CASE WHEN $3 IS NULL THEN channel_policies.keywords ELSE EXCLUDED.keywords END,
                        allowed = coalesce($5, channel_policies.allowed),
                        unfurl_allowed = CASE WHEN $6 THEN $7 ELSE channel_policies.unfurl_allowed END,
                        updated_at = now()
                 RETURNING mode, allowed, unfurl_allowed",
            )
            .bind(installation)
            .bind(&channel)
            .bind(mode)
            .bind(&keywords)
            .bind(allow.map(Toggle::on))
            .bind(unfurl_given)
            .bind(unfurl_value)
            .fetch_one(pool)
            .await?;
            println!(
                "channel {channel}: {mode}{}{}",
                if allowed { ", allow-listed" } else { "" },
                match unfurl {
                    None => "",
                    Some(true) => ", unfurls links and media",
                    Some(false) => ", never unfurls",
                }
            );
        }
    }
    Ok(())
}
