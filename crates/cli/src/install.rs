//! `threadline install …`: register a single-workspace installation by hand
//! until the OAuth flow exists.
//!
//! The bot token never comes on the command line (where `ps`, shell history
//! and process accounting show it): it is read from `SLACK_BOT_TOKEN` in the
//! environment, from a file (`--token-file`) or from standard input
//! (`--token-stdin`), and `--token VALUE` is refused without reading it.

use anyhow::Context as _;
use clap::Subcommand;
use sqlx::PgPool;
use threadline_domain::{AppId, BotId, EnterpriseId, TeamId, UserId};

use secrecy::{ExposeSecret as _, SecretString};
use threadline_runtime::config::Source;
use threadline_tenancy::installations::Registration;
use threadline_tenancy::secrets::{
    Seal, TOKEN_KEYS_SETTING, TOKEN_PUBLIC_KEYS_SETTING, TokenKeys, TokenSealer,
};

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
        /// A file holding the bot token (xoxb-…), alone on its first line.
        /// Without it or --token-stdin, the token is read from
        /// SLACK_BOT_TOKEN in the environment.
        #[arg(
            long = "token-file",
            value_name = "PATH",
            conflicts_with = "token_stdin"
        )]
        token_file: Option<std::path::PathBuf>,
        /// Read the bot token from standard input (its first line).
        #[arg(long = "token-stdin")]
        token_stdin: bool,
        /// Refused: a token on the command line is visible to every user of
        /// the machine (`ps`). Kept only to say so.
        #[arg(long, hide = true, value_name = "REFUSED")]
        token: Option<String>,
        /// Granted bot scopes, comma separated.
        #[arg(long, value_delimiter = ',')]
        scopes: Vec<String>,
    },
    /// List installations (ids and status; never tokens).
    List,
}

/// What `--token VALUE` is answered with (the value is not read further).
pub const ARGV_REFUSED: &str = "--token is refused: a token on the command line is visible to \
every user of the machine (ps, /proc) and stays in shell history. Give the bot token in \
SLACK_BOT_TOKEN, in a file (--token-file PATH) or on standard input (--token-stdin)";

/// Where the bot token is read from.
enum TokenFrom {
    Env,
    File(std::path::PathBuf),
    Stdin,
}

/// The bot token from where it was given: its first line, trimmed.
fn bot_token(from: TokenFrom, src: &Source) -> anyhow::Result<SecretString> {
    let raw = match from {
        TokenFrom::Env => {
            return src
                .secret("SLACK_BOT_TOKEN")?
                .map(|t| SecretString::from(t.expose_secret().trim().to_owned()))
                .ok_or_else(|| {
                    anyhow::anyhow!(
                        "no bot token: set SLACK_BOT_TOKEN, or use --token-file PATH or --token-stdin"
                    )
                });
        }
        TokenFrom::File(path) => SecretString::from(
            std::fs::read_to_string(&path)
                .with_context(|| format!("reading the bot token from {}", path.display()))?,
        ),
        TokenFrom::Stdin => {
            let mut line = String::new();
            std::io::stdin()
                .read_line(&mut line)
                .context("reading the bot token from standard input")?;
            SecretString::from(line)
        }
    };
    let first = raw.expose_secret().lines().next().unwrap_or("").trim();
    anyhow::ensure!(!first.is_empty(), "the bot token given is empty");
    Ok(SecretString::from(first.to_owned()))
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
            token_file,
            token_stdin,
            token,
            scopes,
        } => {
            if token.is_some() {
                anyhow::bail!("{ARGV_REFUSED}");
            }
            let from = if let Some(path) = token_file {
                TokenFrom::File(path)
            } else if token_stdin {
                TokenFrom::Stdin
            } else {
                TokenFrom::Env
            };
            let token = bot_token(from, src)?;
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
            if !token.expose_secret().starts_with("xoxb-") {
                anyhow::bail!("the token given is not a bot token (xoxb-…)");
            }
            // Sealing needs only the public keys: an operator may install
            // without holding the keys that open tokens.
            let cipher: Box<dyn Seal + Sync> = if src.get(TOKEN_KEYS_SETTING).is_some() {
                Box::new(TokenKeys::from_source(src)?)
            } else if let Some(public) = src.get(TOKEN_PUBLIC_KEYS_SETTING) {
                Box::new(TokenSealer::parse(public)?)
            } else {
                anyhow::bail!(
                    "set {TOKEN_PUBLIC_KEYS_SETTING} (or {TOKEN_KEYS_SETTING}) to seal the token"
                );
            };
            let (id, key_id) = threadline_tenancy::installations::register(
                pool,
                cipher.as_ref(),
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
