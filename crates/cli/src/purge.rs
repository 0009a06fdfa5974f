//! `threadline purge`: retention. Deletes audit records, finished receipts
//! (kept well past Slack's retry window so a late retry is still recognised),
//! the raw bodies of unparsed deliveries never replayed (their receipts are
//! closed as `failed`, reason `unparsed_expired`) and the stored text of
//! threads idle past their retention, in one transaction; then the dead
//! letters past their retention (from the broker). `--dry-run` counts
//! without deleting.

use sqlx::PgPool;
use threadline_runtime::config::Source;

#[derive(clap::Args)]
pub struct PurgeArgs {
    /// Audit records older than this many days
    /// (default THREADLINE_AUDIT_RETENTION_DAYS, else 400).
    #[arg(long)]
    audit_days: Option<u64>,
    /// Finished receipts, their contexts and rejections, and the bodies of
    /// unparsed deliveries, older than this
    /// (default THREADLINE_RECEIPT_RETENTION_DAYS, else 30; at least 1, which
    /// is far beyond Slack's retries).
    #[arg(long)]
    receipts_days: Option<u64>,
    /// Threads idle this long lose their stored messages, and settled
    /// proposals this old lose their text
    /// (default THREADLINE_THREAD_RETENTION_DAYS, else 30).
    #[arg(long)]
    threads_days: Option<u64>,
    /// Dead letters older than this many hours (default: the receipts'
    /// retention); 0 removes every dead letter.
    #[arg(long)]
    dead_letters_hours: Option<u64>,
    /// Count what would go, delete nothing.
    #[arg(long)]
    dry_run: bool,
}

#[derive(serde::Serialize, Default)]
pub struct Report {
    dry_run: bool,
    audit_days: u64,
    receipts_days: u64,
    threads_days: u64,
    /// What was (or would be) deleted, each count a field of the report.
    #[serde(flatten)]
    purged: threadline_store::retention::Purged,
    dead_letters_hours: u64,
    /// Dead letters removed from the broker's dead-letter stream.
    dead_letters: u64,
}

fn days(flag: Option<u64>, src: &Source, key: &str, default: u64) -> anyhow::Result<u64> {
    let d = match flag {
        Some(d) => d,
        None => src.bounded(key, default, 1..=36_500)?,
    };
    anyhow::ensure!(
        (1..=36_500).contains(&d),
        "{key}: retention must be 1 to 36500 days, got {d}"
    );
    Ok(d)
}

pub async fn run(args: &PurgeArgs, src: &Source, pool: &PgPool) -> anyhow::Result<Report> {
    let mut r = Report {
        dry_run: args.dry_run,
        audit_days: days(args.audit_days, src, "THREADLINE_AUDIT_RETENTION_DAYS", 400)?,
        receipts_days: days(
            args.receipts_days,
            src,
            "THREADLINE_RECEIPT_RETENTION_DAYS",
            30,
        )?,
        threads_days: days(
            args.threads_days,
            src,
            "THREADLINE_THREAD_RETENTION_DAYS",
            30,
        )?,
        ..Default::default()
    };
    r.purged = threadline_store::retention::purge(
        pool,
        threadline_store::retention::Retention {
            // (each at most 36,500: checked by `days`)
            audit_days: r.audit_days as i32,
            receipts_days: r.receipts_days as i32,
            threads_days: r.threads_days as i32,
        },
        args.dry_run,
    )
    .await?;
    Ok(r)
}

/// Removes the dead letters older than the retention (the dead-letter
/// stream is in arrival order, so everything before the first newer letter).
pub async fn dead_letters(
    args: &PurgeArgs,
    common: &threadline_runtime::config::CommonConfig,
    r: &mut Report,
) -> anyhow::Result<()> {
    use anyhow::Context as _;
    r.dead_letters_hours = args
        .dead_letters_hours
        .unwrap_or(r.receipts_days.saturating_mul(24));
    let nats = threadline_runtime::bus::connect(&common.nats_url, "threadline-cli").await?;
    let js = async_nats::jetstream::new(nats.clone());
    let topology = threadline_runtime::bus::Topology::from_config(common);
    let stream = match js.get_stream(topology.dead_letter_stream()).await {
        Ok(s) => s,
        // No stream: no service ever started here, so no dead letters.
        // Anything else (the broker unreachable, the login refused) is an
        // error: a purge that cannot reach the letters must not say it did.
        Err(e)
            if matches!(
                e.kind(),
                async_nats::jetstream::context::GetStreamErrorKind::JetStream(ref j)
                    if j.error_code() == async_nats::jetstream::ErrorCode::STREAM_NOT_FOUND
            ) =>
        {
            return Ok(());
        }
        Err(e) => {
            return Err(anyhow::Error::new(e).context(format!(
                "opening {} on the broker",
                topology.dead_letter_stream()
            )));
        }
    };
    let info = stream
        .get_info()
        .await
        .context("reading the dead-letter stream")?;
    if info.state.messages == 0 {
        return Ok(());
    }
    let cutoff = time::OffsetDateTime::now_utc()
        - time::Duration::hours(i64::try_from(r.dead_letters_hours).unwrap_or(i64::MAX / 7200));
    let mut keep_from = info.state.last_sequence + 1;
    let mut old = 0;
    for seq in info.state.first_sequence..=info.state.last_sequence {
        let m = match stream.get_raw_message(seq).await {
            Ok(m) => m,
            // A gap: a letter already replayed or dropped.
            Err(e)
                if e.kind()
                    == async_nats::jetstream::stream::LastRawMessageErrorKind::NoMessageFound =>
            {
                continue;
            }
            // Anything else: stop rather than guess (a letter newer than the
            // cutoff must not go with the old ones).
            Err(e) => {
                return Err(anyhow::Error::new(e).context(format!("reading dead letter {seq}")));
            }
        };
        if m.time >= cutoff {
            keep_from = seq;
            break;
        }
        old += 1;
    }
    r.dead_letters = old;
    if old > 0 && !args.dry_run {
        stream
            .purge()
            .sequence(keep_from)
            .await
            .context("removing old dead letters")?;
    }
    nats.flush().await?;
    Ok(())
}
