//! A click on an answer's feedback buttons (an interaction, verified as
//! every interaction is: signature and timestamp on the raw body, or a
//! Socket Mode connection of the app's own). The person's verdict on the
//! decision commits, with its audit record, before Slack gets its 200
//! (`threadline_store::feedback::record`): their latest click wins, a
//! click on an answer since superseded counts for that answer's decision,
//! and a click that names another installation's decision, or a message
//! that is not the decision's answer, changes nothing. Slack toggles the
//! buttons itself: nothing is sent back. A click that could not be
//! recorded gets a 503, which Slack shows the person as a failed action.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use threadline_domain::feedback::Click;
use threadline_store::feedback::{self, Recorded};
use uuid::Uuid;

use crate::AppState;
use crate::installations::Resolved;

#[tracing::instrument(skip_all, fields(decision_id, installation_id))]
pub(crate) async fn click(app: &AppState, click: Click) -> (&'static str, Response) {
    let count = |outcome: &'static str| {
        metrics::counter!("threadline_feedback_clicks_total", "outcome" => outcome).increment(1);
    };
    let Ok(decision) = Uuid::parse_str(&click.decision) else {
        tracing::warn!("feedback click names no decision; refused");
        count("malformed");
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
            tracing::warn!("feedback click for an installation that is not active; not counted");
            count("no_installation");
            return ("refused", StatusCode::OK.into_response());
        }
        Err(e) => return unavailable(&e),
    };
    span.record("installation_id", tracing::field::display(installation));
    let r = feedback::record(
        &app.pool,
        decision,
        &feedback::Click {
            installation,
            channel: click.channel.as_str(),
            message_ts: click.message_ts.as_str(),
            user: click.user.as_str(),
            verdict: click.verdict,
            action_ts: click.action_ts.as_ref().map(|t| t.as_str()),
            channel_ref: threadline_runtime::audit::channel_ref(
                installation,
                click.channel.as_str(),
            ),
        },
    )
    .await;
    let outcome = match r {
        Err(e) => return unavailable(&e),
        Ok(Recorded::Counted) => {
            tracing::info!(verdict = click.verdict.as_str(), "feedback recorded");
            metrics::counter!("threadline_feedback_total", "verdict" => click.verdict.as_str())
                .increment(1);
            "counted"
        }
        Ok(Recorded::Outdated) => {
            tracing::info!("feedback click older than the person's latest; nothing changed");
            "outdated"
        }
        Ok(Recorded::Refused(why)) => {
            tracing::warn!(
                alert = "feedback_click_refused",
                reason = why.as_str(),
                "feedback click not counted"
            );
            why.as_str()
        }
        Ok(Recorded::NotFound) => {
            tracing::warn!("feedback click for an unknown decision; not counted");
            "not_found"
        }
    };
    count(outcome);
    ("handled", StatusCode::OK.into_response())
}

fn unavailable(e: &dyn std::fmt::Display) -> (&'static str, Response) {
    tracing::error!(error = %e, "could not record a feedback click; answering 503");
    (
        "unavailable",
        StatusCode::SERVICE_UNAVAILABLE.into_response(),
    )
}
