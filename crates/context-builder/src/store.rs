//! The thread store as the context-builder uses it: `threadline_store`'s
//! statements (threads, channels), with the channel's audit pseudonym
//! under this process's key.

use sqlx::{PgConnection, PgPool};
use threadline_domain::budget::{Limits, Notice, ParkReason, Verdict};
use threadline_domain::classify::{Classification, Effect, Outcome, Speaker, TriggerSource};
use threadline_domain::late::LateOutcome;
use threadline_domain::state::ReceiptState;
use threadline_runtime::audit;
use threadline_store::budgets::{self, NoteBody, Request};
pub use threadline_store::channels::{channel_kind, learn_channel_kind};
pub use threadline_store::threads::*;
use uuid::Uuid;

/// Ends a receipt: `processing → done | ignored(reason)`, compare-and-set,
/// with its audit record written by the same statement. `at` is the
/// installation and channel the event named.
pub async fn finish(
    conn: &mut PgConnection,
    receipt: Uuid,
    state: ReceiptState,
    reason: Option<&str>,
    at: (Uuid, &str),
) -> sqlx::Result<bool> {
    let pseudonym = audit::channel_ref(at.0, at.1);
    threadline_store::threads::finish(
        conn,
        receipt,
        state,
        reason,
        (at.0, at.1, pseudonym.as_deref()),
    )
    .await
}

/// Counts a failure of the context-builder on this receipt that was not
/// transient; at the worker's limit the receipt is failed.
pub async fn note_failure(pool: &sqlx::PgPool, receipt: Uuid) -> sqlx::Result<Option<i32>> {
    threadline_store::threads::note_failure(
        pool,
        receipt,
        threadline_runtime::worker::FAILURE_LIMIT as i32,
    )
    .await
}

/// An event's change to the thread store, as its handler hands it to the
/// batch of applies ([`apply_many`]).
#[derive(Debug, Clone)]
pub struct ApplyJob {
    pub installation: Uuid,
    pub channel: String,
    pub receipt: Uuid,
    /// The event's id (what a parked request's place names).
    pub event_id: String,
    /// What the event is, after the channel's policy (and, for a late
    /// request, its installation's late-event policy).
    pub classified: Classification,
    /// How late Slack delivered it, when past the configured age.
    pub late: Option<Late>,
}

/// An event that arrived late: how late, and what became of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Late {
    pub age: std::time::Duration,
    pub outcome: LateOutcome,
}

/// What applying an event came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApplyOutcome {
    pub next: Next,
    /// Answers already sent that this human message crossed in flight
    /// (their reconsideration is queued in the same transaction).
    pub crossed: usize,
    /// Pending work cancelled because its source was deleted.
    pub cancelled: u64,
    /// An answered message was edited (recorded; never answered again).
    pub answered_source_changed: bool,
    /// A message repeating a person's action another message owns, recorded
    /// now for the first time.
    pub doubled: bool,
    /// A copy of a deleted message standing in for it now
    /// (`actions::stand_in`): shown, and perhaps asked.
    pub stood_in: Option<threadline_store::actions::StoodIn>,
    /// Copies asked in the place of requests the deletion released of its
    /// burst (`double_text::release`).
    pub released_asked: usize,
    /// The event's lateness, recorded now for the first time.
    pub late_recorded: bool,
    /// The over-budget note was proposed in its thread (parked for a
    /// budget, the first time in the thread).
    pub noted: bool,
}

impl ApplyOutcome {
    /// Finished as ignored for `reason`, nothing else done.
    fn ignored(reason: &'static str, late_recorded: bool) -> Self {
        Self {
            next: Next::Ignored(reason),
            crossed: 0,
            cancelled: 0,
            answered_source_changed: false,
            doubled: false,
            stood_in: None,
            released_asked: 0,
            late_recorded,
            noted: false,
        }
    }
}

/// Where the event goes after its change is committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Finished as ignored, with this reason, in the same transaction.
    Ignored(&'static str),
    /// This receipt owns the turn of `source_ts` in the thread `root`: build
    /// and publish its context.
    Build {
        source_ts: String,
        root: String,
        trigger: TriggerSource,
    },
    /// Parked, for this reason: its receipt finished as done (its change is
    /// in the thread store) in the same transaction; the resumer builds its
    /// context when there is room (DESIGN invariant 11).
    Parked(ParkReason),
}

/// How triggers are admitted to the model's queue (DESIGN invariant 11).
#[derive(Debug, Clone)]
pub struct AdmitRules {
    /// The budgets of an installation without its own
    /// (`THREADLINE_BUDGET_*`; 0: no limit).
    pub limits: Limits,
    /// The most requests one installation holds in the model's queue at
    /// once (`THREADLINE_TENANT_QUEUE_SHARE`).
    pub share: u32,
    /// What a person sees when their workspace is over budget
    /// (`THREADLINE_BUDGET_NOTICE`).
    pub notice: Notice,
}

impl AdmitRules {
    /// Nothing limited, a generous share: what tests of other things use.
    pub fn unlimited() -> Self {
        Self {
            limits: Limits::default(),
            share: 1_000_000,
            notice: Notice::Nothing,
        }
    }
}

/// The over-budget note as posted: threadline's own words, unlabelled
/// (no model wrote them).
pub fn note_body() -> NoteBody {
    use sha2::Digest as _;
    let text = threadline_domain::budget::NOTE_TEXT.to_owned();
    NoteBody {
        blocks: serde_json::json!([{"type": "section", "text": {"type": "mrkdwn", "text": text}}]),
        hash: hex::encode(sha2::Sha256::digest(text.as_bytes())),
        text,
    }
}

/// How long a batch of applies (or of builds) waits for a lock held
/// elsewhere (a thread row another batch or a publisher's record holds)
/// before it is rerun event by event: set by the transaction's own `BEGIN`
/// (`APPLY_BEGIN`, `BUILD_BEGIN`), one round trip for both.
pub const APPLY_LOCK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// A batch of applies' `BEGIN`, its lock wait bounded by [`APPLY_LOCK_TIMEOUT`].
const APPLY_BEGIN: &str = "BEGIN; SET LOCAL lock_timeout = '2000ms'";

/// A batch of builds' `BEGIN`: one snapshot for all its reads
/// ([`begin_snapshot`]'s isolation), its lock wait bounded likewise.
const BUILD_BEGIN: &str =
    "BEGIN ISOLATION LEVEL REPEATABLE READ; SET LOCAL lock_timeout = '2000ms'";

/// Applies the events of concurrent handlers in one transaction (group
/// commit: one commit for the lot), each exactly as it would be alone and
/// the events of one thread in the order given, so that an `app_mention`
/// and its `message` twin in one batch still give the turn to the first.
/// Each event's outcome in the order given. A failure fails the whole
/// transaction; when it is the data's (a refused event) or a lost lock
/// race (a deadlock, the lock timeout), the batcher then runs each event
/// alone, so one bad event fails by itself. Timestamps written with
/// `now()` (audit records, a turn's creation) are the batch's start.
pub async fn apply_many(
    pool: &PgPool,
    jobs: &[ApplyJob],
    rules: &AdmitRules,
) -> sqlx::Result<Vec<ApplyOutcome>> {
    // Threads in key order (a stable sort: one thread's events keep their
    // order), as the publisher's batched records lock them, so that two
    // batches holding several threads never wait on each other crosswise.
    let mut order: Vec<usize> = (0..jobs.len()).collect();
    order.sort_by_key(|&k| jobs[k].thread());
    // Every event of the batch waits while one of them waits for a lock:
    // bounded, and a batch that times out is rerun event by event.
    let mut tx = pool.begin_with(APPLY_BEGIN).await?;
    let mut out: Vec<Option<ApplyOutcome>> = vec![None; jobs.len()];
    for k in order {
        out[k] = Some(apply_one(&mut tx, &jobs[k]).await?);
    }
    let mut out: Vec<ApplyOutcome> = out
        .into_iter()
        .map(|o| o.expect("every event applied"))
        .collect();
    // The triggers' admission, after every thread's lock (the buckets are
    // locked last, in key order), in the order the events came.
    admit(&mut tx, jobs, &mut out, rules).await?;
    tx.commit().await?;
    Ok(out)
}

/// Admits the batch's triggers or parks them (DESIGN invariant 11): a
/// parked one's receipt is finished as done with why (its audit record),
/// and the first request of a thread parked for a spent budget proposes
/// the over-budget note there, when the notice is a note.
async fn admit(
    conn: &mut PgConnection,
    jobs: &[ApplyJob],
    out: &mut [ApplyOutcome],
    rules: &AdmitRules,
) -> sqlx::Result<()> {
    let builds: Vec<(usize, Request)> = out
        .iter()
        .enumerate()
        .filter_map(|(k, o)| match &o.next {
            Next::Build {
                source_ts, root, ..
            } => Some((
                k,
                Request {
                    installation: jobs[k].installation,
                    receipt: jobs[k].receipt,
                    event_id: jobs[k].event_id.clone(),
                    channel: jobs[k].channel.clone(),
                    root_ts: root.clone(),
                    source_ts: source_ts.clone(),
                    channel_ref: audit::channel_ref(jobs[k].installation, &jobs[k].channel),
                },
            )),
            _ => None,
        })
        .collect();
    if builds.is_empty() {
        return Ok(());
    }
    let requests: Vec<Request> = builds.iter().map(|(_, r)| r.clone()).collect();
    let admitted = budgets::admit_many(conn, &requests, &rules.limits, rules.share).await?;
    for ((k, r), a) in builds.iter().zip(admitted) {
        let Verdict::Park(reason) = a.verdict else {
            continue;
        };
        out[*k].next = Next::Parked(reason);
        if !a.new {
            continue;
        }
        let why = format!("parked:{reason}");
        finish(
            conn,
            r.receipt,
            ReceiptState::Done,
            Some(&why),
            (r.installation, &r.channel),
        )
        .await?;
        if reason.over_budget() && rules.notice == Notice::Note {
            out[*k].noted = budgets::propose_note(conn, r, &note_body())
                .await?
                .is_some();
        }
    }
    Ok(())
}

impl ApplyJob {
    /// The thread the event names (`(installation, channel, root)`; the
    /// root is empty for an event that changes no message).
    fn thread(&self) -> (Uuid, &str, &str) {
        let root = match &self.classified.effect {
            Effect::Upsert(f) | Effect::Edit(f) => f.root_ts.as_str(),
            Effect::Delete { root_ts, .. } => root_ts.as_str(),
            Effect::None => "",
        };
        (self.installation, self.channel.as_str(), root)
    }
}

/// One event of [`apply_many`]: its fact, message and thread version; the
/// answers a human message crossed; a deletion's cancelled work; an edited
/// answered source; then the turn's claim, or the receipt finished as
/// ignored.
async fn apply_one(conn: &mut PgConnection, job: &ApplyJob) -> sqlx::Result<ApplyOutcome> {
    let (inst, channel, receipt) = (job.installation, job.channel.as_str(), job.receipt);
    let c = &job.classified;
    let owner = doubled_of(conn, inst, channel, &c.effect).await?;
    let kept = match &owner {
        Some(o) if !o.own => Some(o.ts.as_str()),
        _ => None,
    };
    let late_recorded = match &job.late {
        // (a doubled message is no request, whatever the policy)
        Some(late) => record_late(conn, job, late, kept.is_some()).await?,
        None => false,
    };
    if let Some(kept) = kept {
        // (the deleted message a copy stands in for, delivered again, is
        // no new copy of it)
        let again = owner.as_ref().and_then(|o| o.stood_for.as_deref()) == Some(c_ts(&c.effect));
        return doubled(conn, job, kept, late_recorded, again).await;
    }
    // A copy standing in for a deleted request is asked (or not) by
    // `stand_in` alone: its own deliveries only show it.
    let stands_in = owner.is_some_and(|o| o.stood_for_asked);
    let applied = apply(conn, inst, channel, &c.effect).await?;
    // A human message older than a reply already sent in its thread that
    // the reply did not read crossed that answer in flight.
    let crossed = match (&c.effect, &applied) {
        (Effect::Upsert(f), Some((root, _))) if f.speaker == Speaker::Human => {
            crossed_answers(conn, inst, channel, root, &f.ts)
                .await?
                .len()
        }
        _ => 0,
    };
    let (mut cancelled, mut answered_source_changed, mut stood_in) = (0, false, None);
    let mut released_asked = 0;
    match &c.effect {
        Effect::Delete { ts, .. } => {
            cancelled = cancel_pending(conn, inst, channel, ts, receipt).await?;
            // (the requests of a burst it would have answered are answered
            // now: reconsidered through the outbox)
            // (a copy of it Slack delivered too, still showing, stands in
            // first: it takes its place in its burst, and what it absorbed
            // stays absorbed)
            stood_in = threadline_store::actions::stand_in(conn, inst, channel, ts).await?;
            released_asked = threadline_store::double_text::release(conn, inst, channel, ts)
                .await?
                .len();
        }
        Effect::Edit(f) => {
            answered_source_changed =
                note_answered_source_changed(conn, inst, channel, &f.ts).await?;
        }
        _ => {}
    }
    let next = match (c.outcome, &c.effect) {
        (Outcome::Trigger(_), Effect::Upsert(_)) if stands_in => Next::Ignored(STANDS_IN),
        (Outcome::Trigger(t), Effect::Upsert(f)) => {
            if claim_turn(conn, inst, channel, &f.ts, receipt, t.as_str()).await? {
                Next::Build {
                    source_ts: f.ts.clone(),
                    root: f.root_ts.clone(),
                    trigger: t,
                }
            } else {
                Next::Ignored("duplicate_turn")
            }
        }
        (Outcome::Trigger(_), _) => Next::Ignored("unhandled_type"),
        (Outcome::Ignore(reason), _) => Next::Ignored(reason.as_str()),
    };
    if let Next::Ignored(reason) = next {
        finish(
            conn,
            receipt,
            ReceiptState::Ignored,
            Some(reason),
            (inst, channel),
        )
        .await?;
    }
    Ok(ApplyOutcome {
        next,
        crossed,
        cancelled,
        answered_source_changed,
        doubled: false,
        stood_in,
        released_asked,
        late_recorded,
        noted: false,
    })
}

/// The reason a doubled message's receipts end with.
pub const DOUBLED: &str = "doubled_message";

/// The reason a delivery of a copy standing in for a deleted message ends
/// with (`actions::stand_in` decides whether it is asked).
pub const STANDS_IN: &str = "stands_for_deleted";

/// Who owns the person's action a new human message belongs to (its
/// `client_msg_id`); `None` for a message without one.
struct ActionOwner {
    ts: String,
    /// The message owns it (the first applied, its twin, a redelivery).
    own: bool,
    /// The deleted message it stands in for (`actions::stand_in`).
    stood_for: Option<String>,
    /// That message was a request.
    stood_for_asked: bool,
}

/// The `ts` of a new message's effect ("" for any other).
fn c_ts(effect: &Effect) -> &str {
    match effect {
        Effect::Upsert(f) => f.ts.as_str(),
        _ => "",
    }
}

async fn doubled_of(
    conn: &mut PgConnection,
    inst: Uuid,
    channel: &str,
    effect: &Effect,
) -> sqlx::Result<Option<ActionOwner>> {
    let Effect::Upsert(f) = effect else {
        return Ok(None);
    };
    let (Speaker::Human, Some(action)) = (f.speaker, f.client_msg_id.as_deref()) else {
        return Ok(None);
    };
    let owner = threadline_store::actions::claim(conn, inst, channel, action, &f.ts).await?;
    Ok(Some(ActionOwner {
        own: owner.ts == f.ts,
        ts: owner.ts,
        stood_for: owner.stood_for,
        stood_for_asked: owner.stood_for_asked,
    }))
}

/// A doubled message: recorded (identifiers only) and its receipt ended as
/// ignored: it never asks for an answer. A reply is kept as a hidden copy
/// of the message it repeats, so it neither makes the answer to that
/// message stale nor crosses it; a top-level message is a thread of its
/// own (people may reply under it), shown there. When the person has
/// deleted the message it repeats already, it stands in for it at once.
/// `stood_for`: it is that deleted message, delivered again after a copy
/// stood in for it (only its receipt is ended).
async fn doubled(
    conn: &mut PgConnection,
    job: &ApplyJob,
    kept: &str,
    late_recorded: bool,
    stood_for: bool,
) -> sqlx::Result<ApplyOutcome> {
    let (inst, channel, receipt) = (job.installation, job.channel.as_str(), job.receipt);
    let Effect::Upsert(f) = &job.classified.effect else {
        unreachable!("only a new message is doubled");
    };
    if stood_for {
        finish(
            conn,
            receipt,
            ReceiptState::Ignored,
            Some(DOUBLED),
            (inst, channel),
        )
        .await?;
        return Ok(ApplyOutcome::ignored(DOUBLED, late_recorded));
    }
    let new = threadline_store::actions::record_doubled(conn, inst, channel, &f.ts, kept, receipt)
        .await?;
    if f.ts == f.root_ts {
        apply(conn, inst, channel, &job.classified.effect).await?;
    } else {
        threadline_store::actions::hide_copy(conn, inst, channel, f, kept).await?;
    }
    finish(
        conn,
        receipt,
        ReceiptState::Ignored,
        Some(DOUBLED),
        (inst, channel),
    )
    .await?;
    let stood_in = threadline_store::actions::stand_in(conn, inst, channel, kept).await?;
    Ok(ApplyOutcome {
        doubled: new,
        stood_in,
        ..ApplyOutcome::ignored(DOUBLED, late_recorded)
    })
}

/// Records the event's lateness (with its audit record); a doubled
/// message's as only recorded.
async fn record_late(
    conn: &mut PgConnection,
    job: &ApplyJob,
    late: &Late,
    doubled: bool,
) -> sqlx::Result<bool> {
    let ts = match &job.classified.effect {
        Effect::Upsert(f) | Effect::Edit(f) => f.ts.as_str(),
        Effect::Delete { ts, .. } => ts.as_str(),
        Effect::None => "",
    };
    let pseudonym = audit::channel_ref(job.installation, &job.channel);
    threadline_store::late::record(
        conn,
        &threadline_store::late::LateRecord {
            receipt: job.receipt,
            installation: job.installation,
            channel: &job.channel,
            message_ts: ts,
            age_ms: i64::try_from(late.age.as_millis()).unwrap_or(i64::MAX),
            outcome: if doubled {
                LateOutcome::Recorded
            } else {
                late.outcome
            },
            channel_ref: pseudonym.as_deref(),
        },
    )
    .await
}

/// A trigger's context to build: the thread to read ([`SnapshotJob`]) and
/// what its record names.
#[derive(Debug, Clone)]
pub struct BuildJob {
    pub snapshot: SnapshotJob,
    pub receipt: Uuid,
    pub event_id: String,
    /// The channel's audit pseudonym under this process's key.
    pub channel_ref: Option<String>,
}

/// What building a context came to.
pub enum BuildOutcome {
    /// The source message was deleted: the receipt is finished as ignored
    /// (`source_deleted`), in the same transaction.
    SourceDeleted,
    /// The context is recorded (version, hash, counts; no text) and may be
    /// published.
    Recorded(Snapshot),
}

/// Builds the contexts of concurrent handlers in one REPEATABLE READ
/// transaction (group commit): every thread's version read together with
/// the messages it numbers ([`snapshot_many`]: a statement for the heads
/// and sizes, one for the texts), the receipts of deleted sources finished
/// in one statement and the contexts recorded with their audit records in
/// another, then one commit. Each job's outcome in the order given. A
/// failure fails the transaction; the batcher reruns a refused or
/// concurrency-lost batch job by job.
pub async fn build_many(pool: &PgPool, jobs: &[BuildJob]) -> sqlx::Result<Vec<BuildOutcome>> {
    let mut tx = pool.begin_with(BUILD_BEGIN).await?;
    // A lock another transaction holds (a context being recorded by
    // another build of the receipt, a receipt being finished) would hold
    // every job of the batch: bounded, and rerun job by job. (The batch's
    // statements keep custom plans: a generic plan made while a table was
    // still empty scanned it whole at every call, measured at 1.2-3 ms a
    // call for the texts' read in the bench's first minute.)
    let reads: Vec<SnapshotJob> = jobs.iter().map(|j| j.snapshot.clone()).collect();
    let snaps = snapshot_many(&mut tx, &reads).await?;
    let deleted: Vec<Ending> = jobs
        .iter()
        .zip(&snaps)
        .filter(|(_, s)| s.source_deleted)
        .map(|(j, _)| Ending {
            receipt: j.receipt,
            installation: j.snapshot.inst,
            channel: j.snapshot.channel.clone(),
            pseudonym: j.channel_ref.clone(),
        })
        .collect();
    if !deleted.is_empty() {
        finish_many(
            &mut tx,
            &deleted,
            ReceiptState::Ignored,
            Some("source_deleted"),
        )
        .await?;
    }
    {
        let records: Vec<ContextRecord<'_>> = jobs
            .iter()
            .zip(&snaps)
            .filter(|(_, s)| !s.source_deleted)
            .map(|(j, s)| ContextRecord {
                event_id: &j.event_id,
                receipt_id: j.receipt,
                installation_id: j.snapshot.inst,
                channel_id: &j.snapshot.channel,
                channel_ref: j.channel_ref.clone(),
                root_ts: &j.snapshot.root,
                source_ts: &j.snapshot.source_ts,
                thread_version: s.version,
                content_hash: &s.built.content_hash,
                message_count: s.built.messages.len(),
                truncated: s.built.omitted > 0,
                backfill_partial: s.backfill_partial,
            })
            .collect();
        if !records.is_empty() {
            record_contexts(&mut tx, &records).await?;
        }
    }
    tx.commit().await?;
    Ok(snaps
        .into_iter()
        .map(|s| {
            if s.source_deleted {
                BuildOutcome::SourceDeleted
            } else {
                BuildOutcome::Recorded(s)
            }
        })
        .collect())
}

/// Finishes the receipts of concurrent handlers as `done`, in one
/// statement (with their audit records).
pub async fn finish_done_many(pool: &PgPool, endings: &[Ending]) -> sqlx::Result<Vec<bool>> {
    let mut conn = pool.acquire().await?;
    finish_many(&mut conn, endings, ReceiptState::Done, None).await
}

#[cfg(test)]
mod tests {
    use super::{APPLY_BEGIN, APPLY_LOCK_TIMEOUT, BUILD_BEGIN};

    /// Both `BEGIN`s bound lock waits by [`APPLY_LOCK_TIMEOUT`]; the builds'
    /// reads share one snapshot.
    #[test]
    fn the_begins_bound_lock_waits_by_the_apply_lock_timeout() {
        let bound = format!(
            "; SET LOCAL lock_timeout = '{}ms'",
            APPLY_LOCK_TIMEOUT.as_millis()
        );
        assert_eq!(APPLY_BEGIN, format!("BEGIN{bound}"));
        assert_eq!(
            BUILD_BEGIN,
            format!("BEGIN ISOLATION LEVEL REPEATABLE READ{bound}")
        );
    }
}
