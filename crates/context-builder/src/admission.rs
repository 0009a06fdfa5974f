//! Parked work resumed, and the gauges of budgets and parked work (DESIGN
//! invariant 11). Triggers are admitted or parked as their events are
//! applied (`store::apply_many`); here every replica's resumer takes, each
//! round, the oldest parked requests there is room for now (round-robin
//! across installations, first in, first out within one, `SKIP LOCKED` so
//! replicas share the work), builds their contexts from their threads as
//! they are now, publishes each and marks it admitted at once: a
//! resumer that dies midway leaves its lease to run out, and the request is
//! resumed again (its units are not charged twice; a context published
//! twice is one message, by its `Nats-Msg-Id`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

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

/// Resumes parked work every `every` until `shutdown`.
pub fn spawn_resumer(
    handler: Arc<Handler>,
    rules: AdmitRules,
    every: Duration,
    shutdown: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut swept = tokio::time::Instant::now();
        loop {
            match round(&handler, &rules).await {
                Ok(n) if n > 0 => tracing::debug!(resumed = n, "parked requests resumed"),
                Ok(_) => {}
                Err(e) => tracing::warn!(
                    error = format!("{e:#}"),
                    "resuming parked work failed; trying again"
                ),
            }
            if swept.elapsed() >= SWEEP_EVERY {
                swept = tokio::time::Instant::now();
                if let Err(e) = budgets::sweep_stale(&handler.pool).await {
                    tracing::debug!(error = %e, "sweeping stale admissions failed");
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep(every) => {}
            }
        }
    })
}

/// One round: leased, resumed one installation after another in order
/// (installations side by side), marked admitted. How many were resumed.
async fn round(handler: &Handler, rules: &AdmitRules) -> anyhow::Result<usize> {
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
    let mut by_installation: HashMap<Uuid, Vec<Resumed>> = HashMap::new();
    for r in leased {
        by_installation
            .entry(r.request.installation)
            .or_default()
            .push(r);
    }
    let lines = by_installation
        .into_values()
        .map(|line| resume_line(handler, line));
    Ok(futures::future::join_all(lines).await.into_iter().sum())
}

/// One installation's leased requests, in order: each context built,
/// published and at once marked admitted (a reconsideration of it meanwhile
/// finds it leased, and builds it); at the first failure the rest wait for
/// the next round (their lease runs out), so none overtakes it. How many
/// were marked.
async fn resume_line(handler: &Handler, line: Vec<Resumed>) -> usize {
    let mut marked = 0;
    for r in line {
        let done = match handler.resume(&r.request).await {
            Ok(Resumption::Built) => {
                budgets::mark_admitted(&handler.pool, std::slice::from_ref(&r))
                    .await
                    .map_err(anyhow::Error::from)
            }
            Ok(Resumption::Dropped) => continue,
            Ok(Resumption::NotYet) => {
                // (its lease runs out; none of its line overtakes it)
                tracing::debug!(receipt_id = %r.request.receipt, "a parked request waits for an answer of its thread on its way");
                break;
            }
            Err(e) => Err(e),
        };
        match done {
            Ok(m) => {
                marked += m.len();
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
    marked
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
