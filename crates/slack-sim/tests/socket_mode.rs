//! slack-sim's Socket Mode against Slack's documented behaviour:
//! `apps.connections.open`, `hello`, envelopes and their acks, retries on
//! the Events API schedule, `disconnect` messages and socket faults, seen
//! from a WebSocket client as an app sees them.

use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use threadline_slack_sim::Sim;
use threadline_testkit::eventually;
use threadline_testkit::sim::SimWorkspace;
use tokio_tungstenite::tungstenite::Message;

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn serve(seed: u64) -> String {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = l.local_addr().expect("addr");
    let router = threadline_slack_sim::router(Sim::new(seed));
    tokio::spawn(async move { axum::serve(l, router).await });
    format!("http://{addr}")
}

/// A workspace whose app is in Socket Mode and subscribed to channel
/// messages; retries after 0.05 s, 0.6 s and 3 s, acks due in 300 ms.
async fn workspace(seed: u64) -> SimWorkspace {
    let base = serve(seed).await;
    let ws = SimWorkspace::create(
        &base,
        json!({"socket_mode": true, "events": ["message.channels"]}),
        &["chat:write"],
        None,
    )
    .await;
    ws.ctl(
        "settings",
        json!({"time_scale": 0.01, "delivery_deadline_ms": 300}),
    )
    .await;
    ws
}

async fn connect(url: &str) -> Ws {
    tokio_tungstenite::connect_async(url)
        .await
        .expect("websocket")
        .0
}

/// Opens a connection and reads its `hello`.
async fn open(w: &SimWorkspace) -> (Ws, Value) {
    let mut ws = connect(&w.socket_url().await).await;
    let hello = next(&mut ws).await.expect("hello");
    (ws, hello)
}

/// The next text message within `ms`: `Some(Ok)` a message, `Some(Err)`
/// the connection closed, `None` nothing in time.
async fn next_within(ws: &mut Ws, ms: u64) -> Option<Result<Value, ()>> {
    let read = async {
        loop {
            match ws.next().await {
                Some(Ok(Message::Text(t))) => {
                    return Ok(serde_json::from_str(t.as_str()).expect("json"));
                }
                Some(Ok(Message::Close(_))) | Some(Err(_)) | None => return Err(()),
                Some(Ok(_)) => {}
            }
        }
    };
    tokio::time::timeout(Duration::from_millis(ms), read)
        .await
        .ok()
}

/// The next text message (`None`: the connection closed).
async fn next(ws: &mut Ws) -> Option<Value> {
    next_within(ws, 5000).await.expect("a message in time").ok()
}

async fn ack(ws: &mut Ws, envelope: &Value) {
    ws.send(Message::Text(
        json!({"envelope_id": envelope["envelope_id"]})
            .to_string()
            .into(),
    ))
    .await
    .expect("ack");
}

/// The connection ids, oldest first.
async fn connection_ids(w: &SimWorkspace) -> Vec<u64> {
    w.socket_log().await["connections"]
        .as_array()
        .expect("connections")
        .iter()
        .map(|c| c["id"].as_u64().expect("id"))
        .collect()
}

/// The delivery log once it holds `n` attempts.
async fn deliveries(w: &SimWorkspace, n: usize) -> Vec<Value> {
    eventually("deliveries", Duration::from_secs(10), || async {
        let d = w.deliveries().await;
        let d = d.as_array().cloned().unwrap_or_default();
        (d.len() >= n).then_some(d)
    })
    .await
}

async fn web_api(w: &SimWorkspace, method: &str, token: Option<&str>) -> Value {
    let mut r = w.http.post(format!("{}/api/{method}", w.base));
    if let Some(t) = token {
        r = r.bearer_auth(t);
    }
    r.send().await.expect("web api").json().await.expect("json")
}

#[tokio::test]
async fn connections_open_takes_only_the_app_token_and_each_url_connects_once() {
    let w = workspace(31).await;
    let bot = web_api(&w, "apps.connections.open", Some(&w.token())).await;
    assert_eq!(bot["error"], "not_allowed_token_type");
    let bogus = web_api(&w, "apps.connections.open", Some("xapp-1-A0-nope")).await;
    assert_eq!(bogus["error"], "invalid_auth");
    let none = web_api(&w, "apps.connections.open", None).await;
    assert_eq!(none["error"], "not_authed");

    let answer = web_api(&w, "apps.connections.open", Some(&w.app_token())).await;
    assert_eq!(answer["ok"], true);
    let url = answer["url"].as_str().expect("url");
    let host = w.base.trim_start_matches("http://");
    assert!(url.starts_with(&format!("ws://{host}/socket/")), "{url}");

    let mut first = connect(url).await;
    let hello = next(&mut first).await.expect("hello");
    assert_eq!(hello["type"], "hello");
    assert_eq!(hello["num_connections"], 1);
    assert_eq!(hello["connection_info"]["app_id"], w.app_id());
    assert!(hello["debug_info"]["host"].is_string(), "{hello}");
    assert!(
        tokio_tungstenite::connect_async(url).await.is_err(),
        "a URL connects once"
    );

    // A second connection at once: the app holds both.
    let (_second, hello) = open(&w).await;
    assert_eq!(hello["num_connections"], 2);
    assert_eq!(connection_ids(&w).await.len(), 2);

    // The ticket is short-lived.
    w.ctl("settings", json!({"socket_ticket_ttl_ms": 1})).await;
    let stale = w.socket_url().await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(
        tokio_tungstenite::connect_async(stale.as_str())
            .await
            .is_err(),
        "an expired URL does not connect"
    );
}

#[tokio::test]
async fn an_event_arrives_as_an_envelope_and_an_ack_ends_it() {
    let w = workspace(32).await;
    let (mut ws, _) = open(&w).await;
    let conn = connection_ids(&w).await[0];
    let ts = w.post("over the socket", None).await;

    let env = next(&mut ws).await.expect("envelope");
    assert_eq!(env["type"], "events_api");
    assert_eq!(env["accepts_response_payload"], false);
    assert_eq!(env["retry_attempt"], 0);
    assert_eq!(env["retry_reason"], "");
    let id = env["envelope_id"].as_str().expect("envelope_id");
    assert_eq!(id.len(), 36, "a UUID: {id}");
    let payload = &env["payload"];
    assert_eq!(payload["type"], "event_callback");
    assert_eq!(payload["api_app_id"], w.app_id());
    assert_eq!(payload["event"]["type"], "message");
    assert_eq!(payload["event"]["ts"], ts);
    assert_eq!(payload["event"]["text"], "over the socket");
    for k in [
        "token",
        "team_id",
        "event_id",
        "event_time",
        "authorizations",
    ] {
        assert!(payload.get(k).is_some(), "payload without {k}: {payload}");
    }
    ack(&mut ws, &env).await;

    let d = deliveries(&w, 1).await;
    assert_eq!(d[0]["result"], "acked");
    assert_eq!(d[0]["url"], "socket");
    assert_eq!(d[0]["envelope_id"], id);
    assert_eq!(d[0]["connection"], conn);
    assert_eq!(d[0]["ack_connection"], conn);
    assert_eq!(d[0]["event_id"], payload["event_id"]);
    // Acked: no retry, past the deadline and the first retry's time.
    assert!(next_within(&mut ws, 800).await.is_none(), "no retry");
    assert_eq!(w.deliveries().await.as_array().expect("log").len(), 1);

    let log = w.socket_log().await["log"].clone();
    let kinds: Vec<(&str, &str)> = log
        .as_array()
        .expect("log")
        .iter()
        .map(|r| {
            (
                r["direction"].as_str().expect("direction"),
                r["kind"].as_str().expect("kind"),
            )
        })
        .collect();
    assert_eq!(
        kinds,
        [
            ("opened", "opened"),
            ("sent", "hello"),
            ("sent", "events_api"),
            ("received", "ack"),
        ]
    );
    assert_eq!(log[3]["matched"], true);
    assert_eq!(log[3]["has_payload"], false);
    assert!(log[3]["at_micros"].as_u64() >= log[2]["at_micros"].as_u64());
}

#[tokio::test]
async fn an_unacked_envelope_is_retried_over_another_connection() {
    let w = workspace(33).await;
    let (mut a, _) = open(&w).await;
    let (mut b, _) = open(&w).await;
    let ids = connection_ids(&w).await;
    w.post("nobody answers at first", None).await;

    // The first attempt goes over the oldest connection; no ack.
    let first = next(&mut a).await.expect("envelope");
    assert_eq!(first["retry_attempt"], 0);
    let retry = next(&mut b).await.expect("retry");
    assert_eq!(retry["type"], "events_api");
    assert_eq!(retry["retry_attempt"], 1);
    assert_eq!(retry["retry_reason"], "timeout");
    assert_eq!(
        retry["payload"]["event_id"], first["payload"]["event_id"],
        "the same event"
    );
    assert_ne!(retry["envelope_id"], first["envelope_id"]);
    ack(&mut b, &retry).await;
    // A late ack of the first envelope changes nothing.
    ack(&mut a, &first).await;

    let d = deliveries(&w, 2).await;
    assert_eq!(d[0]["result"], "ack_timeout");
    assert_eq!(d[0]["connection"], ids[0]);
    assert!(
        d[0]["at_micros"].as_u64().expect("at") - d[0]["sent_at_micros"].as_u64().expect("sent")
            >= 300_000,
        "waited for the deadline: {}",
        d[0]
    );
    assert_eq!(d[1]["result"], "acked");
    assert_eq!(d[1]["attempt"], 1);
    assert_eq!(d[1]["retry_reason"], "timeout");
    assert_eq!(d[1]["connection"], ids[1]);
    assert_eq!(d[1]["ack_connection"], ids[1]);

    let late = eventually("the late ack", Duration::from_secs(5), || async {
        let log = w.socket_log().await["log"].clone();
        log.as_array()
            .expect("log")
            .iter()
            .find(|r| r["kind"] == "ack" && r["envelope_id"] == first["envelope_id"])
            .cloned()
    })
    .await;
    assert_eq!(late["matched"], false);
    assert!(next_within(&mut b, 800).await.is_none(), "no more retries");
}

#[tokio::test]
async fn a_connection_dropped_mid_envelope_sees_it_retried_elsewhere() {
    let w = workspace(34).await;
    let (mut a, _) = open(&w).await;
    let (mut b, _) = open(&w).await;
    let ids = connection_ids(&w).await;
    w.ctl(
        "faults",
        json!({"method": "socket", "mode": "drop_mid_envelope"}),
    )
    .await;
    w.post("dropped", None).await;

    let lost = next(&mut a).await.expect("envelope");
    assert_eq!(lost["type"], "events_api");
    assert!(next(&mut a).await.is_none(), "the connection is gone");
    let retry = next(&mut b).await.expect("retry");
    assert_eq!(retry["retry_attempt"], 1);
    assert_eq!(retry["retry_reason"], "timeout");
    assert_eq!(retry["payload"]["event_id"], lost["payload"]["event_id"]);
    ack(&mut b, &retry).await;

    let d = deliveries(&w, 2).await;
    assert_eq!(d[0]["result"], "connection_closed");
    assert_eq!(d[0]["connection"], ids[0]);
    assert_eq!(d[1]["result"], "acked");
    assert_eq!(d[1]["connection"], ids[1]);
    assert_eq!(connection_ids(&w).await, [ids[1]]);
    let log = w.socket_log().await["log"].clone();
    assert!(
        log.as_array()
            .expect("log")
            .iter()
            .any(|r| r["direction"] == "closed"
                && r["kind"] == "dropped"
                && r["connection"] == ids[0]),
        "{log}"
    );
}

#[tokio::test]
async fn a_duplicated_envelope_reaches_two_connections_with_one_id() {
    let w = workspace(35).await;
    let (mut a, _) = open(&w).await;
    let (mut b, _) = open(&w).await;
    let ids = connection_ids(&w).await;
    w.ctl(
        "faults",
        json!({"method": "socket", "mode": "duplicate_envelope"}),
    )
    .await;
    w.post("twice", None).await;

    let (ea, eb) = (
        next(&mut a).await.expect("envelope"),
        next(&mut b).await.expect("envelope"),
    );
    assert_eq!(ea, eb, "the same envelope, envelope_id included");
    ack(&mut a, &ea).await;
    ack(&mut b, &eb).await;

    let d = deliveries(&w, 2).await;
    assert_eq!(d.len(), 2);
    for (r, c) in d.iter().zip(&ids) {
        assert_eq!(r["result"], "acked");
        assert_eq!(r["attempt"], 0);
        assert_eq!(r["envelope_id"], ea["envelope_id"]);
        assert_eq!(r["connection"], *c);
        assert_eq!(r["ack_connection"], ids[0]);
    }
    let acks = eventually("both acks", Duration::from_secs(5), || async {
        let log = w.socket_log().await["log"].clone();
        let acks: Vec<Value> = log
            .as_array()
            .expect("log")
            .iter()
            .filter(|r| r["kind"] == "ack")
            .cloned()
            .collect();
        (acks.len() == 2).then_some(acks)
    })
    .await;
    assert_eq!(acks[0]["matched"], true);
    assert_eq!(acks[1]["matched"], false, "the second ack finds it done");
    assert!(next_within(&mut a, 800).await.is_none(), "no retry");
}

#[tokio::test]
async fn disconnect_messages_warn_or_close_the_connection() {
    let w = workspace(36).await;
    let (mut a, _) = open(&w).await;
    let (mut b, _) = open(&w).await;
    let ids = connection_ids(&w).await;

    // A warning: the message, and the connection stays.
    w.socket_disconnect("warning", Some(ids[0]), None).await;
    let m = next(&mut a).await.expect("disconnect");
    assert_eq!(m["type"], "disconnect");
    assert_eq!(m["reason"], "warning");
    assert!(m["debug_info"]["host"].is_string(), "{m}");
    assert!(next_within(&mut a, 300).await.is_none(), "still open");
    assert!(next_within(&mut b, 50).await.is_none(), "only to a");

    // Refresh requested: the message to every connection, then they close.
    let r = w
        .socket_disconnect("refresh_requested", None, Some(100))
        .await;
    assert_eq!(r["connections"], json!(ids));
    for ws in [&mut a, &mut b] {
        let m = next(ws).await.expect("disconnect");
        assert_eq!(m["reason"], "refresh_requested");
        assert!(next(ws).await.is_none(), "closed a little later");
    }
    eventually("no connection", Duration::from_secs(5), || async {
        connection_ids(&w).await.is_empty().then_some(())
    })
    .await;

    // Link disabled: closes too.
    let (mut c, _) = open(&w).await;
    w.socket_disconnect("link_disabled", None, Some(50)).await;
    assert_eq!(
        next(&mut c).await.expect("disconnect")["reason"],
        "link_disabled"
    );
    assert!(next(&mut c).await.is_none());

    let bad = w
        .http
        .post(format!("{}/_sim/socket/disconnect", w.base))
        .json(&json!({"app_id": w.app_id(), "reason": "bored"}))
        .send()
        .await
        .expect("control");
    assert_eq!(bad.status().as_u16(), 400);
}

#[tokio::test]
async fn with_no_connection_the_delivery_fails_and_is_retried_later() {
    let w = workspace(37).await;
    w.post("nobody is connected", None).await;
    let d = deliveries(&w, 2).await;
    assert_eq!(d[0]["result"], "no_connection");
    assert_eq!(d[0]["envelope_id"], Value::Null);
    assert_eq!(d[1]["result"], "no_connection");
    assert_eq!(d[1]["retry_reason"], "connection_failed");

    // The next retry (0.6 s after) finds the app connected.
    let (mut ws, _) = open(&w).await;
    let env = next(&mut ws).await.expect("retry");
    assert_eq!(env["retry_attempt"], 2);
    assert_eq!(env["retry_reason"], "connection_failed");
    ack(&mut ws, &env).await;
    let d = deliveries(&w, 3).await;
    assert_eq!(d[2]["result"], "acked");
    assert_eq!(d[2]["attempt"], 2);
}

#[tokio::test]
async fn a_click_arrives_as_an_interactive_envelope() {
    let w = workspace(38).await;
    let (mut ws, _) = open(&w).await;
    let posted: Value = w
        .http
        .post(format!("{}/api/chat.postMessage", w.base))
        .bearer_auth(w.token())
        .json(&json!({"channel": w.channel, "text": "pick",
                      "blocks": [{"type": "actions", "block_id": "b1", "elements": [
                          {"type": "button", "action_id": "yes", "value": "y",
                           "text": {"type": "plain_text", "text": "Yes"}}]}]}))
        .send()
        .await
        .expect("post")
        .json()
        .await
        .expect("json");
    let ts = posted["ts"].as_str().expect("ts").to_owned();

    let click = {
        let (user, channel) = (w.user.clone(), w.channel.clone());
        let w = &w;
        async move { w.click(&user, &channel, &ts, "yes").await }
    };
    // (the app's own post comes back as an `events_api` envelope too)
    let app = async {
        loop {
            let env = next(&mut ws).await.expect("envelope");
            ack(&mut ws, &env).await;
            if env["type"] == "interactive" {
                break env;
            }
        }
    };
    let (record, env) = tokio::join!(click, app);
    assert_eq!(env["type"], "interactive");
    assert_eq!(env["accepts_response_payload"], false);
    assert_eq!(env["payload"]["type"], "block_actions");
    assert_eq!(env["payload"]["actions"][0]["action_id"], "yes");
    assert_eq!(record["status"], "acked");

    // Unanswered: once, never retried.
    let posted_ts = env["payload"]["container"]["message_ts"]
        .as_str()
        .expect("ts")
        .to_owned();
    let record = w.click(&w.user, &w.channel, &posted_ts, "yes").await;
    assert_eq!(record["status"], "ack_timeout");
}

#[tokio::test]
async fn socket_mode_switched_on_later_moves_events_to_the_connections() {
    let base = serve(39).await;
    let w = SimWorkspace::create(
        &base,
        json!({"events": ["message.channels"]}),
        &["chat:write"],
        None,
    )
    .await;
    let (mut ws, _) = open(&w).await;
    w.post("before", None).await;
    assert!(
        next_within(&mut ws, 300).await.is_none(),
        "off: nothing over the socket"
    );

    w.set_socket_mode(true).await;
    w.post("after", None).await;
    let env = next(&mut ws).await.expect("envelope");
    assert_eq!(env["payload"]["event"]["text"], "after");
    ack(&mut ws, &env).await;
    let d = deliveries(&w, 1).await;
    assert_eq!(d[0]["result"], "acked");
}
