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
    audit_records: i64,
    receipts: i64,
    contexts: i64,
    rejections: i64,
    /// Stored bodies of unparsed deliveries deleted.
    unparsed_bodies: i64,
    /// Unparsed receipts closed as `failed` (`unparsed_expired`).
    unparsed_expired: i64,
    threads: i64,
    thread_messages: i64,
    proposal_texts: i64,
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
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT set_config('threadline.audit_purge', 'on', true)")
        .execute(&mut *tx)
        .await?;
    r.audit_records =
        sqlx::query("DELETE FROM audit_log WHERE at < now() - make_interval(days => $1::int)")
            .bind(r.audit_days as i64)
            .execute(&mut *tx)
            .await?
            .rows_affected() as i64;

    let cutoff = r.receipts_days as i64;
    // Unparsed deliveries nobody replayed within the retention: the body
    // (message text) goes, the receipt is closed as failed and is deleted
    // like any finished receipt one retention later. A body whose receipt
    // is no longer unparsed has no use and goes too.
    (r.unparsed_bodies, r.unparsed_expired) = sqlx::query_as(
        "WITH old AS (
             SELECT receipt_id FROM unparsed_events
              WHERE received_at < now() - make_interval(days => $1::int)),
         expired AS (
             UPDATE event_receipts r
                SET state = 'failed', state_reason = 'unparsed_expired', updated_at = now()
               FROM old WHERE r.id = old.receipt_id AND r.state = 'unparsed'
             RETURNING 1),
         bodies AS (
             DELETE FROM unparsed_events u
              WHERE u.receipt_id IN (SELECT receipt_id FROM old)
                 OR NOT EXISTS (SELECT 1 FROM event_receipts r
                                 WHERE r.id = u.receipt_id AND r.state = 'unparsed')
             RETURNING 1)
         SELECT (SELECT count(*) FROM bodies), (SELECT count(*) FROM expired)",
    )
    .bind(cutoff)
    .fetch_one(&mut *tx)
    .await?;
    r.receipts = sqlx::query(
        "DELETE FROM event_receipts
          WHERE state IN ('done', 'ignored', 'failed') AND updated_at < now() - make_interval(days => $1::int)",
    )
    .bind(cutoff)
    .execute(&mut *tx)
    .await?
    .rows_affected() as i64;
    r.contexts = sqlx::query(
        "DELETE FROM contexts c
          WHERE c.captured_at < now() - make_interval(days => $1::int)
            AND NOT EXISTS (SELECT 1 FROM event_receipts r WHERE r.id = c.receipt_id)",
    )
    .bind(cutoff)
    .execute(&mut *tx)
    .await?
    .rows_affected() as i64;
    r.rejections = sqlx::query_scalar(
        "WITH a AS (DELETE FROM rejections WHERE received_at < now() - make_interval(days => $1::int) RETURNING 1),
              b AS (DELETE FROM app_rate_limit_notices WHERE received_at < now() - make_interval(days => $1::int) RETURNING 1)
         SELECT (SELECT count(*) FROM a) + (SELECT count(*) FROM b)",
    )
    .bind(cutoff)
    .fetch_one(&mut *tx)
    .await?;

    let (threads, messages): (i64, i64) = sqlx::query_as(
        "WITH idle AS (
             DELETE FROM threads WHERE updated_at < now() - make_interval(days => $1::int)
             RETURNING installation_id, channel_id, root_ts),
         msgs AS (
             DELETE FROM thread_messages m USING idle i
              WHERE m.installation_id = i.installation_id AND m.channel_id = i.channel_id AND m.root_ts = i.root_ts
             RETURNING m.installation_id, m.channel_id, m.ts),
         facts AS (
             DELETE FROM message_facts f USING msgs m
              WHERE f.installation_id = m.installation_id AND f.channel_id = m.channel_id AND f.ts = m.ts
             RETURNING 1),
         gone_turns AS (
             DELETE FROM turns t USING msgs m
              WHERE t.installation_id = m.installation_id AND t.channel_id = m.channel_id AND t.ts = m.ts
             RETURNING 1)
         SELECT (SELECT count(*) FROM idle), (SELECT count(*) FROM msgs)",
    )
    .bind(r.threads_days as i64)
    .fetch_one(&mut *tx)
    .await?;
    (r.threads, r.thread_messages) = (threads, messages);
    r.proposal_texts = sqlx::query(
        "UPDATE decisions SET body_text = NULL, body_blocks = NULL
          WHERE body_text IS NOT NULL AND updated_at < now() - make_interval(days => $1::int)
            AND status NOT IN ('calling', 'proposed', 'review', 'approved')",
    )
    .bind(r.threads_days as i64)
    .execute(&mut *tx)
    .await?
    .rows_affected() as i64;

    if args.dry_run {
        tx.rollback().await?;
    } else {
        tx.commit().await?;
    }
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
