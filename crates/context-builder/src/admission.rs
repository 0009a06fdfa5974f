//! Parked work resumed, and the gauges of budgets and parked work (DESIGN
//! invariant 11). Triggers are admitted or parked as their events are
//! applied (`store::apply_many`); here every replica's resumer takes, each
//! round, the oldest parked requests there is room for now (round-robin
//! across installations, first in, first out within one, `SKIP LOCKED` so
//! replicas share the work), builds their contexts from their threads as
//! they are now (channels side by side, each channel's requests in
//! order), publishes each and marks it admitted at once: a
//! resumer that dies midway leaves its lease to run out, and the request is
//! resumed again (its units are not charged twice; a context published
//! twice is one message, by its `Nats-Msg-Id`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use sqlx::PgPool;
use threadline_domain::budget::ParkReason;
use threadline_runtime::shutdown::CancellationToken;
use threadline_store::budgets::{self, Resumed};
use uuid::Uuid;

use crate::handler::{Handler, Resumption};
use crate::store::AdmitRules;

/// How long a round's requests are leased to it.
const LEASE_SECS: f64 = 30.0;
/// The most requests of one installation resumed in one round.
const PER_ROUND: i64 = 64;
/// How often admitted requests inference never settled are swept.
const SWEEP_EVERY: Duration = Duration::from_secs(60);
/// How often the gauges are sampled.
const SAMPLE_EVERY: Duration = Duration::from_secs(15);
/// The installations with the most parked work that get a gauge each.
const TOP: i64 = 20;

/// Resumes parked work until `shutdown`: every `every` while rounds find
/// nothing to resume; after a round that resumed some, again within a
/// sixteenth of that (at least 5 ms), the pause doubling back to `every` round by empty
/// round (room comes back as the model's queue settles what was resumed:
/// a fixed pause would cap an installation's parked work at a share per
/// pause, whatever the model's queue serves).
pub fn spawn_resumer(
    handler: Arc<Handler>,
    rules: AdmitRules,
    every: Duration,
    at_once: usize,
    shutdown: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let soon = (every / 16).max(Duration::from_millis(5)).min(every);
    tokio::spawn(async move {
        let mut swept = tokio::time::Instant::now();
        let mut pause = every;
        loop {
            let resumed = match round(&handler, &rules, at_once).await {
                Ok(n) => {
                    if n > 0 {
                        tracing::debug!(resumed = n, "parked requests resumed");
                    }
                    n
                }
                Err(e) => {
                    tracing::warn!(
                        error = format!("{e:#}"),
                        "resuming parked work failed; trying again"
                    );
                    0
                }
            };
            if swept.elapsed() >= SWEEP_EVERY {
                swept = tokio::time::Instant::now();
                if let Err(e) = budgets::sweep_stale(&handler.pool).await {
                    tracing::debug!(error = %e, "sweeping stale admissions failed");
                }
            }
            pause = if resumed > 0 {
                soon
            } else {
                (pause * 2).min(every)
            };
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep(pause) => {}
            }
        }
    })
}

/// One round: leased, then resumed channel by channel, channels side by
/// side (at most `at_once`, the event path's concurrency: each resume holds
/// a connection at a time; their builds join the event path's batched
/// statements, where one request at a time would pace an installation's
/// parked work at one build's round trips, below what the pipeline
/// serves), taken from the installations in turn, each channel's requests
/// in order (a person's burst of messages is of one channel: its requests
/// are decided in the order asked). How many were built.
pub async fn round(handler: &Handler, rules: &AdmitRules, at_once: usize) -> anyhow::Result<usize> {
    let leased = budgets::lease_resumable(
        &handler.pool,
        &rules.limits,
        rules.share,
        LEASE_SECS,
        PER_ROUND,
    )
    .await?;
    if leased.is_empty() {
        return Ok(0);
    }
    let at = tokio::time::Instant::now();
    let built = futures::stream::iter(by_channel(leased))
        .map(|line| resume_line(handler, line, at))
        .buffer_unordered(at_once.max(1))
        .collect::<Vec<usize>>()
        .await;
    Ok(built.into_iter().sum())
}

/// The leased requests grouped by channel, each group in the order leased
/// (each installation's oldest first), the groups taken from the
/// installations in turn (a first channel of each, then a second...).
fn by_channel(leased: Vec<Resumed>) -> Vec<Vec<Resumed>> {
    let mut at: HashMap<(Uuid, String), usize> = HashMap::new();
    let mut lines: Vec<Vec<Resumed>> = Vec::new();
    for r in leased {
        let key = (r.request.installation, r.request.channel.clone());
        let i = *at.entry(key).or_insert_with(|| {
            lines.push(Vec::new());
            lines.len() - 1
        });
        lines[i].push(r);
    }
    // (each line's place among its installation's lines: stable, so a
    // first line of every installation comes before any second one)
    let mut nth: HashMap<Uuid, usize> = HashMap::new();
    let mut ranked: Vec<(usize, Vec<Resumed>)> = lines
        .into_iter()
        .map(|line| {
            let n = nth.entry(line[0].request.installation).or_default();
            *n += 1;
            (*n, line)
        })
        .collect();
    ranked.sort_by_key(|(n, _)| *n);
    ranked.into_iter().map(|(_, line)| line).collect()
}

/// One channel's leased requests (leased at `at`), in order: each context
/// built, published and at once marked admitted (a reconsideration of it
/// meanwhile finds it leased, and builds it). At the first that must wait,
/// it and the rest wait that long (their lease shortened to it, while the
/// round's lease is still surely theirs); at the first failure, for their
/// lease to run out: none of the channel overtakes it. How many were built.
async fn resume_line(handler: &Handler, line: Vec<Resumed>, at: tokio::time::Instant) -> usize {
    let mut built = 0;
    for (i, r) in line.iter().enumerate() {
        let marked = match handler.resume(&r.request).await {
            Ok(Resumption::Built) => budgets::mark_admitted(&handler.pool, std::slice::from_ref(r))
                .await
                .map_err(anyhow::Error::from),
            Ok(Resumption::Dropped) => continue,
            Ok(Resumption::NotYet(wait)) => {
                tracing::debug!(receipt_id = %r.request.receipt, "a parked request waits for an answer of its thread on its way");
                // (past half the lease, another round may hold them soon:
                // they wait the lease out)
                if at.elapsed() < Duration::from_secs_f64(LEASE_SECS / 2.0) {
                    let waiting: Vec<Uuid> = line[i..].iter().map(|w| w.request.receipt).collect();
                    if let Err(e) =
                        budgets::lease_for(&handler.pool, &waiting, wait.as_secs_f64()).await
                    {
                        tracing::debug!(error = %e, "shortening a waiting request's lease failed; it runs out as leased");
                    }
                }
                break;
            }
            Err(e) => Err(e),
        };
        match marked {
            Ok(_) => {
                // (a request decided before its mark left the line: the
                // mark finds nothing to move, and it was resumed all the
                // same)
                built += 1;
                let reason = r
                    .reason
                    .as_deref()
                    .and_then(ParkReason::parse)
                    .unwrap_or(ParkReason::TenantQueue);
                metrics::counter!("threadline_requests_resumed_total", "reason" => reason.as_str())
                    .increment(1);
            }
            Err(e) => {
                tracing::warn!(error = format!("{e:#}"), receipt_id = %r.request.receipt, "resuming a parked request failed; it waits for its lease to run out");
                break;
            }
        }
    }
    built
}

/// Samples the gauges once, then every 15 s until `shutdown`.
pub fn spawn_gauges(pool: PgPool, shutdown: CancellationToken) {
    tokio::spawn(async move {
        let mut shown: Vec<Uuid> = Vec::new();
        loop {
            match sample(&pool, &shown).await {
                Ok(now) => shown = now,
                Err(e) => tracing::debug!(error = %e, "budget sample failed"),
            }
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep(SAMPLE_EVERY) => {}
            }
        }
    });
}

/// Parked work by reason and for the installations with the most of it
/// (those no longer among them drop to zero), the installations over
/// budget, the oldest wait and the requests in the model's queue. Every
/// replica reports the same figures (alert on the max).
async fn sample(pool: &PgPool, shown: &[Uuid]) -> sqlx::Result<Vec<Uuid>> {
    let mut conn = pool.acquire().await?;
    let s = budgets::sample(&mut conn, TOP).await?;
    for reason in ParkReason::ALL {
        let n = s
            .parked_by_reason
            .iter()
            .find(|(r, _)| r == reason.as_str())
            .map_or(0, |(_, n)| *n);
        metrics::gauge!("threadline_parked_requests", "reason" => reason.as_str()).set(n as f64);
    }
    for gone in shown
        .iter()
        .filter(|i| !s.parked_by_installation.iter().any(|(j, _)| j == *i))
    {
        metrics::gauge!("threadline_tenant_parked_requests", "installation" => gone.to_string())
            .set(0.0);
    }
    for (inst, n) in &s.parked_by_installation {
        metrics::gauge!("threadline_tenant_parked_requests", "installation" => inst.to_string())
            .set(*n as f64);
    }
    metrics::gauge!("threadline_tenants_over_budget").set(s.over_budget_installations as f64);
    metrics::gauge!("threadline_parked_oldest_seconds").set(s.oldest_parked_seconds);
    metrics::gauge!("threadline_tenant_queue_requests").set(s.in_queue as f64);
    Ok(s.parked_by_installation.iter().map(|(i, _)| *i).collect())
}
