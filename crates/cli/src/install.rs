//! `threadline install …`: register a single-workspace installation by hand
//! until the OAuth flow exists.

use anyhow::Context as _;
use clap::Subcommand;
use sqlx::PgPool;
use threadline_domain::{AppId, BotId, EnterpriseId, TeamId, UserId};

use threadline_runtime::config::Source;
use threadline_runtime::secrets::{TokenCipher, token_aad};
use uuid::Uuid;

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
            // Registration and its token commit together: never an active
            // installation without a token.
            let mut tx = pool.begin().await?;
            let id = upsert(
                &mut tx,
                &app,
                team.as_ref(),
                enterprise.as_ref(),
                org_wide,
                &bot_user,
                &bot_id,
                &scopes,
            )
            .await?;
            let sealed = cipher.seal(token.as_bytes(), &token_aad(&id, "bot"))?;
            sqlx::query("UPDATE installations SET bot_token_sealed = $2, bot_token_key_id = $3, updated_at = now() WHERE id = $1")
                .bind(id)
                .bind(&sealed.bytes)
                .bind(&sealed.key_id)
                .execute(&mut *tx)
                .await
                .context("storing the sealed token")?;
            tx.commit().await.context("committing the installation")?;
            println!(
                "installation {id} active (app {app}, key {})",
                sealed.key_id
            );
        }
        InstallCommand::List => {
            let list: Vec<InstallationRow> = sqlx::query_as(
                "SELECT id, app_id, enterprise_id, team_id, is_enterprise_install AS org_wide, status,
                        bot_token_key_id AS token_key_id
                   FROM installations ORDER BY created_at",
            )
            .fetch_all(pool)
            .await?;
            println!("{}", serde_json::to_string_pretty(&list)?);
        }
    }
    Ok(())
}

/// What `install list` shows: identifiers and status, never token material.
#[derive(sqlx::FromRow, serde::Serialize)]
struct InstallationRow {
    id: Uuid,
    app_id: String,
    enterprise_id: Option<String>,
    team_id: Option<String>,
    org_wide: bool,
    status: String,
    token_key_id: Option<String>,
}

#[allow(clippy::too_many_arguments)]
async fn upsert(
    conn: &mut sqlx::PgConnection,
    app: &AppId,
    team: Option<&TeamId>,
    enterprise: Option<&EnterpriseId>,
    org_wide: bool,
    bot_user: &UserId,
    bot_id: &BotId,
    scopes: &[String],
) -> anyhow::Result<Uuid> {
    macro_rules! upsert_sql {
        ($conflict:literal) => {
            concat!(
                "INSERT INTO installations (id, app_id, enterprise_id, team_id, is_enterprise_install, bot_user_id, bot_id, scopes)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
                 ON CONFLICT ", $conflict, " DO UPDATE
                    SET enterprise_id = EXCLUDED.enterprise_id, bot_user_id = EXCLUDED.bot_user_id,
                        bot_id = EXCLUDED.bot_id, scopes = EXCLUDED.scopes, status = 'active',
                        disabled_reason = NULL, updated_at = now()
                 RETURNING id"
            )
        };
    }
    let sql: &'static str = if org_wide {
        upsert_sql!("(app_id, enterprise_id) WHERE is_enterprise_install")
    } else {
        upsert_sql!("(app_id, team_id) WHERE NOT is_enterprise_install")
    };
    sqlx::query_scalar(sql)
        .bind(Uuid::now_v7())
        .bind(app.as_str())
        .bind(enterprise.map(|e| e.as_str()))
        .bind(team.map(|t| t.as_str()))
        .bind(org_wide)
        .bind(bot_user.as_str())
        .bind(bot_id.as_str())
        .bind(scopes)
        .fetch_one(conn)
        .await
        .context("registering the installation")
}
