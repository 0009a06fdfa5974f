//! Reply intents and the checks around a post, in short transactions: the
//! checks of DESIGN §5 and the claim of §6 in one transaction, the same
//! checks again right before the HTTP call (the fence), the channel's post
//! slots, and the record of a post Slack accepted, whatever became of its
//! intent in the meantime.

use prost::Message as _;
use sqlx::{PgConnection, PgPool};
use threadline_domain::kill_switch::feature_of;
use threadline_domain::state::{DecisionStatus, IntentState, Machine as _, ReceiptState};
use threadline_domain::topic::Topic;
use uuid::Uuid;

use crate::{moves, moves_from_any};

/// What the pre-post checks found.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// This worker owns the post: `sending` by compare-and-set.
    Claimed(Claimed),
    /// The thread changed since the proposal's version.
    Stale,
    /// A newer trigger in the same thread will be answered instead.
    Superseded,
    /// The source message was deleted.
    SourceDeleted,
    /// Already sent for this source event (any action kind).
    AlreadySent,
    /// Another worker is posting, a retry is not due yet, or something in
    /// the thread is accepted but not yet processed (seconds to wait).
    NotNow(f64),
    /// The intent's outcome is unknown: reconcile it before anything else.
    Reconcile(Uuid),
    /// The intent's stream is open and must be stopped first (whoever
    /// finds it due stops it).
    Ending(Uuid),
    /// Held for an operator, or failed for good: nothing to do.
    Closed,
    /// A kill switch covering the installation and the action's feature is
    /// engaged (`scope[:target]`), seen inside the claim transaction.
    Suppressed(String),
}

/// A claim: the intent, the attempt this worker owns, and whether some
/// earlier attempt's outcome was unknown (then Slack is read for evidence
/// before posting again).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claimed {
    pub id: Uuid,
    pub attempt: i32,
    pub ever_unknown: bool,
    /// The decision an earlier attempt posted (its text is what Slack may
    /// already hold), or this attempt's decision on a first claim.
    pub previous_decision: Uuid,
}

pub struct Proposal<'a> {
    pub installation: Uuid,
    pub receipt: Uuid,
    pub decision: Uuid,
    pub event_id: &'a str,
    pub action_kind: &'a str,
    pub channel: &'a str,
    pub root_ts: &'a str,
    pub source_ts: &'a str,
    pub version: i64,
    pub body_hash: &'a str,
    /// The channel's pseudonym for the audit log (the intent keeps it).
    pub channel_ref: Option<String>,
}

/// How long to wait for an unprocessed event of the thread that has been
/// waiting `age` seconds: soon at first, then less often.
fn pending_wait(age: f64) -> f64 {
    if age > 600.0 {
        tracing::warn!(
            alert = "answer_waiting_on_unprocessed_event",
            waiting_seconds = age as i64,
            "an answer is waiting for an event of its thread that has not been processed for over ten minutes (context-builder backlog, or a dead-lettered event)"
        );
    }
    (age / 10.0).clamp(0.5, 10.0)
}

/// The checks of DESIGN §5, the claim of §6 and the channel's post slot in
/// one statement, so one round trip and one commit. The thread row is
/// locked `FOR SHARE` for the statement, so no content change commits
/// between the check and the claim; a content change that committed while
/// the statement waited for that lock is seen through the locked row's
/// version (read committed re-reads a row it had to wait for). The slot and
/// the claim are written only when every check passed; a slot taken for a
/// claim that then lost a race is given back at once.
pub async fn check_and_claim(
    pool: &PgPool,
    p: &Proposal<'_>,
    sending_stale: f64,
    spacing_secs: f64,
) -> sqlx::Result<Verdict> {
    claim_for(pool, p, sending_stale, spacing_secs, Claim::Post).await
}

/// What a claim is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// One post of the whole answer (also after an interrupted stream).
    Post,
    /// The start of a stream: never for an intent that already streamed.
    Stream,
}

/// [`check_and_claim`] for a post or a stream's start.
pub async fn claim_for(
    pool: &PgPool,
    p: &Proposal<'_>,
    sending_stale: f64,
    spacing_secs: f64,
    what: Claim,
) -> sqlx::Result<Verdict> {
    // A new intent is created already claimed: `pending → sending` in one
    // write, as the machine allows. An interrupted stream's intent is
    // claimed again only by a post.
    let mut from = vec![
        IntentState::Pending,
        IntentState::FailedRetryable,
        IntentState::Withdrawn,
    ];
    if what == Claim::Post {
        from.push(IntentState::Interrupted);
    }
    let claim_from = moves(&from, IntentState::Sending);
    debug_assert!(IntentState::Pending.can_become(IntentState::Sending));
    use threadline_domain::budget::{NOTE_ACTION_KIND, note_event_id};
    let c = sqlx::query!(
        r#"WITH th AS (
            SELECT version FROM threads
             WHERE installation_id = $1 AND channel_id = $2 AND root_ts = $3 FOR SHARE),
         c AS (
            SELECT i.id AS intent, i.state, i.attempts, i.decision_id, coalesce(i.streamed, false) AS streamed,
                   extract(epoch FROM i.next_attempt_at - now())::float8 AS due_in,
                   extract(epoch FROM now() - i.sending_since)::float8 AS sending_for,
                   -- the most binding state of the event's intents of other
                   -- action kinds: one reply per source event, whatever the action
                   (SELECT o.state FROM reply_intents o
                     WHERE o.installation_id = $1 AND o.event_id = $6 AND o.action_kind <> $7
                       AND (o.state IN ('sent', 'held', 'sending', 'unknown', 'reconciling', 'streaming', 'ending')
                            OR (o.state IN ('pending', 'failed_retryable') AND o.attempts > 0))
                     ORDER BY CASE o.state WHEN 'sent' THEN 0 WHEN 'held' THEN 1 ELSE 2 END
                     LIMIT 1) AS other,
                   (SELECT e.switch FROM engaged_switch($1::text, $8) e) AS switch,
                   -- an over-budget note ($18: its question's event) comes
                   -- too late once the question is answered, or its answer
                   -- is on its way: the note would say it waits in line
                   ($18::text IS NOT NULL
                    AND (EXISTS (SELECT 1 FROM turns t
                                  WHERE t.installation_id = $1 AND t.channel_id = $2 AND t.ts = $5
                                    AND t.answered_at IS NOT NULL)
                         OR EXISTS (SELECT 1 FROM reply_intents q
                                     WHERE q.installation_id = $1 AND q.event_id = $18
                                       AND (q.state IN ('sent', 'held', 'sending', 'unknown', 'reconciling',
                                                        'streaming', 'ending', 'interrupted')
                                            OR (q.state IN ('pending', 'failed_retryable') AND q.attempts > 0)))))
                       AS answered_first,
                   (SELECT coalesce(bool_or(deleted), false) FROM thread_messages
                     WHERE installation_id = $1 AND channel_id = $2 AND ts = $5) AS deleted,
                   EXISTS (SELECT 1 FROM turns t JOIN thread_messages m
                             ON m.installation_id = t.installation_id AND m.channel_id = t.channel_id AND m.ts = t.ts
                            WHERE t.installation_id = $1 AND t.channel_id = $2 AND m.root_ts = $3
                              AND t.ts::numeric > $5::numeric AND NOT m.deleted) AS newer_trigger,
                   -- something in the thread accepted and not processed yet
                   -- (however old) holds the answer back (migration 0019)
                   (SELECT p.age FROM pending_receipt_age($1, $2, $3, $4, $5) p) AS pending_age,
                   (SELECT version FROM th) AS version
              FROM (SELECT 1) one
              LEFT JOIN reply_intents i ON i.installation_id = $1 AND i.event_id = $6 AND i.action_kind = $7),
         go AS (
            SELECT c.intent, c.attempts, c.decision_id FROM c
             WHERE (c.intent IS NULL OR (c.state = ANY($15) AND c.due_in <= 0 AND NOT ($17 AND c.streamed)))
               AND c.other IS NULL AND c.switch IS NULL AND c.version = $9
               AND NOT c.deleted AND NOT c.newer_trigger AND c.pending_age IS NULL),
         slot AS (
            INSERT INTO post_budgets (installation_id, channel_id, next_allowed_at)
            SELECT $1, $2, clock_timestamp() + make_interval(secs => $10) FROM go
            ON CONFLICT (installation_id, channel_id) DO UPDATE
               SET next_allowed_at = clock_timestamp() + make_interval(secs => $10)
             WHERE post_budgets.next_allowed_at <= clock_timestamp()
            RETURNING next_allowed_at),
         fresh AS (
            INSERT INTO reply_intents (id, installation_id, event_id, action_kind, receipt_id, decision_id, channel_id,
                                       root_ts, body_hash, state, channel_ref, sending_since, first_sending_since,
                                       attempts, claimed_hashes, stream_attempt)
            SELECT $16, $1, $6, $7, $4, $11, $2, $3, $12, $14, $13, now(), now(), 1, ARRAY[$12],
                   CASE WHEN $17 THEN 1 END
              FROM go WHERE go.intent IS NULL AND EXISTS (SELECT 1 FROM slot)
            ON CONFLICT ON CONSTRAINT reply_intents_once DO NOTHING
            RETURNING id, attempts, ever_unknown, decision_id AS previous_decision),
         taken AS (
            UPDATE reply_intents r
               SET state = $14, sending_since = now(), first_sending_since = coalesce(r.first_sending_since, now()),
                   attempts = r.attempts + 1, decision_id = $11, body_hash = $12,
                   claimed_hashes = CASE WHEN $12 = ANY(r.claimed_hashes) THEN r.claimed_hashes
                                         ELSE array_append(r.claimed_hashes, $12) END,
                   -- (a stream's attempt from its claim on: its start is
                   -- no whole answer on its way)
                   stream_attempt = CASE WHEN $17 THEN r.attempts + 1 ELSE r.stream_attempt END,
                   error_code = NULL, updated_at = now()
              FROM go
             WHERE r.id = go.intent AND EXISTS (SELECT 1 FROM slot) AND r.state = ANY($15)
               AND r.next_attempt_at <= now() AND NOT ($17 AND r.streamed)
            RETURNING r.id, r.attempts, r.ever_unknown,
                      CASE WHEN go.attempts > 0 THEN go.decision_id ELSE $11 END AS previous_decision),
         claim AS (SELECT * FROM fresh UNION ALL SELECT * FROM taken)
         SELECT c.intent AS "intent?", c.state AS "state?", c.due_in AS "due_in?", c.sending_for AS "sending_for?",
                c.other AS "other?", c.switch AS "switch?", c.deleted AS "deleted!",
                c.newer_trigger AS "newer_trigger!", c.pending_age AS "pending_age?", c.version AS "version?",
                c.streamed AS "streamed!", c.answered_first AS "answered_first!",
                (SELECT s.next_allowed_at FROM slot s) AS "slot_until?",
                -- the slot as it was before this statement (what it is now,
                -- when this statement did not take it)
                (SELECT b.next_allowed_at FROM post_budgets b
                  WHERE b.installation_id = $1 AND b.channel_id = $2) AS "slot_before?",
                (SELECT extract(epoch FROM b.next_allowed_at - clock_timestamp())::float8
                   FROM post_budgets b WHERE b.installation_id = $1 AND b.channel_id = $2) AS "slot_wait?",
                k.id AS "claimed?", k.attempts AS "attempt?", k.ever_unknown AS "ever_unknown?",
                k.previous_decision AS "previous_decision?"
           FROM c LEFT JOIN claim k ON true"#,
        p.installation,
        p.channel,
        p.root_ts,
        p.receipt,
        p.source_ts,
        p.event_id,
        p.action_kind,
        feature_of(p.action_kind),
        p.version,
        spacing_secs,
        p.decision,
        p.body_hash,
        p.channel_ref,
        IntentState::Sending.as_str(),
        &claim_from,
        Uuid::now_v7(),
        // (a stream is started once per intent, whatever its state now)
        what == Claim::Stream,
        (p.action_kind == NOTE_ACTION_KIND)
            .then(|| p.event_id.strip_prefix(&note_event_id("")))
            .flatten(),
    )
    .fetch_one(pool)
    .await?;
    if let (Some(id), Some(state)) = (c.intent, c.state.as_deref()) {
        let state = IntentState::parse(state)
            .map_err(|e| sqlx::Error::Decode(format!("reply_intents.state: {e}").into()))?;
        use IntentState as S;
        match state {
            S::Sent => return Ok(Verdict::AlreadySent),
            S::Held | S::FailedPermanent => return Ok(Verdict::Closed),
            S::Unknown | S::Reconciling => return Ok(Verdict::Reconcile(id)),
            S::Sending if c.sending_for.is_some_and(|s| s > sending_stale) => {
                // Its worker died or froze between the claim and recording
                // the outcome: reconcile before anything else.
                mark_unknown(pool, id).await?;
                return Ok(Verdict::Reconcile(id));
            }
            S::Sending => return Ok(Verdict::NotNow(5.0)),
            // A stream is on its way: its publisher finishes it (one whose
            // publisher died is taken over and ended, see
            // `streams::take_orphan`).
            S::Streaming => return Ok(Verdict::NotNow(2.0)),
            // Its stream is open and being stopped: nothing is posted beside
            // it until Slack confirmed the stop.
            S::Ending => return Ok(Verdict::Ending(id)),
            S::Interrupted if what == Claim::Stream => return Ok(Verdict::Closed),
            _ if what == Claim::Stream && c.streamed => return Ok(Verdict::Closed),
            S::FailedRetryable | S::Pending if c.due_in.is_some_and(|d| d > 0.0) => {
                return Ok(Verdict::NotNow(c.due_in.unwrap_or(1.0)));
            }
            _ => {}
        }
    }
    // One reply per source event, whatever the action kind: another kind
    // that was sent answers it; one held for an operator closes it; one on
    // its way (or whose outcome is not known yet) is waited for.
    match c.other.as_deref() {
        Some("sent") => return Ok(Verdict::AlreadySent),
        Some("held") => return Ok(Verdict::Closed),
        Some(_) => return Ok(Verdict::NotNow(5.0)),
        None => {}
    }
    // The question an over-budget note is about was answered, or its
    // answer is on its way: the note is discarded, never posted after it.
    if c.answered_first {
        return Ok(Verdict::AlreadySent);
    }
    if let Some(switch) = c.switch {
        return Ok(Verdict::Suppressed(switch));
    }
    if c.version != Some(p.version) {
        return Ok(Verdict::Stale);
    }
    if c.deleted {
        return Ok(Verdict::SourceDeleted);
    }
    // A newer trigger in this thread answers instead of this one.
    if c.newer_trigger {
        return Ok(Verdict::Superseded);
    }
    if let Some(age) = c.pending_age {
        // Not stale yet: wait until it is processed, then check again (it
        // may change the thread, or be a reaction or an unchanged edit).
        return Ok(Verdict::NotNow(pending_wait(age)));
    }
    // A withdrawn intent (released, or paused by a 429) is claimed again
    // once it is due.
    if let Some(due_in) = c.due_in.filter(|d| *d > 0.0) {
        return Ok(Verdict::NotNow(due_in));
    }
    let Some(taken_until) = c.slot_until else {
        // The channel's post slot is not free yet. The snapshot shows when
        // it frees, unless another claim took it while this statement
        // waited for the row (the snapshot still shows the old, past time,
        // or no row): then wait one spacing.
        let wait = c.slot_wait.filter(|w| *w > 0.0).unwrap_or(spacing_secs);
        return Ok(Verdict::NotNow(wait.max(0.05)));
    };
    match (c.claimed, c.attempt, c.ever_unknown, c.previous_decision) {
        (Some(id), Some(attempt), Some(ever_unknown), Some(previous_decision)) => {
            Ok(Verdict::Claimed(Claimed {
                id,
                attempt,
                ever_unknown,
                previous_decision,
            }))
        }
        _ => {
            // Not claimable after all (another worker claimed or created it
            // meanwhile): the slot taken for it goes back.
            give_back_slot(pool, p.installation, p.channel, taken_until, c.slot_before).await?;
            Ok(Verdict::NotNow(5.0))
        }
    }
}

/// `sending → unknown` for an attempt whose worker is taken for dead.
async fn mark_unknown(pool: &PgPool, id: Uuid) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE reply_intents SET state = $2, unknown_since = now(), ever_unknown = true, updated_at = now()
          WHERE id = $1 AND state = ANY($3)",
        id,
        IntentState::Unknown.as_str(),
        &moves(&[IntentState::Sending], IntentState::Unknown)
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Undoes a slot taken by a claim that did not happen, unless another claim
/// has taken the slot since.
async fn give_back_slot(
    pool: &PgPool,
    installation: Uuid,
    channel: &str,
    taken_until: time::OffsetDateTime,
    before: Option<time::OffsetDateTime>,
) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE post_budgets SET next_allowed_at = least(next_allowed_at, coalesce($4, clock_timestamp()))
          WHERE installation_id = $1 AND channel_id = $2 AND next_allowed_at = $3",
        installation,
        channel,
        taken_until,
        before,
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// What the re-check right before the HTTP call found.
#[derive(Debug, Clone, PartialEq)]
pub enum Fence {
    /// Post now.
    Go,
    /// The claim is no longer this attempt's (another delivery took the
    /// intent over after this one stalled): never post.
    Lost,
    /// The claim is older than a post may start (this worker stalled
    /// between the claim and the post): released unposted.
    Expired,
    Stale,
    SourceDeleted,
    Suppressed(String),
    /// The decision was discarded meanwhile (its status).
    Discarded(String),
    /// An event of the thread arrived and is not processed yet (seconds).
    Waiting(f64),
}

/// The checks of the claim again, in one statement right before the HTTP
/// call, so that what reached threadline between the claim and the post
/// still stops it: the claim is still this attempt's and young enough, the
/// version is current, the source is not deleted, no switch is engaged,
/// nothing accepted in the thread is unprocessed, and the decision stands.
pub async fn fence(
    pool: &PgPool,
    p: &Proposal<'_>,
    claim: &Claimed,
    max_claim_age: f64,
) -> sqlx::Result<Fence> {
    fence_for(pool, p, claim, max_claim_age, Claim::Post).await
}

/// [`fence`] for a post or a stream's start (whose decision is still being
/// called: it stands while `calling`).
pub async fn fence_for(
    pool: &PgPool,
    p: &Proposal<'_>,
    claim: &Claimed,
    max_claim_age: f64,
    what: Claim,
) -> sqlx::Result<Fence> {
    let standing: &[&str] = match what {
        Claim::Post => &["proposed", "approved"],
        Claim::Stream => &["calling"],
    };
    struct Row {
        state: Option<String>,
        attempts: Option<i32>,
        claim_age: Option<f64>,
        version: Option<i64>,
        deleted: bool,
        switch: Option<String>,
        pending_age: Option<f64>,
        decision: Option<String>,
    }
    let r = sqlx::query_as!(
        Row,
        r#"SELECT i.state AS "state?", i.attempts AS "attempts?",
                extract(epoch FROM now() - i.sending_since)::float8 AS "claim_age?",
                (SELECT version FROM threads WHERE installation_id = $1 AND channel_id = $2 AND root_ts = $3)
                    AS "version?",
                (SELECT coalesce(bool_or(deleted), false) FROM thread_messages
                  WHERE installation_id = $1 AND channel_id = $2 AND ts = $5) AS "deleted!",
                (SELECT e.switch FROM engaged_switch($1::text, $8) e) AS "switch?",
                (SELECT p.age FROM pending_receipt_age($1, $2, $3, $4, $5) p) AS "pending_age?",
                (SELECT status FROM decisions WHERE id = $7) AS "decision?"
           FROM (SELECT 1) one LEFT JOIN reply_intents i ON i.id = $6"#,
        p.installation,
        p.channel,
        p.root_ts,
        p.receipt,
        p.source_ts,
        claim.id,
        p.decision,
        feature_of(p.action_kind),
    )
    .fetch_one(pool)
    .await?;
    Ok(
        if r.state.as_deref() != Some("sending") || r.attempts != Some(claim.attempt) {
            Fence::Lost
        } else if r.claim_age.is_none_or(|a| a > max_claim_age) {
            Fence::Expired
        } else if let Some(switch) = r.switch {
            Fence::Suppressed(switch)
        } else if r
            .decision
            .as_deref()
            .is_some_and(|s| !standing.contains(&s))
        {
            Fence::Discarded(r.decision.unwrap_or_default())
        } else if r.version != Some(p.version) {
            Fence::Stale
        } else if r.deleted {
            Fence::SourceDeleted
        } else if let Some(age) = r.pending_age {
            Fence::Waiting(pending_wait(age))
        } else {
            Fence::Go
        },
    )
}

/// Gives back a claim that never reached Slack (this attempt posted
/// nothing): `pending` again, due after `retry_in` seconds, unless another
/// attempt has taken the intent since.
pub async fn release(pool: &PgPool, c: &Claimed, code: &str, retry_in: f64) -> sqlx::Result<bool> {
    let r = sqlx::query!(
        "UPDATE reply_intents
            SET state = $5, error_code = $3, next_attempt_at = now() + make_interval(secs => $4),
                unknown_since = NULL, reconcile_reads = 0, updated_at = now()
          WHERE id = $1 AND attempts = $2 AND state = ANY($6)",
        c.id,
        c.attempt,
        code,
        retry_in,
        IntentState::Pending.as_str(),
        &moves(&IntentState::IN_FLIGHT, IntentState::Pending)
    )
    .execute(pool)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// Takes the channel's next post slot (about one a second, shared by all
/// replicas) unless the channel is paused after a 429; returns how long to
/// wait when no slot is free now.
pub async fn take_slot(
    conn: &mut PgConnection,
    installation: Uuid,
    channel: &str,
    spacing_secs: f64,
) -> sqlx::Result<Option<f64>> {
    let got = sqlx::query_scalar!(
        r#"INSERT INTO post_budgets (installation_id, channel_id, next_allowed_at)
         VALUES ($1, $2, clock_timestamp() + make_interval(secs => $3))
         ON CONFLICT (installation_id, channel_id) DO UPDATE
            SET next_allowed_at = clock_timestamp() + make_interval(secs => $3)
          WHERE post_budgets.next_allowed_at <= clock_timestamp()
         RETURNING 1 AS "taken!""#,
        installation,
        channel,
        spacing_secs
    )
    .fetch_optional(&mut *conn)
    .await?;
    if got.is_some() {
        return Ok(None);
    }
    // (a statement of its own: it must see a row another transaction
    // committed while the insert above waited for it)
    let wait = sqlx::query_scalar!(
        r#"SELECT greatest(extract(epoch FROM next_allowed_at - clock_timestamp())::float8, 0.05) AS "wait!"
             FROM post_budgets
            WHERE installation_id = $1 AND channel_id = $2"#,
        installation,
        channel
    )
    .fetch_one(&mut *conn)
    .await?;
    Ok(Some(wait))
}

/// [`take_slot`] on its own (for inspection and tests).
pub async fn reserve_slot(
    pool: &PgPool,
    installation: Uuid,
    channel: &str,
    spacing_secs: f64,
) -> sqlx::Result<Option<f64>> {
    take_slot(
        &mut *pool.acquire().await?,
        installation,
        channel,
        spacing_secs,
    )
    .await
}

/// Slack answered 429 for a post in this channel: no post in it before
/// `secs` (Slack's `chat.postMessage` limit is per channel, so the other
/// channels of the workspace go on).
pub async fn pause_channel(
    pool: &PgPool,
    installation: Uuid,
    channel: &str,
    secs: f64,
) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO post_budgets (installation_id, channel_id, next_allowed_at)
         VALUES ($1, $2, now() + make_interval(secs => $3))
         ON CONFLICT (installation_id, channel_id) DO UPDATE
            SET next_allowed_at = greatest(post_budgets.next_allowed_at, EXCLUDED.next_allowed_at)",
        installation,
        channel,
        secs
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// What recording a post that Slack accepted came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    pub outcome: PostRecord,
    /// Human messages that reached the thread after the answer's context
    /// was taken and before the reply (crossed in flight), newly recorded.
    pub crossed: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PostRecord {
    /// The intent was `sending` (or being reconciled): now `sent`.
    Sent,
    /// The intent had been given up on (held, failed, pending again for a
    /// re-post): the post is recorded all the same, never forgotten.
    Late,
    /// Recorded before with this very ts (a repeated record).
    Already,
    /// Recorded before with another ts: a second post of one intent — a
    /// duplicate-reply incident, kept in `extra_ts`.
    Duplicate,
    /// No such intent.
    Missing,
}

/// Records that Slack holds the post `ts` of `intent`, made from
/// `decision`: the intent becomes `sent` from whatever state it was in (a
/// post that landed after its intent was given up on is still recorded),
/// the decision `published`, the turn answered, and any human message that
/// crossed the answer in flight is recorded. One transaction; the thread
/// row is locked first so that a crossing message committed concurrently
/// by the context-builder is seen by one side or the other.
pub async fn record_post(
    pool: &PgPool,
    intent: Uuid,
    decision: Uuid,
    ts: &str,
    reconciled: bool,
) -> sqlx::Result<Recorded> {
    let mut tx = pool.begin().await?;
    let recorded = record_post_in(&mut tx, intent, decision, ts, reconciled).await?;
    tx.commit().await?;
    Ok(recorded)
}

/// [`record_post`] inside the caller's transaction.
pub async fn record_post_in(
    conn: &mut PgConnection,
    intent: Uuid,
    decision: Uuid,
    ts: &str,
    reconciled: bool,
) -> sqlx::Result<Recorded> {
    let post = PostToRecord {
        intent,
        decision,
        ts: ts.to_owned(),
        reconciled,
    };
    let mut recorded = record_posts_in(conn, std::slice::from_ref(&post)).await?;
    Ok(recorded.pop().expect("one record per post"))
}

/// A post Slack accepted, to be recorded ([`record_posts`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostToRecord {
    pub intent: Uuid,
    pub decision: Uuid,
    pub ts: String,
    /// Found by reconciliation rather than seen in the post's response.
    pub reconciled: bool,
}

/// [`record_post`] for many posts in one transaction (the publisher's
/// group commit): the same locks, checks and writes, one commit for the
/// lot (three statements per round, plus one per `Duplicate` and two per
/// answer crossed in flight). Each post's [`Recorded`] in order.
pub async fn record_posts(pool: &PgPool, posts: &[PostToRecord]) -> sqlx::Result<Vec<Recorded>> {
    let mut tx = pool.begin().await?;
    let recorded = record_posts_in(&mut tx, posts).await?;
    tx.commit().await?;
    Ok(recorded)
}

/// [`record_posts`] inside the caller's transaction. An intent named more
/// than once is recorded once per round, in order, so that the second
/// record sees the first (`Already` or `Duplicate`) exactly as two calls in
/// a row would.
pub async fn record_posts_in(
    conn: &mut PgConnection,
    posts: &[PostToRecord],
) -> sqlx::Result<Vec<Recorded>> {
    let mut out: Vec<Option<Recorded>> = vec![None; posts.len()];
    let mut left: Vec<usize> = (0..posts.len()).collect();
    while !left.is_empty() {
        let mut seen = std::collections::HashSet::new();
        let (round, later): (Vec<usize>, Vec<usize>) = left
            .into_iter()
            .partition(|&k| seen.insert(posts[k].intent));
        let round_posts: Vec<&PostToRecord> = round.iter().map(|&k| &posts[k]).collect();
        for (k, r) in round.iter().zip(record_round(conn, &round_posts).await?) {
            out[*k] = Some(r);
        }
        left = later;
    }
    Ok(out
        .into_iter()
        .map(|r| r.expect("every post recorded"))
        .collect())
}

/// One round of [`record_posts_in`]: every intent at most once.
async fn record_round(
    conn: &mut PgConnection,
    posts: &[&PostToRecord],
) -> sqlx::Result<Vec<Recorded>> {
    // The intents' threads' rows first, then the intents: a crossing
    // message's insert bumps its thread's row, so one of the two
    // transactions waits for the other and the statements after this one
    // see its message (or it sees this reply). Threads are locked in key
    // order and intents in id order, as the context-builder's batches take
    // threads in key order, so that two batches never wait on each other
    // crosswise.
    let ids: Vec<Uuid> = posts.iter().map(|p| p.intent).collect();
    sqlx::query!(
        r#"SELECT 1 AS "locked!" FROM threads t
            WHERE (t.installation_id, t.channel_id, t.root_ts) IN
                  (SELECT i.installation_id, i.channel_id, i.root_ts FROM reply_intents i WHERE i.id = ANY($1))
            ORDER BY t.installation_id, t.channel_id, t.root_ts
              FOR SHARE"#,
        &ids
    )
    .fetch_all(&mut *conn)
    .await?;
    let before = sqlx::query!(
        "SELECT id, state, slack_ts FROM reply_intents WHERE id = ANY($1) ORDER BY id FOR UPDATE",
        &ids
    )
    .fetch_all(&mut *conn)
    .await?;
    let mut found = std::collections::HashMap::new();
    for b in before {
        let state = IntentState::parse(&b.state)
            .map_err(|e| sqlx::Error::Decode(format!("reply_intents.state: {e}").into()))?;
        found.insert(b.id, (state, b.slack_ts));
    }

    let mut outcomes = Vec::with_capacity(posts.len());
    // Sent (or late) now: recorded together by the next statement.
    let (mut sent, mut sent_ts, mut sent_reconciled, mut sent_decision, mut sent_late) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for p in posts {
        let outcome = match found.get(&p.intent) {
            None => PostRecord::Missing,
            Some((IntentState::Sent, Some(known))) if *known == p.ts => PostRecord::Already,
            Some((IntentState::Sent, _)) => {
                sqlx::query!(
                    "UPDATE reply_intents SET extra_ts = array_append(extra_ts, $2), updated_at = now()
                      WHERE id = $1 AND NOT ($2 = ANY(extra_ts))",
                    p.intent,
                    p.ts
                )
                .execute(&mut *conn)
                .await?;
                PostRecord::Duplicate
            }
            Some((state, _)) => {
                // (a stream that stops with the whole answer is on time; a
                // whole answer found for an intent given up on, or whose
                // stream was interrupted, is late, and recorded all the same)
                let late = !IntentState::IN_FLIGHT.contains(state)
                    && !matches!(state, IntentState::Streaming | IntentState::Ending);
                sent.push(p.intent);
                sent_ts.push(p.ts.clone());
                sent_reconciled.push(p.reconciled || late);
                sent_decision.push(p.decision);
                sent_late.push(late);
                if late {
                    PostRecord::Late
                } else {
                    PostRecord::Sent
                }
            }
        };
        outcomes.push(outcome);
    }

    let mut crossed: std::collections::HashMap<Uuid, Vec<String>> = Default::default();
    if !sent.is_empty() {
        // Sent, the decision published and the turn answered, and the
        // human messages of the thread older than the reply that the
        // answer did not read, within the window its context covered
        // (deleted since or not: they were there when it went out),
        // recorded as crossing it in flight: one statement for the round.
        let rows = sqlx::query!(
            r#"WITH u AS (
                SELECT * FROM unnest($1::uuid[], $2::text[], $3::bool[], $4::uuid[], $5::bool[])
                    AS u(id, ts, reconciled, decision, late)),
             i AS (
                UPDATE reply_intents r
                   SET state = $6, slack_ts = u.ts, reconciled = u.reconciled, decision_id = u.decision,
                       error_code = NULL, next_check_at = NULL, end_reason = NULL, updated_at = now(),
                       late_recorded_at = CASE WHEN u.late THEN now() END,
                       -- whole when it was posted, or (a stream) when it stopped:
                       -- by now
                       whole_ts = CASE WHEN r.stream_ts = u.ts
                                       THEN extract(epoch FROM clock_timestamp())::numeric
                                       ELSE u.ts::numeric END
                  FROM u
                 WHERE r.id = u.id AND r.state = ANY($7)
                RETURNING r.id, r.decision_id, u.ts, r.whole_ts),
             d AS (
                UPDATE decisions SET status = $8, updated_at = now()
                 WHERE id IN (SELECT decision_id FROM i) AND status = ANY($9)
                RETURNING id),
             t AS (
                UPDATE turns t SET answered_at = coalesce(t.answered_at, now())
                  FROM i JOIN decisions dd ON dd.id = i.decision_id
                 WHERE t.installation_id = dd.installation_id AND t.channel_id = dd.channel_id
                   AND t.ts = dd.source_ts
                   -- (answered by a decision of its own receipt: not by a
                   -- note about the thread, which has a receipt of its own)
                   AND t.receipt_id = dd.receipt_id
                RETURNING 1)
             INSERT INTO crossed_answers (intent_id, installation_id, channel_id, root_ts, reply_ts, crossing_ts, detected_by,
                                          detected_at)
             SELECT i.id, dd.installation_id, dd.channel_id, dd.root_ts, i.ts, m.ts, 'publisher', clock_timestamp()
               FROM i JOIN decisions dd ON dd.id = i.decision_id
               JOIN thread_messages m
                 ON m.installation_id = dd.installation_id AND m.channel_id = dd.channel_id AND m.root_ts = dd.root_ts
              WHERE dd.context_ts IS NOT NULL
                AND m.speaker = 'user'
                -- deleted only after the context was taken: it was there
                -- when the answer went out
                AND (NOT m.deleted OR m.deleted_at > dd.created_at)
                -- said before the answer was whole (what a person said while
                -- a stream was open crossed it)
                AND m.ts::numeric < i.whole_ts
                AND m.ts::numeric > coalesce(dd.context_floor_ts, '0')::numeric
                AND NOT (m.ts = ANY(dd.context_ts))
             ON CONFLICT DO NOTHING
             RETURNING intent_id, crossing_ts"#,
            &sent,
            &sent_ts,
            &sent_reconciled,
            &sent_decision,
            &sent_late,
            IntentState::Sent.as_str(),
            &moves_from_any(IntentState::Sent),
            DecisionStatus::Published.as_str(),
            &moves_from_any(DecisionStatus::Published)
        )
        .fetch_all(&mut *conn)
        .await?;
        for r in rows {
            crossed.entry(r.intent_id).or_default().push(r.crossing_ts);
        }
    }

    let mut recorded = Vec::with_capacity(posts.len());
    for (p, outcome) in posts.iter().zip(outcomes) {
        let crossed = crossed.remove(&p.intent).unwrap_or_default();
        if !crossed.is_empty() {
            reconsider_crossed(conn, p.intent, p.decision, &crossed).await?;
        }
        recorded.push(Recorded { outcome, crossed });
    }
    Ok(recorded)
}

/// Queues the reconsideration of the thread of an answer that human
/// messages crossed in flight, in the transaction that recorded the
/// crossing: neither is kept without the other.
async fn reconsider_crossed(
    conn: &mut PgConnection,
    intent: Uuid,
    decision: Uuid,
    crossed: &[String],
) -> sqlx::Result<()> {
    let d = sqlx::query!(
        "SELECT installation_id, channel_id, root_ts, receipt_id FROM decisions WHERE id = $1",
        decision
    )
    .fetch_one(&mut *conn)
    .await?;
    let msg = crate::outbox::crossed_reconsider(
        d.installation_id,
        &d.channel_id,
        &d.root_ts,
        d.receipt_id,
    );
    crate::outbox::enqueue(
        conn,
        d.installation_id,
        d.receipt_id,
        Topic::Reconsider,
        &format!(
            "recon:crossed:{intent}:{}",
            crossed.iter().max().map(String::as_str).unwrap_or_default()
        ),
        msg.encode_to_vec(),
    )
    .await?;
    Ok(())
}

/// What evidence of an intent's posts looks like: the body hash of every
/// decision an attempt posted, and the window those posts can have been
/// created in — from just before its first attempt to a minute past the
/// stale time after its last (a later post carries the intent's metadata,
/// which needs no window). Times by the database's clock.
pub async fn evidence(
    pool: &PgPool,
    intent: Uuid,
    stale: f64,
) -> sqlx::Result<(Vec<String>, (f64, f64))> {
    let r = sqlx::query!(
        r#"SELECT CASE WHEN cardinality(claimed_hashes) = 0 THEN ARRAY[body_hash] ELSE claimed_hashes END
                      AS "hashes!",
                  extract(epoch FROM coalesce(first_sending_since, sending_since, created_at))::float8 - 2
                      AS "from!",
                  extract(epoch FROM coalesce(sending_since, created_at))::float8 + $2 + 60 AS "to!"
             FROM reply_intents WHERE id = $1"#,
        intent,
        stale
    )
    .fetch_one(pool)
    .await?;
    Ok((r.hashes, (r.from, r.to)))
}

/// The decision whose text Slack holds in a post of `intent` with body
/// hash `hash`: the newest decision of the intent's event with that output
/// hash, else `fallback`.
pub async fn decision_for_post(
    pool: &PgPool,
    intent: Uuid,
    hash: Option<&String>,
    fallback: Uuid,
) -> sqlx::Result<Uuid> {
    let Some(hash) = hash else {
        return Ok(fallback);
    };
    let found = sqlx::query_scalar!(
        "SELECT d.id FROM decisions d
           JOIN reply_intents i ON i.installation_id = d.installation_id AND i.event_id = d.event_id
          WHERE i.id = $1 AND d.output_hash = $2
          ORDER BY d.created_at DESC LIMIT 1",
        intent,
        hash
    )
    .fetch_optional(pool)
    .await?;
    Ok(found.unwrap_or(fallback))
}

/// Moves the intent of attempt `attempt` from `sending` (or a
/// reconciliation) to another state — never one a later attempt owns now;
/// `unknown` marks it for an evidence read before any later post, and a
/// `ratelimited` code counts a 429.
pub async fn transition(
    pool: &PgPool,
    id: Uuid,
    attempt: i32,
    to: IntentState,
    code: Option<&str>,
    retry_in: Option<f64>,
) -> sqlx::Result<bool> {
    // Only the attempt that owns the intent ends it, and only by a move
    // the machine allows from where it is.
    let from = moves(&IntentState::IN_FLIGHT, to);
    let r = sqlx::query!(
        "UPDATE reply_intents
            SET state = $2, error_code = $3,
                next_attempt_at = CASE WHEN $4::float8 IS NULL THEN next_attempt_at ELSE now() + make_interval(secs => $4) END,
                unknown_since = CASE WHEN $2 = 'unknown' THEN now() ELSE unknown_since END,
                ever_unknown = ever_unknown OR $2 = 'unknown',
                ratelimited_attempts = ratelimited_attempts + CASE WHEN $3 = 'ratelimited' THEN 1 ELSE 0 END,
                updated_at = now()
          WHERE id = $1 AND attempts = $5 AND state = ANY($6)",
        id,
        to.as_str(),
        code,
        retry_in,
        attempt,
        &from
    )
    .execute(pool)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// Slack answered 429 to attempt `attempt`: the intent waits `wait`
/// seconds (`failed_retryable`), or, once Slack has refused `max` attempts
/// this way, fails for good (`rate_limited_too_often`). Returns whether it
/// gave up, or `None` when a later attempt owns the intent now.
pub async fn rate_limited(
    pool: &PgPool,
    id: Uuid,
    attempt: i32,
    wait: f64,
    max: i32,
) -> sqlx::Result<Option<bool>> {
    let state = sqlx::query_scalar!(
        "UPDATE reply_intents
            SET ratelimited_attempts = ratelimited_attempts + 1,
                state = CASE WHEN ratelimited_attempts + 1 >= $4 THEN $5 ELSE $6 END,
                error_code = CASE WHEN ratelimited_attempts + 1 >= $4 THEN 'rate_limited_too_often' ELSE 'ratelimited' END,
                next_attempt_at = now() + make_interval(secs => $3), updated_at = now()
          WHERE id = $1 AND attempts = $2 AND state = ANY($7) AND state = ANY($8)
         RETURNING state",
        id,
        attempt,
        wait,
        max,
        IntentState::FailedPermanent.as_str(),
        IntentState::FailedRetryable.as_str(),
        &moves(&IntentState::IN_FLIGHT, IntentState::FailedPermanent),
        &moves(&IntentState::IN_FLIGHT, IntentState::FailedRetryable)
    )
    .fetch_optional(pool)
    .await?;
    Ok(state.map(|s| s == IntentState::FailedPermanent.as_str()))
}

/// A proposal of a decision that may no longer be posted (discarded, or
/// published by another attempt): an intent of it waiting to be (re)tried is
/// withdrawn, so nothing keeps driving it.
pub async fn withdraw_waiting(pool: &PgPool, decision: Uuid) -> sqlx::Result<u64> {
    let r = sqlx::query!(
        "UPDATE reply_intents SET state = $2, updated_at = now()
          WHERE decision_id = $1 AND state = ANY($3)
            AND EXISTS (SELECT 1 FROM decisions d WHERE d.id = $1 AND d.status NOT IN ('proposed', 'approved', 'review'))",
        decision,
        IntentState::Withdrawn.as_str(),
        &moves(
            &[IntentState::Pending, IntentState::FailedRetryable],
            IntentState::Withdrawn
        )
    )
    .execute(pool)
    .await?;
    Ok(r.rows_affected())
}

/// Holds an intent whose outcome is unknown but can no longer be
/// reconciled (its installation lost its token: uninstalled, revoked):
/// nothing is posted, and an operator sees why.
pub async fn hold_unreadable(pool: &PgPool, id: Uuid, code: &str) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE reply_intents SET state = $3, error_code = $2, updated_at = now()
          WHERE id = $1 AND state = ANY($4)",
        id,
        code,
        IntentState::Held.as_str(),
        &moves(&IntentState::IN_FLIGHT, IntentState::Held)
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Discards a decision (`stale`, `superseded`, `cancelled`, `suppressed`);
/// an intent of it that never reached Slack is withdrawn with it, so no
/// post is left waiting for a decision that will never come.
pub async fn set_decision(
    pool: &PgPool,
    decision: Uuid,
    status: DecisionStatus,
    reason: Option<&str>,
) -> sqlx::Result<()> {
    set_decision_in(&mut *pool.acquire().await?, decision, status, reason).await?;
    Ok(())
}

/// [`set_decision`] on the caller's connection; true when the decision
/// was still open and is now discarded.
pub async fn set_decision_in(
    conn: &mut PgConnection,
    decision: Uuid,
    status: DecisionStatus,
    reason: Option<&str>,
) -> sqlx::Result<bool> {
    // The publisher discards what was offered to it (proposed or approved)
    // and nothing else; a status that is no discard matches no row. (A
    // decision still being called when its stream ends is left to its
    // model call, which settles it and finds it stale: discarding it here
    // would stop the call sooner, but the request's place in the model's
    // queue, kept by receipt, would then be freed by the stopped call
    // under the reconsideration that took it over.)
    let from = if status.is_discard() {
        moves(
            &[DecisionStatus::Proposed, DecisionStatus::Approved],
            status,
        )
    } else {
        Vec::new()
    };
    let discarded = sqlx::query_scalar!(
        r#"WITH d AS (
             UPDATE decisions SET status = $2, status_reason = $3, updated_at = now()
              WHERE id = $1 AND status = ANY($4)
             RETURNING id),
         w AS (
             UPDATE reply_intents SET state = $5, error_code = $2, updated_at = now()
              WHERE decision_id IN (SELECT id FROM d) AND state = ANY($6)
             RETURNING 1)
         SELECT EXISTS (SELECT 1 FROM d) AS "discarded!""#,
        decision,
        status.as_str(),
        reason,
        &from,
        IntentState::Withdrawn.as_str(),
        &moves(
            &[IntentState::Pending, IntentState::FailedRetryable],
            IntentState::Withdrawn
        )
    )
    .fetch_one(conn)
    .await?;
    Ok(discarded)
}

/// A pending claim of `decision` that will not be posted (its decision was
/// discarded before the post): withdrawn, so nothing keeps driving it.
pub async fn withdraw_pending(pool: &PgPool, intent: Uuid, decision: Uuid) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE reply_intents SET state = $3, updated_at = now()
          WHERE id = $1 AND state = ANY($4) AND decision_id = $2",
        intent,
        decision,
        IntentState::Withdrawn.as_str(),
        &moves(&[IntentState::Pending], IntentState::Withdrawn)
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// The posts other intents of the thread hold in Slack (their `slack_ts`
/// and any duplicate `extra_ts`): a reconciliation never takes one of them
/// for its own.
pub async fn other_posts_in_thread(
    pool: &PgPool,
    installation: Uuid,
    channel: &str,
    root_ts: &str,
    intent: Uuid,
) -> sqlx::Result<Vec<String>> {
    sqlx::query_scalar!(
        r#"SELECT t AS "t!" FROM reply_intents, unnest(array_append(array_append(extra_ts, slack_ts), stream_ts)) AS t
            WHERE installation_id = $1 AND channel_id = $2 AND root_ts = $3 AND id <> $4 AND t IS NOT NULL"#,
        installation,
        channel,
        root_ts,
        intent
    )
    .fetch_all(pool)
    .await
}

/// `unknown → reconciling` (a reconciliation begins); returns the decision
/// the intent names and how long its outcome has been unknown (seconds).
pub async fn begin_reconciling(pool: &PgPool, intent: Uuid) -> sqlx::Result<(Uuid, f64)> {
    sqlx::query!(
        "UPDATE reply_intents SET state = $2, updated_at = now() WHERE id = $1 AND state = ANY($3)",
        intent,
        IntentState::Reconciling.as_str(),
        &moves(&[IntentState::Unknown], IntentState::Reconciling)
    )
    .execute(pool)
    .await?;
    let r = sqlx::query!(
        r#"SELECT decision_id, coalesce(extract(epoch FROM now() - unknown_since)::float8, 0) AS "unknown_for!"
             FROM reply_intents WHERE id = $1"#,
        intent
    )
    .fetch_one(pool)
    .await?;
    Ok((r.decision_id, r.unknown_for))
}

/// Counts one more read of Slack for the intent's evidence; returns the
/// reads so far.
pub async fn count_reconcile_read(pool: &PgPool, intent: Uuid) -> sqlx::Result<i32> {
    sqlx::query_scalar!(
        "UPDATE reply_intents SET reconcile_reads = reconcile_reads + 1, updated_at = now() WHERE id = $1
         RETURNING reconcile_reads",
        intent
    )
    .fetch_one(pool)
    .await
}

/// `reconciling → held` for an operator, with why; one held for want of
/// evidence is read again later (late checks, the first after
/// `late_check_secs`).
pub async fn hold_after_reconciling(
    pool: &PgPool,
    intent: Uuid,
    why: &str,
    late_check_secs: f64,
) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE reply_intents SET state = $4, error_code = $2, updated_at = now(),
                next_check_at = CASE WHEN $2 = 'no_evidence_of_post' THEN now() + make_interval(secs => $3) END,
                late_checks = 0
          WHERE id = $1 AND state = ANY($5)",
        intent,
        why,
        late_check_secs,
        IntentState::Held.as_str(),
        &moves(&[IntentState::Reconciling], IntentState::Held)
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// `reconciling → pending`: Slack shows no post of the intent, so it may
/// be posted (once) again.
pub async fn repost_after_reconciling(pool: &PgPool, intent: Uuid) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE reply_intents SET state = $2, reconcile_reads = 0, unknown_since = NULL, updated_at = now()
          WHERE id = $1 AND state = ANY($3)",
        intent,
        IntentState::Pending.as_str(),
        &moves(&[IntentState::Reconciling], IntentState::Pending)
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// An intent no delivery drives any more, taken by the sweeper.
#[derive(Debug, Clone)]
pub struct Undriven {
    pub intent: Uuid,
    pub decision: Uuid,
    /// Its state when taken (`sending` ones became `unknown` on the way).
    pub was: String,
}

/// Takes up to 100 intents that nothing has moved for `idle` seconds (and
/// that were not swept in that time): `sending` ones past `sending_stale`
/// become `unknown` on the way.
pub async fn take_undriven(
    pool: &PgPool,
    sending_stale: f64,
    idle: f64,
) -> sqlx::Result<Vec<Undriven>> {
    sqlx::query_as!(
        Undriven,
        r#"WITH taken AS (
            SELECT id, state AS was FROM reply_intents
             WHERE ((state = 'sending' AND sending_since < now() - make_interval(secs => $1))
                 OR (state IN ('unknown', 'reconciling') AND updated_at < now() - make_interval(secs => $2))
                 OR (state IN ('pending', 'failed_retryable')
                     AND next_attempt_at < now() - make_interval(secs => $2)
                     AND updated_at < now() - make_interval(secs => $2)))
               AND (swept_at IS NULL OR swept_at < now() - make_interval(secs => $2))
             ORDER BY updated_at LIMIT 100
             FOR UPDATE SKIP LOCKED)
         UPDATE reply_intents r
            SET swept_at = now(),
                state = CASE WHEN taken.was = ANY($4) THEN $3 ELSE r.state END,
                unknown_since = CASE WHEN taken.was = 'sending' THEN now() ELSE r.unknown_since END,
                ever_unknown = r.ever_unknown OR taken.was = 'sending'
           FROM taken WHERE r.id = taken.id
         RETURNING r.id AS intent, r.decision_id AS decision, taken.was"#,
        sending_stale,
        idle,
        IntentState::Unknown.as_str(),
        &moves(&[IntentState::Sending], IntentState::Unknown)
    )
    .fetch_all(pool)
    .await
}

/// A held intent due for a late check of Slack for its post.
#[derive(Debug, Clone)]
pub struct LateCheck {
    pub intent: Uuid,
    pub installation: Uuid,
    pub decision: Uuid,
    pub channel: String,
    pub root_ts: String,
    /// Checks made so far, this one included.
    pub checks: i32,
}

/// Takes up to 20 held intents due for a late check, with a lease that
/// grows with the checks made (a row that keeps failing is retried less
/// and less often, and after 20 checks left held).
pub async fn take_late_checks(pool: &PgPool) -> sqlx::Result<Vec<LateCheck>> {
    sqlx::query_as!(
        LateCheck,
        r#"WITH taken AS (
            SELECT id FROM reply_intents
             WHERE state = 'held' AND next_check_at <= now()
             ORDER BY next_check_at LIMIT 20
             FOR UPDATE SKIP LOCKED)
         UPDATE reply_intents r
            SET late_checks = r.late_checks + 1,
                next_check_at = CASE WHEN r.late_checks >= 20 THEN NULL
                                     ELSE now() + make_interval(secs => least(60 * 2 ^ r.late_checks, 86400)) END
           FROM taken WHERE r.id = taken.id
         RETURNING r.id AS intent, r.installation_id AS installation, r.decision_id AS decision,
                   r.channel_id AS channel, r.root_ts, r.late_checks AS checks"#
    )
    .fetch_all(pool)
    .await
}

/// The next late check of a held intent: in `secs`, or never (`None`).
pub async fn schedule_late_check(
    pool: &PgPool,
    intent: Uuid,
    secs: Option<f64>,
) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE reply_intents
            SET next_check_at = CASE WHEN $2::float8 IS NULL THEN NULL ELSE now() + make_interval(secs => $2) END
          WHERE id = $1 AND state = 'held'",
        intent,
        secs
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Reply intents by state, and the age in seconds of the oldest whose
/// outcome is unsettled (unknown, being reconciled, held, or `sending` for
/// longer than a post can take).
pub async fn ledger(pool: &PgPool) -> sqlx::Result<(Vec<(String, i64)>, f64)> {
    let by_state =
        sqlx::query!(r#"SELECT state, count(*) AS "n!" FROM reply_intents GROUP BY state"#)
            .fetch_all(pool)
            .await?
            .into_iter()
            .map(|r| (r.state, r.n))
            .collect();
    let oldest = sqlx::query_scalar!(
        r#"SELECT coalesce(max(extract(epoch FROM now() - coalesce(unknown_since, sending_since, updated_at))), 0)::float8
                  AS "oldest!"
             FROM reply_intents
            WHERE state IN ('unknown', 'reconciling', 'held')
               OR (state = 'sending' AND sending_since < now() - interval '60 seconds')"#
    )
    .fetch_one(pool)
    .await?;
    Ok((by_state, oldest))
}

/// What an operator on call watches besides the intents' states: how long
/// the oldest stream of an answer has been open (streaming, or being
/// stopped) and how long the oldest event threadline acknowledged has
/// waited to be processed (answers of its thread wait for it), in seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Waits {
    pub stream_open: f64,
    pub event_unprocessed: f64,
}

pub async fn waits(pool: &PgPool) -> sqlx::Result<Waits> {
    let r = sqlx::query!(
        r#"SELECT coalesce((SELECT max(extract(epoch FROM now() - stream_started_at)) FROM reply_intents
                             WHERE state = ANY($1) AND stream_started_at IS NOT NULL), 0)::float8 AS "stream!",
                  coalesce((SELECT max(extract(epoch FROM now() - received_at)) FROM event_receipts
                             WHERE state = ANY($2)), 0)::float8 AS "event!""#,
        &[IntentState::Streaming.as_str(), IntentState::Ending.as_str()] as &[&str],
        &[ReceiptState::Accepted.as_str(), ReceiptState::Processing.as_str()] as &[&str],
    )
    .fetch_one(pool)
    .await?;
    Ok(Waits {
        stream_open: r.stream,
        event_unprocessed: r.event,
    })
}

/// A reply intent as an operator lists it (no text).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Listed {
    pub id: Uuid,
    pub installation_id: Uuid,
    pub event_id: String,
    pub channel_id: String,
    pub root_ts: String,
    pub state: IntentState,
    pub attempts: i32,
    pub error_code: Option<String>,
    pub slack_ts: Option<String>,
    pub reconciled: bool,
}

/// The newest 500 intents in `state`.
pub async fn list(pool: &PgPool, state: IntentState) -> sqlx::Result<Vec<Listed>> {
    let rows = sqlx::query!(
        "SELECT id, installation_id, event_id, channel_id, root_ts, attempts, error_code, slack_ts, reconciled
           FROM reply_intents WHERE state = $1 ORDER BY updated_at DESC LIMIT 500",
        state.as_str()
    )
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| Listed {
            id: r.id,
            installation_id: r.installation_id,
            event_id: r.event_id,
            channel_id: r.channel_id,
            root_ts: r.root_ts,
            state,
            attempts: r.attempts,
            error_code: r.error_code,
            slack_ts: r.slack_ts,
            reconciled: r.reconciled,
        })
        .collect())
}

/// The intent's state and decision, locked for the caller's transaction
/// (an operator settling it).
pub async fn lock_for_operator(
    conn: &mut PgConnection,
    id: Uuid,
) -> sqlx::Result<Option<(IntentState, Uuid)>> {
    let row = sqlx::query!(
        "SELECT state, decision_id FROM reply_intents WHERE id = $1 FOR UPDATE",
        id
    )
    .fetch_optional(conn)
    .await?;
    row.map(|r| {
        IntentState::parse(&r.state)
            .map(|s| (s, r.decision_id))
            .map_err(|e| sqlx::Error::Decode(format!("reply_intents.state: {e}").into()))
    })
    .transpose()
}

/// An operator found no post of a held intent: `held → pending`, due now,
/// so it may be posted once more (the caller queues its proposal in the
/// same transaction). False when it was not held.
pub async fn operator_repost(conn: &mut PgConnection, id: Uuid) -> sqlx::Result<bool> {
    let r = sqlx::query!(
        "UPDATE reply_intents SET state = $2, reconcile_reads = 0, unknown_since = NULL, next_check_at = NULL,
                next_attempt_at = now(), updated_at = now()
          WHERE id = $1 AND state = ANY($3)",
        id,
        IntentState::Pending.as_str(),
        &moves(&[IntentState::Held], IntentState::Pending)
    )
    .execute(conn)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// An operator gives a held intent up: `held → failed_permanent`, nothing
/// more is posted. False when it was not held.
pub async fn operator_abandon(conn: &mut PgConnection, id: Uuid) -> sqlx::Result<bool> {
    let r = sqlx::query!(
        "UPDATE reply_intents SET state = $2, error_code = 'abandoned_by_operator', next_check_at = NULL,
                updated_at = now()
          WHERE id = $1 AND state = ANY($3)",
        id,
        IntentState::FailedPermanent.as_str(),
        &moves(&[IntentState::Held], IntentState::FailedPermanent)
    )
    .execute(conn)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// The decision an intent names now.
pub async fn decision_of(pool: &PgPool, intent: Uuid) -> sqlx::Result<Uuid> {
    sqlx::query_scalar!(
        "SELECT decision_id FROM reply_intents WHERE id = $1",
        intent
    )
    .fetch_one(pool)
    .await
}
