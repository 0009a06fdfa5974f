//! Per-installation admission and budgets (DESIGN invariant 11), shared by
//! every replica: the per-minute buckets (`tenant_budgets`), the tokens of
//! each UTC day (`tenant_tokens`), each triggering request's place in its
//! installation's line (`tenant_work`: parked, or admitted to the model's
//! queue) and the note said once per thread (`budget_notes`). The rules are
//! `threadline_domain::budget`'s; these statements read and write what
//! they decide.
//!
//! An admission round locks the buckets of its installations (in key
//! order, each round in one transaction), then reads their standing in a
//! statement of its own (so it sees every round that held the lock before
//! it), then records what was decided. Inference frees a request's place
//! in the statement that settles its decision (`decisions::settle_many`).

use std::collections::HashMap;

use sqlx::{PgConnection, PgPool};
use threadline_domain::budget::{Limits, ParkReason, Standing, Verdict, refill};
use threadline_domain::state::{Machine as _, WorkState};
use uuid::Uuid;

use crate::moves;

/// How long an admitted request holds its place in the model's queue when
/// inference never settles it (its context dead-lettered): after this it
/// counts no more, and the resumer deletes it.
pub const ADMITTED_STALE_SECS: f64 = 600.0;

/// The most over-budget notes one installation is sent in a minute: a
/// workspace over budget that opens thread after thread is not answered
/// with a post in each (the notes are threadline's own posts, under no
/// budget else); a thread not told for this is told by a later request of
/// it, if any, once the minute has passed.
pub const NOTES_PER_MINUTE: i64 = 5;

/// An installation's budgets as one round sees them: its limits (the
/// defaults with its overrides) and its buckets refilled to now, locked
/// for the round's transaction.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bucket {
    pub limits: Limits,
    pub answers: f64,
    pub model_calls: f64,
    /// When it was refilled to (the clock once its lock was taken, as
    /// seconds since the epoch): what is stored as its `refilled_at`.
    pub at: f64,
}

/// Locks the buckets of `insts` for this transaction (made full for an
/// installation that has none yet), in key order.
pub async fn lock(
    conn: &mut PgConnection,
    insts: &[Uuid],
    defaults: &Limits,
) -> sqlx::Result<HashMap<Uuid, Bucket>> {
    let rows = sqlx::query!(
        r#"WITH i AS (SELECT DISTINCT x AS inst FROM unnest($1::uuid[]) x),
         lim AS (
            SELECT i.inst, coalesce(p.answers_per_minute, $2) AS apm,
                   coalesce(p.model_calls_per_minute, $3) AS cpm,
                   coalesce(p.model_tokens_per_day, $4) AS tpd
              FROM i LEFT JOIN installation_policies p ON p.installation_id = i.inst),
         up AS (
            -- (the no-op update takes the row's lock)
            INSERT INTO tenant_budgets (installation_id, answers, model_calls)
            SELECT lim.inst, lim.apm, lim.cpm FROM lim ORDER BY lim.inst
            ON CONFLICT (installation_id) DO UPDATE SET installation_id = EXCLUDED.installation_id
            -- (the clock once the lock is held, not the transaction's
            -- start: a round that began earlier but locked later must
            -- neither refill from a time before the last one nor store it)
            RETURNING installation_id, answers, model_calls, refilled_at, clock_timestamp() AS at)
         SELECT up.installation_id AS "inst!", up.answers AS "answers!", up.model_calls AS "model_calls!",
                extract(epoch FROM up.at - up.refilled_at)::float8 AS "elapsed!",
                extract(epoch FROM up.at)::float8 AS "at!",
                lim.apm AS "apm!", lim.cpm AS "cpm!", lim.tpd AS "tpd!"
           FROM up JOIN lim ON lim.inst = up.installation_id"#,
        insts,
        defaults.answers_per_minute as i32,
        defaults.model_calls_per_minute as i32,
        defaults.model_tokens_per_day as i64,
    )
    .fetch_all(&mut *conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| {
            let limits = Limits {
                answers_per_minute: r.apm.max(0) as u32,
                model_calls_per_minute: r.cpm.max(0) as u32,
                model_tokens_per_day: r.tpd.max(0) as u64,
            };
            let bucket = Bucket {
                limits,
                answers: refill(r.answers, limits.answers_per_minute, r.elapsed),
                model_calls: refill(r.model_calls, limits.model_calls_per_minute, r.elapsed),
                at: r.at,
            };
            (r.inst, bucket)
        })
        .collect())
}

/// Where an installation stands: its requests in the model's queue
/// (admitted within [`ADMITTED_STALE_SECS`], or parked and being resumed),
/// whether requests other than `receipts` wait parked, its tokens today,
/// and which of `receipts` have a place already (a redelivery).
#[derive(Debug, Clone, Default)]
pub struct Found {
    pub in_queue: i64,
    pub parked_ahead: bool,
    /// Why the oldest of those waits.
    pub head: Option<ParkReason>,
    pub tokens_today: i64,
    pub admitted: Vec<Uuid>,
    /// Parked already, with why.
    pub parked: Vec<(Uuid, Option<String>)>,
}

/// [`Found`] for each of `insts`, read after their buckets were locked.
pub async fn standing(
    conn: &mut PgConnection,
    insts: &[Uuid],
    receipts: &[Uuid],
) -> sqlx::Result<HashMap<Uuid, Found>> {
    let rows = sqlx::query!(
        r#"WITH i AS (SELECT DISTINCT x AS inst FROM unnest($1::uuid[]) x)
         SELECT i.inst AS "inst!",
                (SELECT count(*) FROM tenant_work w
                  WHERE w.installation_id = i.inst
                    AND ((w.state = $3 AND w.admitted_at > now() - make_interval(secs => $5))
                         OR (w.state = $4 AND w.lease_until > now()))) AS "in_queue!",
                EXISTS (SELECT 1 FROM tenant_work w
                         WHERE w.installation_id = i.inst AND w.state = $4
                           AND NOT (w.receipt_id = ANY($2))) AS "parked_ahead!",
                (SELECT w.reason FROM tenant_work w
                  WHERE w.installation_id = i.inst AND w.state = $4 AND NOT (w.receipt_id = ANY($2))
                  ORDER BY w.source_ts::numeric, w.seq LIMIT 1) AS head,
                coalesce((SELECT t.tokens FROM tenant_tokens t
                           WHERE t.installation_id = i.inst AND t.day = (now() AT TIME ZONE 'UTC')::date), 0)
                    AS "tokens!",
                ARRAY(SELECT w.receipt_id FROM tenant_work w
                       WHERE w.installation_id = i.inst AND w.receipt_id = ANY($2) AND w.state = $3)
                    AS "admitted!",
                ARRAY(SELECT w.receipt_id FROM tenant_work w
                       WHERE w.installation_id = i.inst AND w.receipt_id = ANY($2) AND w.state = $4)
                    AS "parked!",
                ARRAY(SELECT coalesce(w.reason, '') FROM tenant_work w
                       WHERE w.installation_id = i.inst AND w.receipt_id = ANY($2) AND w.state = $4)
                    AS "parked_reasons!"
           FROM i"#,
        insts,
        receipts,
        WorkState::Admitted.as_str(),
        WorkState::Parked.as_str(),
        ADMITTED_STALE_SECS,
    )
    .fetch_all(&mut *conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| {
            let parked = r
                .parked
                .into_iter()
                .zip(r.parked_reasons)
                .map(|(id, why)| (id, (!why.is_empty()).then_some(why)))
                .collect();
            (
                r.inst,
                Found {
                    in_queue: r.in_queue,
                    parked_ahead: r.parked_ahead,
                    head: r.head.as_deref().and_then(ParkReason::parse),
                    tokens_today: r.tokens,
                    admitted: r.admitted,
                    parked,
                },
            )
        })
        .collect())
}

/// The installations with at least `min` requests parked for their turn
/// (`tenant_queue`: their share of the model's queue held; not those
/// waiting for a spent budget), and how many: the gateway's shedding
/// signal, counted every 250 ms by each replica.
pub async fn parked_for_turn_at_least(pool: &PgPool, min: i64) -> sqlx::Result<Vec<(Uuid, i64)>> {
    Ok(sqlx::query!(
        r#"SELECT installation_id AS "inst!", count(*) AS "n!" FROM tenant_work
            WHERE state = $1 AND reason = $2 GROUP BY installation_id HAVING count(*) >= $3"#,
        WorkState::Parked.as_str(),
        ParkReason::TenantQueue.as_str(),
        min.max(1),
    )
    .fetch_all(pool)
    .await?
    .into_iter()
    .map(|r| (r.inst, r.n))
    .collect())
}

/// A triggering request, as its place in the line names it (identifiers
/// only: the context is built from the thread when it is admitted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub installation: Uuid,
    pub receipt: Uuid,
    pub event_id: String,
    pub channel: String,
    pub root_ts: String,
    pub source_ts: String,
    /// The channel's audit pseudonym.
    pub channel_ref: Option<String>,
}

/// What admission made of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admitted {
    pub verdict: Verdict,
    /// Decided now (false: a redelivery found its place already).
    pub new: bool,
}

/// Admits or parks `requests` (oldest first) in the caller's transaction:
/// the buckets of their installations locked, their standing read, each
/// decided by `threadline_domain::budget`, the units of the admitted taken
/// and every request's place recorded. A request that has a place already
/// keeps it (a redelivery is neither charged again nor parked twice).
pub async fn admit_many(
    conn: &mut PgConnection,
    requests: &[Request],
    defaults: &Limits,
    share: u32,
) -> sqlx::Result<Vec<Admitted>> {
    if requests.is_empty() {
        return Ok(Vec::new());
    }
    let mut insts: Vec<Uuid> = requests.iter().map(|r| r.installation).collect();
    insts.sort_unstable();
    insts.dedup();
    let receipts: Vec<Uuid> = requests.iter().map(|r| r.receipt).collect();
    let buckets = lock(conn, &insts, defaults).await?;
    let found = standing(conn, &insts, &receipts).await?;
    let mut now: HashMap<Uuid, Standing> = HashMap::new();
    let mut out = Vec::with_capacity(requests.len());
    let mut charged = std::collections::HashSet::new();
    for r in requests {
        let (Some(b), Some(f)) = (buckets.get(&r.installation), found.get(&r.installation)) else {
            // (a lock always returns its installation's bucket; were it
            // not to, the request goes on uncounted rather than be lost)
            out.push(Admitted {
                verdict: Verdict::Admit,
                new: false,
            });
            continue;
        };
        if f.admitted.contains(&r.receipt) {
            out.push(Admitted {
                verdict: Verdict::Admit,
                new: false,
            });
            continue;
        }
        if let Some((_, why)) = f.parked.iter().find(|(id, _)| *id == r.receipt) {
            let reason = why
                .as_deref()
                .and_then(ParkReason::parse)
                .unwrap_or(ParkReason::TenantQueue);
            out.push(Admitted {
                verdict: Verdict::Park(reason),
                new: false,
            });
            continue;
        }
        let s = now.entry(r.installation).or_insert_with(|| Standing {
            answers: b.answers,
            model_calls: b.model_calls,
            tokens_today: f.tokens_today,
            in_queue: u32::try_from(f.in_queue).unwrap_or(u32::MAX),
            parked_ahead: f.parked_ahead,
            head: f.head,
        });
        let verdict = s.decide(&b.limits, share, 1)[0];
        if verdict == Verdict::Admit {
            charged.insert(r.installation);
        }
        out.push(Admitted { verdict, new: true });
    }
    let spent: Vec<Spent> = charged
        .iter()
        .map(|i| (*i, now[i].answers, now[i].model_calls, buckets[i].at))
        .collect();
    let placed: Vec<(&Request, Verdict)> = requests
        .iter()
        .zip(&out)
        .filter(|(_, a)| a.new)
        .map(|(r, a)| (r, a.verdict))
        .collect();
    record(conn, &spent, &placed).await?;
    Ok(out)
}

/// A bucket after the units taken: its installation, what is left of each
/// budget, and when it was refilled to ([`Bucket::at`]).
type Spent = (Uuid, f64, f64, f64);

/// Stores the buckets after the units taken (refilled to when they were
/// locked, never back in time) and the places of new requests, in one
/// statement.
async fn record(
    conn: &mut PgConnection,
    spent: &[Spent],
    placed: &[(&Request, Verdict)],
) -> sqlx::Result<()> {
    let state = |v: &Verdict| match v {
        Verdict::Admit => WorkState::Admitted.as_str().to_owned(),
        Verdict::Park(_) => WorkState::Parked.as_str().to_owned(),
    };
    let reason = |v: &Verdict| match v {
        Verdict::Admit => None,
        Verdict::Park(r) => Some(r.as_str().to_owned()),
    };
    sqlx::query!(
        r#"WITH b AS (
            UPDATE tenant_budgets t
               SET answers = u.answers, model_calls = u.calls, refilled_at = greatest(t.refilled_at, to_timestamp(u.at))
              FROM unnest($1::uuid[], $2::float8[], $3::float8[], $15::float8[]) AS u(inst, answers, calls, at)
             WHERE t.installation_id = u.inst)
         INSERT INTO tenant_work (receipt_id, installation_id, event_id, channel_id, root_ts, source_ts, channel_ref,
                                  state, reason, parked_at, charged, admitted_at)
         SELECT w.receipt, w.inst, w.event_id, w.channel, w.root_ts, w.source_ts, nullif(w.channel_ref, ''),
                w.state, w.reason, CASE WHEN w.state = $13 THEN clock_timestamp() END, w.state = $14,
                CASE WHEN w.state = $14 THEN now() END
           FROM unnest($4::uuid[], $5::uuid[], $6::text[], $7::text[], $8::text[], $9::text[], $10::text[],
                       $11::text[], $12::text[]) WITH ORDINALITY
                AS w(receipt, inst, event_id, channel, root_ts, source_ts, channel_ref, state, reason, n)
          ORDER BY w.n
         ON CONFLICT (receipt_id) DO NOTHING"#,
        &spent.iter().map(|s| s.0).collect::<Vec<_>>(),
        &spent.iter().map(|s| s.1).collect::<Vec<_>>(),
        &spent.iter().map(|s| s.2).collect::<Vec<_>>(),
        &placed.iter().map(|p| p.0.receipt).collect::<Vec<_>>(),
        &placed.iter().map(|p| p.0.installation).collect::<Vec<_>>(),
        &placed
            .iter()
            .map(|p| p.0.event_id.clone())
            .collect::<Vec<_>>(),
        &placed.iter().map(|p| p.0.channel.clone()).collect::<Vec<_>>(),
        &placed.iter().map(|p| p.0.root_ts.clone()).collect::<Vec<_>>(),
        &placed
            .iter()
            .map(|p| p.0.source_ts.clone())
            .collect::<Vec<_>>(),
        &placed
            .iter()
            .map(|p| p.0.channel_ref.clone().unwrap_or_default())
            .collect::<Vec<_>>(),
        &placed.iter().map(|p| state(&p.1)).collect::<Vec<_>>(),
        &placed.iter().map(|p| reason(&p.1)).collect::<Vec<_>>() as &[Option<String>],
        WorkState::Parked.as_str(),
        WorkState::Admitted.as_str(),
        &spent.iter().map(|s| s.3).collect::<Vec<_>>(),
    )
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// The body of the over-budget note, as the publisher posts it.
#[derive(Debug, Clone)]
pub struct NoteBody {
    pub text: String,
    pub blocks: serde_json::Value,
    pub hash: String,
}

/// Proposes the over-budget note in the thread of `r`, once per thread, in
/// the caller's transaction (which holds the thread's row: the event's
/// change bumped its version): its mark, a decision of threadline's own
/// (`budget_note`, already `proposed`, keyed apart from the question's
/// answer) and its proposal in the outbox, for the publisher to post
/// through the one reply mechanism. A note not claimed yet (its thread
/// moved on before it was posted: a newer question made it stale or
/// superseded) is replaced by one bound to this question and version; a
/// note claimed or posted is the thread's. `None` when nothing is proposed
/// (also when its installation was sent [`NOTES_PER_MINUTE`] notes in the
/// last minute).
pub async fn propose_note(
    conn: &mut PgConnection,
    r: &Request,
    body: &NoteBody,
) -> sqlx::Result<Option<Uuid>> {
    use threadline_domain::budget::{NOTE_ACTION_KIND, note_event_id};
    use threadline_domain::state::DecisionStatus;
    // (the installation's bucket is locked by this transaction: rounds of
    // one installation count these one after another)
    let recent = sqlx::query_scalar!(
        r#"SELECT count(*) AS "n!" FROM budget_notes
            WHERE installation_id = $1 AND noted_at > now() - make_interval(secs => 60)"#,
        r.installation
    )
    .fetch_one(&mut *conn)
    .await?;
    if recent >= NOTES_PER_MINUTE {
        return Ok(None);
    }
    let marked = sqlx::query!(
        r#"SELECT n.decision_id, d.status AS "status?",
                  EXISTS (SELECT 1 FROM reply_intents i
                           WHERE i.installation_id = d.installation_id AND i.event_id = d.event_id
                             AND i.action_kind = d.action_kind) AS "claimed!"
             FROM budget_notes n LEFT JOIN decisions d ON d.id = n.decision_id
            WHERE n.installation_id = $1 AND n.channel_id = $2 AND n.root_ts = $3
              FOR UPDATE OF n"#,
        r.installation,
        r.channel,
        r.root_ts
    )
    .fetch_optional(&mut *conn)
    .await?;
    let replaceable = [
        DecisionStatus::Proposed,
        DecisionStatus::Stale,
        DecisionStatus::Superseded,
    ];
    let old = match &marked {
        None => None,
        Some(m)
            if !m.claimed
                && m.status.as_deref().is_none_or(|st| {
                    DecisionStatus::parse(st).is_ok_and(|st| replaceable.contains(&st))
                }) =>
        {
            Some(m.decision_id)
        }
        Some(_) => return Ok(None),
    };
    let id = Uuid::now_v7();
    // Its own receipt id (the decision's binding is apart from the
    // question's answer, which comes later at the same version).
    let inserted = sqlx::query!(
        "INSERT INTO decisions (id, receipt_id, installation_id, event_id, channel_id, root_ts, source_ts,
                                thread_version, status, action_kind, provider, fallback, output_hash, body_text,
                                body_blocks, channel_ref)
         SELECT $1, $1, $2, $3, $4, $5, $6, t.version, $7, $8, 'threadline', true, $9, $10, $11, $12
           FROM threads t WHERE t.installation_id = $2 AND t.channel_id = $4 AND t.root_ts = $5",
        id,
        r.installation,
        note_event_id(&r.event_id),
        r.channel,
        r.root_ts,
        r.source_ts,
        DecisionStatus::Proposed.as_str(),
        NOTE_ACTION_KIND,
        body.hash,
        body.text,
        body.blocks,
        r.channel_ref,
    )
    .execute(&mut *conn)
    .await?;
    if inserted.rows_affected() == 0 {
        return Ok(None);
    }
    sqlx::query!(
        "INSERT INTO budget_notes (installation_id, channel_id, root_ts, decision_id) VALUES ($1, $2, $3, $4)
         ON CONFLICT (installation_id, channel_id, root_ts) DO UPDATE
            SET decision_id = EXCLUDED.decision_id, noted_at = now()",
        r.installation,
        r.channel,
        r.root_ts,
        id
    )
    .execute(&mut *conn)
    .await?;
    if let Some(old) = old {
        // (never claimed: its proposal, when it comes, finds it settled)
        sqlx::query!(
            "UPDATE decisions SET status = $2, status_reason = 'newer_note', updated_at = now()
              WHERE id = $1 AND status = ANY($3)",
            old,
            DecisionStatus::Superseded.as_str(),
            &moves(&[DecisionStatus::Proposed], DecisionStatus::Superseded),
        )
        .execute(&mut *conn)
        .await?;
    }
    let Some(d) = crate::decisions::load(&mut *conn, id).await? else {
        return Ok(None);
    };
    crate::decisions::enqueue_proposal(conn, &d, NOTE_ACTION_KIND).await?;
    Ok(Some(id))
}

/// A parked request leased by the resumer.
#[derive(Debug, Clone)]
pub struct Resumed {
    pub request: Request,
    /// Why it was parked.
    pub reason: Option<String>,
}

/// One round of the resumer, in one short transaction: the installations
/// with parked work that no other resumer is on (their buckets locked, or
/// skipped when another round holds them), the oldest parked requests of
/// each that there is room for now (their units taken, at most
/// `per_installation`), leased for `lease_secs`: every installation with
/// work parked gets its turn each round, and within one the requests go in
/// the order asked. A request charged by a round that died is not
/// charged again. A request that will never be answered (its question
/// deleted, or not its thread's latest any more) is dropped, uncharged.
pub async fn lease_resumable(
    pool: &PgPool,
    defaults: &Limits,
    share: u32,
    lease_secs: f64,
    per_installation: i64,
) -> sqlx::Result<Vec<Resumed>> {
    let mut tx = pool.begin().await?;
    let locked = sqlx::query_scalar!(
        r#"SELECT b.installation_id FROM tenant_budgets b
            WHERE EXISTS (SELECT 1 FROM tenant_work w WHERE w.installation_id = b.installation_id AND w.state = $1)
              AND NOT EXISTS (SELECT 1 FROM tenant_work l
                               WHERE l.installation_id = b.installation_id AND l.state = $1
                                 AND l.lease_until > now())
            ORDER BY b.installation_id
            FOR UPDATE SKIP LOCKED"#,
        WorkState::Parked.as_str(),
    )
    .fetch_all(&mut *tx)
    .await?;
    if locked.is_empty() {
        tx.commit().await?;
        return Ok(Vec::new());
    }
    let buckets = lock(&mut tx, &locked, defaults).await?;
    let found = standing(&mut tx, &locked, &[]).await?;
    // Each installation's oldest first: in the order asked (a question's
    // Slack ts), whatever order concurrent intake parked them in.
    let oldest = sqlx::query!(
        r#"SELECT w.receipt_id AS "receipt!", w.installation_id AS "inst!", w.event_id AS "event_id!",
                  w.channel_id AS "channel!", w.root_ts AS "root_ts!", w.source_ts AS "source_ts!", w.channel_ref,
                  w.reason, w.charged AS "charged!",
                  -- never to be answered: its question deleted, or a newer
                  -- question in its thread answers instead
                  (EXISTS (SELECT 1 FROM thread_messages m
                            WHERE m.installation_id = w.installation_id AND m.channel_id = w.channel_id
                              AND m.ts = w.source_ts AND m.deleted)
                   OR EXISTS (SELECT 1 FROM turns n JOIN thread_messages m
                                ON m.installation_id = n.installation_id AND m.channel_id = n.channel_id
                               AND m.ts = n.ts
                               WHERE n.installation_id = w.installation_id AND n.channel_id = w.channel_id
                                 AND m.root_ts = w.root_ts AND n.ts::numeric > w.source_ts::numeric
                                 AND NOT m.deleted)) AS "gone!"
             FROM unnest($2::uuid[]) AS t(inst)
            CROSS JOIN LATERAL (
                SELECT x.* FROM tenant_work x
                 WHERE x.installation_id = t.inst AND x.state = $1
                 ORDER BY x.source_ts::numeric, x.seq LIMIT $3) w"#,
        WorkState::Parked.as_str(),
        &locked,
        per_installation,
    )
    .fetch_all(&mut *tx)
    .await?;
    let mut now: HashMap<Uuid, (Standing, bool)> = HashMap::new();
    let mut leased = Vec::new();
    let mut gone = Vec::new();
    for w in oldest {
        if w.gone {
            // (dropped before anything is charged for it)
            gone.push(w.receipt);
            continue;
        }
        let (Some(b), Some(f)) = (buckets.get(&w.inst), found.get(&w.inst)) else {
            continue;
        };
        let (s, open) = now.entry(w.inst).or_insert_with(|| {
            (
                Standing {
                    answers: b.answers,
                    model_calls: b.model_calls,
                    tokens_today: f.tokens_today,
                    in_queue: u32::try_from(f.in_queue).unwrap_or(u32::MAX),
                    parked_ahead: false,
                    head: None,
                },
                true,
            )
        });
        // (in order: once one cannot resume, none behind it does)
        *open = *open
            && if w.charged {
                s.in_queue += 1;
                true
            } else {
                s.resumable(&b.limits, share, 1) == 1
            };
        if *open {
            leased.push((
                w.charged,
                Resumed {
                    request: Request {
                        installation: w.inst,
                        receipt: w.receipt,
                        event_id: w.event_id,
                        channel: w.channel,
                        root_ts: w.root_ts,
                        source_ts: w.source_ts,
                        channel_ref: w.channel_ref,
                    },
                    reason: w.reason,
                },
            ));
        }
    }
    let spent: Vec<Spent> = now
        .iter()
        .filter(|(i, _)| {
            leased
                .iter()
                .any(|(c, l)| !c && l.request.installation == **i)
        })
        .map(|(i, (s, _))| (*i, s.answers, s.model_calls, buckets[i].at))
        .collect();
    let receipts: Vec<Uuid> = leased.iter().map(|(_, l)| l.request.receipt).collect();
    sqlx::query!(
        r#"WITH b AS (
            UPDATE tenant_budgets t
               SET answers = u.answers, model_calls = u.calls, refilled_at = greatest(t.refilled_at, to_timestamp(u.at))
              FROM unnest($1::uuid[], $2::float8[], $3::float8[], $8::float8[]) AS u(inst, answers, calls, at)
             WHERE t.installation_id = u.inst),
         g AS (DELETE FROM tenant_work WHERE receipt_id = ANY($7) AND state = $6)
         UPDATE tenant_work SET lease_until = now() + make_interval(secs => $5), charged = true
          WHERE receipt_id = ANY($4) AND state = $6"#,
        &spent.iter().map(|s| s.0).collect::<Vec<_>>(),
        &spent.iter().map(|s| s.1).collect::<Vec<_>>(),
        &spent.iter().map(|s| s.2).collect::<Vec<_>>(),
        &receipts,
        lease_secs,
        WorkState::Parked.as_str(),
        &gone,
        &spent.iter().map(|s| s.3).collect::<Vec<_>>(),
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(leased.into_iter().map(|(_, l)| l).collect())
}

/// Resumed requests whose contexts are in the model's queue now:
/// `parked → admitted`, each with its audit record (`context`, `resumed`,
/// why it had waited). Returns the receipts moved.
pub async fn mark_admitted(pool: &PgPool, resumed: &[Resumed]) -> sqlx::Result<Vec<Uuid>> {
    let receipts: Vec<Uuid> = resumed.iter().map(|r| r.request.receipt).collect();
    sqlx::query_scalar!(
        r#"WITH m AS (
            UPDATE tenant_work SET state = $2, admitted_at = now(), lease_until = NULL
             WHERE receipt_id = ANY($1) AND state = ANY($3)
            RETURNING receipt_id, installation_id, event_id, channel_ref, reason)
         INSERT INTO audit_log (stage, outcome, reason, installation_id, event_id, receipt_id, channel_ref)
         SELECT 'context', 'resumed', m.reason, m.installation_id, m.event_id, m.receipt_id, m.channel_ref FROM m
         RETURNING receipt_id AS "receipt!""#,
        &receipts,
        WorkState::Admitted.as_str(),
        &moves(&[WorkState::Parked], WorkState::Admitted),
    )
    .fetch_all(pool)
    .await
}

/// Leased requests a round did not build, behind one of their channel
/// that must wait: their lease ends in `secs` (their installation's line
/// goes on then, rather than when the round's lease would have run out).
/// It only ever shortens a lease.
pub async fn lease_for(pool: &PgPool, receipts: &[Uuid], secs: f64) -> sqlx::Result<u64> {
    let r = sqlx::query!(
        "UPDATE tenant_work SET lease_until = least(lease_until, now() + make_interval(secs => $2))
          WHERE receipt_id = ANY($1) AND state = $3 AND lease_until > now()",
        receipts,
        secs,
        WorkState::Parked.as_str()
    )
    .execute(pool)
    .await?;
    Ok(r.rows_affected())
}

/// A parked request that will never be answered (its installation is
/// gone, its question deleted): its place goes.
pub async fn drop_parked(pool: &PgPool, receipt: Uuid) -> sqlx::Result<bool> {
    let r = sqlx::query!(
        "DELETE FROM tenant_work WHERE receipt_id = $1 AND state = $2",
        receipt,
        WorkState::Parked.as_str()
    )
    .execute(pool)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// A request decided without a settle of its own (the publisher ended its
/// streamed answer), or whose rebuild built nothing: its place, in
/// whatever state, goes.
pub async fn free(pool: &PgPool, receipt: Uuid) -> sqlx::Result<bool> {
    let r = sqlx::query!("DELETE FROM tenant_work WHERE receipt_id = $1", receipt)
        .execute(pool)
        .await?;
    Ok(r.rows_affected() == 1)
}

/// Tokens a model call spent whose decision another holder settled (its
/// lease ran out and a redelivery took it over): that settle counted its
/// own call and freed the request's place; this call's `tokens` count
/// against today's too (0 counts nothing). Either the call stopped midway
/// while its answer streamed (providers report a stream's usage only at
/// its end, so `tokens` is inference's estimate of what was read and
/// written until then), or it ran to its end and lost its settle (the
/// usage the provider reported).
pub async fn count_tokens(pool: &PgPool, installation: Uuid, tokens: i64) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO tenant_tokens (installation_id, day, tokens)
         SELECT $1, (now() AT TIME ZONE 'UTC')::date, $2::bigint WHERE $2::bigint > 0
         ON CONFLICT (installation_id, day) DO UPDATE SET tokens = tenant_tokens.tokens + EXCLUDED.tokens",
        installation,
        tokens
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Admitted requests inference never settled within
/// [`ADMITTED_STALE_SECS`] (their context dead-lettered): their places go.
pub async fn sweep_stale(pool: &PgPool) -> sqlx::Result<u64> {
    let r = sqlx::query!(
        "DELETE FROM tenant_work WHERE state = $1 AND admitted_at < now() - make_interval(secs => $2)",
        WorkState::Admitted.as_str(),
        ADMITTED_STALE_SECS
    )
    .execute(pool)
    .await?;
    Ok(r.rows_affected())
}

/// A request rebuilt for a newer version of its thread (a
/// reconsideration): `Some(Parked)` when it waits parked and no resumer
/// holds it (the resumer builds it, from the thread as it is then);
/// otherwise it keeps its place in the model's queue (`Some(Admitted)`),
/// or takes one now (`None`) if its installation holds fewer than `share`
/// there — else it is parked now (`tenant_queue`, `Some(Parked)`), as a
/// new request would be. A request in the queue is charged one model call
/// when its installation has that limit (`defaults` with its overrides),
/// whatever is left: the bucket, refilled to now, may go into debt, at
/// most its size. A parked request under a resumer's lease counts as
/// admitted: its context may be published already from an older version
/// of the thread, and its mark as admitted may come after this
/// reconsideration, which must then build it. The installation's bucket
/// is locked first, as admission and the resumer lock it, so that the
/// share is counted under the same lock.
pub async fn rebuild(
    pool: &PgPool,
    r: &Request,
    defaults: &Limits,
    share: u32,
) -> sqlx::Result<Option<WorkState>> {
    let mut tx = pool.begin().await?;
    let buckets = lock(&mut tx, &[r.installation], defaults).await?;
    let found = sqlx::query!(
        r#"WITH cur AS (
            SELECT CASE WHEN state = $9 AND lease_until > now() THEN $8 ELSE state END AS state
              FROM tenant_work WHERE receipt_id = $1),
         room AS (
            SELECT CASE WHEN count(*) >= $10 THEN $9 ELSE $8 END AS state
              FROM tenant_work WHERE installation_id = $2 AND state = $8),
         placed AS (
            INSERT INTO tenant_work (receipt_id, installation_id, event_id, channel_id, root_ts, source_ts,
                                     channel_ref, state, reason, parked_at, charged, admitted_at)
            SELECT $1, $2, $3, $4, $5, $6, $7, room.state,
                   CASE WHEN room.state = $9 THEN $11 END,
                   CASE WHEN room.state = $9 THEN clock_timestamp() END,
                   room.state = $8,
                   CASE WHEN room.state = $8 THEN now() END
              FROM room WHERE NOT EXISTS (SELECT 1 FROM cur)
            ON CONFLICT (receipt_id) DO NOTHING
            RETURNING state)
         SELECT state AS "state!", false AS "new!" FROM cur
         UNION ALL SELECT state, true FROM placed"#,
        r.receipt,
        r.installation,
        r.event_id,
        r.channel,
        r.root_ts,
        r.source_ts,
        r.channel_ref,
        WorkState::Admitted.as_str(),
        WorkState::Parked.as_str(),
        i64::from(share),
        ParkReason::TenantQueue.as_str(),
    )
    .fetch_optional(&mut *tx)
    .await?;
    let (state, new) = match found {
        Some(f) => (
            Some(
                WorkState::parse(&f.state)
                    .map_err(|e| sqlx::Error::Decode(format!("tenant_work.state: {e}").into()))?,
            ),
            f.new,
        ),
        None => (None, false),
    };
    if state != Some(WorkState::Parked)
        && let Some(b) = buckets.get(&r.installation)
        && b.limits.model_calls_per_minute > 0
    {
        let size = f64::from(b.limits.model_calls_per_minute);
        let left = (b.model_calls - 1.0).max(-size);
        record(&mut tx, &[(r.installation, b.answers, left, b.at)], &[]).await?;
    }
    tx.commit().await?;
    // (a place taken now answers `None`, as before: the caller gives it
    // back if the rebuild builds nothing)
    Ok(match (state, new) {
        (Some(WorkState::Admitted), true) => None,
        (s, _) => s,
    })
}

/// What is parked and admitted now, for gauges and `threadline stats`.
#[derive(Debug, Clone, Default)]
pub struct Sample {
    /// Parked requests by reason.
    pub parked_by_reason: Vec<(String, i64)>,
    /// The installations with the most parked requests (at most `top`).
    pub parked_by_installation: Vec<(Uuid, i64)>,
    /// Installations with requests parked for a spent budget.
    pub over_budget_installations: i64,
    /// The oldest parked request's wait, in seconds (0: none).
    pub oldest_parked_seconds: f64,
    /// Requests admitted to the model's queue and not decided yet.
    pub in_queue: i64,
    /// Over-budget notes proposed, ever.
    pub notes: i64,
}

pub async fn sample(conn: &mut PgConnection, top: i64) -> sqlx::Result<Sample> {
    let parked_by_reason = sqlx::query!(
        r#"SELECT coalesce(reason, '') AS "key!", count(*) AS "n!" FROM tenant_work WHERE state = $1
            GROUP BY 1 ORDER BY 1"#,
        WorkState::Parked.as_str()
    )
    .fetch_all(&mut *conn)
    .await?
    .into_iter()
    .map(|r| (r.key, r.n))
    .collect();
    let parked_by_installation = sqlx::query!(
        r#"SELECT installation_id AS "inst!", count(*) AS "n!" FROM tenant_work WHERE state = $1
            GROUP BY 1 ORDER BY 2 DESC, 1 LIMIT $2"#,
        WorkState::Parked.as_str(),
        top
    )
    .fetch_all(&mut *conn)
    .await?
    .into_iter()
    .map(|r| (r.inst, r.n))
    .collect();
    let r = sqlx::query!(
        r#"SELECT count(DISTINCT installation_id) FILTER (WHERE state = $1 AND reason <> ALL($3))
                    AS "over!",
                  coalesce(extract(epoch FROM now() - min(parked_at) FILTER (WHERE state = $1)), 0)::float8
                    AS "oldest!",
                  count(*) FILTER (WHERE state = $2) AS "in_queue!",
                  (SELECT count(*) FROM budget_notes) AS "notes!"
             FROM tenant_work"#,
        WorkState::Parked.as_str(),
        WorkState::Admitted.as_str(),
        &[ParkReason::TenantQueue.as_str().to_owned()] as &[String],
    )
    .fetch_one(&mut *conn)
    .await?;
    Ok(Sample {
        parked_by_reason,
        parked_by_installation,
        over_budget_installations: r.over,
        oldest_parked_seconds: r.oldest,
        in_queue: r.in_queue,
        notes: r.notes,
    })
}
