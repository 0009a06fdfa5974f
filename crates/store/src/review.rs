//! Human review in Slack: each installation's review settings (channel,
//! reviewers, how much of an answer a request shows), the review request
//! the publisher posts for a decision, and a reviewer's verdict — one code
//! path for the CLI and for a click on Approve / Reject that the gateway
//! received. A verdict and what it asks of the publisher (post the answer,
//! or show the outcome on the request) commit together through the outbox.

use sqlx::{PgConnection, PgPool};
use threadline_domain::state::{
    DecisionStatus, IntentState, Machine as _, ReviewRequestState as R,
};
use uuid::Uuid;

/// An installation's review settings.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Settings {
    /// Where review requests are posted (`None`: only the CLI reviews).
    pub channel_id: Option<String>,
    /// Slack user ids whose clicks count.
    pub reviewers: Vec<String>,
    /// How many characters of the proposed answer a request shows (0: none).
    pub preview_chars: i32,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            channel_id: None,
            reviewers: Vec::new(),
            preview_chars: 600,
        }
    }
}

pub async fn settings(pool: &PgPool, installation: Uuid) -> sqlx::Result<Settings> {
    let row = sqlx::query_as!(
        Settings,
        "SELECT channel_id, reviewers, preview_chars FROM review_settings WHERE installation_id = $1",
        installation
    )
    .fetch_optional(pool)
    .await?;
    Ok(row.unwrap_or_default())
}

/// Changes to the review settings; `None` leaves a setting as it is.
#[derive(Debug, Clone, Default)]
pub struct Changes {
    /// `Some(None)`: no review channel (CLI review only).
    pub channel_id: Option<Option<String>>,
    pub reviewers: Option<Vec<String>>,
    pub preview_chars: Option<i32>,
}

pub async fn set_settings(pool: &PgPool, installation: Uuid, c: &Changes) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO review_settings AS s (installation_id, channel_id, reviewers, preview_chars)
         VALUES ($1, $3::text, coalesce($4::text[], '{}'), coalesce($5::int, 600))
         ON CONFLICT (installation_id) DO UPDATE
            SET channel_id = CASE WHEN $2::bool THEN $3::text ELSE s.channel_id END,
                reviewers = coalesce($4, s.reviewers),
                preview_chars = coalesce($5, s.preview_chars),
                updated_at = now()",
        installation,
        c.channel_id.is_some(),
        c.channel_id.clone().flatten(),
        c.reviewers.as_deref(),
        c.preview_chars,
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// What posting a decision's review request may do now.
#[derive(Debug, Clone, PartialEq)]
pub enum PostClaim {
    /// This publisher posts it (attempt number).
    Post { attempt: i32 },
    /// An earlier attempt's outcome is unknown (its answer was lost, or its
    /// publisher died): the request is looked for first in `channel` (where
    /// that attempt posted), from `since` (Unix seconds: when the first
    /// attempt of unknown outcome went to post); the latest post began
    /// `waited` seconds ago by the database's clock (an attempt that only
    /// read the channel does not count); this publisher holds `attempt`.
    Reconcile {
        attempt: i32,
        channel: String,
        since: f64,
        waited: f64,
    },
    /// Already posted.
    Posted,
    /// Slack refused it for good earlier.
    Failed,
    /// Another publisher is posting it now.
    Busy,
    /// Its outcome is unknown and held: the sweeper's late checks look for
    /// it.
    Held,
}

/// Claims the post of a decision's review request in `channel`. An attempt
/// still `posting` after `stale` seconds counts as unknown. A request held
/// for the late checks is not claimed: the sweeper looks for it.
pub async fn claim_post(
    pool: &PgPool,
    decision: Uuid,
    installation: Uuid,
    channel: &str,
    stale: f64,
) -> sqlx::Result<PostClaim> {
    let r = sqlx::query!(
        r#"WITH old AS (
             SELECT state, channel_id, next_check_at IS NOT NULL AS held,
                    extract(epoch FROM coalesce(unknown_since, post_started_at, posting_since))::float8 AS since,
                    extract(epoch FROM now() - coalesce(post_started_at, posting_since))::float8 AS waited
               FROM review_messages WHERE decision_id = $1),
         ins AS (
             INSERT INTO review_messages (decision_id, installation_id, channel_id, state)
             VALUES ($1, $2, $3, $5) ON CONFLICT (decision_id) DO NOTHING
             RETURNING attempt),
         retake AS (
             UPDATE review_messages r
                SET state = $5, attempt = r.attempt + 1, posting_since = now(),
                    -- (a publisher that died posting left an unknown outcome)
                    unknown_since = coalesce(r.unknown_since, r.post_started_at, r.posting_since),
                    updated_at = now()
              WHERE r.decision_id = $1 AND r.state = ANY($6) AND r.next_check_at IS NULL
                -- (an attempt still posting only once it is stale)
                AND (r.state <> $5 OR r.posting_since < now() - make_interval(secs => $4))
             RETURNING r.attempt)
         SELECT (SELECT attempt FROM ins) AS new_attempt,
                (SELECT attempt FROM retake) AS retake_attempt,
                (SELECT state FROM old) AS old_state,
                (SELECT channel_id FROM old) AS old_channel,
                (SELECT since FROM old) AS since,
                (SELECT waited FROM old) AS waited,
                (SELECT held FROM old) AS held"#,
        decision,
        installation,
        channel,
        stale,
        R::Posting.as_str(),
        &crate::moves(&[R::Unknown, R::Posting], R::Posting),
    )
    .fetch_one(pool)
    .await?;
    let old = r
        .old_state
        .as_deref()
        .map(R::parse)
        .transpose()
        .map_err(|e| sqlx::Error::Decode(Box::new(e)))?;
    Ok(match (r.new_attempt, r.retake_attempt, old) {
        (Some(attempt), _, _) => PostClaim::Post { attempt },
        (None, Some(attempt), _) => PostClaim::Reconcile {
            attempt,
            channel: r.old_channel.unwrap_or_else(|| channel.to_owned()),
            since: r.since.unwrap_or(0.0),
            waited: r.waited.unwrap_or(0.0),
        },
        (None, None, Some(R::Posted)) => PostClaim::Posted,
        (None, None, Some(R::Failed)) => PostClaim::Failed,
        (None, None, Some(R::Unknown)) if r.held == Some(true) => PostClaim::Held,
        _ => PostClaim::Busy,
    })
}

/// What recording a request Slack holds came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recorded {
    /// Recorded now, or already recorded at this ts.
    Request,
    /// Another request of the decision is recorded (at the ts given): this
    /// one is a second copy in Slack.
    Copy(String),
}

/// Records the request Slack holds at `ts` (whichever attempt posted it:
/// a post that landed is recorded, never forgotten). A request recorded
/// at another ts already makes this one a copy. (Two statements: the
/// second sees a record committed while the first waited for its row.)
pub async fn posted(db: &mut PgConnection, decision: Uuid, ts: &str) -> sqlx::Result<Recorded> {
    let updated = sqlx::query!(
        "UPDATE review_messages
            SET state = $3, ts = $2, error_code = NULL, next_check_at = NULL, updated_at = now()
          WHERE decision_id = $1 AND state = ANY($4)",
        decision,
        ts,
        R::Posted.as_str(),
        &crate::moves_from_any(R::Posted),
    )
    .execute(&mut *db)
    .await?;
    if updated.rows_affected() == 1 {
        return Ok(Recorded::Request);
    }
    let recorded = sqlx::query_scalar!(
        "SELECT ts FROM review_messages WHERE decision_id = $1",
        decision
    )
    .fetch_optional(&mut *db)
    .await?
    .flatten();
    Ok(match recorded {
        Some(r) if r != ts => Recorded::Copy(r),
        _ => Recorded::Request,
    })
}

/// Attempt `attempt` got no answer it could read (or could not read the
/// channel for it): Slack may hold the post. The first such attempt's start
/// stays the request's `unknown_since`.
pub async fn unknown(pool: &PgPool, decision: Uuid, attempt: i32) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE review_messages
            SET state = $3, unknown_since = coalesce(unknown_since, post_started_at, posting_since),
                updated_at = now()
          WHERE decision_id = $1 AND attempt = $2 AND state = ANY($4)",
        decision,
        attempt,
        R::Unknown.as_str(),
        &crate::moves(&[R::Posting], R::Unknown),
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Past the window, reconciling attempt `attempt` found no request: it is
/// held, as a reply is, and the sweeper reads the channel again in
/// `first_check` seconds, then less and less often. `false` when the claim
/// was no longer this attempt's (nothing held).
pub async fn hold(
    pool: &PgPool,
    decision: Uuid,
    attempt: i32,
    first_check: f64,
) -> sqlx::Result<bool> {
    let r = sqlx::query!(
        "UPDATE review_messages
            SET state = $3, next_check_at = now() + make_interval(secs => $4), checks = 0,
                updated_at = now()
          WHERE decision_id = $1 AND attempt = $2 AND state = ANY($5)",
        decision,
        attempt,
        R::Unknown.as_str(),
        first_check,
        &crate::moves(&[R::Posting], R::Unknown),
    )
    .execute(pool)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// Whether attempt `attempt` still holds decision `decision`'s request,
/// claimed less than `max_age` seconds ago: the last check before its post
/// (a publisher paused past its claim's age must not post over the one
/// that took it over). When it does, the post begins now
/// (`post_started_at`).
pub async fn fence(
    pool: &PgPool,
    decision: Uuid,
    attempt: i32,
    max_age: f64,
) -> sqlx::Result<bool> {
    let r = sqlx::query!(
        "UPDATE review_messages SET post_started_at = now(), updated_at = now()
          WHERE decision_id = $1 AND attempt = $2 AND state = $3
            AND posting_since > now() - make_interval(secs => $4)",
        decision,
        attempt,
        R::Posting.as_str(),
        max_age,
    )
    .execute(pool)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// Attempt `attempt` certainly posted nothing and may be tried again (a
/// 429, a refused connection, a claim too old to post on): the claim is
/// given back. A request none of whose attempts had an unknown outcome
/// leaves nothing behind; otherwise it is unknown again, and the next
/// attempt reads the channel first (and posts only past the window of the
/// latest post).
pub async fn release(pool: &PgPool, decision: Uuid, attempt: i32) -> sqlx::Result<()> {
    sqlx::query!(
        "WITH gone AS (
             DELETE FROM review_messages
              WHERE decision_id = $1 AND attempt = $2 AND state = $3 AND unknown_since IS NULL
             RETURNING 1)
         UPDATE review_messages SET state = $4, updated_at = now()
          WHERE decision_id = $1 AND attempt = $2 AND state = $3 AND unknown_since IS NOT NULL",
        decision,
        attempt,
        R::Posting.as_str(),
        R::Unknown.as_str(),
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Slack refused the request for good (`code`): the CLI still reviews it.
pub async fn failed(pool: &PgPool, decision: Uuid, attempt: i32, code: &str) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE review_messages SET state = $4, error_code = $3, updated_at = now()
          WHERE decision_id = $1 AND attempt = $2 AND state = ANY($5)",
        decision,
        attempt,
        code,
        R::Failed.as_str(),
        &crate::moves(&[R::Posting], R::Failed),
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// A request of unknown outcome that no attempt drives any more (the review
/// channel unset, a kill switch engaged, its decision decided) is looked
/// for by the sweeper in `after` seconds, unless it is held already; so is
/// one whose attempt is still `posting` after `stale` seconds (its
/// publisher died). `false` when there was none to hand over.
pub async fn look_later(
    pool: &PgPool,
    decision: Uuid,
    after: f64,
    stale: f64,
) -> sqlx::Result<bool> {
    let r = sqlx::query!(
        "UPDATE review_messages
            SET state = $3, unknown_since = coalesce(unknown_since, post_started_at, posting_since),
                next_check_at = now() + make_interval(secs => $2), checks = 0, updated_at = now()
          WHERE decision_id = $1 AND next_check_at IS NULL
            AND (state = $3
                 OR (state = $4 AND posting_since < now() - make_interval(secs => $5)))",
        decision,
        after,
        R::Unknown.as_str(),
        R::Posting.as_str(),
        stale,
    )
    .execute(pool)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// A held request due for a late check (taken by [`take_late_checks`]).
#[derive(Debug, Clone)]
pub struct LateCheck {
    pub decision: Uuid,
    pub installation: Uuid,
    pub channel: String,
    /// When its first attempt of unknown outcome began (Unix seconds).
    pub since: f64,
    /// Late checks made before this one.
    pub checks: i32,
}

/// Takes up to `limit` held requests whose late check is due, leasing each
/// for `lease` seconds (another sweeper takes it after that, should this
/// one die).
pub async fn take_late_checks(
    pool: &PgPool,
    limit: i64,
    lease: f64,
) -> sqlx::Result<Vec<LateCheck>> {
    let rows = sqlx::query!(
        r#"UPDATE review_messages r SET next_check_at = now() + make_interval(secs => $3)
            WHERE r.decision_id IN (
                  SELECT decision_id FROM review_messages
                   WHERE next_check_at <= now() AND state = $2
                   ORDER BY next_check_at LIMIT $1 FOR UPDATE SKIP LOCKED)
           RETURNING r.decision_id, r.installation_id, r.channel_id, r.checks,
                     extract(epoch FROM coalesce(r.unknown_since, r.post_started_at, r.posting_since))::float8 AS "since!""#,
        limit,
        R::Unknown.as_str(),
        lease,
    )
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| LateCheck {
            decision: r.decision_id,
            installation: r.installation_id,
            channel: r.channel_id,
            since: r.since,
            checks: r.checks,
        })
        .collect())
}

/// After late check number `checks` found nothing: the next one in `next`
/// seconds, or none (`None`: the schedule ended, the request stays unknown
/// and no longer looked for).
pub async fn schedule_late_check(
    pool: &PgPool,
    decision: Uuid,
    checks: i32,
    next: Option<f64>,
) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE review_messages
            SET next_check_at = now() + make_interval(secs => $3), checks = $2 + 1,
                updated_at = now()
          WHERE decision_id = $1 AND state = $4 AND next_check_at IS NOT NULL",
        decision,
        checks,
        next,
        R::Unknown.as_str(),
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// A review request and what its decision came to.
#[derive(Debug, Clone)]
pub struct Posted {
    pub channel_id: String,
    pub state: R,
    /// When its first attempt of unknown outcome went to post, else its
    /// latest attempt (Unix seconds).
    pub since: f64,
    /// Seconds since its latest post began, by the database's clock.
    pub waited: f64,
    /// Held for the sweeper's late checks (it looks for the request).
    pub held: bool,
    /// Slack's ts (none until posted).
    pub ts: Option<String>,
    /// The outcome the message shows (`None`: still asking).
    pub shown: Option<String>,
    pub status: DecisionStatus,
    pub status_reason: Option<String>,
    pub reviewed_by: Option<String>,
    /// Where the answer was (or would have been) posted.
    pub answer_channel: String,
    /// The event's reply intent: its state (none: never claimed).
    pub intent_state: Option<IntentState>,
}

/// The decision's review request, in whatever state it is.
pub async fn request(pool: &PgPool, decision: Uuid) -> sqlx::Result<Option<Posted>> {
    let Some(r) = sqlx::query!(
        r#"SELECT r.channel_id, r.state,
                  extract(epoch FROM coalesce(r.unknown_since, r.post_started_at, r.posting_since))::float8 AS "since!",
                  extract(epoch FROM now() - coalesce(r.post_started_at, r.posting_since))::float8 AS "waited!",
                  r.next_check_at IS NOT NULL AS "held!",
                  r.ts, r.shown, d.status, d.status_reason, d.reviewed_by,
                  d.channel_id AS answer_channel,
                  (SELECT i.state FROM reply_intents i
                    WHERE i.installation_id = d.installation_id AND i.event_id = d.event_id
                      AND i.action_kind = d.action_kind) AS "intent_state?"
             FROM review_messages r JOIN decisions d ON d.id = r.decision_id
            WHERE r.decision_id = $1"#,
        decision
    )
    .fetch_optional(pool)
    .await?
    else {
        return Ok(None);
    };
    let decode = |what: &str, e: threadline_domain::state::UnknownState| {
        sqlx::Error::Decode(format!("{what}: {e}").into())
    };
    Ok(Some(Posted {
        channel_id: r.channel_id,
        state: R::parse(&r.state).map_err(|e| decode("review_messages.state", e))?,
        since: r.since,
        waited: r.waited,
        held: r.held,
        ts: r.ts,
        shown: r.shown,
        status: DecisionStatus::parse(&r.status).map_err(|e| decode("decisions.status", e))?,
        status_reason: r.status_reason,
        reviewed_by: r.reviewed_by,
        answer_channel: r.answer_channel,
        intent_state: r
            .intent_state
            .map(|s| IntentState::parse(&s).map_err(|e| decode("reply_intents.state", e)))
            .transpose()?,
    }))
}

/// The request now shows `shown`.
pub async fn mark_shown(pool: &PgPool, decision: Uuid, shown: &str) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE review_messages SET shown = $2, updated_at = now() WHERE decision_id = $1",
        decision,
        shown
    )
    .execute(pool)
    .await?;
    Ok(())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Approve,
    Reject,
}

impl Verdict {
    pub fn status(self) -> DecisionStatus {
        match self {
            Verdict::Approve => DecisionStatus::Approved,
            Verdict::Reject => DecisionStatus::Rejected,
        }
    }
}

/// A click on a review request, as the gateway verified it.
#[derive(Debug, Clone, Copy)]
pub struct Click<'a> {
    /// The installation the signed request resolved to.
    pub installation: Uuid,
    /// Where the clicked message is, and who clicked.
    pub channel: &'a str,
    pub message_ts: &'a str,
    pub user: &'a str,
}

/// Why a click was not counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The user is not on the installation's reviewer list.
    NotAReviewer,
    /// The decision belongs to another installation.
    OtherInstallation,
    /// The clicked message is not the decision's review request.
    NotTheRequest,
}

impl Refusal {
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::NotAReviewer => "not_a_reviewer",
            Refusal::OtherInstallation => "other_installation",
            Refusal::NotTheRequest => "not_the_request",
        }
    }
}

/// What a verdict came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decided {
    /// Recorded: approved (its proposal queued for the publisher with the
    /// approval) or rejected.
    Recorded(DecisionStatus),
    /// The decision was no longer waiting for review: it is `status` (by
    /// `reviewed_by`, if a reviewer decided it). Its review request is asked
    /// to show that.
    NotWaiting {
        status: DecisionStatus,
        reviewed_by: Option<String>,
    },
    Refused(Refusal),
    NotFound,
}

/// A reviewer's verdict on decision `id`, by `by` (an operator's name, or
/// `slack:<user id>` for a click), in one transaction with what it asks of
/// the publisher: an approval queues the proposal (the publisher re-runs
/// the staleness and kill-switch checks before it may post), a rejection
/// queues the update of the review request. A click counts only from a
/// reviewer of the decision's installation, on the decision's own review
/// request. A second verdict changes nothing.
pub async fn decide(
    pool: &PgPool,
    id: Uuid,
    verdict: Verdict,
    by: &str,
    click: Option<Click<'_>>,
) -> sqlx::Result<Decided> {
    let mut tx = pool.begin().await?;
    let Some(row) = sqlx::query!(
        r#"SELECT d.status, d.installation_id, d.reviewed_by, r.channel_id AS "request_channel?",
                  r.ts AS "request_ts?", r.decision_id IS NOT NULL AS "has_request!",
                  coalesce((SELECT s.reviewers FROM review_settings s
                             WHERE s.installation_id = d.installation_id), '{}') AS "reviewers!"
             FROM decisions d LEFT JOIN review_messages r ON r.decision_id = d.id
            WHERE d.id = $1
              FOR UPDATE OF d"#,
        id
    )
    .fetch_optional(&mut *tx)
    .await?
    else {
        return Ok(Decided::NotFound);
    };
    if let Some(c) = click {
        if row.installation_id != c.installation {
            return Ok(Decided::Refused(Refusal::OtherInstallation));
        }
        // A request whose post's outcome is unknown has no ts yet: a click
        // on a message in its channel that names this decision proves
        // Slack holds it there, and records it (or its outcome could never
        // be shown on it).
        let same_channel = row.request_channel.as_deref() == Some(c.channel);
        let unrecorded = same_channel && row.request_ts.is_none();
        if !unrecorded && (!same_channel || row.request_ts.as_deref() != Some(c.message_ts)) {
            return Ok(Decided::Refused(Refusal::NotTheRequest));
        }
        if !row.reviewers.iter().any(|r| r == c.user) {
            return Ok(Decided::Refused(Refusal::NotAReviewer));
        }
        if unrecorded && let Recorded::Copy(_) = posted(&mut tx, id, c.message_ts).await? {
            // (another copy was recorded meanwhile: this one is not the
            // request whose click counts)
            return Ok(Decided::Refused(Refusal::NotTheRequest));
        }
    }
    let status =
        DecisionStatus::parse(&row.status).map_err(|e| sqlx::Error::Decode(Box::new(e)))?;
    if status != DecisionStatus::Review {
        // The request shows what became of the decision (a rejection's or a
        // discard's outcome; an approval's own proposal is already queued
        // and shows it once it is published or discarded).
        if row.has_request && status != DecisionStatus::Approved {
            enqueue_outcome(&mut tx, id, status.as_str()).await?;
        }
        tx.commit().await?;
        return Ok(Decided::NotWaiting {
            status,
            reviewed_by: row.reviewed_by,
        });
    }
    let to = verdict.status();
    crate::decisions::review(&mut *tx, id, to, by).await?;
    match verdict {
        Verdict::Approve => {
            let d = crate::decisions::load(&mut *tx, id)
                .await?
                .ok_or(sqlx::Error::RowNotFound)?;
            crate::decisions::enqueue_proposal(&mut tx, &d, "approved").await?;
        }
        Verdict::Reject if row.has_request => {
            enqueue_outcome(&mut tx, id, to.as_str()).await?;
        }
        Verdict::Reject => {}
    }
    tx.commit().await?;
    Ok(Decided::Recorded(to))
}

/// Queues the decision's proposal for the publisher to show `status` on
/// its review request (it posts nothing for a decision that does not
/// stand).
async fn enqueue_outcome(conn: &mut PgConnection, id: Uuid, status: &str) -> sqlx::Result<()> {
    let d = crate::decisions::load(&mut *conn, id)
        .await?
        .ok_or(sqlx::Error::RowNotFound)?;
    crate::decisions::enqueue_proposal(conn, &d, &format!("outcome-{status}")).await
}

/// Why a decision waiting for review can no longer be posted as proposed:
/// what the publisher's checks would find at its approval (DESIGN §5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MovedOn {
    /// The thread changed since the decision's version.
    Stale,
    /// The question was deleted.
    SourceDeleted,
    /// A newer request in the thread will be answered instead.
    Superseded,
}

impl MovedOn {
    /// The status the decision is discarded with, and its reason.
    pub fn status(self) -> (DecisionStatus, &'static str) {
        match self {
            MovedOn::Stale => (DecisionStatus::Stale, "thread_changed"),
            MovedOn::SourceDeleted => (DecisionStatus::Cancelled, "source_deleted"),
            MovedOn::Superseded => (DecisionStatus::Superseded, "newer_trigger"),
        }
    }
}

/// Decisions waiting for review (at most `limit`, the longest waiting
/// first) whose thread has moved on in a way the publisher would refuse
/// at approval: a newer request, the question deleted, or any other change
/// committed to the thread. Unprocessed events are not looked at: they are
/// judged once they are processed. Candidates only: [`discard_if_moved_on`]
/// judges each again inside the transaction that discards it.
pub async fn moved_on(pool: &PgPool, limit: i64) -> sqlx::Result<Vec<Uuid>> {
    sqlx::query_scalar!(
        r#"SELECT d.id FROM decisions d
             JOIN threads th ON th.installation_id = d.installation_id AND th.channel_id = d.channel_id
                            AND th.root_ts = d.root_ts
            WHERE d.status = $1
              AND (th.version <> d.thread_version
                   OR EXISTS (SELECT 1 FROM thread_messages m
                               WHERE m.installation_id = d.installation_id AND m.channel_id = d.channel_id
                                 AND m.ts = d.source_ts AND m.deleted)
                   OR EXISTS (SELECT 1 FROM turns t JOIN thread_messages m
                                ON m.installation_id = t.installation_id AND m.channel_id = t.channel_id
                                   AND m.ts = t.ts
                               WHERE t.installation_id = d.installation_id AND t.channel_id = d.channel_id
                                 AND m.root_ts = d.root_ts AND t.ts::numeric > d.source_ts::numeric
                                 AND NOT m.deleted))
            ORDER BY d.updated_at
            LIMIT $2"#,
        DecisionStatus::Review.as_str(),
        limit
    )
    .fetch_all(pool)
    .await
}

/// Discards decision `id` if it is still waiting for review and its thread
/// has moved on, judged here, with the decision's row locked (a verdict
/// that committed first wins; a change that committed after the candidate
/// was listed is seen): the publisher's checks at approval, in their order
/// (changed → `stale`, question deleted → `cancelled`, a newer request →
/// `superseded`). In the same transaction, a stale or cancelled decision's
/// thread is handed to reconsideration, and the update of its review
/// request is queued (whether or not one is known now: a request being
/// posted at this moment is updated too), and what waited on the answer
/// goes on without it ([`crate::decisions::discarded`]). What it was
/// discarded as, and a copy of its deleted request asked in its place.
pub async fn discard_if_moved_on(
    conn: &mut PgConnection,
    id: Uuid,
) -> sqlx::Result<Option<(MovedOn, Vec<crate::actions::StoodIn>)>> {
    let Some(w) = sqlx::query!(
        r#"SELECT th.version <> d.thread_version AS "changed!",
                  coalesce((SELECT bool_or(m.deleted) FROM thread_messages m
                             WHERE m.installation_id = d.installation_id AND m.channel_id = d.channel_id
                               AND m.ts = d.source_ts), false) AS "deleted!",
                  EXISTS (SELECT 1 FROM turns t JOIN thread_messages m
                            ON m.installation_id = t.installation_id AND m.channel_id = t.channel_id
                               AND m.ts = t.ts
                           WHERE t.installation_id = d.installation_id AND t.channel_id = d.channel_id
                             AND m.root_ts = d.root_ts AND t.ts::numeric > d.source_ts::numeric
                             AND NOT m.deleted) AS "newer!"
             FROM decisions d
             JOIN threads th ON th.installation_id = d.installation_id AND th.channel_id = d.channel_id
                            AND th.root_ts = d.root_ts
            WHERE d.id = $1 AND d.status = $2
              FOR UPDATE OF d"#,
        id,
        DecisionStatus::Review.as_str(),
    )
    .fetch_optional(&mut *conn)
    .await?
    else {
        return Ok(None);
    };
    // (in the order the publisher's checks take them)
    let moved_on = if w.changed {
        MovedOn::Stale
    } else if w.deleted {
        MovedOn::SourceDeleted
    } else if w.newer {
        MovedOn::Superseded
    } else {
        return Ok(None);
    };
    let (status, reason) = moved_on.status();
    let discarded = sqlx::query_scalar!(
        r#"UPDATE decisions SET status = $2, status_reason = $3, updated_at = now()
            WHERE id = $1 AND status = ANY($4)
           RETURNING id"#,
        id,
        status.as_str(),
        reason,
        &crate::moves(&[DecisionStatus::Review], status),
    )
    .fetch_optional(&mut *conn)
    .await?
    .is_some();
    if !discarded {
        return Ok(None);
    }
    let d = crate::decisions::load(&mut *conn, id)
        .await?
        .ok_or(sqlx::Error::RowNotFound)?;
    let asked = match moved_on {
        MovedOn::Stale => {
            crate::decisions::enqueue_reconsider(conn, &d, "version_changed").await?;
            crate::decisions::discarded(conn, &d).await?
        }
        MovedOn::SourceDeleted => {
            crate::decisions::enqueue_reconsider(conn, &d, "source_deleted").await?;
            crate::decisions::discarded(conn, &d).await?
        }
        // (the newer request is answered instead)
        MovedOn::Superseded => Vec::new(),
    };
    crate::decisions::enqueue_proposal(conn, &d, &format!("outcome-{}", status.as_str())).await?;
    Ok(Some((moved_on, asked)))
}

/// The prefix of a failed request's code when its post's outcome was
/// unknown and the review channel could not be read to tell: Slack may
/// hold that request, so it is never asked again.
pub const UNREADABLE: &str = "unreadable:";

/// Asks in the review channel about every answer of the installation that
/// waits for review without a request there: one waiting from before the
/// channel was set up, or whose request Slack refused for good (that
/// attempt is forgotten: Slack holds nothing of it). A request whose post
/// may have landed (an attempt's outcome was unknown) is never asked
/// again. Their proposals are queued for the publisher in one
/// transaction; a request already posted, or on its way, is left as it is.
/// How many were queued.
pub async fn ask_waiting(pool: &PgPool, installation: Uuid) -> sqlx::Result<u64> {
    let mut tx = pool.begin().await?;
    sqlx::query!(
        "DELETE FROM review_messages r USING decisions d
          WHERE r.decision_id = d.id AND d.installation_id = $1 AND d.status = $2 AND r.state = $3
            AND NOT starts_with(coalesce(r.error_code, ''), $4) AND r.unknown_since IS NULL",
        installation,
        DecisionStatus::Review.as_str(),
        R::Failed.as_str(),
        UNREADABLE,
    )
    .execute(&mut *tx)
    .await?;
    let waiting = sqlx::query_scalar!(
        "SELECT d.id FROM decisions d
          WHERE d.installation_id = $1 AND d.status = $2
            AND NOT EXISTS (SELECT 1 FROM review_messages r WHERE r.decision_id = d.id)
          ORDER BY d.created_at",
        installation,
        DecisionStatus::Review.as_str(),
    )
    .fetch_all(&mut *tx)
    .await?;
    // (a tag of its own, so the bus's duplicate window never drops it)
    let tag = format!("ask-{}", Uuid::now_v7());
    for id in &waiting {
        let d = crate::decisions::load(&mut *tx, *id)
            .await?
            .ok_or(sqlx::Error::RowNotFound)?;
        crate::decisions::enqueue_proposal(&mut tx, &d, &tag).await?;
    }
    tx.commit().await?;
    Ok(waiting.len() as u64)
}
