//! Review in Slack: the publisher posts a review request for a decision
//! that needs a reviewer into the installation's review channel (once:
//! claimed like a reply, and an unknown outcome is looked for in the
//! channel's history by the request's metadata before another post), with
//! the proposed answer as far as the settings show it and Approve / Reject
//! buttons. A click reaches the gateway (`POST /slack/interactions`), which
//! records the verdict and queues the decision's proposal in one
//! transaction; once the decision came to something (posted, rejected,
//! stale, discarded) the request is updated to say so and by whom, and
//! loses its buttons.

use secrecy::ExposeSecret as _;
use serde_json::{Value, json};
use threadline_domain::state::{DecisionStatus, IntentState, Machine as _, ReviewRequestState};
use threadline_runtime::worker::Disposition;
use threadline_slack::WebError;
use threadline_store::decisions::Decision;
use threadline_store::review::{self, PostClaim};
use uuid::Uuid;

use crate::handler::{Handler, defer, jitter};

/// The request's action ids (the gateway accepts clicks on these only).
pub const APPROVE: &str = threadline_domain::review::APPROVE_ACTION;
pub const REJECT: &str = threadline_domain::review::REJECT_ACTION;
/// The `event_type` of a review request's metadata.
pub const METADATA_TYPE: &str = "threadline_review";

/// Slack's codes after which the request may be tried again at once.
const UNKNOWN_CODES: &[&str] = &["fatal_error", "internal_error", "service_unavailable"];

impl Handler {
    /// Posts the review request of decision `d` (status `review`) when the
    /// installation has a review channel; without one, only the CLI
    /// reviews it.
    pub(crate) async fn request_review(&self, d: &Decision) -> anyhow::Result<Disposition> {
        let settings = review::settings(&self.pool, d.installation_id).await?;
        let Some(channel) = settings.channel_id.as_deref() else {
            // (a request of unknown outcome posted before the channel was
            // unset is still looked for, by the sweeper)
            review::look_later(&self.pool, d.id, 0.0, self.sending_stale).await?;
            return Ok(Disposition::Done);
        };
        let Some(bot) = self.bot(d.installation_id).await? else {
            tracing::warn!("no token to post the review request with; the CLI still reviews it");
            return Ok(Disposition::Done);
        };
        // A request carries the model's text: a kill switch holds it too.
        if let Some(switch) = threadline_store::kill_switches::engaged(
            &self.pool,
            d.installation_id,
            threadline_domain::kill_switch::FEATURE_REPLIES,
        )
        .await?
        {
            tracing::warn!(switch = %switch, "kill switch engaged; review request not posted (the CLI still reviews it)");
            // (reading is not posting: one of unknown outcome is looked for)
            review::look_later(&self.pool, d.id, 0.0, self.sending_stale).await?;
            return Ok(Disposition::Done);
        }
        let token = bot.token.expose_secret();
        let (attempt, channel) = match review::claim_post(
            &self.pool,
            d.id,
            d.installation_id,
            channel,
            self.sending_stale,
        )
        .await?
        {
            PostClaim::Posted | PostClaim::Failed => return self.review_follow_up(d.id).await,
            PostClaim::Busy => return Ok(defer(jitter(self.sending_stale / 2.0, &d.id))),
            PostClaim::Held => return Ok(Disposition::Done),
            PostClaim::Post { attempt } => (attempt, channel.to_owned()),
            // (looked for where the attempt of unknown outcome posted, even
            // if the settings name another channel since)
            PostClaim::Reconcile {
                attempt,
                channel,
                since,
                waited,
            } => match self.find_request(token, &channel, d.id, since).await {
                Ok(Some(ts)) => {
                    self.record_request(token, &channel, d.id, &ts).await?;
                    metrics::counter!("threadline_review_requests_total", "outcome" => "found")
                        .increment(1);
                    return self.review_follow_up(d.id).await;
                }
                Ok(None) => match self.look_again(waited) {
                    Look::Post => (attempt, channel),
                    Look::Within(wait) => {
                        review::unknown(&self.pool, d.id, attempt).await?;
                        return Ok(defer(jitter(wait, &d.id)));
                    }
                    Look::Hold => {
                        let first = self.evidence.late_check_secs;
                        if review::hold(&self.pool, d.id, attempt, first).await? {
                            // not a state: the review request's outcome label
                            metrics::counter!("threadline_review_requests_total", "outcome" => "held")
                                .increment(1);
                            tracing::warn!(
                                alert = "review_request_held",
                                decision_id = %d.id,
                                waited,
                                "a review request's post outcome is unknown and it is not in the review channel; not posted again, looked for later (the CLI still reviews it)"
                            );
                        }
                        return Ok(Disposition::Done);
                    }
                },
                Err(WebError::Api { code }) if !UNKNOWN_CODES.contains(&code.as_str()) => {
                    // Unreadable for good (a private review channel
                    // without groups:history, the bot removed): a
                    // second post could duplicate the request, so none.
                    tracing::warn!(
                        alert = "review_request_unreadable",
                        installation_id = %d.installation_id,
                        code = %code,
                        "a review request's post outcome is unknown and the review channel cannot be read; the CLI still reviews it"
                    );
                    // (marked so that `review setup` never asks again:
                    // Slack may hold this request)
                    let code = format!("{}{code}", review::UNREADABLE);
                    review::failed(&self.pool, d.id, attempt, &code).await?;
                    return Ok(Disposition::Done);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "reading the review channel failed; trying later");
                    review::unknown(&self.pool, d.id, attempt).await?;
                    return Ok(defer(jitter(retry_secs(&e), &d.id)));
                }
            },
        };
        let channel = channel.as_str();
        let public = self.is_public(d).await?;
        let (text, blocks) = render(d, &settings, None, public);
        let metadata = json!({
            "event_type": METADATA_TYPE,
            "event_payload": {"decision_id": d.id.to_string()},
        })
        .to_string();
        let blocks = blocks.to_string();
        let form = [
            ("channel", channel),
            ("text", text.as_str()),
            ("blocks", blocks.as_str()),
            ("metadata", metadata.as_str()),
            ("unfurl_links", "false"),
            ("unfurl_media", "false"),
        ];
        // The last check before the post, as a reply's: the claim is still
        // this attempt's and young enough that no other publisher takes it
        // for lost before the post could finish.
        let max_age = (self.sending_stale - self.slack_timeout).max(self.slack_timeout);
        if !review::fence(&self.pool, d.id, attempt, max_age).await? {
            // (given back only if it is still this attempt's: it posted
            // nothing)
            review::release(&self.pool, d.id, attempt).await?;
            return Ok(defer(jitter(1.0, &d.id)));
        }
        match self.web.call("chat.postMessage", token, &form).await {
            Ok(v) => {
                let Some(ts) = v.get("ts").and_then(Value::as_str) else {
                    review::unknown(&self.pool, d.id, attempt).await?;
                    return Ok(defer(jitter(2.0, &d.id)));
                };
                if self.record_request(token, channel, d.id, ts).await? {
                    metrics::counter!("threadline_review_requests_total", "outcome" => ReviewRequestState::Posted.name())
                        .increment(1);
                }
                // (a verdict the CLI gave meanwhile shows at once)
                self.review_follow_up(d.id).await
            }
            Err(WebError::RateLimited { retry_after }) => {
                review::release(&self.pool, d.id, attempt).await?;
                Ok(defer(jitter(retry_after.as_secs_f64(), &d.id)))
            }
            Err(WebError::Transport(t)) if t == "connect" => {
                review::release(&self.pool, d.id, attempt).await?;
                Ok(defer(jitter(2.0, &d.id)))
            }
            Err(WebError::Api { code }) if !UNKNOWN_CODES.contains(&code.as_str()) => {
                metrics::counter!("threadline_review_requests_total", "outcome" => "refused")
                    .increment(1);
                tracing::warn!(
                    alert = "review_request_refused",
                    installation_id = %d.installation_id,
                    code = %code,
                    "Slack refused the review request (is the bot in the review channel?); the CLI still reviews it"
                );
                review::failed(&self.pool, d.id, attempt, &code).await?;
                Ok(Disposition::Done)
            }
            Err(e) => {
                // The request may have reached Slack: looked for before
                // another post.
                tracing::warn!(error = %e, "review request outcome unknown; reconciling");
                review::unknown(&self.pool, d.id, attempt).await?;
                Ok(defer(jitter(2.0, &d.id)))
            }
        }
    }

    /// How long after an attempt began its request may still land in
    /// Slack: the client's timeout, then the evidence window replies wait
    /// for a post of unknown outcome.
    fn request_window(&self) -> f64 {
        self.slack_timeout + self.evidence.window_secs
    }

    /// What follows a read that did not find a request whose first
    /// attempt of unknown outcome began `waited` seconds ago, by the
    /// replies' rules: within the window it may still land, and is read
    /// again soon; after it, it is posted again only where a reply would be
    /// (`THREADLINE_RECONCILE_ALLOW_REPOST`); otherwise it is held, and the
    /// sweeper looks for it on the late checks' widening schedule (Slack
    /// may apply a post long after the client gave up: a second post would
    /// show the request twice).
    fn look_again(&self, waited: f64) -> Look {
        if waited < self.request_window() {
            Look::Within(self.evidence.pause())
        } else if self.evidence.allow_repost {
            Look::Post
        } else {
            Look::Hold
        }
    }

    /// Records the request Slack holds at `ts`; `false` when another copy
    /// was recorded already. Such a copy is raised and deleted: the
    /// recorded one is the request whose buttons count and whose outcome is
    /// shown.
    async fn record_request(
        &self,
        token: &str,
        channel: &str,
        id: Uuid,
        ts: &str,
    ) -> anyhow::Result<bool> {
        let recorded = crate::handler::persist(|| async {
            let mut c = self.pool.acquire().await?;
            review::posted(&mut c, id, ts).await
        })
        .await?;
        let review::Recorded::Copy(recorded) = recorded else {
            return Ok(true);
        };
        metrics::counter!("threadline_review_requests_total", "outcome" => "duplicate")
            .increment(1);
        tracing::error!(
            alert = "duplicate_review_request",
            decision_id = %id,
            recorded = %recorded,
            copy = %ts,
            "a second copy of a review request is in Slack; deleting it"
        );
        let form = [("channel", channel), ("ts", ts)];
        if let Err(e) = self.web.call("chat.delete", token, &form).await {
            tracing::warn!(error = %e, copy = %ts, "the review request's copy could not be deleted");
        }
        Ok(false)
    }

    /// A held request's late check (the sweeper's): a request found is
    /// recorded and shows its decision's outcome; otherwise it is looked
    /// for again later, less and less often, for about a week.
    pub(crate) async fn review_late_check(&self, due: review::LateCheck) -> anyhow::Result<()> {
        let review::LateCheck {
            decision,
            installation,
            channel,
            since,
            checks,
        } = due;
        let first = self.evidence.late_check_secs;
        let Some(bot) = self.bot(installation).await? else {
            // No token to read with (uninstalled, revoked): nothing more to learn.
            review::schedule_late_check(&self.pool, decision, checks, None).await?;
            given_up(decision, "no token for its installation");
            return Ok(());
        };
        let token = bot.token.expose_secret();
        match self.find_request(token, &channel, decision, since).await {
            Ok(Some(ts)) => {
                self.record_request(token, &channel, decision, &ts).await?;
                metrics::counter!("threadline_review_requests_total", "outcome" => "found")
                    .increment(1);
                tracing::warn!(
                    alert = "late_review_request_found",
                    decision_id = %decision,
                    "a held review request was found in the review channel; recorded"
                );
                // (what the decision came to shows on it now; a failure to
                // show it is retried when the decision is handled again)
                if let Err(e) = self.review_follow_up(decision).await {
                    tracing::warn!(
                        error = format!("{e:#}"),
                        "showing the outcome on a late review request failed"
                    );
                }
                return Ok(());
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(error = %e, "late check of a held review request could not read the channel")
            }
        }
        let next = crate::sweeper::next_check(checks + 1, first);
        review::schedule_late_check(&self.pool, decision, checks, next).await?;
        if next.is_none() {
            given_up(decision, "not found in a week of late checks");
        }
        Ok(())
    }

    /// Whether the answer's channel is known to be public (a DM, a private
    /// channel or one whose kind is not known is not).
    async fn is_public(&self, d: &Decision) -> anyhow::Result<bool> {
        if !d.channel_id.starts_with('C') {
            return Ok(false);
        }
        Ok(
            threadline_store::channels::channel_kind(&self.pool, d.installation_id, &d.channel_id)
                .await?
                == Some(false),
        )
    }

    /// The ts of decision `id`'s review request in `channel`, if Slack holds
    /// one posted since `since` (Unix seconds), by its metadata.
    async fn find_request(
        &self,
        token: &str,
        channel: &str,
        id: Uuid,
        since: f64,
    ) -> Result<Option<String>, WebError> {
        let oldest = format!("{:.6}", (since - 5.0).max(0.0));
        let mut cursor = String::new();
        for _ in 0..20 {
            let mut form = vec![
                ("channel", channel),
                ("oldest", oldest.as_str()),
                ("include_all_metadata", "true"),
                ("limit", "200"),
            ];
            if !cursor.is_empty() {
                form.push(("cursor", cursor.as_str()));
            }
            let v = self.web.call("conversations.history", token, &form).await?;
            let found = v
                .get("messages")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .find(|m| {
                    let meta = m.get("metadata");
                    meta.and_then(|x| x.get("event_type"))
                        .and_then(Value::as_str)
                        == Some(METADATA_TYPE)
                        && meta
                            .and_then(|x| x.get("event_payload"))
                            .and_then(|p| p.get("decision_id"))
                            .and_then(Value::as_str)
                            == Some(id.to_string().as_str())
                });
            if let Some(ts) = found.and_then(|m| m.get("ts")).and_then(Value::as_str) {
                return Ok(Some(ts.to_owned()));
            }
            match v
                .pointer("/response_metadata/next_cursor")
                .and_then(Value::as_str)
            {
                Some(c) if !c.is_empty() => cursor = c.to_owned(),
                _ => return Ok(None),
            }
        }
        // (not read to its end: not found is not known)
        Err(WebError::Transport(
            "review channel history not read to its end".into(),
        ))
    }

    /// Discards the answers waiting for review whose thread moved on (a
    /// change, a deleted question, a newer request), as the publisher's
    /// checks would at their approval: each in one transaction with its
    /// thread's reconsideration (stale or deleted) and its request's update,
    /// both through the outbox. A verdict that committed first wins.
    pub(crate) async fn sweep_reviews(&self) -> anyhow::Result<()> {
        for id in review::moved_on(&self.pool, 100).await? {
            // (judged again, and settled, in one transaction)
            let mut tx = self.pool.begin().await?;
            let discarded = review::discard_if_moved_on(&mut tx, id).await?;
            tx.commit().await?;
            if let Some((moved_on, asked)) = discarded {
                crate::handler::stand_ins_asked(id, &asked);
                let (status, _) = moved_on.status();
                metrics::counter!("threadline_review_discards_total", "status" => status.as_str())
                    .increment(1);
                tracing::info!(
                    decision_id = %id,
                    status = status.as_str(),
                    "an answer waiting for review was discarded: its thread moved on"
                );
            }
        }
        Ok(())
    }

    /// Updates decision `id`'s review request with what the decision came
    /// to, once it came to something and the request does not show it yet.
    pub(crate) async fn review_follow_up(&self, id: Uuid) -> anyhow::Result<Disposition> {
        let Some(r) = review::request(&self.pool, id).await? else {
            return Ok(Disposition::Done);
        };
        let Some(outcome) = Outcome::of(&r) else {
            return Ok(Disposition::Done);
        };
        if r.shown.as_deref() == Some(outcome.code.as_str())
            || r.state == ReviewRequestState::Failed
        {
            return Ok(Disposition::Done);
        }
        let Some(d) = threadline_store::decisions::load(&self.pool, id).await? else {
            return Ok(Disposition::Done);
        };
        let Some(bot) = self.bot(d.installation_id).await? else {
            return Ok(Disposition::Done);
        };
        let ts = match r.ts.clone() {
            Some(ts) => ts,
            // Decided while the request's post outcome was unknown (or in
            // flight): Slack may show it with live buttons, so it is looked
            // for and, found, shown the outcome. (A post in flight records
            // its ts and follows up itself.)
            None => match self
                .find_request(bot.token.expose_secret(), &r.channel_id, id, r.since)
                .await
            {
                Ok(Some(ts)) => {
                    self.record_request(bot.token.expose_secret(), &r.channel_id, id, &ts)
                        .await?;
                    metrics::counter!("threadline_review_requests_total", "outcome" => "found")
                        .increment(1);
                    match review::request(&self.pool, id).await?.and_then(|r| r.ts) {
                        Some(ts) => ts,
                        None => return Ok(defer(jitter(1.0, &id))),
                    }
                }
                // Not there: one of unknown outcome may still land with its
                // buttons, so it is looked for again (the sweeper does once
                // it is held, and shows the outcome when it finds it).
                Ok(None) => {
                    return match (r.state, r.held) {
                        (_, true) => Ok(Disposition::Done),
                        // (in flight; or its publisher died, and the sweeper
                        // looks for it from now)
                        (ReviewRequestState::Posting, false) => {
                            let late = self.evidence.late_check_secs;
                            match review::look_later(&self.pool, id, late, self.sending_stale)
                                .await?
                            {
                                true => Ok(Disposition::Done),
                                false => Ok(defer(jitter(self.evidence.pause(), &id))),
                            }
                        }
                        (_, false) => match self.look_again(r.waited) {
                            Look::Within(wait) => Ok(defer(jitter(wait, &id))),
                            // (decided: no request is posted any more)
                            Look::Hold | Look::Post => {
                                let late = self.evidence.late_check_secs;
                                review::look_later(&self.pool, id, late, self.sending_stale)
                                    .await?;
                                Ok(Disposition::Done)
                            }
                        },
                    };
                }
                Err(WebError::Api { code }) if !UNKNOWN_CODES.contains(&code.as_str()) => {
                    tracing::warn!(code = %code, "the review channel cannot be read; the request's outcome is in the decision");
                    return Ok(Disposition::Done);
                }
                Err(e) => return Ok(defer(jitter(retry_secs(&e), &id))),
            },
        };
        let settings = review::settings(&self.pool, d.installation_id).await?;
        let public = self.is_public(&d).await?;
        let (text, blocks) = render(&d, &settings, Some(&outcome), public);
        let blocks = blocks.to_string();
        let form = [
            ("channel", r.channel_id.as_str()),
            ("ts", ts.as_str()),
            ("text", text.as_str()),
            ("blocks", blocks.as_str()),
        ];
        match self
            .web
            .call("chat.update", bot.token.expose_secret(), &form)
            .await
        {
            Ok(_) => {
                review::mark_shown(&self.pool, id, &outcome.code).await?;
                Ok(Disposition::Done)
            }
            Err(WebError::Api { code }) if !UNKNOWN_CODES.contains(&code.as_str()) => {
                // Refused for good (gone, archived, the token revoked):
                // nothing more to show; the outcome is in the decision.
                tracing::warn!(
                    alert = "review_request_not_updated",
                    code = %code,
                    "the review request cannot be updated; its outcome is in the decision"
                );
                review::mark_shown(&self.pool, id, &outcome.code).await?;
                Ok(Disposition::Done)
            }
            Err(e) => {
                tracing::warn!(error = %e, "updating the review request failed; trying later");
                Ok(defer(jitter(retry_secs(&e), &id)))
            }
        }
    }
}

/// A held review request is no longer looked for (`why`): counted and
/// raised; the CLI reviews its answer.
fn given_up(decision: Uuid, why: &'static str) {
    metrics::counter!("threadline_review_requests_total", "outcome" => "given_up").increment(1);
    tracing::warn!(
        alert = "review_request_given_up",
        decision_id = %decision,
        why,
        "a held review request is no longer looked for (the CLI reviews its answer)"
    );
}

/// What follows a read that did not find a request of unknown outcome.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Look {
    /// Within the window: read again after this many seconds.
    Within(f64),
    /// Past the window, where the policy allows another post.
    Post,
    /// Past the window: held for the sweeper's late checks.
    Hold,
}

/// How long to wait before trying a Slack call again after `e`.
fn retry_secs(e: &WebError) -> f64 {
    match e {
        WebError::RateLimited { retry_after } => retry_after.as_secs_f64(),
        _ => 2.0,
    }
}

/// What a reviewed decision came to, as its review request shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The decision's status (and reason) it shows: shown once.
    pub code: String,
    pub line: String,
}

impl Outcome {
    /// `None` while the decision waits for review or for its publish.
    pub fn of(r: &review::Posted) -> Option<Outcome> {
        let who = r.reviewed_by.as_deref().map(reviewer);
        let approved = match &who {
            Some(w) => format!("Approved by {w}, but "),
            None => String::new(),
        };
        use DecisionStatus as D;
        let held = r.intent_state == Some(IntentState::Held);
        let line = match r.status {
            D::Approved if held => format!(
                "Approved by {}; posting it needs an operator (an earlier attempt's outcome is unknown): `threadline intents list`.",
                who.as_deref().unwrap_or("a reviewer")
            ),
            D::Approved => format!(
                "Approved by {}: posting…",
                who.as_deref().unwrap_or("a reviewer")
            ),
            D::Published => match &who {
                Some(w) => format!("Approved by {w}: posted in <#{}>.", r.answer_channel),
                None => format!("Posted in <#{}>.", r.answer_channel),
            },
            D::Rejected => format!(
                "Rejected by {}: not posted.",
                who.as_deref().unwrap_or("a reviewer")
            ),
            D::Stale => capitalise(&format!(
                "{approved}the thread changed while this waited for review: not posted. The thread is being reconsidered."
            )),
            D::Superseded if r.status_reason.as_deref() == Some("already_answered") => capitalise(
                &format!("{approved}the request was already answered: not posted."),
            ),
            D::Superseded => capitalise(&format!(
                "{approved}a newer request in the thread replaced this one: not posted."
            )),
            D::Suppressed => {
                capitalise(&format!("{approved}a kill switch is engaged: not posted."))
            }
            D::Cancelled => {
                let why = match r.status_reason.as_deref() {
                    Some("source_deleted") => "the question was deleted",
                    Some("installation_unavailable") => "the installation is no longer available",
                    Some(s) if s.starts_with("missing_scope") => {
                        "the bot lacks the scope to post it"
                    }
                    _ => "it was cancelled",
                };
                capitalise(&format!("{approved}{why}: not posted."))
            }
            D::Calling | D::Proposed | D::Review => return None,
        };
        let code = match &r.status_reason {
            _ if held && r.status == D::Approved => {
                format!("{}:{}", D::Approved, IntentState::Held)
            }
            Some(reason) => format!("{}:{reason}", r.status),
            None => r.status.to_string(),
        };
        Some(Outcome { code, line })
    }
}

fn capitalise(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_uppercase().chain(c).collect(),
        None => String::new(),
    }
}

/// A reviewer as the request names them: a Slack user as a mention, an
/// operator (CLI) by name.
fn reviewer(by: &str) -> String {
    match by.strip_prefix("slack:") {
        Some(user) if user.chars().all(|c| c.is_ascii_alphanumeric()) => format!("<@{user}>"),
        _ => format!("`{}` (CLI)", escape(by)),
    }
}

/// `&`, `<` and `>` as Slack's mrkdwn needs them escaped.
fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Section text is limited to 3,000 characters by Slack.
const SECTION_MAX: usize = 3000;

/// The review request: fallback text and blocks. With `outcome`, the
/// buttons give way to it.
pub fn render(
    d: &Decision,
    settings: &review::Settings,
    outcome: Option<&Outcome>,
    public: bool,
) -> (String, Value) {
    let text = format!(
        "An answer needs review before it is posted in <#{}>.",
        d.channel_id
    );
    let reasons = if d.review_reasons.is_empty() {
        "policy".to_owned()
    } else {
        d.review_reasons.join(", ")
    };
    let mut blocks = vec![
        json!({"type": "section", "text": {"type": "mrkdwn", "text": format!(
            "*An answer needs review* before it is posted in <#{}> (a reply in the thread of `{}`).",
            d.channel_id, d.root_ts
        )}}),
        json!({"type": "context", "elements": [{"type": "mrkdwn", "text": format!(
            "Why: {reasons}. Proposed by an AI model; nothing is posted until a reviewer approves, and the thread is checked again first."
        )}]}),
    ];
    // The answer without its label, with anything that looks like a
    // credential redacted: a review channel is no place for a secret (an
    // operator reads the whole text with the CLI).
    let body = d
        .body_blocks
        .as_ref()
        .and_then(|b| b.pointer("/0/text/text"))
        .and_then(Value::as_str)
        .or(d.body_text.as_deref())
        .unwrap_or_default();
    let body = threadline_domain::output::redact_secrets(body);
    // The model's text is stored escaped; the fallback (threadline's own
    // text, held for a mass mention) as written: escaped here, so that the
    // request can never ping the review channel.
    let body = if d.fallback { escape(&body) } else { body };
    // Only an answer asked in a public channel (or in the review channel
    // itself) is quoted: a private channel's or a DM's would reach people
    // who cannot read where it was asked.
    let limit = if public || settings.channel_id.as_deref() == Some(d.channel_id.as_str()) {
        settings.preview_chars
    } else {
        0
    };
    let preview = preview(&body, limit);
    match preview {
        Some(p) => blocks.push(json!({"type": "section", "text": {"type": "mrkdwn", "text": p}})),
        None => blocks.push(json!({"type": "context", "elements": [{"type": "mrkdwn", "text": format!(
            "The answer's text is not shown here; an operator reads it with `threadline review show {}`.",
            d.id
        )}]})),
    }
    match outcome {
        None => blocks.push(json!({
            "type": "actions",
            "block_id": "threadline_review",
            "elements": [
                {"type": "button", "action_id": APPROVE, "value": d.id.to_string(), "style": "primary",
                 "text": {"type": "plain_text", "text": "Approve"}},
                {"type": "button", "action_id": REJECT, "value": d.id.to_string(), "style": "danger",
                 "text": {"type": "plain_text", "text": "Reject"}},
            ],
        })),
        Some(o) => blocks.push(json!({"type": "section", "text": {"type": "mrkdwn", "text": o.line}})),
    }
    // The answer's AI label, as it would be posted.
    if let Some(label) = d
        .body_blocks
        .as_ref()
        .and_then(|b| b.pointer("/1/elements/0/text"))
        .and_then(Value::as_str)
    {
        blocks.push(json!({"type": "context", "elements": [{"type": "mrkdwn", "text": label}]}));
    }
    blocks.push(json!({"type": "context", "elements": [{"type": "mrkdwn", "text": format!("Decision `{}`", d.id)}]}));
    let text = match outcome {
        Some(o) => format!("{text} {}", o.line),
        None => text,
    };
    (text, Value::Array(blocks))
}

/// The first `max` characters of the answer as a quote, cut at a word
/// where it can be; `None` when nothing of it is to be shown.
fn preview(body: &str, max: i32) -> Option<String> {
    let max = usize::try_from(max).unwrap_or(0);
    if max == 0 || body.trim().is_empty() {
        return None;
    }
    // (every line break Slack shows starts a quoted line)
    let body = body.replace(['\r', '\u{2028}', '\u{2029}'], "\n");
    let mut cut: String = body.chars().take(max).collect();
    if cut.len() < body.len() {
        if let Some(i) = cut
            .rfind(char::is_whitespace)
            .filter(|i| cut[..*i].chars().count() > max / 2)
        {
            cut.truncate(i);
        }
        cut = whole_entities(cut);
        cut.push('…');
    }
    let quoted: String = cut
        .lines()
        .map(|l| format!("> {l}"))
        .collect::<Vec<_>>()
        .join("\n");
    if quoted.chars().count() <= SECTION_MAX {
        return Some(quoted);
    }
    let mut cut = whole_entities(quoted.chars().take(SECTION_MAX - 1).collect());
    cut.push('…');
    Some(cut)
}

/// `s` without an HTML entity cut in half at its end (it would show as
/// text).
fn whole_entities(mut s: String) -> String {
    if let Some(i) = s.rfind('&').filter(|i| !s[*i..].contains(';')) {
        s.truncate(i);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn posted(status: &str, reason: Option<&str>, by: Option<&str>) -> review::Posted {
        review::Posted {
            channel_id: "CREVIEW".into(),
            state: ReviewRequestState::Posted,
            since: 0.0,
            waited: 0.0,
            held: false,
            ts: Some("1.2".into()),
            shown: None,
            status: DecisionStatus::parse(status).expect("a status"),
            status_reason: reason.map(str::to_owned),
            reviewed_by: by.map(str::to_owned),
            answer_channel: "CANSWER".into(),
            intent_state: None,
        }
    }

    #[test]
    fn the_outcome_names_the_reviewer_and_what_became_of_the_answer() {
        let o = |s, r, b| Outcome::of(&posted(s, r, b)).map(|o| o.line);
        assert_eq!(o("review", None, None), None, "still asking");
        assert_eq!(
            o("approved", None, Some("slack:U1")).as_deref(),
            Some("Approved by <@U1>: posting…")
        );
        assert_eq!(
            o("published", None, Some("slack:U1")).as_deref(),
            Some("Approved by <@U1>: posted in <#CANSWER>.")
        );
        assert_eq!(
            o("rejected", None, Some("ana")).as_deref(),
            Some("Rejected by `ana` (CLI): not posted.")
        );
        assert_eq!(
            o("stale", Some("thread_changed"), Some("slack:U1")).as_deref(),
            Some(
                "Approved by <@U1>, but the thread changed while this waited for review: not posted. The thread is being reconsidered."
            )
        );
        assert_eq!(
            o("cancelled", Some("source_deleted"), None).as_deref(),
            Some("The question was deleted: not posted.")
        );
        assert_eq!(
            Outcome::of(&posted("stale", Some("thread_changed"), None))
                .unwrap()
                .code,
            "stale:thread_changed"
        );
    }

    #[test]
    fn a_reviewer_name_cannot_become_markup() {
        assert_eq!(reviewer("slack:U0ABC"), "<@U0ABC>");
        assert!(!reviewer("slack:<!here>").contains("<!"));
        assert!(!reviewer("<!channel>").contains("<!"));
    }

    #[test]
    fn the_preview_is_quoted_limited_and_never_cuts_an_entity() {
        assert_eq!(preview("anything", 0), None);
        assert_eq!(
            preview("two\nlines", 100).as_deref(),
            Some("> two\n> lines")
        );
        let p = preview("restart the pool &amp; wait for it", 24).unwrap();
        assert_eq!(p, "> restart the pool &amp;…", "cut at a word");
        assert_eq!(
            preview("x&amp;y", 3).as_deref(),
            Some("> x…"),
            "never half an entity"
        );
        let p = preview("aaaa &amp;", 7).unwrap();
        assert_eq!(p, "> aaaa…");
        let long = "word ".repeat(2000);
        assert!(preview(&long, 2500).unwrap().chars().count() <= SECTION_MAX);
        let lines = "a\n".repeat(2000);
        assert!(preview(&lines, 2500).unwrap().chars().count() <= SECTION_MAX);
        assert_eq!(
            preview("one\u{2028}two\rthree", 100).as_deref(),
            Some("> one\n> two\n> three"),
            "no line escapes the quote"
        );
    }

    #[test]
    fn the_request_carries_buttons_until_it_shows_an_outcome() {
        let d = Decision {
            id: Uuid::nil(),
            receipt_id: Uuid::nil(),
            installation_id: Uuid::nil(),
            event_id: "Ev1".into(),
            channel_id: "C1".into(),
            root_ts: "1.1".into(),
            source_ts: "1.1".into(),
            thread_version: 1,
            action_kind: "thread_reply".into(),
            status: threadline_domain::state::DecisionStatus::Review,
            review_reasons: vec!["mention".into()],
            fallback: false,
            model_config_id: None,
            output_hash: None,
            body_text: Some("ping &lt;!here&gt;".into()),
            body_blocks: None,
        };
        let s = review::Settings::default();
        let (_, blocks) = render(&d, &s, None, true);
        let actions = blocks
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["type"] == "actions")
            .expect("buttons");
        assert_eq!(actions["elements"][0]["action_id"], APPROVE);
        assert_eq!(actions["elements"][1]["value"], Uuid::nil().to_string());
        let o = Outcome::of(&posted("rejected", None, Some("slack:U1"))).unwrap();
        let (text, blocks) = render(&d, &s, Some(&o), true);
        assert!(
            blocks
                .as_array()
                .unwrap()
                .iter()
                .all(|b| b["type"] != "actions")
        );
        assert!(text.contains("Rejected by <@U1>"));
        let secret = Decision {
            body_text: Some("use xoxb-1234567890-abcdefghij now".into()),
            ..d.clone()
        };
        let (_, blocks) = render(&secret, &s, None, true);
        assert!(!blocks.to_string().contains("xoxb-1234567890"), "{blocks}");
        assert!(
            blocks.to_string().contains("use [redacted] now"),
            "{blocks}"
        );
        let fallback = Decision {
            body_blocks: Some(json!([
                {"type": "section", "text": {"type": "mrkdwn", "text": "Ask <!channel> in <https://status.example|status>"}},
                {"type": "context", "elements": [{"type": "mrkdwn", "text": "AI-generated"}]}
            ])),
            fallback: true,
            ..d.clone()
        };
        let (_, blocks) = render(&fallback, &s, None, true);
        let shown = blocks.to_string();
        assert!(
            !shown.contains("<!channel>") && shown.contains("&lt;!channel&gt;"),
            "{shown}"
        );
        assert_eq!(
            blocks
                .as_array()
                .unwrap()
                .iter()
                .filter(|b| b.to_string().contains("AI-generated"))
                .count(),
            1,
            "labelled"
        );
        let hidden = review::Settings {
            preview_chars: 0,
            ..s.clone()
        };
        let (_, blocks) = render(&d, &hidden, None, true);
        assert!(
            !blocks.to_string().contains("ping"),
            "no text when the settings show none"
        );
        let (_, blocks) = render(&d, &s, None, false);
        assert!(
            !blocks.to_string().contains("ping"),
            "no text of a private conversation"
        );
    }
}
