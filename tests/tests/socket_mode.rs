//! Socket Mode intake, judged from Slack's side: a gateway that opens
//! WebSocket connections to slack-sim (`apps.connections.open` with the
//! app-level token) receives events as envelopes and acknowledges each one
//! only after its receipt and outbox row are committed. slack-sim's socket
//! log (every envelope sent, every acknowledgement received, with its
//! connection) and the thread say what happened.

use std::time::Duration;

use serde_json::{Value, json};
use threadline_testkit::eventually;
use threadline_tests::{Proc, Stack, sim_ctl, sim_get};

/// A stack whose app is in Socket Mode, served by a gateway replica that
/// holds two connections; the HTTP gateway gets no events any more.
async fn socket_stack() -> (Stack, Proc) {
    socket_stack_with(&[]).await
}

async fn socket_stack_with(extra: &[(&str, String)]) -> (Stack, Proc) {
    let s = Stack::start(extra).await;
    let gateway = s.spawn_socket_gateway().await;
    eventually("two connections open", Duration::from_secs(30), || async {
        let v = log(&s).await;
        (v["connections"].as_array()?.len() >= 2).then_some(())
    })
    .await;
    (s, gateway)
}

async fn log(s: &Stack) -> Value {
    sim_get(&s.sim, &format!("socket?app_id={}", s.app)).await
}

fn entries(v: &Value) -> Vec<Value> {
    v["log"].as_array().cloned().unwrap_or_default()
}

/// The envelopes of the events `event_ids` sent so far, and the
/// acknowledgements that matched one of them.
async fn envelopes_about(s: &Stack, event_ids: &[String]) -> (Vec<Value>, Vec<Value>) {
    let all = entries(&log(s).await);
    let sent: Vec<Value> = all
        .iter()
        .filter(|e| {
            e["direction"] == "sent"
                && e["kind"] == "events_api"
                && e["event_id"]
                    .as_str()
                    .is_some_and(|id| event_ids.iter().any(|x| x == id))
        })
        .cloned()
        .collect();
    let ids: Vec<&str> = sent
        .iter()
        .filter_map(|e| e["envelope_id"].as_str())
        .collect();
    let acked = all
        .iter()
        .filter(|e| {
            e["direction"] == "received"
                && e["kind"] == "ack"
                && e["matched"] == true
                && e["envelope_id"]
                    .as_str()
                    .is_some_and(|id| ids.contains(&id))
        })
        .cloned()
        .collect();
    (sent, acked)
}

/// The events slack-sim delivered about message `ts` (the mention and its
/// `message` twin).
async fn event_ids_of(s: &Stack, ts: &str) -> Vec<String> {
    let d = sim_get(&s.sim, &format!("deliveries?app_id={}", s.app)).await;
    let mut ids: Vec<String> = d["deliveries"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|x| x["message_ts"] == ts)
        .filter_map(|x| x["event_id"].as_str().map(str::to_owned))
        .collect();
    ids.sort();
    ids.dedup();
    ids
}

/// A mention over Socket Mode is answered once; a connection dropped right
/// after an envelope was sent (before any acknowledgement could come) and
/// an envelope sent twice over both connections still give one receipt per
/// event and one answer each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socket_mode_survives_a_dropped_connection_and_duplicate_envelopes_with_one_receipt_each() {
    let (s, gateway) = socket_stack().await;
    let mut roots = Vec::new();
    for fault in ["drop_mid_envelope", "duplicate_envelope"] {
        sim_ctl(&s.sim, "faults", json!({"method": "socket", "mode": fault})).await;
        let root = s
            .post(&format!("<@{}> {fault}: what happened?", s.bot_user), None)
            .await;
        let answers = s.wait_answers(&root, 1).await;
        assert_eq!(answers.len(), 1, "{fault}: {answers:?}");
        let ids = event_ids_of(&s, &root).await;
        assert!(!ids.is_empty(), "{fault}: delivered");
        for id in &ids {
            let n = threadline_store::testing::receipts::count_receipts_of(&s.db.pool, id)
                .await
                .expect("receipts");
            assert_eq!(n, 1, "{fault}: one receipt for {id}");
        }
        let (sent, acked) = envelopes_about(&s, &ids).await;
        assert!(
            sent.len() > ids.len(),
            "{fault}: the fault made slack-sim send again: {sent:?}"
        );
        assert!(!acked.is_empty(), "{fault}: acknowledged");
        roots.push(root);
    }
    let seen = log(&s).await;
    assert!(
        entries(&seen)
            .iter()
            .any(|e| e["direction"] == "closed" && e["kind"] == "dropped"),
        "a connection was dropped: {seen}"
    );
    eventually(
        "the dropped connection replaced",
        Duration::from_secs(30),
        || async { (log(&s).await["connections"].as_array()?.len() >= 2).then_some(()) },
    )
    .await;
    // Slack refreshes every connection: fresh ones are opened, and a
    // mention right after is still answered once.
    let before: Vec<Value> = log(&s).await["connections"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    sim_ctl(
        &s.sim,
        "socket/disconnect",
        json!({"app_id": s.app, "reason": "refresh_requested", "close_after_ms": 500}),
    )
    .await;
    eventually("fresh connections", Duration::from_secs(30), || async {
        let now = log(&s).await["connections"].as_array().cloned()?;
        (now.len() >= 2 && now.iter().all(|c| !before.contains(c))).then_some(())
    })
    .await;
    let root = s
        .post(&format!("<@{}> after the refresh?", s.bot_user), None)
        .await;
    assert_eq!(s.wait_answers(&root, 1).await.len(), 1);
    // The replica is ready while a connection is open, and not once Slack
    // disabled the app's Socket Mode and closed them (it takes no events).
    let ready = || async {
        reqwest::get(format!("{}/readyz", gateway.base_url))
            .await
            .expect("readyz")
            .status()
            .as_u16()
    };
    assert_eq!(ready().await, 200);
    sim_ctl(
        &s.sim,
        "socket/disconnect",
        json!({"app_id": s.app, "reason": "link_disabled", "close_after_ms": 200}),
    )
    .await;
    eventually("the replica not ready", Duration::from_secs(30), || async {
        (ready().await == 503).then_some(())
    })
    .await;
    gateway.kill().await;
    s.stop().await;
}

/// Without a spool, with Postgres away nothing can be committed, so no
/// envelope is acknowledged: slack-sim sends the mention again and again;
/// once Postgres is back one delivery is acknowledged, after its commit,
/// and the mention is answered once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_spool_no_envelope_is_acknowledged_before_its_receipt_is_committed() {
    let (s, gateway) = socket_stack_with(&[("THREADLINE_SPOOL_ENABLED", "false".to_owned())]).await;
    s.db.take_down().await;
    let root = s
        .post(&format!("<@{}> is the database up?", s.bot_user), None)
        .await;
    let ids = eventually(
        "the events were delivered",
        Duration::from_secs(20),
        || async {
            let ids = event_ids_of(&s, &root).await;
            (!ids.is_empty()).then_some(ids)
        },
    )
    .await;
    // Slack's deadline passes for the first envelopes (3 s) with no commit
    // possible: none of them is acknowledged.
    let sent = eventually(
        "an envelope sent again",
        Duration::from_secs(30),
        || async {
            let (sent, acked) = envelopes_about(&s, &ids).await;
            assert!(
                acked.is_empty(),
                "acknowledged while nothing could be committed: {acked:?}"
            );
            sent.iter()
                .any(|e| e["retry_attempt"].as_u64().is_some_and(|n| n >= 1))
                .then_some(sent)
        },
    )
    .await;
    assert!(sent.len() >= 2, "{sent:?}");
    let (_, acked) = envelopes_about(&s, &ids).await;
    assert!(acked.is_empty(), "{acked:?}");
    s.db.bring_up().await;
    let answers = s.wait_answers(&root, 1).await;
    assert_eq!(answers.len(), 1, "{answers:?}");
    let (_, acked) = envelopes_about(&s, &ids).await;
    assert!(!acked.is_empty(), "acknowledged once committed");
    for id in &ids {
        let n = threadline_store::testing::receipts::count_receipts_of(&s.db.pool, id)
            .await
            .expect("receipts");
        assert_eq!(n, 1, "one receipt for {id}");
    }
    // The envelopes sent again are counted as Slack's retries, by the reason
    // Socket Mode gives.
    let metrics = reqwest::get(format!("{}/metrics", gateway.base_url))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("threadline_gateway_slack_retries_total{reason=\"timeout\"}")),
        "{metrics}"
    );
    gateway.kill().await;
    s.stop().await;
}

/// With Postgres away an envelope is acknowledged once the broker holds it
/// in the spool (Socket Mode as HTTP); once Postgres is back the drainer
/// records each event once and the mention is answered once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_envelope_is_acknowledged_once_spooled_while_postgres_is_away() {
    let (s, gateway) = socket_stack_with(&[("THREADLINE_SPOOL_AFTER_MS", "500".to_owned())]).await;
    s.db.take_down().await;
    let root = s
        .post(&format!("<@{}> is the spool there?", s.bot_user), None)
        .await;
    let ids = eventually(
        "the events were delivered",
        Duration::from_secs(20),
        || async {
            let ids = event_ids_of(&s, &root).await;
            (ids.len() >= 2).then_some(ids)
        },
    )
    .await;
    eventually(
        "every envelope acknowledged",
        Duration::from_secs(20),
        || async {
            let (sent, acked) = envelopes_about(&s, &ids).await;
            (!sent.is_empty() && acked.len() >= ids.len()).then_some(())
        },
    )
    .await;
    let (sent, _) = envelopes_about(&s, &ids).await;
    assert!(
        sent.iter().all(|e| e["retry_attempt"].as_u64() == Some(0)),
        "nothing sent again: {sent:?}"
    );
    assert!(s.answers(&root).await.is_empty(), "nothing answered yet");
    s.db.bring_up().await;
    let answers = s.wait_answers(&root, 1).await;
    assert_eq!(answers.len(), 1, "{answers:?}");
    for id in &ids {
        let n = threadline_store::testing::receipts::count_receipts_of(&s.db.pool, id)
            .await
            .expect("receipts");
        assert_eq!(n, 1, "one receipt for {id}");
    }
    gateway.kill().await;
    s.stop().await;
}

/// The ids of the app's open connections.
async fn open_connections(s: &Stack) -> Vec<u64> {
    log(s).await["connections"]
        .as_array()
        .map(|c| c.iter().filter_map(|x| x["id"].as_u64()).collect())
        .unwrap_or_default()
}

/// Whether the app closed connection `c` (the emulator saw it go).
async fn closed_by_app(s: &Stack, c: u64) -> bool {
    entries(&log(s).await)
        .iter()
        .any(|e| e["direction"] == "closed" && e["connection"] == c && e["kind"] == "app")
}

/// A message larger than any envelope Slack sends is not read into memory:
/// the gateway closes that connection at once, opens another, and intake
/// goes on (a mention after it is answered once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_socket_message_closes_its_connection_and_intake_goes_on() {
    let (s, gateway) = socket_stack().await;
    let c = open_connections(&s).await[0];
    sim_ctl(
        &s.sim,
        "socket/send",
        json!({"app_id": s.app, "connection": c, "pad_bytes": 3 << 20}),
    )
    .await;
    eventually(
        "the oversized message's connection closed by the gateway",
        Duration::from_secs(20),
        || async { closed_by_app(&s, c).await.then_some(()) },
    )
    .await;
    eventually("two connections again", Duration::from_secs(30), || async {
        (open_connections(&s).await.len() >= 2).then_some(())
    })
    .await;
    let root = s
        .post(&format!("<@{}> still there?", s.bot_user), None)
        .await;
    assert_eq!(s.wait_answers(&root, 1).await.len(), 1);
    gateway.kill().await;
    s.stop().await;
}

/// A connection Slack asked to replace (a `disconnect` warning) is closed
/// by a fixed deadline, however long it is kept alive with pings: no task
/// is left reading it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_connection_is_closed_by_its_deadline_whatever_keeps_it_alive() {
    let (s, gateway) = socket_stack().await;
    let c = open_connections(&s).await[0];
    sim_ctl(
        &s.sim,
        "socket/disconnect",
        json!({"app_id": s.app, "connection": c, "reason": "warning"}),
    )
    .await;
    // Slack's warning leaves it open; pings every second keep it alive.
    sim_ctl(
        &s.sim,
        "socket/send",
        json!({"app_id": s.app, "connection": c, "ping_every_ms": 1000, "pings": 90}),
    )
    .await;
    eventually(
        "the replaced connection closed by the gateway",
        Duration::from_secs(40),
        || async { closed_by_app(&s, c).await.then_some(()) },
    )
    .await;
    gateway.kill().await;
    s.stop().await;
}
