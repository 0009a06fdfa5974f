//! Double texting under an installation's `latest` policy
//! (`threadline_domain::double_text`): what each request of a person's
//! burst came to (`double_texts`), decided once, and the earlier messages
//! of a burst its latest request's answer reads. Identifiers only are
//! stored here; the earlier messages' text is read from the thread store.

use sqlx::PgPool;
use threadline_domain::double_text::{BurstPart, EARLIER_MAX};
use threadline_domain::state::{IntentState, Machine as _};
use uuid::Uuid;

/// A person's earlier message of a burst, read with its latest request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Earlier {
    pub ts: String,
    pub user_id: String,
    pub text: String,
}

/// The request at `ts`: what it comes to, decided now unless decided
/// before (by its own earlier build, or by a later request of its burst
/// that read it). Absorbed when the next request of the same person in the
/// same conversation (the same thread, or both top-level in the channel)
/// was sent within `quiet_ms` of it and has not decided yet: that one's
/// build reads this one (its thread, or the walk of [`earlier`]), as it
/// decides itself before it reads. A next request that decided already
/// (this one reached threadline late, after it was built) never read it:
/// this one is answered alone.
pub async fn decide(
    pool: &PgPool,
    inst: Uuid,
    channel: &str,
    ts: &str,
    quiet_ms: i64,
) -> sqlx::Result<BurstPart> {
    let later = sqlx::query!(
        r#"SELECT l.ts,
                  EXISTS (SELECT 1 FROM double_texts d
                           WHERE d.installation_id = l.installation_id AND d.channel_id = l.channel_id
                             AND d.ts = l.ts) AS "decided!"
             FROM thread_messages q
             JOIN thread_messages l
               ON l.installation_id = q.installation_id AND l.channel_id = q.channel_id
              AND l.user_id = q.user_id AND NOT l.deleted
              AND (l.root_ts = q.root_ts OR (q.root_ts = q.ts AND l.root_ts = l.ts))
              AND l.ts::numeric > q.ts::numeric
              AND l.ts::numeric <= q.ts::numeric + $4::bigint / 1000.0
             JOIN turns t ON t.installation_id = l.installation_id AND t.channel_id = l.channel_id
                         AND t.ts = l.ts
            WHERE q.installation_id = $1 AND q.channel_id = $2 AND q.ts = $3
            ORDER BY l.ts::numeric
            LIMIT 1"#,
        inst,
        channel,
        ts,
        quiet_ms
    )
    .fetch_optional(pool)
    .await?;
    // A later request that has decided already was built (or read by one
    // built) without this one, which reached threadline after it: this one
    // is answered on its own.
    let part = match later {
        Some(l) if !l.decided => BurstPart::Absorbed { later_ts: l.ts },
        _ => BurstPart::Alone,
    };
    unread(pool, inst, channel, ts).await?;
    settle(pool, inst, channel, ts, &part).await
}

/// Forgets that the request at `ts` was absorbed when the request that
/// absorbed it was deleted since and no answer read it (the release of
/// [`release`], for a rebuild that comes first: a deleted request's
/// answer discarded as stale, say).
async fn unread(pool: &PgPool, inst: Uuid, channel: &str, ts: &str) -> sqlx::Result<()> {
    sqlx::query!(
        r#"DELETE FROM double_texts d
            WHERE d.installation_id = $1 AND d.channel_id = $2 AND d.ts = $3 AND d.outcome = 'absorbed'
              AND EXISTS (SELECT 1 FROM thread_messages lm
                           WHERE lm.installation_id = d.installation_id AND lm.channel_id = d.channel_id
                             AND lm.ts = d.later_ts AND lm.deleted)
              AND NOT EXISTS (SELECT 1 FROM turns l
                               WHERE l.installation_id = d.installation_id AND l.channel_id = d.channel_id
                                 AND l.ts = d.later_ts AND l.answered_at IS NOT NULL)
              AND NOT EXISTS (SELECT 1 FROM double_texts b
                               WHERE b.installation_id = d.installation_id AND b.channel_id = d.channel_id
                                 AND b.ts = d.later_ts AND b.outcome = 'absorbed')
              AND NOT EXISTS (SELECT 1 FROM decisions x
                               WHERE x.installation_id = d.installation_id AND x.channel_id = d.channel_id
                                 AND x.source_ts = d.later_ts
                                 AND x.status NOT IN ('stale', 'superseded', 'cancelled', 'suppressed'))
              -- (an answer in its thread went out or may show: it read them)
              AND NOT EXISTS (SELECT 1 FROM thread_messages lt
                                JOIN reply_intents r ON r.installation_id = lt.installation_id
                                                    AND r.channel_id = lt.channel_id AND r.root_ts = lt.root_ts
                               WHERE lt.installation_id = d.installation_id AND lt.channel_id = d.channel_id
                                 AND lt.ts = d.later_ts AND r.action_kind <> $4
                                 AND (r.state = ANY($5) OR r.state = ANY($6) OR (r.state = $7 AND r.end_reason = $8)))"#,
        inst,
        channel,
        ts,
        threadline_domain::budget::NOTE_ACTION_KIND,
        &shown() as &[&str],
        &may_show() as &[&str],
        IntentState::Ending.as_str(),
        threadline_domain::reply::Ending::Interrupted.reason()
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Records `part` for the request at `ts` unless one was recorded before;
/// what is recorded now (a second statement, so it sees a row another
/// transaction committed meanwhile).
async fn settle(
    pool: &PgPool,
    inst: Uuid,
    channel: &str,
    ts: &str,
    part: &BurstPart,
) -> sqlx::Result<BurstPart> {
    let later = match part {
        BurstPart::Alone => None,
        BurstPart::Absorbed { later_ts } => Some(later_ts.as_str()),
    };
    sqlx::query!(
        "INSERT INTO double_texts (installation_id, channel_id, ts, outcome, later_ts)
         VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
        inst,
        channel,
        ts,
        part.as_str(),
        later
    )
    .execute(pool)
    .await?;
    let row = sqlx::query!(
        "SELECT outcome, later_ts FROM double_texts
          WHERE installation_id = $1 AND channel_id = $2 AND ts = $3",
        inst,
        channel,
        ts
    )
    .fetch_one(pool)
    .await?;
    BurstPart::parse(&row.outcome, row.later_ts).ok_or_else(|| {
        sqlx::Error::Decode(format!("double_texts.outcome: {:?}", row.outcome).into())
    })
}

/// What the request at `ts` came to, when decided.
pub async fn part(
    pool: &PgPool,
    inst: Uuid,
    channel: &str,
    ts: &str,
) -> sqlx::Result<Option<BurstPart>> {
    let row = sqlx::query!(
        "SELECT outcome, later_ts FROM double_texts
          WHERE installation_id = $1 AND channel_id = $2 AND ts = $3",
        inst,
        channel,
        ts
    )
    .fetch_optional(pool)
    .await?;
    Ok(row.and_then(|r| BurstPart::parse(&r.outcome, r.later_ts)))
}

/// Whether the answer to a reply in the thread `root` reads the burst
/// before the root with its thread: the root is a request of a burst (its
/// part decided now when the root's own build has not come yet: decided
/// once, whichever comes first) answered in its own thread — alone, or
/// absorbed by a request of that thread, not by a later top-level one
/// (whose answer reads them) — and no answer went out in the thread yet
/// (the first one read them). The root's own answer would have read the
/// burst; an answer to a reply answers the root too while the root has
/// none (superseded by it, or discarded as stale). While an answer of the
/// thread is on its way, whether it went out is not known yet: the build
/// asks again once it settled.
pub async fn root_burst_read(
    pool: &PgPool,
    inst: Uuid,
    channel: &str,
    root: &str,
    quiet_ms: i64,
) -> sqlx::Result<RootBurst> {
    // (a deleted root's burst is released, answered on its own)
    if root_deleted(pool, inst, channel, root).await? {
        return Ok(RootBurst::NotRead);
    }
    let part = match part(pool, inst, channel, root).await? {
        Some(p) => p,
        None if is_request(pool, inst, channel, root).await? => {
            decide(pool, inst, channel, root, quiet_ms).await?
        }
        None => return Ok(RootBurst::NotRead),
    };
    let in_thread = match &part {
        BurstPart::Alone => true,
        BurstPart::Absorbed { later_ts } => {
            root_of(pool, inst, channel, later_ts).await?.as_deref() == Some(root)
        }
    };
    if !in_thread || !has_burst(pool, inst, channel, root, quiet_ms).await? {
        return Ok(RootBurst::NotRead);
    }
    thread_answer(pool, inst, channel, root).await
}

/// Whether the top-level request `root` has earlier messages of its burst
/// to read: a request recorded as absorbed by it, or one of the same
/// person sent within `quiet_ms` before it (which [`earlier`] would
/// decide). None: the answer to a reply has nothing of the burst to read,
/// and nothing to wait for.
async fn has_burst(
    pool: &PgPool,
    inst: Uuid,
    channel: &str,
    root: &str,
    quiet_ms: i64,
) -> sqlx::Result<bool> {
    sqlx::query_scalar!(
        r#"SELECT EXISTS (SELECT 1 FROM double_texts d
                           WHERE d.installation_id = $1 AND d.channel_id = $2 AND d.later_ts = $3
                             AND d.outcome = 'absorbed')
               OR EXISTS (SELECT 1 FROM thread_messages n
                            JOIN thread_messages p
                              ON p.installation_id = n.installation_id AND p.channel_id = n.channel_id
                             AND p.user_id = n.user_id AND p.root_ts = p.ts
                             AND p.ts::numeric < n.ts::numeric
                             AND p.ts::numeric >= n.ts::numeric - $4::bigint / 1000.0
                            JOIN turns t ON t.installation_id = p.installation_id AND t.channel_id = p.channel_id
                                        AND t.ts = p.ts
                           WHERE n.installation_id = $1 AND n.channel_id = $2 AND n.ts = $3
                             AND n.root_ts = n.ts) AS "burst!""#,
        inst,
        channel,
        root,
        quiet_ms
    )
    .fetch_one(pool)
    .await
}

/// What the answer to a reply does with the burst before its thread's
/// root ([`root_burst_read`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RootBurst {
    /// It reads them with its thread.
    Read,
    /// Another answer read them, or the root's burst is not its to read.
    NotRead,
    /// An answer of the thread is on its way (a post claimed, sent or of
    /// unknown outcome; a stream claimed, open or ending): whether it went
    /// out decides.
    AnswerOnItsWay,
}

/// Whether the message at `ts` was deleted.
async fn root_deleted(pool: &PgPool, inst: Uuid, channel: &str, ts: &str) -> sqlx::Result<bool> {
    sqlx::query_scalar!(
        r#"SELECT EXISTS (SELECT 1 FROM thread_messages
                           WHERE installation_id = $1 AND channel_id = $2 AND ts = $3 AND deleted) AS "deleted!""#,
        inst,
        channel,
        ts
    )
    .fetch_one(pool)
    .await
}

/// Whether the message at `ts` is a request (it has a turn).
async fn is_request(pool: &PgPool, inst: Uuid, channel: &str, ts: &str) -> sqlx::Result<bool> {
    sqlx::query_scalar!(
        r#"SELECT EXISTS (SELECT 1 FROM turns
                           WHERE installation_id = $1 AND channel_id = $2 AND ts = $3) AS "request!""#,
        inst,
        channel,
        ts
    )
    .fetch_one(pool)
    .await
}

/// The thread root of the message at `ts`, when it is known.
async fn root_of(
    pool: &PgPool,
    inst: Uuid,
    channel: &str,
    ts: &str,
) -> sqlx::Result<Option<String>> {
    sqlx::query_scalar!(
        "SELECT root_ts FROM thread_messages WHERE installation_id = $1 AND channel_id = $2 AND ts = $3",
        inst,
        channel,
        ts
    )
    .fetch_optional(pool)
    .await
}

/// Whether an answer in the thread `root` went out or may show whole
/// ([`shown`]; not the over-budget note): the first one read the burst
/// before its root, if it had one. Once a newer request's turn exists no
/// answer built before it is claimed any more (the claim checks for a
/// newer trigger and the thread's version), so what this sees at a build
/// is all that may show beside it, once none is on its way
/// ([`on_its_way`]: a post that may yet be found absent, a stream whose
/// start is being claimed, still open, or whose last stop is in flight).
async fn thread_answer(
    pool: &PgPool,
    inst: Uuid,
    channel: &str,
    root: &str,
) -> sqlx::Result<RootBurst> {
    let r = sqlx::query!(
        r#"SELECT bool_or(r.state = ANY($5)) AS "shown?", bool_or(r.state = ANY($6)) AS "on_its_way?"
             FROM reply_intents r
            WHERE r.installation_id = $1 AND r.channel_id = $2 AND r.root_ts = $3
              AND r.action_kind <> $4"#,
        inst,
        channel,
        root,
        threadline_domain::budget::NOTE_ACTION_KIND,
        &shown() as &[&str],
        &on_its_way() as &[&str]
    )
    .fetch_one(pool)
    .await?;
    Ok(
        match (r.shown.unwrap_or(false), r.on_its_way.unwrap_or(false)) {
            (true, _) => RootBurst::NotRead,
            (false, true) => RootBurst::AnswerOnItsWay,
            (false, false) => RootBurst::Read,
        },
    )
}

/// The states of a thread's answer that went out or may show whole:
/// sent, or held (its post's outcome unknown). [`unread`] and [`release`]
/// count [`may_show`] too.
fn shown() -> Vec<&'static str> {
    [IntentState::Sent, IntentState::Held]
        .iter()
        .map(|s| s.as_str())
        .collect()
}

/// The states of a post on its way, or whose outcome is not known yet.
fn posting() -> Vec<&'static str> {
    IntentState::IN_FLIGHT.iter().map(|s| s.as_str()).collect()
}

/// The states of an answer on its way that may yet show whole, beside
/// [`shown`]: a post or a stream's start or stop on its way or of unknown
/// outcome ([`posting`]), and an open stream (its last stop may be in
/// flight, showing the whole answer; ended early instead because its
/// thread changed or its question went, its decision is discarded, which
/// releases what waited on it: [`crate::decisions::discarded`]). [`unread`]
/// and [`release`] also count a stream `ending` only interrupted (ending
/// reason `interrupted`): Slack may have expired it, and then it is
/// finished whole by an update of that message. A stream ending for a
/// reason of its own (the thread moved on, a switch, a review) answers
/// nothing, as an `interrupted` one did.
fn may_show() -> Vec<&'static str> {
    let mut states = posting();
    states.push(IntentState::Streaming.as_str());
    states
}

/// The states of an answer on its way: [`may_show`], and a stream ending
/// (whether it went out is not known until it settled).
fn on_its_way() -> Vec<&'static str> {
    let mut states = may_show();
    states.push(IntentState::Ending.as_str());
    states
}

/// A top-level request of a burst, as a walk back meets it.
struct Met {
    ts: String,
    user_id: String,
    text: String,
    deleted: bool,
}

/// The earlier messages of the burst that ends at the top-level request
/// `ts`, oldest first: going back from it, the top-level request recorded
/// as absorbed by the one after it (whatever became of it since: a deleted
/// one is walked through, not read), else the same person's previous
/// top-level request in the channel sent within `quiet_ms` of it, when it
/// is absorbed by it (decided so now when it was not decided yet: this
/// request read it). Every recorded one is read, however many; no more
/// than [`EARLIER_MAX`] are absorbed by the window. A request of the burst
/// answered alone, or read by another request, ends the walk.
pub async fn earlier(
    pool: &PgPool,
    inst: Uuid,
    channel: &str,
    ts: &str,
    quiet_ms: i64,
) -> sqlx::Result<Vec<Earlier>> {
    let mut found = Vec::new();
    let mut next = ts.to_owned();
    loop {
        let met = match recorded_before(pool, inst, channel, &next).await? {
            Some(m) => m,
            None if found.len() >= EARLIER_MAX => break,
            None => {
                let Some(p) = window_before(pool, inst, channel, &next, quiet_ms).await? else {
                    break;
                };
                let read = BurstPart::Absorbed {
                    later_ts: next.clone(),
                };
                // (absorbed by another request, a reply in its own thread:
                // that one's answer reads it)
                if settle(pool, inst, channel, &p.ts, &read).await? != read {
                    break;
                }
                p
            }
        };
        next = met.ts.clone();
        if !met.deleted {
            found.push(Earlier {
                ts: met.ts,
                user_id: met.user_id,
                text: met.text,
            });
        }
    }
    found.reverse();
    Ok(found)
}

/// The top-level request recorded as absorbed by `next` (the latest, if
/// more than one).
async fn recorded_before(
    pool: &PgPool,
    inst: Uuid,
    channel: &str,
    next: &str,
) -> sqlx::Result<Option<Met>> {
    sqlx::query_as!(
        Met,
        r#"SELECT d.ts, coalesce(m.user_id, '') AS "user_id!", m.text, m.deleted
             FROM double_texts d
             JOIN thread_messages m ON m.installation_id = d.installation_id
                                   AND m.channel_id = d.channel_id AND m.ts = d.ts
            WHERE d.installation_id = $1 AND d.channel_id = $2 AND d.later_ts = $3
              AND d.outcome = 'absorbed' AND m.root_ts = m.ts
            ORDER BY d.ts::numeric DESC
            LIMIT 1"#,
        inst,
        channel,
        next
    )
    .fetch_optional(pool)
    .await
}

/// The same person's previous top-level request before the top-level
/// `next`, sent within `quiet_ms` of it (not deleted).
async fn window_before(
    pool: &PgPool,
    inst: Uuid,
    channel: &str,
    next: &str,
    quiet_ms: i64,
) -> sqlx::Result<Option<Met>> {
    sqlx::query_as!(
        Met,
        r#"SELECT p.ts, p.user_id AS "user_id!", p.text, p.deleted
             FROM thread_messages n
             JOIN thread_messages p
               ON p.installation_id = n.installation_id AND p.channel_id = n.channel_id
              AND p.user_id = n.user_id AND NOT p.deleted AND p.root_ts = p.ts
              AND p.ts::numeric < n.ts::numeric
              AND p.ts::numeric >= n.ts::numeric - $4::bigint / 1000.0
             JOIN turns t ON t.installation_id = p.installation_id AND t.channel_id = p.channel_id
                         AND t.ts = p.ts
            WHERE n.installation_id = $1 AND n.channel_id = $2 AND n.ts = $3 AND n.root_ts = n.ts
            ORDER BY p.ts::numeric DESC
            LIMIT 1"#,
        inst,
        channel,
        next,
        quiet_ms
    )
    .fetch_optional(pool)
    .await
}

/// The deletion of the request at `deleted_ts`, before it was answered,
/// releases the requests it absorbed: their records go, and each one's
/// thread is reconsidered through the outbox (in the caller's transaction),
/// so it is answered now (alone, or by a later request of its burst that
/// is still there). Nothing is released while the deleted request has an
/// answer (or one on its way: its decision not discarded), or was absorbed
/// itself (the answer that read it reads them too): the context-builder
/// calls this when it applies the deletion, the publisher when it cancels
/// the deleted request's answer. A copy that took a released request's
/// place (no turn of its own yet) is asked in its place
/// ([`crate::actions::ask_stand_in`]); the copies asked so.
pub async fn release(
    conn: &mut sqlx::PgConnection,
    inst: Uuid,
    channel: &str,
    deleted_ts: &str,
) -> sqlx::Result<Vec<crate::actions::StoodIn>> {
    let released = sqlx::query!(
        r#"DELETE FROM double_texts d
            USING thread_messages m
            WHERE d.installation_id = $1 AND d.channel_id = $2 AND d.later_ts = $3
              AND d.outcome = 'absorbed'
              AND m.installation_id = d.installation_id AND m.channel_id = d.channel_id AND m.ts = d.ts
              -- (a request: its turn, or the turn of the deleted request
              -- it stands in for, a copy that took its place)
              AND (EXISTS (SELECT 1 FROM turns t
                            WHERE t.installation_id = d.installation_id AND t.channel_id = d.channel_id
                              AND t.ts = d.ts)
                   OR EXISTS (SELECT 1 FROM person_actions a
                                JOIN turns t ON t.installation_id = a.installation_id
                                            AND t.channel_id = a.channel_id AND t.ts = a.stood_for
                               WHERE a.installation_id = d.installation_id AND a.channel_id = d.channel_id
                                 AND a.ts = d.ts))
              -- (deleted, and neither answered nor absorbed itself: no
              -- answer read them)
              AND EXISTS (SELECT 1 FROM thread_messages lm
                           WHERE lm.installation_id = d.installation_id AND lm.channel_id = d.channel_id
                             AND lm.ts = d.later_ts AND lm.deleted)
              AND NOT EXISTS (SELECT 1 FROM turns l
                               WHERE l.installation_id = d.installation_id AND l.channel_id = d.channel_id
                                 AND l.ts = d.later_ts AND l.answered_at IS NOT NULL)
              AND NOT EXISTS (SELECT 1 FROM double_texts b
                               WHERE b.installation_id = d.installation_id AND b.channel_id = d.channel_id
                                 AND b.ts = d.later_ts AND b.outcome = 'absorbed')
              -- (an answer of it on its way may yet show: the publisher
              -- releases them when it cancels that answer instead)
              AND NOT EXISTS (SELECT 1 FROM decisions x
                               WHERE x.installation_id = d.installation_id AND x.channel_id = d.channel_id
                                 AND x.source_ts = d.later_ts
                                 AND x.status NOT IN ('stale', 'superseded', 'cancelled', 'suppressed'))
              -- (an answer in its thread went out or may show: an answer to
              -- a reply there answers its root too, and read them; one on
              -- its way, a post or a stream not ending early, may yet show
              -- whole: the publisher releases them when it discards it)
              AND NOT EXISTS (SELECT 1 FROM thread_messages lt
                                JOIN reply_intents r ON r.installation_id = lt.installation_id
                                                    AND r.channel_id = lt.channel_id AND r.root_ts = lt.root_ts
                               WHERE lt.installation_id = d.installation_id AND lt.channel_id = d.channel_id
                                 AND lt.ts = d.later_ts AND r.action_kind <> $4
                                 AND (r.state = ANY($5) OR r.state = ANY($6) OR (r.state = $7 AND r.end_reason = $8)))
        RETURNING d.ts, m.root_ts,
                  (SELECT t.receipt_id FROM turns t
                    WHERE t.installation_id = d.installation_id AND t.channel_id = d.channel_id
                      AND t.ts = d.ts) AS receipt_id,
                  (SELECT a.stood_for FROM person_actions a
                    WHERE a.installation_id = d.installation_id AND a.channel_id = d.channel_id
                      AND a.ts = d.ts AND a.stood_for IS NOT NULL LIMIT 1) AS stood_for"#,
        inst,
        channel,
        deleted_ts,
        threadline_domain::budget::NOTE_ACTION_KIND,
        &shown() as &[&str],
        &may_show() as &[&str],
        IntentState::Ending.as_str(),
        threadline_domain::reply::Ending::Interrupted.reason()
    )
    .fetch_all(&mut *conn)
    .await?;
    let mut asked = Vec::new();
    for r in &released {
        let Some(receipt_id) = r.receipt_id else {
            // A copy that took a deleted request's place in the burst
            // (no turn of its own yet): asked now in that request's place,
            // as when nothing else answered it.
            if let Some(deleted) = &r.stood_for
                && let Some(s) = crate::actions::ask_stand_in(conn, inst, channel, deleted).await?
                && s.asked
            {
                asked.push(s);
            }
            continue;
        };
        let msg = threadline_proto::v1::Reconsider {
            schema_version: threadline_proto::v1::SCHEMA_VERSION,
            installation_id: inst.to_string(),
            channel_id: channel.to_owned(),
            root_ts: r.root_ts.clone(),
            stale_version: 0,
            receipt_id: receipt_id.to_string(),
            reason: "burst_released".to_owned(),
        };
        crate::outbox::enqueue(
            conn,
            inst,
            receipt_id,
            threadline_domain::topic::Topic::Reconsider,
            &format!("recon:burst:{inst}:{channel}:{}:{deleted_ts}", r.ts),
            prost::Message::encode_to_vec(&msg),
        )
        .await?;
    }
    Ok(asked)
}
