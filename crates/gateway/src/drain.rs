//! The spool's drainer, beside the relay: it records each spooled delivery
//! exactly as the gateway would have on arrival (see [`crate::spool`]).

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use axum::http::{HeaderMap, HeaderValue};
use prost::Message as _;
use threadline_proto::v1::SpooledDelivery;
use threadline_runtime::bus::{Topic, Topology};
use threadline_runtime::shutdown::CancellationToken;
use threadline_runtime::worker::{Contracts, Disposition};

use crate::AppState;
use crate::events::Answer;

/// Deliveries the drainer records at once, in spool order (they are
/// submitted together, so the intake commits them together).
pub const DRAIN_WINDOW: usize = 32;

/// A delivery Postgres refused this many times is kept as an `unparsed`
/// receipt instead (held, with its body).
const REFUSALS_BEFORE_HOLDING: i64 = 5;

/// Records one spooled delivery as the gateway would have on arrival.
/// Postgres away → `Transient` (the drainer waits); Postgres refusing this
/// delivery → `Fail` a few times, then it is held as an `unparsed` receipt
/// with its body (never dropped, and the spool moves on); an undecodable
/// message → `Poison` (dead-lettered).
pub async fn drain_one(app: &AppState, payload: &[u8], delivered: i64) -> Disposition {
    let Ok(d) = SpooledDelivery::decode(payload) else {
        return Disposition::Poison("undecodable_spooled_delivery".into());
    };
    let mut headers = HeaderMap::new();
    if let Ok(v) = HeaderValue::from_str(&d.retry_num.to_string()) {
        headers.insert("x-slack-retry-num", v);
    }
    if let Ok(v) = HeaderValue::from_str(&d.retry_reason)
        && !d.retry_reason.is_empty()
    {
        headers.insert("x-slack-retry-reason", v);
    }
    let (mut answer, _) =
        crate::events::record(app, &headers, &d.body, d.received_at_unix_ms).await;
    if answer == Answer::Refused && delivered >= REFUSALS_BEFORE_HOLDING {
        answer = crate::events::hold_refused(app, &headers, &d.body).await.0;
    }
    match answer {
        Answer::Unavailable => Disposition::Transient,
        Answer::Refused => Disposition::Fail("refused_by_postgres".into()),
        a => {
            metrics::counter!("threadline_spool_drained_total", "outcome" => a.label())
                .increment(1);
            Disposition::Done
        }
    }
}

/// Runs the drainer on the spool's durable consumer until `shutdown`
/// (started again whenever it stops otherwise: the consumer was deleted
/// or not declared yet).
pub async fn drain(
    app: AppState,
    js: jetstream::Context,
    topology: Topology,
    letters: Arc<dyn Contracts>,
    stop: CancellationToken,
) {
    let app = Arc::new(app);
    while !stop.is_cancelled() {
        let handler = {
            let app = app.clone();
            move |msg: jetstream::Message| {
                let app = app.clone();
                async move {
                    let delivered = msg.info().map(|i| i.delivered).unwrap_or(1);
                    drain_one(&app, &msg.payload, delivered).await
                }
            }
        };
        let r = threadline_runtime::worker::run(
            js.clone(),
            topology.clone(),
            letters.clone(),
            Topic::Spool,
            DRAIN_WINDOW,
            stop.clone(),
            handler,
        )
        .await;
        if stop.is_cancelled() {
            return;
        }
        match r {
            Ok(()) => tracing::warn!("the spool drainer stopped; starting it again"),
            Err(e) => tracing::warn!(
                error = format!("{e:#}"),
                "the spool drainer could not start; trying again"
            ),
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(Duration::from_secs(2)) => {}
        }
    }
}
