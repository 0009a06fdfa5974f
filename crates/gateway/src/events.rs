//! `POST /slack/events`: verify, parse, resolve, record durably, answer.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use threadline_domain::{DeliveryIdentity, Envelope, EnvelopeError, EventCallback};
use threadline_slack::SignatureError;
use uuid::Uuid;

use crate::AppState;
use crate::installations::Resolved;
use crate::intake::{NewReceipt, Outcome, Unparsed};
use crate::unverified::ReadError;
use threadline_store::receipts::{ReceiptMeta, build as build_receipt, parse_error_text};

/// What a delivery came to; the label of the ack-latency histogram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Answer {
    Accepted,
    /// Held as an `unparsed` receipt: signed, identified, not parseable.
    Unparsed,
    Duplicate,
    Challenge,
    Ignored,
    Rejected(&'static str),
    Unavailable,
    /// Postgres refused this delivery itself (503; trying again changes
    /// nothing, so it is never spooled).
    Refused,
    /// Postgres could not take it in time: kept in the broker's spool,
    /// recorded by the drainer later.
    Spooled,
    /// Refused unread: the budget for unverified bodies was spent.
    Busy,
    /// New work refused before anything was written: the pipeline is
    /// behind (`crate::shed`); Slack retries it.
    Shed,
}

impl Answer {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Answer::Accepted => "accepted", // not a state: the gateway's answer
            Answer::Unparsed => "unparsed", // not a state: the gateway's answer
            Answer::Duplicate => "duplicate",
            Answer::Challenge => "url_verification",
            Answer::Ignored => "ignored", // not a state: the gateway's answer
            Answer::Rejected(_) => "rejected", // not a state: the gateway's answer
            Answer::Unavailable | Answer::Refused => "unavailable",
            Answer::Spooled => "spooled",
            Answer::Busy => "busy",
            Answer::Shed => "shed",
        }
    }
}

pub async fn slack_events(State(app): State<AppState>, request: Request) -> Response {
    let started = Instant::now();
    let (parts, body) = request.into_parts();
    let headers = parts.headers;
    let (answer, response) = match receive(&app, &headers, body).await {
        // (shedding is for deliveries over HTTP only: a Socket Mode
        // envelope not acknowledged is retried on a schedule of its own,
        // and such apps are small)
        Ok(body) if app.shed.active() && sheds(&app, &headers, &body) => (
            Answer::Shed,
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "overloaded: try again later",
            )
                .into_response(),
        ),
        Ok(body) => handle(&app, &headers, &body, "http").await,
        // The body may be unread: the connection cannot carry another
        // request, and a client (or proxy) must not try.
        Err((answer, mut response)) => {
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            (answer, response)
        }
    };
    if let Answer::Rejected(reason) = answer {
        metrics::counter!("threadline_gateway_rejections_total", "reason" => reason).increment(1);
    }
    metrics::histogram!("threadline_gateway_ack_seconds", "outcome" => answer.label())
        .record(started.elapsed().as_secs_f64());
    response
}

fn now_unix() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// The body of a delivery whose signature verifies. Signature headers that
/// are missing, malformed or stale are refused before the body is read; the
/// body is read only within the budget for unverified bytes (else 503,
/// unread), and that share is given back once the signature is checked.
pub(crate) async fn receive(
    app: &AppState,
    headers: &HeaderMap,
    body: Body,
) -> Result<Bytes, (Answer, Response)> {
    let now = now_unix();
    // The headers alone, against an empty body: every failure but a
    // mismatch is about the headers. The full check follows the read.
    match verify(app, headers, b"", now) {
        Ok(()) | Err(SignatureError::Mismatch) => {}
        Err(e) => return Err(unauthorized(e)),
    }
    let limit = app.max_body_bytes;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    let declared = declared.map(|n| n as usize);
    let Some(share) = app.unverified.reserve(declared.unwrap_or(limit)).await else {
        metrics::counter!("threadline_gateway_unverified_budget_refusals_total").increment(1);
        refusal_line("unverified_budget");
        let mut resp = StatusCode::SERVICE_UNAVAILABLE.into_response();
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        return Err((Answer::Busy, resp));
    };
    let body =
        match crate::unverified::read(body, limit, declared, app.body_timeout, share.cut()).await {
            Ok(body) => body,
            Err(ReadError::TooLarge) => return Err(too_large()),
            Err(ReadError::Slow) => {
                refusal_line("body_timeout");
                return Err((
                    Answer::Rejected("body_timeout"),
                    StatusCode::REQUEST_TIMEOUT.into_response(),
                ));
            }
            Err(ReadError::Broken) => {
                refusal_line("body_unreadable");
                return Err((
                    Answer::Rejected("body_unreadable"),
                    StatusCode::BAD_REQUEST.into_response(),
                ));
            }
        };
    verify(app, headers, &body, now).map_err(unauthorized)?;
    drop(share);
    Ok(body)
}

fn verify(
    app: &AppState,
    headers: &HeaderMap,
    body: &[u8],
    now: i64,
) -> Result<(), SignatureError> {
    app.verifier.verify(
        headers
            .get("x-slack-request-timestamp")
            .map(HeaderValue::as_bytes),
        headers.get("x-slack-signature").map(HeaderValue::as_bytes),
        body,
        now,
    )
}

/// A line for a refusal of an unverified request, at most one a minute per
/// `reason` (anyone can cause them at will; the metrics count each).
fn refusal_line(reason: &'static str) {
    if let Some(unlogged) = threadline_runtime::sampled::refusals().admit(reason) {
        tracing::warn!(
            reason,
            unlogged_since_last = unlogged,
            "unverified request refused (one line a minute per reason; the metrics count each)"
        );
    }
}

fn unauthorized(e: SignatureError) -> (Answer, Response) {
    // No detail to the caller, and nothing of the body or signatures in logs.
    refusal_line(e.reason_code());
    metrics::counter!("threadline_auth_failures_total", "source" => "slack_signature", "reason" => e.reason_code())
        .increment(1);
    (
        Answer::Rejected(e.reason_code()),
        StatusCode::UNAUTHORIZED.into_response(),
    )
}

fn too_large() -> (Answer, Response) {
    refusal_line("body_too_large");
    (
        Answer::Rejected("body_too_large"),
        StatusCode::PAYLOAD_TOO_LARGE.into_response(),
    )
}

/// An event body received over a Socket Mode connection (the app's own
/// connection stands for the signature): handled like a verified HTTP
/// delivery; the status its acknowledgement waits for (200 only once the
/// receipt and its outbox row are committed).
pub(crate) async fn accept_body(app: &AppState, headers: &HeaderMap, body: &[u8]) -> StatusCode {
    let started = Instant::now();
    let (answer, response) = handle(app, headers, body, "socket_mode").await;
    metrics::histogram!("threadline_gateway_ack_seconds", "outcome" => answer.label())
        .record(started.elapsed().as_secs_f64());
    response.status()
}

/// A delivery whose signature verified (or that came over the app's own
/// Socket Mode connection): recorded in Postgres, or kept in the spool when
/// Postgres cannot take it within the spool's bound, or when deliveries
/// already wait there (a new one goes behind them). A delivery without an
/// identity (a URL check, a malformed body) is never spooled.
async fn handle(
    app: &AppState,
    headers: &HeaderMap,
    body: &[u8],
    transport: &'static str,
) -> (Answer, Response) {
    let received = now_unix_ms();
    let Some(spool) = app.spool.as_deref() else {
        return record(app, headers, body, received).await;
    };
    // One deadline for the whole answer, inside Slack's 3 s.
    let deadline = tokio::time::Instant::now() + crate::spool::ANSWER_WITHIN;
    let left = || deadline.saturating_duration_since(tokio::time::Instant::now());
    // (the spool is tried once per delivery)
    let spooled = |why: &'static str, within: Duration| async move {
        let id = DeliveryIdentity::from_body(body)?;
        match spool
            .put(
                &id,
                retry_headers(headers),
                body,
                received,
                transport,
                within,
            )
            .await
        {
            Ok(()) => {
                metrics::counter!("threadline_gateway_spooled_total", "reason" => why).increment(1);
                Some((Answer::Spooled, StatusCode::OK.into_response()))
            }
            Err(e) => {
                tracing::error!(error = %e, reason = why, "could not spool the delivery");
                None
            }
        }
    };
    if spool.active() {
        return match spooled("behind_spooled", crate::spool::PUT_TIMEOUT).await {
            Some(r) => r,
            // The broker is away: Postgres alone, in the time left.
            None => {
                match tokio::time::timeout(left(), record(app, headers, body, received)).await {
                    Ok(r) => r,
                    Err(_) => {
                        unavailable(&"neither the spool nor Postgres took the delivery in time")
                    }
                }
            }
        };
    }
    let for_postgres = spool
        .after
        .min(left().saturating_sub(crate::spool::PUT_TIMEOUT));
    match tokio::time::timeout(for_postgres, record(app, headers, body, received)).await {
        // Away or overloaded: the spool keeps it. (A delivery Postgres
        // refused for good is answered 503 as it is: spooling it would
        // change nothing.)
        Ok((Answer::Unavailable, response)) => spooled("postgres_unavailable", left())
            .await
            .unwrap_or_else(|| {
                tracing::error!(
                    "neither Postgres nor the spool took the delivery: 503, Slack retries"
                );
                (Answer::Unavailable, response)
            }),
        Ok(r) => r,
        // (its intake entry is dropped unwritten: see the intake)
        Err(_) => spooled("postgres_slow", left()).await.unwrap_or_else(|| {
            unavailable(&"the receipt was not committed in time, and the spool refused it")
        }),
    }
}

/// A verified delivery, recorded in Postgres (receipt and outbox row, a
/// rejection, or an unparsed receipt) as received at `received` (unix ms).
pub(crate) async fn record(
    app: &AppState,
    headers: &HeaderMap,
    body: &[u8],
    received: i64,
) -> (Answer, Response) {
    // Slack's SSL check (sent to slash-command URLs): a signed form post
    // that only needs a 200.
    if is_ssl_check(headers, body) {
        return (Answer::Ignored, StatusCode::OK.into_response());
    }
    let envelope = match Envelope::parse(body) {
        Ok(e) => e,
        // Invariant 10: what carries an identity is kept, parsed or not.
        Err(e) => {
            return match DeliveryIdentity::from_body(body) {
                Some(identity) => {
                    let why = (e.reason_code(), parse_error_text(&e));
                    accept_unparsed(app, headers, identity, why, body).await
                }
                None => malformed(app, e).await,
            };
        }
    };
    match envelope {
        Envelope::UrlVerification { challenge } => (
            Answer::Challenge,
            axum::Json(serde_json::json!({ "challenge": challenge })).into_response(),
        ),
        Envelope::AppRateLimited {
            api_app_id,
            team_id,
            minute_rate_limited,
        } => {
            tracing::warn!(
                alert = "app_rate_limited",
                api_app_id = api_app_id.as_ref().map(|a| a.as_str()),
                team_id = team_id.as_ref().map(|t| t.as_str()),
                minute_rate_limited,
                "Slack is dropping events for this app: more than 30,000 events in an hour for a workspace"
            );
            metrics::counter!("threadline_gateway_app_rate_limited_total").increment(1);
            let r = threadline_store::rejections::app_rate_limited(
                &app.pool,
                api_app_id.as_ref().map(|a| a.as_str()),
                team_id.as_ref().map(|t| t.as_str()),
                minute_rate_limited,
            )
            .await;
            match r {
                Ok(_) => (Answer::Ignored, StatusCode::OK.into_response()),
                Err(e) => not_recorded(&e),
            }
        }
        Envelope::Other { envelope_type } => {
            tracing::info!(envelope_type = %envelope_type, "envelope type not handled; acknowledged");
            metrics::counter!("threadline_gateway_unhandled_envelopes_total").increment(1);
            (Answer::Ignored, StatusCode::OK.into_response())
        }
        Envelope::EventCallback(cb) => accept(app, headers, *cb, received).await,
    }
}

/// Whether this delivery is new work shed while its installation's
/// requests wait parked (parsed only while shedding is on; one that does
/// not parse, or whose installation is not in the resolver's cache, is
/// recorded as usual: nothing waits on Postgres before a delivery's answer
/// deadline is set).
fn sheds(app: &AppState, headers: &HeaderMap, body: &[u8]) -> bool {
    let retry = retry_headers(headers).0;
    if !crate::shed::early_try(retry) {
        return false;
    }
    let Ok(Envelope::EventCallback(cb)) = Envelope::parse(body) else {
        return false;
    };
    if !crate::shed::may_shed(&cb, retry) {
        return false;
    }
    match app.resolver.cached_active(&cb.installation_key()) {
        Some(installation) => app.shed.sheds(installation, retry),
        None => false,
    }
}

fn is_ssl_check(headers: &HeaderMap, body: &[u8]) -> bool {
    let form = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/x-www-form-urlencoded"));
    form && body.split(|b| *b == b'&').any(|kv| kv == b"ssl_check=1")
}

async fn malformed(app: &AppState, e: EnvelopeError) -> (Answer, Response) {
    let reason = e.reason_code();
    tracing::warn!(reason, error = %e, "signed delivery is malformed and has no identity; rejected without retry");
    if let Err(e) = record_rejection(app, reason, None).await {
        // Not recorded: let Slack retry, rather than lose the record.
        return not_recorded(&e);
    }
    let mut resp = (StatusCode::BAD_REQUEST, "malformed Events API payload").into_response();
    resp.headers_mut()
        .insert("x-slack-no-retry", HeaderValue::from_static("1"));
    (Answer::Rejected(reason), resp)
}

/// A delivery Postgres could not record because of `e`: refused for good
/// (a constraint, a value) or unavailable (away, overloaded).
fn not_recorded(e: &sqlx::Error) -> (Answer, Response) {
    if threadline_runtime::transient::sql_is_transient(e) {
        unavailable(e)
    } else {
        refused(e)
    }
}

/// [`not_recorded`] for the intake's error.
fn not_committed(e: &crate::intake::IntakeError) -> (Answer, Response) {
    match e {
        crate::intake::IntakeError::Refused(_) => refused(e),
        _ => unavailable(e),
    }
}

fn refused(e: &dyn std::fmt::Display) -> (Answer, Response) {
    tracing::error!(error = %e, "Postgres refused the delivery; answering 503");
    (
        Answer::Refused,
        StatusCode::SERVICE_UNAVAILABLE.into_response(),
    )
}

fn unavailable(e: &dyn std::fmt::Display) -> (Answer, Response) {
    // (with a spool, the delivery is spooled next: logged there)
    tracing::error!(error = %e, "could not record the delivery in Postgres");
    (
        Answer::Unavailable,
        StatusCode::SERVICE_UNAVAILABLE.into_response(),
    )
}

/// A minimal, content-free rejection record. A rejection is answered only
/// once it is recorded; otherwise the caller answers 503 and Slack retries.
async fn record_rejection(
    app: &AppState,
    reason: &str,
    cb: Option<(&EventCallback, Option<Uuid>)>,
) -> Result<(), sqlx::Error> {
    let key = cb.map(|(cb, _)| cb.installation_key());
    let r = threadline_store::rejections::record(
        &app.pool,
        &threadline_store::rejections::Rejection {
            reason,
            api_app_id: cb.map(|(cb, _)| cb.api_app_id.as_str()),
            team_id: key
                .as_ref()
                .and_then(|k| k.team_id.as_ref().map(|t| t.as_str())),
            enterprise_id: key
                .as_ref()
                .and_then(|k| k.enterprise_id.as_ref().map(|e| e.as_str())),
            event_id: cb.map(|(cb, _)| cb.event_id.as_str()),
            installation_id: cb.and_then(|(_, id)| id),
        },
    )
    .await;
    if let Err(e) = &r {
        tracing::warn!(reason, error = %e, "could not record rejection");
    }
    r
}

/// The reasons Slack documents for retrying a delivery (and `timeout`,
/// its reason for an envelope sent again over Socket Mode). The header is
/// not covered by the signature, so anything else is `other`: a replayed
/// delivery cannot mint metric series or stored values.
const RETRY_REASONS: [&str; 7] = [
    "timeout",
    "http_timeout",
    "too_many_redirects",
    "connection_failed",
    "ssl_error",
    "http_error",
    "unknown_error",
];

pub(crate) fn retry_headers(headers: &HeaderMap) -> (i32, Option<&'static str>) {
    let num = headers
        .get("x-slack-retry-num")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<i32>().ok())
        .filter(|n| (0..=100).contains(n))
        .unwrap_or(0);
    // Stored and counted only; a retry is never dropped for being one.
    let reason = headers.get("x-slack-retry-reason").map(|v| {
        let v = v.as_bytes().trim_ascii();
        RETRY_REASONS
            .into_iter()
            .find(|r| r.as_bytes() == v)
            .unwrap_or("other")
    });
    (num, reason)
}

#[tracing::instrument(skip_all, fields(event_id = %cb.event_id, api_app_id = %cb.api_app_id, installation_id))]
async fn accept(
    app: &AppState,
    headers: &HeaderMap,
    cb: EventCallback,
    received: i64,
) -> (Answer, Response) {
    let (installation_id, bot) = match app.resolver.resolve_with_bot(&cb.installation_key()).await {
        Ok((Resolved::Active(id), bot)) => (id, bot),
        Ok((Resolved::Disabled(id), _)) => {
            if let Err(e) =
                record_rejection(app, "installation_disabled", Some((&cb, Some(id)))).await
            {
                return not_recorded(&e);
            }
            return (
                Answer::Rejected("installation_disabled"),
                StatusCode::OK.into_response(),
            );
        }
        Ok((Resolved::Unknown, _)) => {
            tracing::warn!("event for an unknown installation; acknowledged, no job");
            if let Err(e) = record_rejection(app, "unknown_installation", Some((&cb, None))).await {
                return not_recorded(&e);
            }
            return (
                Answer::Rejected("unknown_installation"),
                StatusCode::OK.into_response(),
            );
        }
        Err(e) => return not_recorded(&e),
    };
    tracing::Span::current().record("installation_id", tracing::field::display(installation_id));
    let (retry_num, retry_reason) = retry_headers(headers);
    count_retry(retry_num, retry_reason);
    let carrier = threadline_runtime::telemetry::current_trace_carrier();
    let mut receipt = build_receipt(
        &cb,
        ReceiptMeta {
            id: Uuid::now_v7(),
            installation_id,
            retry_num,
            retry_reason: retry_reason.map(str::to_owned),
            received_at_unix_ms: received,
            traceparent: carrier.get("traceparent").cloned(),
            tracestate: carrier.get("tracestate").cloned(),
        },
    );
    // Our own new reply is settled with its receipt: no outbox round, no
    // context-builder work (the publisher recorded the post already).
    if let Some(bot) = &bot {
        threadline_store::receipts::settle_own_reply(&mut receipt, &cb, bot, |channel| {
            threadline_runtime::audit::channel_ref(installation_id, channel)
        });
    }
    match app.intake.submit(receipt).await {
        Ok(Outcome::New | Outcome::Settled) => (Answer::Accepted, StatusCode::OK.into_response()),
        Ok(Outcome::Duplicate) => (Answer::Duplicate, StatusCode::OK.into_response()),
        Err(e) => not_committed(&e),
    }
}

fn count_retry(retry_num: i32, retry_reason: Option<&'static str>) {
    if retry_num > 0 {
        metrics::counter!(
            "threadline_gateway_slack_retries_total",
            "reason" => retry_reason.unwrap_or("unspecified")
        )
        .increment(1);
    }
}

/// A signed delivery whose identity reads but whose envelope or event does
/// not parse: recorded as an `unparsed` receipt with its body (for replay
/// after an upgrade) and answered 200 only once committed; a retry of it is
/// a duplicate. Its installation is resolved when it can be (a disabled one
/// is recorded too: the receipt is held, not processed), else left unknown.
#[tracing::instrument(skip_all, fields(event_id = %identity.event_id, api_app_id = %identity.api_app_id, installation_id, reason))]
async fn accept_unparsed(
    app: &AppState,
    headers: &HeaderMap,
    identity: DeliveryIdentity,
    (reason, error): (&'static str, String),
    body: &[u8],
) -> (Answer, Response) {
    let installation_id = match app.resolver.resolve(&identity.installation_key()).await {
        Ok(Resolved::Active(id) | Resolved::Disabled(id)) => Some(id),
        Ok(Resolved::Unknown) => None,
        Err(e) => return not_recorded(&e),
    };
    if let Some(id) = installation_id {
        tracing::Span::current().record("installation_id", tracing::field::display(id));
    }
    // The parser's message names fields, never values.
    tracing::warn!(reason, error = %error, "signed delivery does not parse; held as unparsed");
    let (retry_num, retry_reason) = retry_headers(headers);
    count_retry(retry_num, retry_reason);
    let key = identity.installation_key();
    let receipt = NewReceipt {
        id: Uuid::now_v7(),
        installation_id,
        api_app_id: identity.api_app_id.to_string(),
        event_id: identity.event_id.to_string(),
        team_id: key
            .team_id
            .as_ref()
            .or(identity.team_id.as_ref())
            .map(|t| t.to_string()),
        enterprise_id: key.enterprise_id.as_ref().map(|e| e.to_string()),
        event_type: identity
            .event_type
            .clone()
            .unwrap_or_else(|| "unknown".to_owned()), // not a state: no event type
        event_subtype: None,
        channel_id: None,
        message_ts: None,
        thread_ts: None,
        event_time: identity.event_time,
        retry_num,
        retry_reason: retry_reason.map(str::to_owned),
        msg_id: String::new(),
        payload: Vec::new(),
        traceparent: None,
        tracestate: None,
        unparsed: Some(Unparsed {
            parse_error: error,
            body: body.to_vec(),
        }),
        own_reply: None,
    };
    match app.intake.submit(receipt).await {
        Ok(Outcome::New | Outcome::Settled) => {
            metrics::counter!("threadline_gateway_unparsed_total", "reason" => reason).increment(1);
            (Answer::Unparsed, StatusCode::OK.into_response())
        }
        Ok(Outcome::Duplicate) => (Answer::Duplicate, StatusCode::OK.into_response()),
        Err(e) => not_committed(&e),
    }
}

/// A delivery Postgres refused time and again (out of the spool): kept
/// as an `unparsed` receipt with its body, held for an operator and for
/// replay, never dropped (invariant 10).
pub(crate) async fn hold_refused(
    app: &AppState,
    headers: &HeaderMap,
    body: &[u8],
) -> (Answer, Response) {
    match DeliveryIdentity::from_body(body) {
        Some(identity) => {
            let why = (
                "refused_by_postgres",
                "refused_by_postgres: Postgres refused its receipt, time and again".to_owned(),
            );
            accept_unparsed(app, headers, identity, why, body).await
        }
        None => refused(&"a spooled delivery without an identity"),
    }
}

fn now_unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_headers_are_bounded_and_mapped_to_slacks_reasons() {
        let mut h = HeaderMap::new();
        assert_eq!(retry_headers(&h), (0, None));
        h.insert("x-slack-retry-num", HeaderValue::from_static("2"));
        h.insert(
            "x-slack-retry-reason",
            HeaderValue::from_static("http_timeout"),
        );
        assert_eq!(retry_headers(&h), (2, Some("http_timeout")));
        for reason in RETRY_REASONS {
            h.insert("x-slack-retry-reason", HeaderValue::from_static(reason));
            assert_eq!(retry_headers(&h).1, Some(reason));
        }
        h.insert("x-slack-retry-num", HeaderValue::from_static("-1"));
        h.insert("x-slack-retry-reason", HeaderValue::from_static("<script>"));
        assert_eq!(retry_headers(&h), (0, Some("other")));
        h.insert(
            "x-slack-retry-reason",
            HeaderValue::from_static("http_timeout_2"),
        );
        assert_eq!(retry_headers(&h).1, Some("other"));
    }

    #[test]
    fn ssl_check_needs_a_form_body() {
        let mut h = HeaderMap::new();
        assert!(!is_ssl_check(&h, b"ssl_check=1&token=x"));
        h.insert(
            "content-type",
            HeaderValue::from_static("application/x-www-form-urlencoded"),
        );
        assert!(is_ssl_check(&h, b"ssl_check=1&token=x"));
        assert!(!is_ssl_check(&h, b"ssl_check=0"));
    }
}
