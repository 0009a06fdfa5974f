//! Decisions: what the model (or the fallback) answered for one event at
//! one thread version, and what a publisher may post. The row is the truth
//! of a post: the bus message only names it. A decision is claimed before
//! the model call with a lease (so one replica calls the model for a
//! binding), then settled by compare-and-set; no lock is held while the
//! model runs.

use prost::Message as _;
use sqlx::{PgConnection, PgExecutor, PgPool};
use threadline_domain::sources::Source;
use threadline_domain::state::{DecisionStatus, IntentState, Machine as _};
use threadline_proto::v1::{ProposalReady, SCHEMA_VERSION, proposal_ready};
use uuid::Uuid;

use crate::moves;

/// A decision as publishing it needs it.
#[derive(Debug, Clone)]
pub struct Decision {
    pub id: Uuid,
    pub receipt_id: Uuid,
    pub installation_id: Uuid,
    pub event_id: String,
    pub channel_id: String,
    pub root_ts: String,
    pub source_ts: String,
    pub thread_version: i64,
    pub action_kind: String,
    pub status: DecisionStatus,
    pub review_reasons: Vec<String>,
    pub fallback: bool,
    pub model_config_id: Option<String>,
    pub output_hash: Option<String>,
    pub body_text: Option<String>,
    pub body_blocks: Option<serde_json::Value>,
}

/// A decision's status as the database stored it, as its machine's state.
fn status_of(s: &str) -> sqlx::Result<DecisionStatus> {
    DecisionStatus::parse(s)
        .map_err(|e| sqlx::Error::Decode(format!("decisions.status: {e}").into()))
}

pub async fn load(conn: impl PgExecutor<'_>, id: Uuid) -> sqlx::Result<Option<Decision>> {
    let Some(r) = sqlx::query!(
        "SELECT id, receipt_id, installation_id, event_id, channel_id, root_ts, source_ts, thread_version,
                action_kind, status, review_reasons, fallback, model_config_id, output_hash, body_text,
                body_blocks
           FROM decisions WHERE id = $1",
        id
    )
    .fetch_optional(conn)
    .await?
    else {
        return Ok(None);
    };
    Ok(Some(Decision {
        id: r.id,
        receipt_id: r.receipt_id,
        installation_id: r.installation_id,
        event_id: r.event_id,
        channel_id: r.channel_id,
        root_ts: r.root_ts,
        source_ts: r.source_ts,
        thread_version: r.thread_version,
        action_kind: r.action_kind,
        status: status_of(&r.status)?,
        review_reasons: r.review_reasons,
        fallback: r.fallback,
        model_config_id: r.model_config_id,
        output_hash: r.output_hash,
        body_text: r.body_text,
        body_blocks: r.body_blocks,
    }))
}

/// A decision as its publisher reads it before any claim.
#[derive(Debug, Clone)]
pub struct ForPost {
    pub decision: Decision,
    /// Whether links may unfurl: the channel's setting, else the
    /// installation's, else not.
    pub unfurl: bool,
    /// An earlier attempt of the decision's reply intent whose outcome is
    /// not known: to be settled from evidence before anything else.
    pub unsettled: Option<Uuid>,
    /// Whether answers may be streamed here: the channel's setting, else
    /// the installation's, else yes.
    pub streaming_allowed: bool,
    /// The event's reply intent as it was read: its state and whether an
    /// attempt's outcome was ever unknown or an attempt streamed (none: no
    /// intent yet).
    pub intent: Option<(IntentState, bool)>,
    /// The person's action was streamed an answer already, through the
    /// deleted message the decision's source stands in for (its copy,
    /// `person_actions.stood_for`): one action streams once at most, so
    /// this answer is posted whole.
    pub action_streamed: bool,
}

/// A decision with what posting it needs, in one statement: the channel's
/// unfurl policy, and the event's reply intent if an earlier attempt's
/// outcome is unknown: `unknown`, `reconciling`, or `sending` for longer
/// than `sending_stale` seconds (its worker died or froze between the claim
/// and recording the outcome; configured longer than twice the Slack
/// timeout, so a post still in flight is never taken for dead), which this
/// statement moves to `unknown`.
pub async fn load_for_post(
    pool: &PgPool,
    id: Uuid,
    sending_stale: f64,
) -> sqlx::Result<Option<ForPost>> {
    let row = sqlx::query!(
        r#"WITH d AS (
            SELECT * FROM decisions WHERE id = $1),
         i AS (
            SELECT r.id, r.state, r.ever_unknown OR r.streamed AS ever_unknown, extract(epoch FROM now() - r.sending_since)::float8 AS sending_for
              FROM reply_intents r JOIN d
                ON r.installation_id = d.installation_id AND r.event_id = d.event_id
               AND r.action_kind = d.action_kind),
         gone AS (
            UPDATE reply_intents r SET state = $3, unknown_since = now(), ever_unknown = true, updated_at = now()
              FROM i WHERE r.id = i.id AND r.state = ANY($4) AND i.sending_for > $2
            RETURNING r.id)
         SELECT d.id, d.receipt_id, d.installation_id, d.event_id, d.channel_id, d.root_ts, d.source_ts,
                d.thread_version, d.action_kind, d.status, d.review_reasons, d.fallback, d.model_config_id,
                d.output_hash, d.body_text, d.body_blocks,
                coalesce((SELECT c.unfurl_allowed FROM channel_policies c
                           WHERE c.installation_id = d.installation_id AND c.channel_id = d.channel_id),
                         (SELECT p.unfurl_allowed FROM installation_policies p
                           WHERE p.installation_id = d.installation_id),
                         false) AS "unfurl!",
                coalesce((SELECT c.streaming_allowed FROM channel_policies c
                           WHERE c.installation_id = d.installation_id AND c.channel_id = d.channel_id),
                         (SELECT p.streaming_allowed FROM installation_policies p
                           WHERE p.installation_id = d.installation_id),
                         true) AS "streaming_allowed!",
                (SELECT state FROM i LIMIT 1) AS "intent_state?",
                (SELECT ever_unknown FROM i LIMIT 1) AS "intent_ever_unknown?",
                EXISTS (SELECT 1 FROM person_actions a
                          JOIN decisions k ON k.installation_id = a.installation_id AND k.channel_id = a.channel_id
                                          AND k.root_ts IN (d.root_ts, a.stood_for) AND k.source_ts = a.stood_for
                          JOIN reply_intents r ON r.installation_id = k.installation_id AND r.event_id = k.event_id
                                              AND r.action_kind = k.action_kind
                         WHERE a.installation_id = d.installation_id AND a.channel_id = d.channel_id
                           AND a.ts = d.source_ts AND a.stood_for IS NOT NULL AND r.streamed) AS "action_streamed!",
                (SELECT u.id FROM (SELECT id FROM i WHERE state = ANY($5) UNION SELECT id FROM gone) u
                  LIMIT 1) AS unsettled
           FROM d"#,
        id,
        sending_stale,
        IntentState::Unknown.as_str(),
        &moves(&[IntentState::Sending], IntentState::Unknown),
        &[IntentState::Unknown.as_str(), IntentState::Reconciling.as_str()] as &[&str]
    )
    .fetch_optional(pool)
    .await?;
    let Some(r) = row else {
        return Ok(None);
    };
    let intent = match r.intent_state {
        Some(s) => Some((
            IntentState::parse(&s)
                .map_err(|e| sqlx::Error::Decode(format!("reply_intents.state: {e}").into()))?,
            r.intent_ever_unknown.unwrap_or(false),
        )),
        None => None,
    };
    Ok(Some(ForPost {
        decision: Decision {
            id: r.id,
            receipt_id: r.receipt_id,
            installation_id: r.installation_id,
            event_id: r.event_id,
            channel_id: r.channel_id,
            root_ts: r.root_ts,
            source_ts: r.source_ts,
            thread_version: r.thread_version,
            action_kind: r.action_kind,
            status: status_of(&r.status)?,
            review_reasons: r.review_reasons,
            fallback: r.fallback,
            model_config_id: r.model_config_id,
            output_hash: r.output_hash,
            body_text: r.body_text,
            body_blocks: r.body_blocks,
        },
        unfurl: r.unfurl,
        unsettled: r.unsettled,
        streaming_allowed: r.streaming_allowed,
        intent,
        action_streamed: r.action_streamed,
    }))
}

/// The bus message naming a decision; every field comes from the row, never
/// from model output. The publisher posts what the row holds; the text
/// still travels for a publisher of the previous release during a rolling
/// upgrade (in the outbox only until the relay publishes it, like an
/// event's payload).
pub fn proposal(d: &Decision) -> ProposalReady {
    ProposalReady {
        schema_version: SCHEMA_VERSION,
        decision_id: d.id.to_string(),
        receipt_id: d.receipt_id.to_string(),
        installation_id: d.installation_id.to_string(),
        event_id: d.event_id.clone(),
        channel_id: d.channel_id.clone(),
        root_ts: d.root_ts.clone(),
        source_ts: d.source_ts.clone(),
        thread_version: d.thread_version,
        action_kind: d.action_kind.clone(),
        needs_review: !d.review_reasons.is_empty(),
        fallback: d.fallback,
        text: d.body_text.clone().unwrap_or_default(),
        blocks_json: d
            .body_blocks
            .as_ref()
            .map(|b| b.to_string())
            .unwrap_or_default(),
        body_hash: d.output_hash.clone().unwrap_or_default(),
        review_reasons: d.review_reasons.clone(),
        model_config_id: d.model_config_id.clone().unwrap_or_default(),
        stream: false,
        assistant: String::new(),
        assistant_title: String::new(),
        work: Some(proposal_ready::Work::Answer(
            threadline_proto::v1::Answer {},
        )),
    }
}

/// The message id of a decision's proposal: `prop:<decision>`, or
/// `prop:<decision>:<tag>` when it is handed over again on purpose (an
/// approval, an operator's re-post), so that the stream's duplicate window
/// drops a repeat of the same hand-over but not a new one.
pub fn proposal_msg_id(id: Uuid, tag: Option<&str>) -> String {
    match tag {
        Some(t) => format!("prop:{id}:{t}"),
        None => format!("prop:{id}"),
    }
}

/// Queues the decision's proposal in the outbox inside the caller's
/// transaction: the state change that asks for the post (an approval, an
/// operator's re-post) and the request to post commit together, and a
/// relay publishes it.
pub async fn enqueue_proposal(
    conn: &mut PgConnection,
    d: &Decision,
    tag: &str,
) -> sqlx::Result<()> {
    crate::outbox::enqueue(
        conn,
        d.installation_id,
        d.receipt_id,
        threadline_domain::topic::Topic::Proposals,
        &proposal_msg_id(d.id, Some(tag)),
        proposal(d).encode_to_vec(),
    )
    .await
}

pub enum Claim {
    /// This worker calls the model for the decision.
    Mine(Uuid),
    /// Another worker holds the lease; try again after it may have expired.
    Busy,
    /// Already settled with this status.
    Settled(Uuid, DecisionStatus),
}

/// What a decision is bound to: the event and the thread version its
/// context read, and what that context held.
pub struct Binding<'a> {
    pub receipt: Uuid,
    pub installation: Uuid,
    pub event_id: &'a str,
    pub channel: &'a str,
    pub root_ts: &'a str,
    pub source_ts: &'a str,
    pub version: i64,
    /// The Slack ts of every message of the context.
    pub context_ts: Vec<String>,
    /// The oldest reply a truncated context kept (None: not truncated).
    pub context_floor_ts: Option<String>,
    /// The channel's pseudonym for the audit log, when this process holds
    /// the audit key.
    pub channel_ref: Option<String>,
}

impl<'a> Binding<'a> {
    pub fn of(
        ctx: &'a threadline_proto::v1::ContextReady,
        receipt: Uuid,
        installation: Uuid,
        channel_ref: Option<String>,
    ) -> Self {
        let context_ts: Vec<String> = ctx.messages.iter().map(|m| m.ts.clone()).collect();
        let context_floor_ts = ctx.truncated.then(|| {
            ctx.messages
                .iter()
                .filter(|m| m.ts != ctx.root_ts)
                .map(|m| m.ts.clone())
                .min_by(|a, b| ts_order(a, b))
                .unwrap_or_else(|| ctx.source_ts.clone())
        });
        Self {
            receipt,
            installation,
            event_id: &ctx.event_id,
            channel: &ctx.channel_id,
            root_ts: &ctx.root_ts,
            source_ts: &ctx.source_ts,
            version: ctx.thread_version,
            context_ts,
            context_floor_ts,
            channel_ref,
        }
    }
}

/// Slack timestamps in time order (`secs.micros`).
fn ts_order(a: &str, b: &str) -> std::cmp::Ordering {
    let key = |t: &str| {
        let (s, f) = t.split_once('.').unwrap_or((t, "0"));
        (s.parse::<u64>().unwrap_or(0), f.parse::<u64>().unwrap_or(0))
    };
    key(a).cmp(&key(b))
}

/// Claims the decision of a binding for a model call: a new one, or one
/// whose holder's lease ran out (it crashed), or one held by an earlier
/// delivery of this very message (that delivery gave up).
pub async fn claim(
    pool: &PgPool,
    b: &Binding<'_>,
    lease_secs: f64,
    message_seq: Option<u64>,
) -> sqlx::Result<Claim> {
    let (receipt, installation, event_id, channel, root_ts, source_ts, version) = (
        b.receipt,
        b.installation,
        b.event_id,
        b.channel,
        b.root_ts,
        b.source_ts,
        b.version,
    );
    let seq = message_seq.and_then(|s| i64::try_from(s).ok());
    let id = Uuid::now_v7();
    let inserted = sqlx::query_scalar!(
        "INSERT INTO decisions (id, receipt_id, installation_id, event_id, channel_id, root_ts, source_ts, thread_version,
                                status, lease_until, lease_message_seq, context_ts, context_floor_ts, channel_ref)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'calling', now() + make_interval(secs => $9), $11, $12, $13,
                 -- the pseudonym the context-builder wrote for this event when
                 -- this process holds no audit key
                 coalesce($10, (SELECT a.channel_ref FROM audit_log a
                                 WHERE a.installation_id = $3 AND a.event_id = $4 AND a.channel_ref IS NOT NULL
                                 LIMIT 1)))
         ON CONFLICT ON CONSTRAINT decisions_binding DO NOTHING
         RETURNING id",
        id,
        receipt,
        installation,
        event_id,
        channel,
        root_ts,
        source_ts,
        version,
        lease_secs,
        b.channel_ref.as_deref(),
        seq,
        &b.context_ts,
        b.context_floor_ts.as_deref(),
    )
    .fetch_optional(pool)
    .await?;
    if let Some(id) = inserted {
        return Ok(Claim::Mine(id));
    }
    // Taken over once the holder's lease has run out (it crashed), or by a
    // redelivery of the very message whose earlier delivery holds it (that
    // delivery gave up: JetStream does not redeliver a message in hand).
    let taken = sqlx::query_scalar!(
        "UPDATE decisions SET lease_until = now() + make_interval(secs => $3), lease_message_seq = $4,
                              updated_at = now()
          WHERE receipt_id = $1 AND thread_version = $2 AND status = 'calling'
            AND (lease_until < now() OR lease_message_seq = $4)
         RETURNING id",
        receipt,
        version,
        lease_secs,
        seq,
    )
    .fetch_optional(pool)
    .await?;
    if let Some(id) = taken {
        return Ok(Claim::Mine(id));
    }
    let row = sqlx::query!(
        "SELECT id, status FROM decisions WHERE receipt_id = $1 AND thread_version = $2",
        receipt,
        version,
    )
    .fetch_one(pool)
    .await?;
    let (id, status) = (row.id, row.status);
    let status = DecisionStatus::parse(&status).map_err(|e| sqlx::Error::Decode(Box::new(e)))?;
    Ok(if status == DecisionStatus::Calling {
        Claim::Busy
    } else {
        Claim::Settled(id, status)
    })
}

pub struct Settled<'a> {
    pub status: DecisionStatus,
    pub reason: Option<&'a str>,
    pub action_kind: &'a str,
    pub review_reasons: Vec<String>,
    pub model_config_id: &'a str,
    pub provider: &'a str,
    pub fallback: bool,
    pub prompt_tokens: Option<i32>,
    pub completion_tokens: Option<i32>,
    pub output_hash: Option<&'a str>,
    pub body_text: Option<&'a str>,
    pub body_blocks: Option<&'a serde_json::Value>,
    /// The links the answer took from what it read (see
    /// `threadline_domain::sources`): no text `body_text` does not hold.
    pub sources: &'a [Source],
}

/// `calling → proposed | review | suppressed | cancelled`, compare-and-set:
/// only a decision still being called is settled, and only by a move the
/// machine allows from there. Returns the row as settled (none when the
/// lease was lost and another worker settled it).
pub async fn settle(pool: &PgPool, id: Uuid, s: &Settled<'_>) -> sqlx::Result<Option<Decision>> {
    Ok(settle_many(pool, &[Settle::of(id, s)])
        .await?
        .pop()
        .flatten())
}

/// One decision to claim in a batch ([`claim_many`]): a [`Binding`] with
/// what the claim needs, owned so that it can wait for its batch.
#[derive(Debug, Clone)]
pub struct ClaimRequest {
    pub receipt: Uuid,
    pub installation: Uuid,
    pub event_id: String,
    pub channel: String,
    pub root_ts: String,
    pub source_ts: String,
    pub version: i64,
    pub context_ts: Vec<String>,
    pub context_floor_ts: Option<String>,
    pub channel_ref: Option<String>,
    /// The stream sequence of the message asking (a redelivery of it takes
    /// its own earlier delivery's lease over).
    pub message_seq: Option<u64>,
    pub lease_secs: f64,
    /// The kill-switch feature checked with the claim.
    pub feature: String,
}

impl ClaimRequest {
    pub fn of(b: &Binding<'_>, lease_secs: f64, message_seq: Option<u64>, feature: &str) -> Self {
        Self {
            receipt: b.receipt,
            installation: b.installation,
            event_id: b.event_id.to_owned(),
            channel: b.channel.to_owned(),
            root_ts: b.root_ts.to_owned(),
            source_ts: b.source_ts.to_owned(),
            version: b.version,
            context_ts: b.context_ts.clone(),
            context_floor_ts: b.context_floor_ts.clone(),
            channel_ref: b.channel_ref.clone(),
            message_seq,
            lease_secs,
            feature: feature.to_owned(),
        }
    }
}

/// What [`claim_many`] found for one request, with what the model call
/// must know first, read by the same statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimFound {
    /// None: not decidable from this statement's snapshot (a binding
    /// another transaction created while this statement ran, or a second
    /// request for a binding earlier in the same batch): claim it alone
    /// with [`claim`].
    pub claim: Option<ClaimOutcome>,
    /// The installation exists and is active.
    pub active: bool,
    /// The kill switch engaged for the installation and the feature.
    pub switch: Option<String>,
}

/// [`Claim`] as a value (comparable, for tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimOutcome {
    Mine(Uuid),
    Busy,
    Settled(Uuid, DecisionStatus),
}

impl From<ClaimOutcome> for Claim {
    fn from(c: ClaimOutcome) -> Self {
        match c {
            ClaimOutcome::Mine(id) => Claim::Mine(id),
            ClaimOutcome::Busy => Claim::Busy,
            ClaimOutcome::Settled(id, s) => Claim::Settled(id, s),
        }
    }
}

/// [`claim`] for many bindings in one statement (one round trip, one
/// commit), with each installation's status and engaged kill switch read
/// alongside. Answers every request, in order. Two requests for one
/// binding never both get it: a new row goes to the request that created
/// it (by its own id), a takeover to the one request the update joined.
pub async fn claim_many(pool: &PgPool, reqs: &[ClaimRequest]) -> sqlx::Result<Vec<ClaimFound>> {
    let n = reqs.len();
    let col = |f: &dyn Fn(&ClaimRequest) -> String| reqs.iter().map(f).collect::<Vec<String>>();
    let receipts: Vec<Uuid> = reqs.iter().map(|r| r.receipt).collect();
    let installations: Vec<Uuid> = reqs.iter().map(|r| r.installation).collect();
    let versions: Vec<i64> = reqs.iter().map(|r| r.version).collect();
    let seqs: Vec<Option<i64>> = reqs
        .iter()
        .map(|r| r.message_seq.and_then(|s| i64::try_from(s).ok()))
        .collect();
    let context_ts: Vec<serde_json::Value> = reqs
        .iter()
        .map(|r| serde_json::Value::from(r.context_ts.clone()))
        .collect();
    let floors: Vec<Option<String>> = reqs.iter().map(|r| r.context_floor_ts.clone()).collect();
    let refs: Vec<Option<String>> = reqs.iter().map(|r| r.channel_ref.clone()).collect();
    let ids: Vec<Uuid> = (0..n).map(|_| Uuid::now_v7()).collect();
    let leases: Vec<f64> = reqs.iter().map(|r| r.lease_secs).collect();
    let rows = sqlx::query!(
        r#"WITH u AS (
            SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::text[], $5::text[], $6::text[], $7::int8[],
                                 $8::int8[], $9::jsonb[], $10::text[], $11::text[], $12::uuid[], $13::float8[],
                                 $14::text[])
                   WITH ORDINALITY AS u(receipt, installation, event_id, channel, root_ts, source_ts, version, seq,
                                        context_ts, floor_ts, channel_ref, new_id, lease, feature, n)),
         ins AS (
            INSERT INTO decisions (id, receipt_id, installation_id, event_id, channel_id, root_ts, source_ts,
                                   thread_version, status, lease_until, lease_message_seq, context_ts,
                                   context_floor_ts, channel_ref)
            SELECT u.new_id, u.receipt, u.installation, u.event_id, u.channel, u.root_ts, u.source_ts, u.version,
                   'calling', now() + make_interval(secs => u.lease), u.seq,
                   ARRAY(SELECT jsonb_array_elements_text(u.context_ts)), u.floor_ts,
                   -- the pseudonym the context-builder wrote for this event
                   -- when this process holds no audit key
                   coalesce(u.channel_ref, (SELECT a.channel_ref FROM audit_log a
                                             WHERE a.installation_id = u.installation AND a.event_id = u.event_id
                                               AND a.channel_ref IS NOT NULL
                                             LIMIT 1))
              FROM u ORDER BY u.receipt, u.version, u.n
            ON CONFLICT ON CONSTRAINT decisions_binding DO NOTHING
            RETURNING id),
         -- taken over once the holder's lease has run out (it crashed), or
         -- by a redelivery of the very message whose earlier delivery holds
         -- it (that delivery gave up)
         took AS (
            UPDATE decisions d
               SET lease_until = now() + make_interval(secs => u.lease), lease_message_seq = u.seq,
                   updated_at = now()
              FROM u
             WHERE d.receipt_id = u.receipt AND d.thread_version = u.version AND d.status = 'calling'
               AND (d.lease_until < now() OR d.lease_message_seq = u.seq)
            RETURNING u.n, d.id)
         SELECT u.n AS "n!", coalesce(ins.id, took.id, d.id) AS "id?",
                (ins.id IS NOT NULL OR took.id IS NOT NULL) AS "mine!", d.status AS "status?",
                coalesce((SELECT i.status = 'active' FROM installations i WHERE i.id = u.installation), false)
                    AS "active!",
                (SELECT e.switch FROM engaged_switch(u.installation::text, u.feature) e) AS "switch?"
           FROM u
           LEFT JOIN ins ON ins.id = u.new_id
           LEFT JOIN took ON took.n = u.n
           LEFT JOIN decisions d ON d.receipt_id = u.receipt AND d.thread_version = u.version
          ORDER BY u.n"#,
        &receipts,
        &installations,
        &col(&|r| r.event_id.clone()),
        &col(&|r| r.channel.clone()),
        &col(&|r| r.root_ts.clone()),
        &col(&|r| r.source_ts.clone()),
        &versions,
        &seqs as &[Option<i64>],
        &context_ts,
        &floors as &[Option<String>],
        &refs as &[Option<String>],
        &ids,
        &leases,
        &col(&|r| r.feature.clone()),
    )
    .fetch_all(pool)
    .await?;
    rows.into_iter()
        .map(|r| {
            let claim = match (r.id, r.mine, r.status.as_deref()) {
                (Some(id), true, _) => Some(ClaimOutcome::Mine(id)),
                (Some(id), false, Some(status)) => {
                    let status = DecisionStatus::parse(status)
                        .map_err(|e| sqlx::Error::Decode(Box::new(e)))?;
                    Some(if status == DecisionStatus::Calling {
                        ClaimOutcome::Busy
                    } else {
                        ClaimOutcome::Settled(id, status)
                    })
                }
                _ => None,
            };
            Ok(ClaimFound {
                claim,
                active: r.active,
                switch: r.switch,
            })
        })
        .collect()
}

/// A settle waiting for its batch ([`settle_many`]): [`Settled`], owned.
#[derive(Debug, Clone)]
pub struct Settle {
    pub id: Uuid,
    pub status: DecisionStatus,
    pub reason: Option<String>,
    pub action_kind: String,
    pub review_reasons: Vec<String>,
    pub model_config_id: String,
    pub provider: String,
    pub fallback: bool,
    pub prompt_tokens: Option<i32>,
    pub completion_tokens: Option<i32>,
    pub output_hash: Option<String>,
    pub body_text: Option<String>,
    pub body_blocks: Option<serde_json::Value>,
    pub sources: Vec<String>,
}

impl Settle {
    pub fn of(id: Uuid, s: &Settled<'_>) -> Self {
        Self {
            id,
            status: s.status,
            reason: s.reason.map(str::to_owned),
            action_kind: s.action_kind.to_owned(),
            review_reasons: s.review_reasons.clone(),
            model_config_id: s.model_config_id.to_owned(),
            provider: s.provider.to_owned(),
            fallback: s.fallback,
            prompt_tokens: s.prompt_tokens,
            completion_tokens: s.completion_tokens,
            output_hash: s.output_hash.map(str::to_owned),
            body_text: s.body_text.map(str::to_owned),
            body_blocks: s.body_blocks.cloned(),
            sources: s.sources.iter().map(|x| x.url().to_owned()).collect(),
        }
    }
}

/// [`settle`] for many decisions in one statement: each by
/// compare-and-set from `calling`, by a move the machine allows. Answers
/// every settle, in order: the row as settled, or none where the lease was
/// lost and another worker settled it.
pub async fn settle_many(pool: &PgPool, all: &[Settle]) -> sqlx::Result<Vec<Option<Decision>>> {
    let ids: Vec<Uuid> = all.iter().map(|s| s.id).collect();
    let statuses: Vec<String> = all.iter().map(|s| s.status.as_str().to_owned()).collect();
    // The one start each settle may move from: `calling`, where the
    // machine allows the move (`calling → calling` is a lease takeover,
    // not a settle: no start, so no row).
    let from: Vec<Option<String>> = all
        .iter()
        .map(|s| {
            (s.status != DecisionStatus::Calling)
                .then(|| {
                    moves(&[DecisionStatus::Calling], s.status)
                        .into_iter()
                        .next()
                })
                .flatten()
        })
        .collect();
    let reasons: Vec<Option<String>> = all.iter().map(|s| s.reason.clone()).collect();
    let kinds: Vec<String> = all.iter().map(|s| s.action_kind.clone()).collect();
    let review: Vec<serde_json::Value> = all
        .iter()
        .map(|s| serde_json::Value::from(s.review_reasons.clone()))
        .collect();
    let configs: Vec<String> = all.iter().map(|s| s.model_config_id.clone()).collect();
    let providers: Vec<String> = all.iter().map(|s| s.provider.clone()).collect();
    let fallbacks: Vec<bool> = all.iter().map(|s| s.fallback).collect();
    let prompt: Vec<Option<i32>> = all.iter().map(|s| s.prompt_tokens).collect();
    let completion: Vec<Option<i32>> = all.iter().map(|s| s.completion_tokens).collect();
    let hashes: Vec<Option<String>> = all.iter().map(|s| s.output_hash.clone()).collect();
    let bodies: Vec<Option<String>> = all.iter().map(|s| s.body_text.clone()).collect();
    let blocks: Vec<Option<serde_json::Value>> =
        all.iter().map(|s| s.body_blocks.clone()).collect();
    let sources: Vec<serde_json::Value> = all
        .iter()
        .map(|s| serde_json::Value::from(s.sources.clone()))
        .collect();
    let rows = sqlx::query!(
        r#"WITH u AS (
            SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::jsonb[],
                                 $7::text[], $8::text[], $9::bool[], $10::int4[], $11::int4[], $12::text[],
                                 $13::text[], $14::jsonb[], $16::jsonb[])
                   WITH ORDINALITY AS u(id, status, from_status, reason, action_kind, review_reasons,
                                        model_config_id, provider, fallback, prompt_tokens, completion_tokens,
                                        output_hash, body_text, body_blocks, sources, n)),
         done AS (
            UPDATE decisions d
               SET status = u.status, status_reason = u.reason, action_kind = u.action_kind,
                   review_reasons = ARRAY(SELECT jsonb_array_elements_text(u.review_reasons)),
                   model_config_id = u.model_config_id, provider = u.provider, fallback = u.fallback,
                   prompt_tokens = u.prompt_tokens, completion_tokens = u.completion_tokens,
                   output_hash = u.output_hash, body_text = u.body_text, body_blocks = u.body_blocks,
                   sources = ARRAY(SELECT jsonb_array_elements_text(u.sources)),
                   lease_until = NULL, updated_at = now()
              FROM u
             WHERE d.id = u.id AND d.status = u.from_status
            RETURNING u.n, d.id, d.receipt_id, d.installation_id, d.event_id, d.channel_id, d.root_ts, d.source_ts,
                      d.thread_version, d.action_kind, d.status, d.review_reasons, d.fallback, d.model_config_id,
                      d.output_hash, d.body_text, d.body_blocks, d.prompt_tokens, d.completion_tokens),
         -- A decided request leaves its installation's share of the
         -- model's queue (whatever became of the settle: a decision
         -- discarded meanwhile is decided too), in whatever state its
         -- place is: a resumed request may be decided before its mark as
         -- admitted, which then finds nothing to move...
         freed AS (
            DELETE FROM tenant_work w USING decisions d, u
             WHERE d.id = u.id AND w.receipt_id = d.receipt_id AND w.state = ANY($15)),
         -- ...and what its model call used counts against today's tokens.
         spent AS (
            INSERT INTO tenant_tokens (installation_id, day, tokens)
            SELECT done.installation_id, (now() AT TIME ZONE 'UTC')::date,
                   sum(coalesce(done.prompt_tokens, 0) + coalesce(done.completion_tokens, 0))
              FROM done GROUP BY done.installation_id
            HAVING sum(coalesce(done.prompt_tokens, 0) + coalesce(done.completion_tokens, 0)) > 0
            ON CONFLICT (installation_id, day) DO UPDATE SET tokens = tenant_tokens.tokens + EXCLUDED.tokens)
         SELECT u.n AS "n!", done.id AS "id?", done.receipt_id AS "receipt_id?",
                done.installation_id AS "installation_id?", done.event_id AS "event_id?",
                done.channel_id AS "channel_id?", done.root_ts AS "root_ts?", done.source_ts AS "source_ts?",
                done.thread_version AS "thread_version?", done.action_kind AS "action_kind?",
                done.status AS "status?", done.review_reasons AS "review_reasons?", done.fallback AS "fallback?",
                done.model_config_id, done.output_hash, done.body_text, done.body_blocks
           FROM u LEFT JOIN done ON done.n = u.n
          ORDER BY u.n"#,
        &ids,
        &statuses,
        &from as &[Option<String>],
        &reasons as &[Option<String>],
        &kinds,
        &review,
        &configs,
        &providers,
        &fallbacks,
        &prompt as &[Option<i32>],
        &completion as &[Option<i32>],
        &hashes as &[Option<String>],
        &bodies as &[Option<String>],
        &blocks as &[Option<serde_json::Value>],
        &[
            threadline_domain::state::WorkState::Admitted.name(),
            threadline_domain::state::WorkState::Parked.name()
        ] as &[&str],
        &sources,
    )
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| {
            Some(Decision {
                id: r.id?,
                receipt_id: r.receipt_id?,
                installation_id: r.installation_id?,
                event_id: r.event_id?,
                channel_id: r.channel_id?,
                root_ts: r.root_ts?,
                source_ts: r.source_ts?,
                thread_version: r.thread_version?,
                action_kind: r.action_kind?,
                status: status_of(&r.status?).ok()?,
                review_reasons: r.review_reasons?,
                fallback: r.fallback?,
                model_config_id: r.model_config_id,
                output_hash: r.output_hash,
                body_text: r.body_text,
                body_blocks: r.body_blocks,
            })
        })
        .collect())
}

/// An intent held for an operator keeps its decision: a newer proposal of
/// the event (`decision`, not the one the intent names) is cancelled.
pub async fn cancel_for_held_intent(
    pool: &PgPool,
    decision: Uuid,
    intent: Uuid,
) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE decisions SET status = $3, status_reason = 'intent_held', updated_at = now()
          WHERE id = $1 AND status = ANY($4)
            AND id <> (SELECT decision_id FROM reply_intents WHERE id = $2)",
        decision,
        intent,
        DecisionStatus::Cancelled.as_str(),
        &moves(
            &[DecisionStatus::Proposed, DecisionStatus::Approved],
            DecisionStatus::Cancelled
        )
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Human review so far: decisions waiting for review, and reviewed ones
/// approved and rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReviewCounts {
    pub waiting: i64,
    pub approved: i64,
    pub rejected: i64,
}

pub async fn review_counts(pool: &PgPool) -> sqlx::Result<ReviewCounts> {
    sqlx::query_as!(
        ReviewCounts,
        r#"SELECT (SELECT count(*) FROM decisions WHERE status = 'review') AS "waiting!",
                  count(*) FILTER (WHERE status <> 'rejected') AS "approved!",
                  count(*) FILTER (WHERE status = 'rejected') AS "rejected!"
             FROM decisions WHERE reviewed_by IS NOT NULL"#
    )
    .fetch_one(pool)
    .await
}

/// A decision waiting for a reviewer, as listed (no text).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Waiting {
    pub id: Uuid,
    pub installation_id: Uuid,
    pub event_id: String,
    pub channel_id: String,
    pub thread_version: i64,
    pub action_kind: String,
    pub review_reasons: Vec<String>,
}

/// Decisions waiting for review, oldest first.
pub async fn waiting_for_review(pool: &PgPool) -> sqlx::Result<Vec<Waiting>> {
    sqlx::query_as!(
        Waiting,
        "SELECT id, installation_id, event_id, channel_id, thread_version, action_kind, review_reasons
           FROM decisions WHERE status = 'review' ORDER BY created_at"
    )
    .fetch_all(pool)
    .await
}

/// The decision's status, locked for the caller's transaction (a reviewer
/// deciding on it).
pub async fn lock_status(
    conn: &mut PgConnection,
    id: Uuid,
) -> sqlx::Result<Option<DecisionStatus>> {
    let status = sqlx::query_scalar!("SELECT status FROM decisions WHERE id = $1 FOR UPDATE", id)
        .fetch_optional(conn)
        .await?;
    status
        .map(|s| DecisionStatus::parse(&s).map_err(|e| sqlx::Error::Decode(Box::new(e))))
        .transpose()
}

/// A reviewer's verdict: `review → approved` or `review → rejected`, with
/// who decided. False when the decision was not waiting for review.
pub async fn review(
    conn: impl PgExecutor<'_>,
    id: Uuid,
    verdict: DecisionStatus,
    by: &str,
) -> sqlx::Result<bool> {
    // A reviewer approves or rejects; the discards are the services'.
    if !matches!(verdict, DecisionStatus::Approved | DecisionStatus::Rejected)
        || !DecisionStatus::Review.can_become(verdict)
    {
        return Ok(false);
    }
    let r = sqlx::query!(
        "UPDATE decisions SET status = $3, reviewed_by = $2, reviewed_at = now(), updated_at = now()
          WHERE id = $1 AND status = ANY($4)",
        id,
        by,
        verdict.as_str(),
        &moves(&[DecisionStatus::Review], verdict)
    )
    .execute(conn)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// What waited on the answer `d`, discarded now in the caller's transaction
/// (stale, or its question deleted), goes on without it: the requests its
/// deleted request absorbed of a burst are released, and those of its
/// thread's deleted root ([`crate::double_text::release`]), and a copy of its
/// deleted request that stands in for it is asked
/// ([`crate::actions::ask_stand_in`]), as is a copy standing in for an
/// earlier deleted request of its thread this answer may have read. The
/// publisher's checks and the sweep of answers waiting for review call
/// this when they find a thread moved on; an answer a kill switch
/// suppresses, a reviewer rejects or Slack refuses for good does not (its
/// switch, verdict or error explains what waited on it). The copies asked
/// now (in the place of a deleted request or of one a burst released).
pub async fn discarded(
    conn: &mut PgConnection,
    d: &Decision,
) -> sqlx::Result<Vec<crate::actions::StoodIn>> {
    let mut requests = vec![d.source_ts.as_str()];
    if d.root_ts != d.source_ts {
        requests.push(d.root_ts.as_str());
    }
    let mut asked = Vec::new();
    for request in requests {
        asked.extend(
            crate::double_text::release(conn, d.installation_id, &d.channel_id, request).await?,
        );
    }
    // (a copy standing in for a deleted request of this thread, its own
    // question or an earlier one this answer may have read, waited on it)
    let waiting = crate::actions::stood_for_in_thread(
        conn,
        (d.installation_id, &d.channel_id),
        &d.root_ts,
        &d.source_ts,
    )
    .await?;
    for deleted in waiting {
        let stood_in =
            crate::actions::ask_stand_in(conn, d.installation_id, &d.channel_id, &deleted).await?;
        asked.extend(stood_in.filter(|s| s.asked));
    }
    Ok(asked)
}

/// Hands the thread of decision `d` to reconsideration through the outbox,
/// in the caller's transaction (the decision was discarded in it, `why`:
/// `version_changed`, `source_deleted`): `recon:<installation>:<channel>:
/// <root>:<version>`, so a burst for one version coalesces into one.
pub async fn enqueue_reconsider(
    conn: &mut PgConnection,
    d: &Decision,
    why: &str,
) -> sqlx::Result<()> {
    let msg = threadline_proto::v1::Reconsider {
        schema_version: threadline_proto::v1::SCHEMA_VERSION,
        installation_id: d.installation_id.to_string(),
        channel_id: d.channel_id.clone(),
        root_ts: d.root_ts.clone(),
        stale_version: d.thread_version,
        receipt_id: d.receipt_id.to_string(),
        reason: why.to_owned(),
    };
    crate::outbox::enqueue(
        conn,
        d.installation_id,
        d.receipt_id,
        threadline_domain::topic::Topic::Reconsider,
        &format!(
            "recon:{}:{}:{}:{}",
            d.installation_id, d.channel_id, d.root_ts, d.thread_version
        ),
        msg.encode_to_vec(),
    )
    .await
}
