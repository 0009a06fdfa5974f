//! `threadline install …`: register a single-workspace installation by hand
//! until the OAuth flow exists.

use anyhow::Context as _;
use clap::Subcommand;
use sqlx::PgPool;
use threadline_domain::{AppId, BotId, EnterpriseId, TeamId, UserId};

use threadline_runtime::config::Source;
use threadline_tenancy::installations::Registration;
use threadline_tenancy::secrets::TokenCipher;

#[derive(Subcommand)]
pub enum InstallCommand {
    /// Register (or update) an installation; the bot token is stored encrypted.
    Add {
        /// Workspace id (T…). Omit with --org-wide.
        #[arg(long)]
        team: Option<String>,
        /// Enterprise Grid organisation id (E…).
        #[arg(long)]
        enterprise: Option<String>,
        /// Install across the whole organisation (needs --enterprise).
        #[arg(long)]
        org_wide: bool,
        /// Slack app id (A…).
        #[arg(long)]
        app: String,
        /// The bot's user id (U…).
        #[arg(long = "bot-user")]
        bot_user: String,
        /// The bot id (B…).
        #[arg(long = "bot-id")]
        bot_id: String,
        /// Bot token (xoxb-…); read from SLACK_BOT_TOKEN when omitted, so it
        /// need not appear in shell history.
        #[arg(long, env = "SLACK_BOT_TOKEN", hide_env_values = true)]
        token: String,
        /// Granted bot scopes, comma separated.
        #[arg(long, value_delimiter = ',')]
        scopes: Vec<String>,
    },
    /// List installations (ids and status; never tokens).
    List,
}

pub async fn run(cmd: InstallCommand, src: &Source, pool: &PgPool) -> anyhow::Result<()> {
    match cmd {
        InstallCommand::Add {
            team,
            enterprise,
            org_wide,
            app,
            bot_user,
            bot_id,
            token,
            scopes,
        } => {
            let app = AppId::parse(app).context("--app")?;
            let team = team.map(TeamId::parse).transpose().context("--team")?;
            let enterprise = enterprise
                .map(EnterpriseId::parse)
                .transpose()
                .context("--enterprise")?;
            let bot_user = UserId::parse(bot_user).context("--bot-user")?;
            let bot_id = BotId::parse(bot_id).context("--bot-id")?;
            match (org_wide, &team, &enterprise) {
                (true, _, None) => anyhow::bail!("--org-wide needs --enterprise"),
                (true, Some(_), _) => anyhow::bail!("--org-wide installs have no --team"),
                (false, None, _) => {
                    anyhow::bail!("--team is required (or --org-wide with --enterprise)")
                }
                _ => {}
            }
            if !token.starts_with("xoxb-") {
                anyhow::bail!("--token must be a bot token (xoxb-…)");
            }
            let cipher = TokenCipher::from_source(src)?;
            let token = secrecy::SecretString::from(token);
            let (id, key_id) = threadline_tenancy::installations::register(
                pool,
                &cipher,
                &Registration {
                    app_id: app.as_str(),
                    team_id: team.as_ref().map(|t| t.as_str()),
                    enterprise_id: enterprise.as_ref().map(|e| e.as_str()),
                    org_wide,
                    bot_user_id: bot_user.as_str(),
                    bot_id: bot_id.as_str(),
                    scopes: &scopes,
                },
                &threadline_tenancy::installations::Tokens {
                    bot_token: &token,
                    refresh_token: None,
                    expires_in: None,
                },
            )
            .await?;
            println!("installation {id} active (app {app}, key {key_id})");
        }
        InstallCommand::List => {
            let list = threadline_store::installations::list(pool).await?;
            println!("{}", serde_json::to_string_pretty(&list)?);
        }
    }
    Ok(())
}
