//! Events API delivery by Slack's rules: signed with the app's signing
//! secret; a delivery fails on no answer within the deadline (3 s), a
//! non-2xx status or a connection error; a failed delivery is retried up to
//! 3 times — nearly at once, after 1 minute, after 5 minutes (times the time
//! scale) — with `X-Slack-Retry-Num` and `X-Slack-Retry-Reason`; a non-2xx
//! answer with `X-Slack-No-Retry: 1` stops the retries. An app in Socket
//! Mode gets its events over its connections on the same schedule (see
//! [`crate::socket`]).

use std::time::Duration;

use threadline_slack::{SigningSecret, sign};

use crate::Sim;
use crate::model::{DeliveryRecord, FaultMode, now_micros, now_unix};

pub use crate::model::Envelope;

/// `X-Slack-Request-Timestamp` and `X-Slack-Signature` for a body sent at `ts`.
pub fn signature_headers(secret: &SigningSecret, ts: i64, body: &[u8]) -> (String, String) {
    let ts = ts.to_string();
    let sig = sign(secret, &ts, body);
    (ts, sig)
}

/// Retry delays after the first attempt, in unscaled seconds.
const RETRY_DELAYS: [f64; 3] = [0.0, 60.0, 300.0];

/// Starts delivering each envelope (in order, unless a reorder window holds
/// them back and releases them reversed).
pub fn dispatch(sim: &Sim, envelopes: Vec<Envelope>) {
    let mut ready = Vec::new();
    let mut reordered = false;
    {
        let mut w = sim.lock();
        let window = w.settings.reorder_window;
        if window > 1 {
            w.reorder_queue.extend(envelopes);
            if w.reorder_queue.len() >= window {
                ready = std::mem::take(&mut w.reorder_queue);
                ready.reverse();
                reordered = true;
            }
        } else {
            ready = envelopes;
        }
    }
    if reordered {
        // Released in reverse: each first attempt finishes before the next
        // starts, so the app sees exactly the reversed order.
        let sim = sim.clone();
        tokio::spawn(async move {
            for env in ready {
                let (tx, rx) = tokio::sync::oneshot::channel();
                tokio::spawn(deliver(sim.clone(), env, Some(tx)));
                let _ = rx.await;
            }
        });
    } else {
        for env in ready {
            tokio::spawn(deliver(sim.clone(), env, None));
        }
    }
}

enum Outcome {
    Status(u16, bool),
    Timeout,
    ConnectionFailed,
}

/// Delivers one event with retries; `first_done` is told when the first
/// attempt has finished.
async fn deliver(
    sim: Sim,
    env: Envelope,
    mut first_done: Option<tokio::sync::oneshot::Sender<()>>,
) {
    let body = serde_json::to_vec(&env.body).unwrap_or_default();
    let mut retry_reason: Option<&'static str> = None;
    let mut previous_connection = None;
    for attempt in 0..=RETRY_DELAYS.len() as u32 {
        if attempt > 0 {
            let scale = sim.lock().settings.time_scale;
            let secs = RETRY_DELAYS[attempt as usize - 1] * scale;
            tokio::time::sleep(Duration::from_secs_f64(secs.max(0.05))).await;
        }
        let socket_mode = sim.lock().apps.get(&env.app_id).map(|a| a.socket_mode);
        if socket_mode == Some(true) {
            let a = crate::socket::deliver(&sim, &env, attempt, retry_reason, previous_connection)
                .await;
            if let Some(tx) = first_done.take() {
                let _ = tx.send(());
            }
            if a.done {
                return;
            }
            retry_reason = a.next_reason;
            previous_connection = a.connection;
            continue;
        }
        let (app, fault, deadline) = {
            let mut w = sim.lock();
            let Some(app) = w.apps.get(&env.app_id).cloned() else {
                return;
            };
            let fault = w.take_fault("events", Some(&env.app_id), env.channel.as_deref());
            (
                app,
                fault,
                Duration::from_millis(w.settings.delivery_deadline_ms),
            )
        };
        let Some(first) = app.request_urls.first().cloned() else {
            return;
        };
        let urls = match fault.as_ref().map(|f| f.mode) {
            Some(FaultMode::Duplicate) => app.request_urls.clone(),
            _ => vec![first],
        };
        let Ok(secret) = SigningSecret::new(&app.signing_secret) else {
            return;
        };
        let sends = urls.iter().map(|url| {
            let (ts, sig) = signature_headers(&secret, now_unix(), &body);
            let mut req = sim
                .http
                .post(url)
                .timeout(deadline)
                .header("content-type", "application/json")
                .header("x-slack-request-timestamp", ts)
                .header("x-slack-signature", sig)
                .body(body.clone());
            if let Some(reason) = retry_reason {
                req = req
                    .header("x-slack-retry-num", attempt.to_string())
                    .header("x-slack-retry-reason", reason);
            }
            async move {
                match req.send().await {
                    Ok(r) => {
                        let no_retry = r
                            .headers()
                            .get("x-slack-no-retry")
                            .is_some_and(|v| v.as_bytes() == b"1");
                        Outcome::Status(r.status().as_u16(), no_retry)
                    }
                    Err(e) if e.is_timeout() => Outcome::Timeout,
                    Err(_) => Outcome::ConnectionFailed,
                }
            }
        });
        let sent_at = now_micros();
        let outcomes = futures::future::join_all(sends).await;
        let held = matches!(
            fault.as_ref().map(|f| f.mode),
            Some(FaultMode::HoldPastDeadline)
        );
        let mut done = false;
        let mut next_reason = None;
        {
            let mut w = sim.lock();
            for (i, (url, outcome)) in urls.iter().zip(&outcomes).enumerate() {
                let (status, result) = match outcome {
                    _ if held && i == 0 => (None, "held_past_deadline"),
                    Outcome::Status(s, _) if (200..300).contains(s) => (Some(*s), "ok"),
                    Outcome::Status(s, true) => (Some(*s), "http_error_no_retry"),
                    Outcome::Status(s, false) => (Some(*s), "http_error"),
                    Outcome::Timeout => (None, "http_timeout"),
                    Outcome::ConnectionFailed => (None, "connection_failed"),
                };
                w.deliveries.push(DeliveryRecord {
                    event_id: env.event_id.clone(),
                    app_id: env.app_id.clone(),
                    event_type: env.event_type.clone(),
                    url: url.clone(),
                    attempt,
                    retry_reason: retry_reason.map(str::to_owned),
                    status,
                    result: result.to_owned(),
                    at_micros: now_micros(),
                    sent_at_micros: sent_at,
                    channel: env.channel.clone(),
                    message_ts: env.message_ts.clone(),
                    subtype: env.subtype.clone(),
                    envelope_id: None,
                    connection: None,
                    ack_connection: None,
                });
                if i == 0 {
                    match result {
                        "ok" | "http_error_no_retry" => done = true,
                        "held_past_deadline" | "http_timeout" => next_reason = Some("http_timeout"),
                        "connection_failed" => next_reason = Some("connection_failed"),
                        _ => next_reason = Some("http_error"),
                    }
                }
            }
        }
        if let Some(tx) = first_done.take() {
            let _ = tx.send(());
        }
        if done {
            return;
        }
        retry_reason = next_reason;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deliveries_are_signed_as_in_slacks_documented_example() {
        let body = std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/fixtures/slack/signing/body.txt"
        ))
        .expect("fixture");
        let secret = SigningSecret::new("8f742231b10e8888abcd99yyyzzz85a5").expect("secret");
        assert_eq!(
            signature_headers(&secret, 1_531_420_618, &body),
            (
                "1531420618".to_owned(),
                "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503".to_owned()
            )
        );
    }
}
