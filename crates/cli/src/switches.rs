//! `threadline kill-switch …`: stop replies at once, for everything, one
//! installation or one feature, without a deploy.

use clap::{Args, Subcommand};
use sqlx::PgPool;
use threadline_runtime::killswitch;

#[derive(Args)]
pub struct Target {
    /// Every installation and feature.
    #[arg(long, conflicts_with_all = ["installation", "feature"])]
    global: bool,
    /// One installation (its id, from `threadline install list`).
    #[arg(long)]
    installation: Option<uuid::Uuid>,
    /// One feature: `replies` (thread replies) or `tools` (actions beyond a
    /// reply). Any other name is refused when engaging; a switch of an old,
    /// unknown name can still be released.
    #[arg(long)]
    feature: Option<String>,
}

#[derive(Subcommand)]
pub enum SwitchCommand {
    /// Engage: suppress model calls and posts in scope.
    Engage {
        #[command(flatten)]
        target: Target,
        /// Why (recorded with the switch).
        #[arg(long)]
        reason: String,
        /// Who (recorded); defaults to $USER.
        #[arg(long, env = "USER", default_value = "operator", value_parser = crate::operator::operator_id)]
        by: String,
    },
    /// Release a switch.
    Release {
        #[command(flatten)]
        target: Target,
        #[arg(long, env = "USER", default_value = "operator", value_parser = crate::operator::operator_id)]
        by: String,
    },
    /// Show every switch.
    List,
}

/// The switch a target names; an engaged feature switch must name a
/// feature threadline consults, so a typo never governs nothing.
fn scope(t: &Target, engaging: bool) -> anyhow::Result<(&'static str, String)> {
    match (t.global, &t.installation, &t.feature) {
        (true, None, None) => Ok(("global", String::new())),
        (false, Some(i), None) => Ok(("installation", i.to_string())),
        (false, None, Some(f)) if engaging => Ok((
            "feature",
            killswitch::parse_feature(f)
                .map_err(|e| anyhow::anyhow!("--feature: {e}"))?
                .to_owned(),
        )),
        (false, None, Some(f)) if !f.trim().is_empty() => Ok(("feature", f.trim().to_owned())),
        _ => anyhow::bail!("name exactly one scope: --global, --installation ID or --feature NAME"),
    }
}

pub async fn run(cmd: SwitchCommand, pool: &PgPool) -> anyhow::Result<()> {
    match cmd {
        SwitchCommand::Engage { target, reason, by } => {
            let (s, t) = scope(&target, true)?;
            threadline_store::kill_switches::set(pool, s, &t, true, Some(&reason), &by).await?;
            println!(
                "kill switch engaged: {s}{}{t}",
                if t.is_empty() { "" } else { ":" }
            );
        }
        SwitchCommand::Release { target, by } => {
            let (s, t) = scope(&target, false)?;
            threadline_store::kill_switches::set(pool, s, &t, false, None, &by).await?;
            println!(
                "kill switch released: {s}{}{t}",
                if t.is_empty() { "" } else { ":" }
            );
        }
        SwitchCommand::List => println!(
            "{}",
            serde_json::to_string_pretty(&threadline_store::kill_switches::list(pool).await?)?
        ),
    }
    Ok(())
}
