//! `POST /slack/interactions`: a click on a review request's Approve or
//! Reject button, or on an answer's feedback buttons (handled in
//! [`crate::feedback`]). Verified like an event delivery (signature and timestamp
//! on the raw body, read within the budget for unverified bytes); then the
//! verdict and what it asks of the publisher (post the approved answer, or
//! show the rejection on the request) commit in one transaction, the CLI's
//! code path (`threadline_store::review::decide`), before Slack gets its
//! 200. A click counts only from a user on the installation's reviewer
//! list, on the decision's own review request; a second click changes
//! nothing. Slack does not retry interactions: a click that could not be
//! recorded gets a 503, which Slack shows the person as a failed action,
//! so they can click again. A click that was not counted (not a reviewer,
//! or the answer already decided) is answered, once what it found is
//! committed, with a note only the person sees, through the click's
//! `response_url` (on a task of its own: the click's answer never waits
//! for it).

use std::time::Instant;

use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use threadline_domain::review::{Interaction, parse_form, response_url_allowed};
use threadline_domain::state::{DecisionStatus, Machine as _};
use threadline_store::review::{Click, Decided, Verdict, decide};
use uuid::Uuid;

use crate::AppState;
use crate::installations::Resolved;

pub async fn slack_interactions(State(app): State<AppState>, request: Request) -> Response {
    let started = Instant::now();
    let (parts, body) = request.into_parts();
    let (outcome, response) = match crate::events::receive(&app, &parts.headers, body).await {
        Ok(body) => handle(&app, &body).await,
        Err((answer, mut response)) => {
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            (answer.label(), response)
        }
    };
    metrics::histogram!("threadline_gateway_interaction_seconds", "outcome" => outcome)
        .record(started.elapsed().as_secs_f64());
    response
}

async fn handle(app: &AppState, body: &Bytes) -> (&'static str, Response) {
    on(app, parse_form(body)).await
}

/// An interaction received over a Socket Mode connection (the payload as
/// JSON, no form, no signature: the connection is the app's own): the
/// status its acknowledgement waits for.
pub(crate) async fn handle_payload(app: &AppState, payload: &serde_json::Value) -> StatusCode {
    let parsed = if payload.is_object() {
        threadline_domain::review::parse(payload)
    } else {
        Err(threadline_domain::review::InteractionError::NotJson)
    };
    on(app, parsed).await.1.status()
}

/// One handler per kind of interaction.
async fn on(
    app: &AppState,
    parsed: Result<Interaction, threadline_domain::review::InteractionError>,
) -> (&'static str, Response) {
    match parsed {
        Ok(Interaction::Review(c)) => review(app, c).await,
        Ok(Interaction::Feedback(c)) => crate::feedback::click(app, c).await,
        Ok(Interaction::Other { kind, action }) => {
            // (codes only: an action id is the app's own identifier)
            tracing::debug!(kind = %kind.chars().take(40).collect::<String>(), has_action = action.is_some(), "interaction not handled; acknowledged");
            ("ignored", StatusCode::OK.into_response()) // not a state: the gateway's answer
        }
        Err(e) => {
            tracing::warn!(reason = e.code(), error = %e, "signed interaction is malformed; refused");
            metrics::counter!("threadline_review_clicks_total", "outcome" => "malformed")
                .increment(1);
            (
                "rejected", // not a state: the gateway's answer
                (StatusCode::BAD_REQUEST, "malformed interaction payload").into_response(),
            )
        }
    }
}

/// A click on a review request's Approve or Reject.
#[tracing::instrument(skip_all, fields(decision_id, installation_id))]
async fn review(
    app: &AppState,
    click: threadline_domain::review::Click,
) -> (&'static str, Response) {
    let Ok(decision) = Uuid::parse_str(&click.decision) else {
        tracing::warn!("review click names no decision; refused");
        metrics::counter!("threadline_review_clicks_total", "outcome" => "malformed").increment(1);
        return (
            "rejected", // not a state: the gateway's answer
            (StatusCode::BAD_REQUEST, "malformed interaction payload").into_response(),
        );
    };
    let span = tracing::Span::current();
    span.record("decision_id", tracing::field::display(decision));
    let installation = match app.resolver.resolve(&click.key).await {
        Ok(Resolved::Active(id)) => id,
        Ok(Resolved::Disabled(_) | Resolved::Unknown) => {
            tracing::warn!("review click for an installation that is not active; not counted");
            metrics::counter!("threadline_review_clicks_total", "outcome" => "no_installation")
                .increment(1);
            return ("refused", StatusCode::OK.into_response());
        }
        Err(e) => return unavailable(&e),
    };
    span.record("installation_id", tracing::field::display(installation));
    let verdict = if click.approve {
        Verdict::Approve
    } else {
        Verdict::Reject
    };
    let by = format!("slack:{}", click.user.as_str());
    let r = decide(
        &app.pool,
        decision,
        verdict,
        &by,
        Some(Click {
            installation,
            channel: click.channel.as_str(),
            message_ts: click.message_ts.as_str(),
            user: click.user.as_str(),
        }),
    )
    .await;
    let outcome = match r {
        Err(e) => return unavailable(&e),
        Ok(Decided::Recorded(status)) => {
            tracing::info!(verdict = status.as_str(), reviewer = %click.user.as_str(), "review recorded from Slack");
            "recorded"
        }
        Ok(Decided::NotWaiting { status, .. }) => {
            tracing::info!(
                status = status.as_str(),
                "review click on a decision no longer waiting; nothing changed"
            );
            app.responder
                .tell(click.response_url.as_deref(), &already(status));
            "not_waiting"
        }
        Ok(Decided::Refused(why)) => {
            tracing::warn!(
                alert = "review_click_refused",
                reason = why.as_str(),
                user = %click.user.as_str(),
                "review click not counted"
            );
            // (a click on something else than the request is no person's
            // mistake to explain: nothing is said)
            if why == threadline_store::review::Refusal::NotAReviewer {
                app.responder
                    .tell(click.response_url.as_deref(), NOT_A_REVIEWER);
            }
            why.as_str()
        }
        Ok(Decided::NotFound) => {
            tracing::warn!("review click for an unknown decision; not counted");
            "not_found"
        }
    };
    // What was committed may have queued work for the publisher.
    app.wake.wake();
    metrics::counter!("threadline_review_clicks_total", "outcome" => outcome).increment(1);
    ("handled", StatusCode::OK.into_response())
}

fn unavailable(e: &dyn std::fmt::Display) -> (&'static str, Response) {
    tracing::error!(error = %e, "could not record a review click; answering 503");
    (
        "unavailable",
        StatusCode::SERVICE_UNAVAILABLE.into_response(),
    )
}

/// What a person who is not on the reviewer list is told.
pub const NOT_A_REVIEWER: &str = "Only this workspace's threadline reviewers can approve or reject answers, so your click was not counted. Nothing was approved or rejected.";

/// What a click on an answer already decided is told.
fn already(status: DecisionStatus) -> String {
    let what = match status {
        DecisionStatus::Approved => "was already approved",
        DecisionStatus::Published => "was already approved and posted",
        DecisionStatus::Rejected => "was already rejected",
        _ => "is no longer waiting for review",
    };
    format!("This answer {what}; your click changed nothing.")
}

/// Replies to the person who clicked, through the click's `response_url`
/// (an ephemeral message only they see), after the click was answered.
/// Best effort: one try, bounded; a URL outside Slack's hooks host (or the
/// configured Web API's own origin) is not followed.
#[derive(Clone)]
pub struct Responder {
    client: reqwest::Client,
    web_api_url: String,
}

impl Responder {
    pub fn new(web_api_url: &str) -> reqwest::Result<Self> {
        Ok(Self {
            client: reqwest::Client::builder()
                .timeout(std::time::Duration::from_secs(10))
                .connect_timeout(std::time::Duration::from_secs(5))
                .redirect(reqwest::redirect::Policy::none())
                .build()?,
            web_api_url: web_api_url.to_owned(),
        })
    }

    /// Sends `text` to the person, ephemeral, on a task of its own.
    pub fn tell(&self, url: Option<&str>, text: &str) {
        let Some(url) = url else {
            return;
        };
        if !response_url_allowed(url, &self.web_api_url) {
            tracing::warn!("a click's response_url is not Slack's; not followed");
            metrics::counter!("threadline_review_click_replies_total", "result" => "refused_url")
                .increment(1);
            return;
        }
        let (client, url) = (self.client.clone(), url.to_owned());
        let body = serde_json::json!({
            "response_type": "ephemeral",
            "replace_original": false,
            "text": text,
        });
        tokio::spawn(async move {
            let result = match client.post(&url).json(&body).send().await {
                Ok(r) if r.status().is_success() => "ok",
                Ok(r) => {
                    tracing::warn!(
                        status = r.status().as_u16(),
                        "Slack refused the reply to a click"
                    );
                    "refused"
                }
                Err(e) => {
                    tracing::warn!(error = %e.without_url(), "replying to a click failed");
                    "failed" // not a state: a reply's result
                }
            };
            metrics::counter!("threadline_review_click_replies_total", "result" => result)
                .increment(1);
        });
    }
}
