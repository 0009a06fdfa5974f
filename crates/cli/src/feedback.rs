//! `threadline feedback export`: the people's verdicts on answers, from the
//! feedback buttons every answer carries, as JSON lines for an evaluation
//! loop: decision, model, thread version, labels, verdict, time; one line
//! per person's latest verdict on an answer, oldest first. No text, and no
//! person.

use clap::Subcommand;
use sqlx::PgPool;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use uuid::Uuid;

#[derive(Subcommand)]
pub enum FeedbackCommand {
    /// Every latest verdict as a JSON line (oldest first).
    Export {
        /// Only verdicts given at or after this time (RFC 3339, e.g.
        /// 2026-12-01T00:00:00Z).
        #[arg(long, value_parser = rfc3339)]
        since: Option<OffsetDateTime>,
        /// Only this installation's.
        #[arg(long)]
        installation: Option<Uuid>,
    },
}

fn rfc3339(s: &str) -> Result<OffsetDateTime, String> {
    OffsetDateTime::parse(s, &Rfc3339).map_err(|e| format!("not an RFC 3339 time ({e})"))
}

pub async fn run(cmd: FeedbackCommand, pool: &PgPool) -> anyhow::Result<()> {
    match cmd {
        FeedbackCommand::Export {
            since,
            installation,
        } => {
            use std::io::Write as _;
            let rows = threadline_store::feedback::export(pool, since, installation).await?;
            let mut out = std::io::stdout().lock();
            for r in rows {
                serde_json::to_writer(&mut out, &r)?;
                out.write_all(b"\n")?;
            }
            out.flush()?;
        }
    }
    Ok(())
}
