//! slack-sim against Slack's documented behaviour: event shapes, signing,
//! the retry schedule and headers, Web API errors, rate limits and faults.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use serde_json::{Value, json};
use threadline_domain::Envelope;
use threadline_slack::{SigningSecret, Verifier};
use threadline_slack_sim::Sim;
use threadline_slack_sim::model::ts_key;
use threadline_testkit::eventually;

/// What the fake app does with the next delivery.
#[derive(Clone, Copy)]
enum Behave {
    Status(u16, bool),
    Sleep(u64),
}

#[derive(Clone, Debug)]
struct Received {
    headers: HeaderMap,
    body: Value,
    raw: Vec<u8>,
}

#[derive(Clone, Default)]
struct AppSide {
    got: Arc<Mutex<Vec<Received>>>,
    script: Arc<Mutex<VecDeque<Behave>>>,
}

async fn receive(
    State(app): State<AppSide>,
    headers: HeaderMap,
    body: Bytes,
) -> axum::response::Response {
    let next = app.script.lock().expect("lock").pop_front();
    app.got.lock().expect("lock").push(Received {
        headers: headers.clone(),
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
        raw: body.to_vec(),
    });
    match next {
        None => StatusCode::OK.into_response(),
        Some(Behave::Status(s, no_retry)) => {
            let mut r = StatusCode::from_u16(s).expect("status").into_response();
            if no_retry {
                r.headers_mut()
                    .insert("x-slack-no-retry", "1".parse().expect("hv"));
            }
            r
        }
        Some(Behave::Sleep(ms)) => {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            StatusCode::OK.into_response()
        }
    }
}

async fn serve(router: axum::Router) -> String {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = l.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(l, router).await });
    format!("http://{addr}")
}

async fn app_side() -> (AppSide, String) {
    let side = AppSide::default();
    let url = serve(
        axum::Router::new()
            .route("/slack/events", axum::routing::post(receive))
            .with_state(side.clone()),
    )
    .await;
    (side, format!("{url}/slack/events"))
}

/// A workspace with a person, a public channel and an installed app.
struct World {
    base: String,
    http: reqwest::Client,
    team: String,
    user: String,
    channel: String,
    app: String,
    secret: String,
    token: String,
    bot_user: String,
    bot_id: String,
}

impl World {
    async fn new(seed: u64, request_urls: Vec<String>, events: &[&str], scopes: &[&str]) -> Self {
        let base = serve(threadline_slack_sim::router(Sim::new(seed))).await;
        let http = reqwest::Client::new();
        let mut w = Self {
            base,
            http,
            team: String::new(),
            user: String::new(),
            channel: String::new(),
            app: String::new(),
            secret: String::new(),
            token: String::new(),
            bot_user: String::new(),
            bot_id: String::new(),
        };
        w.team = w.ctl("teams", json!({"name": "Acme"})).await["id"]
            .as_str()
            .expect("id")
            .into();
        w.user = w
            .ctl("users", json!({"team_id": w.team, "name": "ana"}))
            .await["id"]
            .as_str()
            .expect("id")
            .into();
        w.channel = w
            .ctl("channels", json!({"team_id": w.team, "name": "general", "kind": "public", "members": [w.user]}))
            .await["id"]
            .as_str()
            .expect("id")
            .into();
        let app = w
            .ctl(
                "apps",
                json!({"name": "Threadline", "request_urls": request_urls, "events": events}),
            )
            .await;
        w.app = app["id"].as_str().expect("id").into();
        w.secret = app["signing_secret"].as_str().expect("secret").into();
        let inst = w
            .ctl(
                &format!("apps/{}/installs", w.app),
                json!({"team_id": w.team, "scopes": scopes, "join_channels": [w.channel]}),
            )
            .await;
        w.token = inst["bot_token"].as_str().expect("token").into();
        w.bot_user = inst["bot_user_id"].as_str().expect("bot user").into();
        w.bot_id = inst["bot_id"].as_str().expect("bot id").into();
        w
    }

    async fn ctl(&self, path: &str, body: Value) -> Value {
        let r = self
            .http
            .post(format!("{}/_sim/{path}", self.base))
            .json(&body)
            .send()
            .await
            .expect("control call");
        assert!(r.status().is_success(), "{path}: {}", r.status());
        r.json().await.expect("json")
    }

    async fn get(&self, path: &str) -> Value {
        self.http
            .get(format!("{}/_sim/{path}", self.base))
            .send()
            .await
            .expect("get")
            .json()
            .await
            .expect("json")
    }

    async fn api(&self, method: &str, form: &[(&str, &str)]) -> (u16, HeaderMap, Value) {
        let r = self
            .http
            .post(format!("{}/api/{method}", self.base))
            .bearer_auth(&self.token)
            .form(form)
            .send()
            .await
            .expect("web api");
        let (s, h) = (r.status().as_u16(), r.headers().clone());
        (s, h, r.json().await.expect("json"))
    }
}

fn verify(secret: &str, r: &Received) {
    let v = Verifier::new(vec![SigningSecret::new(secret).expect("secret")]).expect("verifier");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs() as i64;
    v.verify(
        r.headers
            .get("x-slack-request-timestamp")
            .map(|h| h.as_bytes()),
        r.headers.get("x-slack-signature").map(|h| h.as_bytes()),
        &r.raw,
        now,
    )
    .expect("delivery is signed like Slack signs");
}

fn keys(v: &Value) -> Vec<String> {
    let mut k: Vec<String> = v
        .as_object()
        .map(|o| o.keys().cloned().collect())
        .unwrap_or_default();
    k.sort();
    k
}

async fn received(side: &AppSide, n: usize) -> Vec<Received> {
    eventually(&format!("{n} deliveries"), Duration::from_secs(10), || {
        let got = side.got.lock().expect("lock").clone();
        async move { (got.len() >= n).then_some(got) }
    })
    .await
}

#[tokio::test]
async fn a_mention_yields_app_mention_and_message_events_shaped_and_signed_like_slacks() {
    let (side, url) = app_side().await;
    let w = World::new(
        7,
        vec![url],
        &["app_mention", "message.channels"],
        &["chat:write", "channels:history"],
    )
    .await;
    let posted = w
        .ctl("act/post", json!({"user": w.user, "channel": w.channel, "text": format!("<@{}> summarise please", w.bot_user)}))
        .await;
    let ts = posted["ts"].as_str().expect("ts").to_owned();
    let got = received(&side, 2).await;
    let fixture: Value = serde_json::from_slice(&threadline_testkit::fixture(
        "events/app_mention_authorizations.bolt-python.json",
    ))
    .expect("fixture");
    let mut types = Vec::new();
    for r in &got {
        verify(&w.secret, r);
        assert!(r.headers.get("x-slack-retry-num").is_none());
        for k in [
            "token",
            "team_id",
            "api_app_id",
            "event",
            "type",
            "event_id",
            "event_time",
            "authorizations",
            "is_ext_shared_channel",
            "event_context",
        ] {
            assert!(r.body.get(k).is_some(), "envelope lacks {k}: {}", r.body);
        }
        assert_eq!(r.body["authorizations"][0]["user_id"], w.bot_user.as_str());
        let parsed = Envelope::parse(&r.raw).expect("threadline parses the emulator's envelope");
        let Envelope::EventCallback(cb) = parsed else {
            panic!("not an event_callback")
        };
        assert_eq!(cb.event.ts.as_ref().map(|t| t.as_str()), Some(ts.as_str()));
        types.push(r.body["event"]["type"].as_str().expect("type").to_owned());
        if r.body["event"]["type"] == "app_mention" {
            // Same keys as Slack's own app_mention example (blocks aside).
            let mut want = keys(&fixture["event"]);
            want.retain(|k| k != "blocks");
            assert_eq!(keys(&r.body["event"]), want);
        } else {
            assert_eq!(r.body["event"]["channel_type"], "channel");
        }
    }
    types.sort();
    assert_eq!(types, ["app_mention", "message"]);
    assert_ne!(
        got[0].body["event_id"], got[1].body["event_id"],
        "each event has its own id"
    );
}

#[tokio::test]
async fn failed_deliveries_are_retried_on_slacks_schedule_with_its_headers() {
    let (side, url) = app_side().await;
    let w = World::new(8, vec![url], &["message.channels"], &[]).await;
    w.ctl(
        "settings",
        json!({"time_scale": 0.005, "delivery_deadline_ms": 300}),
    )
    .await;

    // 500, then a timeout, then 200: three attempts.
    side.script
        .lock()
        .expect("lock")
        .extend([Behave::Status(500, false), Behave::Sleep(1000)]);
    w.ctl(
        "act/post",
        json!({"user": w.user, "channel": w.channel, "text": "one"}),
    )
    .await;
    let got = received(&side, 3).await;
    let retry = |r: &Received| {
        (
            r.headers
                .get("x-slack-retry-num")
                .map(|v| v.to_str().expect("ascii").to_owned()),
            r.headers
                .get("x-slack-retry-reason")
                .map(|v| v.to_str().expect("ascii").to_owned()),
        )
    };
    assert_eq!(retry(&got[0]), (None, None));
    assert_eq!(
        retry(&got[1]),
        (Some("1".into()), Some("http_error".into()))
    );
    assert_eq!(
        retry(&got[2]),
        (Some("2".into()), Some("http_timeout".into()))
    );
    assert!(
        got.iter()
            .all(|r| r.body["event_id"] == got[0].body["event_id"]),
        "a retry re-sends the same event"
    );
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        side.got.lock().expect("lock").len(),
        3,
        "no attempt after a 2xx"
    );

    // X-Slack-No-Retry on a non-2xx stops retries.
    side.got.lock().expect("lock").clear();
    side.script
        .lock()
        .expect("lock")
        .push_back(Behave::Status(400, true));
    w.ctl(
        "act/post",
        json!({"user": w.user, "channel": w.channel, "text": "two"}),
    )
    .await;
    received(&side, 1).await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(side.got.lock().expect("lock").len(), 1);

    // Always failing: the first try plus 3 retries, then Slack gives up.
    side.got.lock().expect("lock").clear();
    side.script
        .lock()
        .expect("lock")
        .extend([Behave::Status(503, false); 6]);
    w.ctl(
        "act/post",
        json!({"user": w.user, "channel": w.channel, "text": "three"}),
    )
    .await;
    received(&side, 4).await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let got = side.got.lock().expect("lock").clone();
    assert_eq!(got.len(), 4);
    assert_eq!(retry(&got[3]).0.as_deref(), Some("3"));
}

#[tokio::test]
async fn unreachable_apps_see_connection_failed_retries() {
    let dead = format!("http://127.0.0.1:{}/slack/events", {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    });
    let w = World::new(9, vec![dead], &["message.channels"], &[]).await;
    w.ctl("settings", json!({"time_scale": 0.002})).await;
    let posted = w
        .ctl(
            "act/post",
            json!({"user": w.user, "channel": w.channel, "text": "hello"}),
        )
        .await;
    let event_id = posted["events"][0]["event_id"]
        .as_str()
        .expect("event id")
        .to_owned();
    let d = eventually("four failed attempts", Duration::from_secs(10), || {
        let w = &w;
        let event_id = event_id.clone();
        async move {
            let d = w.get(&format!("deliveries?event_id={event_id}")).await;
            (d["deliveries"].as_array().map(Vec::len) == Some(4)).then_some(d)
        }
    })
    .await;
    let reasons: Vec<Value> = d["deliveries"]
        .as_array()
        .expect("list")
        .iter()
        .map(|x| x["retry_reason"].clone())
        .collect();
    assert_eq!(
        reasons,
        [
            Value::Null,
            json!("connection_failed"),
            json!("connection_failed"),
            json!("connection_failed")
        ]
    );
}

#[tokio::test]
async fn posts_land_in_the_thread_come_back_as_events_and_are_rate_limited() {
    let (side, url) = app_side().await;
    let w = World::new(
        10,
        vec![url],
        &["message.channels"],
        &["chat:write", "channels:history"],
    )
    .await;
    let root = w
        .ctl(
            "act/post",
            json!({"user": w.user, "channel": w.channel, "text": "question"}),
        )
        .await["ts"]
        .as_str()
        .expect("ts")
        .to_owned();
    received(&side, 1).await;
    let metadata = json!({"event_type": "threadline_reply", "event_payload": {"intent_id": "i-1", "source_ts": root}}).to_string();
    let (status, _, body) = w
        .api(
            "chat.postMessage",
            &[
                ("channel", &w.channel),
                ("thread_ts", &root),
                ("text", "answer"),
                ("metadata", &metadata),
            ],
        )
        .await;
    assert_eq!((status, body["ok"].clone()), (200, json!(true)), "{body}");
    let reply_ts = body["ts"].as_str().expect("ts").to_owned();
    assert_eq!(body["message"]["bot_id"], w.bot_id.as_str());
    assert_eq!(body["message"]["thread_ts"], root.as_str());

    // The bot's own post comes back as a message event (the loop to ignore).
    let got = received(&side, 2).await;
    let echo = &got[1].body["event"];
    assert_eq!(
        (echo["bot_id"].as_str(), echo["user"].as_str()),
        (Some(w.bot_id.as_str()), Some(w.bot_user.as_str()))
    );
    assert_eq!(echo["app_id"], w.app.as_str());
    assert_eq!(echo["thread_ts"], root.as_str());

    // conversations.replies shows it, with metadata only when asked.
    let (_, _, r) = w
        .api(
            "conversations.replies",
            &[("channel", &w.channel), ("ts", &root)],
        )
        .await;
    assert_eq!(r["messages"].as_array().map(Vec::len), Some(2), "{r}");
    assert!(r["messages"][1].get("metadata").is_none());
    let (_, _, r) = w
        .api(
            "conversations.replies",
            &[
                ("channel", &w.channel),
                ("ts", &root),
                ("include_all_metadata", "true"),
            ],
        )
        .await;
    assert_eq!(
        r["messages"][1]["metadata"]["event_payload"]["intent_id"],
        "i-1"
    );
    assert_eq!(r["messages"][0]["reply_count"], 1);

    // Ground truth: one app post in the thread, for this trigger.
    let posts = w.get(&format!("app_posts?app_id={}", w.app)).await;
    assert_eq!(
        posts["per_thread"],
        json!([{"channel": w.channel, "thread_ts": root, "count": 1}])
    );
    assert_eq!(posts["per_trigger"][0]["trigger_ts"], root.as_str());
    let thread = w
        .get(&format!("channels/{}/threads/{root}", w.channel))
        .await;
    assert_eq!(thread["messages"][1]["ts"], reply_ts.as_str());

    // About one post a second per channel: a burst past the allowance gets 429.
    w.ctl(
        "settings",
        json!({"post_burst": 2.0, "posts_per_second": 1.0}),
    )
    .await;
    let mut statuses = Vec::new();
    let mut retry_after = None;
    for i in 0..4 {
        let (s, h, b) = w
            .api(
                "chat.postMessage",
                &[("channel", &w.channel), ("text", &format!("burst {i}"))],
            )
            .await;
        if s == 429 {
            assert_eq!(b, json!({"ok": false, "error": "ratelimited"}));
            retry_after = h
                .get("retry-after")
                .map(|v| v.to_str().expect("ascii").to_owned());
        }
        statuses.push(s);
    }
    assert!(statuses.contains(&429), "{statuses:?}");
    assert_eq!(retry_after.as_deref(), Some("1"));
}

#[tokio::test]
async fn web_api_errors_use_slacks_codes() {
    let w = World::new(11, vec![], &[], &["chat:write"]).await;
    let other = w
        .ctl(
            "channels",
            json!({"team_id": w.team, "name": "random", "kind": "public", "members": [w.user]}),
        )
        .await;
    let other = other["id"].as_str().expect("id").to_owned();
    type Case<'a> = (&'a str, Vec<(&'a str, String)>, &'a str);
    let cases: Vec<Case<'_>> = vec![
        (
            "chat.postMessage",
            vec![("channel", "C0NOPE".into()), ("text", "x".into())],
            "channel_not_found",
        ),
        (
            "chat.postMessage",
            vec![("channel", other.clone()), ("text", "x".into())],
            "not_in_channel",
        ),
        (
            "chat.postMessage",
            vec![("channel", w.channel.clone()), ("text", " ".into())],
            "no_text",
        ),
        (
            "chat.postMessage",
            vec![("channel", w.channel.clone()), ("text", "x".repeat(40_001))],
            "msg_too_long",
        ),
        (
            "conversations.replies",
            vec![("channel", w.channel.clone()), ("ts", "1.000001".into())],
            "missing_scope",
        ),
        ("chat.unknownMethod", vec![], "unknown_method"),
    ];
    for (method, form, code) in cases {
        let form: Vec<(&str, &str)> = form.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let (status, _, body) = w.api(method, &form).await;
        assert_eq!(
            (status, body["ok"].clone(), body["error"].as_str()),
            (200, json!(false), Some(code)),
            "{method}"
        );
    }
    let (_, _, body) = w
        .api(
            "conversations.replies",
            &[("channel", &w.channel), ("ts", "1.000001")],
        )
        .await;
    assert_eq!(body["needed"], "channels:history");
    // Token problems.
    let r = w
        .http
        .post(format!("{}/api/auth.test", w.base))
        .send()
        .await
        .expect("req");
    assert_eq!(
        r.json::<Value>().await.expect("json")["error"],
        "not_authed"
    );
    let r = w
        .http
        .post(format!("{}/api/auth.test", w.base))
        .bearer_auth("xoxb-forged")
        .send()
        .await
        .expect("req");
    assert_eq!(
        r.json::<Value>().await.expect("json")["error"],
        "invalid_auth"
    );
    let (_, _, me) = w.api("auth.test", &[]).await;
    assert_eq!(
        (me["user_id"].as_str(), me["bot_id"].as_str()),
        (Some(w.bot_user.as_str()), Some(w.bot_id.as_str()))
    );
    w.ctl(
        &format!("apps/{}/revoke", w.app),
        json!({"team_id": w.team}),
    )
    .await;
    let (_, _, body) = w.api("auth.test", &[]).await;
    assert_eq!(body["error"], "token_revoked");
    // Archived channels refuse posts.
    let w = World::new(12, vec![], &[], &["chat:write"]).await;
    w.ctl(&format!("channels/{}/archive", w.channel), json!({}))
        .await;
    let (_, _, body) = w
        .api(
            "chat.postMessage",
            &[("channel", &w.channel), ("text", "x")],
        )
        .await;
    assert_eq!(body["error"], "is_archived");
}

#[tokio::test]
async fn replies_paginate_with_cursors_and_honour_the_non_marketplace_limits() {
    let w = World::new(13, vec![], &[], &["chat:write", "channels:history"]).await;
    let root = w
        .ctl(
            "act/post",
            json!({"user": w.user, "channel": w.channel, "text": "root"}),
        )
        .await["ts"]
        .as_str()
        .expect("ts")
        .to_owned();
    for i in 0..20 {
        w.ctl("act/post", json!({"user": w.user, "channel": w.channel, "text": format!("r{i}"), "thread_ts": root})).await;
    }
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut form = vec![
            ("channel", w.channel.clone()),
            ("ts", root.clone()),
            ("limit", "6".into()),
        ];
        if let Some(c) = &cursor {
            form.push(("cursor", c.clone()));
        }
        let form: Vec<(&str, &str)> = form.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let (_, _, page) = w.api("conversations.replies", &form).await;
        assert_eq!(page["ok"], true, "{page}");
        seen.extend(
            page["messages"]
                .as_array()
                .expect("messages")
                .iter()
                .map(|m| m["text"].as_str().unwrap_or_default().to_owned()),
        );
        match page["response_metadata"]["next_cursor"].as_str() {
            Some(c) if page["has_more"] == true => cursor = Some(c.to_owned()),
            _ => break,
        }
    }
    let want: Vec<String> = std::iter::once("root".to_owned())
        .chain((0..20).map(|i| format!("r{i}")))
        .collect();
    assert_eq!(seen, want, "every message once, in order");

    // A non-Marketplace app: at most 15 messages a call, one call a minute.
    let app = w
        .ctl(
            "apps",
            json!({"name": "Limited", "non_marketplace_limits": true}),
        )
        .await;
    let inst = w
        .ctl(&format!("apps/{}/installs", app["id"].as_str().expect("id")), json!({"team_id": w.team, "scopes": ["channels:history"], "join_channels": [w.channel]}))
        .await;
    let call = || {
        w.http
            .post(format!("{}/api/conversations.replies", w.base))
            .bearer_auth(inst["bot_token"].as_str().expect("token"))
            .form(&[
                ("channel", w.channel.as_str()),
                ("ts", root.as_str()),
                ("limit", "200"),
            ])
            .send()
    };
    let r = call().await.expect("req");
    let page: Value = r.json().await.expect("json");
    assert_eq!(page["messages"].as_array().map(Vec::len), Some(15));
    assert_eq!(page["has_more"], true);
    let r = call().await.expect("req");
    assert_eq!(r.status(), 429);
    assert!(r.headers().get("retry-after").is_some());
}

#[tokio::test]
async fn faults_leave_the_post_applied_or_not_as_slack_would() {
    let w = World::new(14, vec![], &[], &["chat:write", "channels:history"]).await;
    let short = reqwest::Client::builder()
        .timeout(Duration::from_millis(400))
        .build()
        .expect("client");
    let post = |text: &'static str| {
        short
            .post(format!("{}/api/chat.postMessage", w.base))
            .bearer_auth(&w.token)
            .form(&[("channel", w.channel.as_str()), ("text", text)])
            .send()
    };
    let fault =
        |mode: &str| json!({"method": "chat.postMessage", "mode": mode, "latency_ms": 5000});

    w.ctl("faults", fault("lost_response")).await;
    let err = post("lost").await.expect_err("the answer never comes");
    assert!(err.is_timeout());
    w.ctl("faults", fault("reset")).await;
    assert!(
        post("reset").await.is_err(),
        "the connection drops without an answer"
    );
    w.ctl("faults", fault("fatal_error")).await;
    let body: Value = post("fatal")
        .await
        .expect("answer")
        .json()
        .await
        .expect("json");
    assert_eq!(body["error"], "fatal_error");
    w.ctl(
        "faults",
        json!({"method": "chat.postMessage", "mode": "http_error", "status": 502}),
    )
    .await;
    assert_eq!(post("bad gateway").await.expect("answer").status(), 502);
    w.ctl(
        "faults",
        json!({"method": "chat.postMessage", "mode": "ratelimited", "retry_after": 7, "times": 2}),
    )
    .await;
    for _ in 0..2 {
        let r = post("storm").await.expect("answer");
        assert_eq!(
            (
                r.status().as_u16(),
                r.headers()
                    .get("retry-after")
                    .map(|v| v.to_str().expect("ascii").to_owned())
            ),
            (429, Some("7".into()))
        );
    }

    // Ground truth: lost, reset and fatal posts landed; the 502 and 429s did not.
    let calls = w.get("calls?method=chat.postMessage").await;
    let effects: Vec<&str> = calls["calls"]
        .as_array()
        .expect("calls")
        .iter()
        .map(|c| c["effect"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(
        effects,
        [
            "applied_response_lost",
            "applied_connection_reset",
            "applied",
            "not_applied",
            "not_applied",
            "not_applied"
        ]
    );
    let posts = w.get(&format!("app_posts?app_id={}", w.app)).await;
    assert_eq!(
        posts["per_thread"].as_array().map(Vec::len),
        Some(3),
        "{posts}"
    );
}

#[tokio::test]
async fn edits_and_deletions_produce_message_changed_and_message_deleted() {
    let (side, url) = app_side().await;
    let w = World::new(15, vec![url], &["message.channels"], &[]).await;
    let ts = w
        .ctl(
            "act/post",
            json!({"user": w.user, "channel": w.channel, "text": "draft"}),
        )
        .await["ts"]
        .as_str()
        .expect("ts")
        .to_owned();
    w.ctl(
        "act/edit",
        json!({"user": w.user, "channel": w.channel, "ts": ts, "text": "final"}),
    )
    .await;
    w.ctl("act/delete", json!({"channel": w.channel, "ts": ts}))
        .await;
    let got = received(&side, 3).await;
    let mut by_subtype = std::collections::BTreeMap::new();
    for r in &got {
        let Envelope::EventCallback(cb) = Envelope::parse(&r.raw).expect("parses") else {
            panic!("callback")
        };
        by_subtype.insert(
            r.body["event"]["subtype"]
                .as_str()
                .unwrap_or("plain")
                .to_owned(),
            (cb.event.ts.clone(), r.body["event"].clone()),
        );
    }
    let (changed_ts, changed) = &by_subtype["message_changed"];
    assert_eq!(changed_ts.as_ref().map(|t| t.as_str()), Some(ts.as_str()));
    assert_eq!(
        (
            changed["message"]["text"].as_str(),
            changed["previous_message"]["text"].as_str()
        ),
        (Some("final"), Some("draft"))
    );
    assert_eq!(changed["hidden"], true);
    // As Slack shows it: who edited and when, in whole seconds; the event's
    // own time has microseconds and is the edit's time.
    let event_ts = changed["event_ts"].as_str().expect("event_ts");
    let secs = event_ts.split('.').next().expect("seconds");
    assert_eq!(
        changed["message"]["edited"],
        json!({"user": w.user, "ts": format!("{secs}.000000")}),
        "{changed}"
    );
    assert!(
        changed["previous_message"].get("edited").is_none(),
        "{changed}"
    );
    let (deleted_ts, deleted) = &by_subtype["message_deleted"];
    assert_eq!(deleted_ts.as_ref().map(|t| t.as_str()), Some(ts.as_str()));
    assert_eq!(deleted["deleted_ts"], ts.as_str());
}

#[tokio::test]
async fn oauth_install_code_exchange_and_token_rotation() {
    let w = World::new(16, vec![], &[], &[]).await;
    let app = w
        .ctl("apps", json!({"name": "Rotating", "token_rotation": true}))
        .await;
    let (client_id, client_secret) = (
        app["client_id"].as_str().expect("id"),
        app["client_secret"].as_str().expect("secret"),
    );
    let no_redirect = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    let r = no_redirect
        .get(format!("{}/oauth/v2/authorize", w.base))
        .query(&[
            ("client_id", client_id),
            ("scope", "chat:write,app_mentions:read"),
            ("state", "s-1"),
            ("redirect_uri", "http://app.example/cb"),
            ("team", &w.team),
        ])
        .send()
        .await
        .expect("authorize");
    assert_eq!(r.status(), 303);
    let location = r.headers()["location"]
        .to_str()
        .expect("location")
        .to_owned();
    assert!(
        location.starts_with("http://app.example/cb?code=") && location.ends_with("&state=s-1"),
        "{location}"
    );
    let code = location
        .split("code=")
        .nth(1)
        .and_then(|s| s.split('&').next())
        .expect("code")
        .to_owned();
    let exchange = |form: Vec<(&'static str, String)>| {
        let http = w.http.clone();
        let url = format!("{}/api/oauth.v2.access", w.base);
        async move {
            http.post(url)
                .form(&form)
                .send()
                .await
                .expect("req")
                .json::<Value>()
                .await
                .expect("json")
        }
    };
    let creds = |extra: Vec<(&'static str, String)>| {
        let mut f = vec![
            ("client_id", client_id.to_owned()),
            ("client_secret", client_secret.to_owned()),
        ];
        f.extend(extra);
        f
    };
    let first = exchange(creds(vec![("code", code.clone())])).await;
    assert_eq!(first["ok"], true, "{first}");
    assert_eq!(first["scope"], "app_mentions:read,chat:write");
    assert!(
        first["access_token"]
            .as_str()
            .expect("token")
            .starts_with("xoxe.xoxb-")
    );
    assert_eq!(first["expires_in"], 43_200);
    // Codes are single use.
    assert_eq!(
        exchange(creds(vec![("code", code)])).await["error"],
        "invalid_code"
    );
    let refreshed = exchange(creds(vec![
        ("grant_type", "refresh_token".into()),
        (
            "refresh_token",
            first["refresh_token"].as_str().expect("rt").into(),
        ),
    ]))
    .await;
    assert_eq!(refreshed["ok"], true, "{refreshed}");
    assert_ne!(refreshed["access_token"], first["access_token"]);
    assert_ne!(refreshed["refresh_token"], first["refresh_token"]);
    let r = w
        .http
        .post(format!("{}/api/auth.test", w.base))
        .bearer_auth(refreshed["access_token"].as_str().expect("token"))
        .send()
        .await
        .expect("req");
    assert_eq!(r.json::<Value>().await.expect("json")["ok"], true);
    let bad = exchange(vec![
        ("client_id", client_id.into()),
        ("client_secret", "wrong".into()),
        ("code", "x".into()),
    ])
    .await;
    assert_eq!(bad["error"], "bad_client_secret");
}

#[tokio::test]
async fn duplicate_delivery_to_several_urls_and_holding_past_the_deadline() {
    let (a, url_a) = app_side().await;
    let (b, url_b) = app_side().await;
    let w = World::new(17, vec![url_a, url_b], &["message.channels"], &[]).await;
    w.ctl("settings", json!({"time_scale": 0.002})).await;
    w.ctl("faults", json!({"method": "events", "mode": "duplicate"}))
        .await;
    w.ctl(
        "act/post",
        json!({"user": w.user, "channel": w.channel, "text": "fan out"}),
    )
    .await;
    let (ga, gb) = (received(&a, 1).await, received(&b, 1).await);
    assert_eq!(
        ga[0].body["event_id"], gb[0].body["event_id"],
        "the same event reaches both URLs"
    );

    // Held past the deadline: the app answered 200, Slack retries anyway.
    a.got.lock().expect("lock").clear();
    w.ctl(
        "faults",
        json!({"method": "events", "mode": "hold_past_deadline"}),
    )
    .await;
    w.ctl(
        "act/post",
        json!({"user": w.user, "channel": w.channel, "text": "slow"}),
    )
    .await;
    let got = received(&a, 2).await;
    assert_eq!(
        got[1]
            .headers
            .get("x-slack-retry-reason")
            .map(|v| v.to_str().expect("ascii")),
        Some("http_timeout")
    );
    assert_eq!(got[0].body["event_id"], got[1].body["event_id"]);
}

#[tokio::test]
async fn the_same_seed_replays_the_same_ids() {
    let a = World::new(42, vec![], &[], &[]).await;
    let b = World::new(42, vec![], &[], &[]).await;
    let c = World::new(43, vec![], &[], &[]).await;
    assert_eq!(
        (&a.team, &a.user, &a.channel, &a.app, &a.token),
        (&b.team, &b.user, &b.channel, &b.app, &b.token)
    );
    assert_ne!(a.team, c.team);
}

#[tokio::test]
async fn json_bodies_update_delete_info_and_event_authorizations() {
    let (side, url) = app_side().await;
    let w = World::new(
        18,
        vec![url],
        &["message.channels"],
        &["chat:write", "channels:read"],
    )
    .await;
    // JSON body, as Slack accepts with application/json.
    let r = w
        .http
        .post(format!("{}/api/chat.postMessage", w.base))
        .bearer_auth(&w.token)
        .json(&json!({"channel": w.channel, "text": "v1", "metadata": {"event_type": "x", "event_payload": {}}}))
        .send()
        .await
        .expect("req");
    let body: Value = r.json().await.expect("json");
    assert_eq!(body["ok"], true, "{body}");
    let ts = body["ts"].as_str().expect("ts").to_owned();
    let (_, _, up) = w
        .api(
            "chat.update",
            &[("channel", &w.channel), ("ts", &ts), ("text", "v2")],
        )
        .await;
    assert_eq!(
        (up["ok"].clone(), up["text"].clone()),
        (json!(true), json!("v2")),
        "{up}"
    );
    let (_, _, del) = w
        .api("chat.delete", &[("channel", &w.channel), ("ts", &ts)])
        .await;
    assert_eq!(del["ok"], true);
    let (_, _, gone) = w
        .api(
            "chat.update",
            &[("channel", &w.channel), ("ts", &ts), ("text", "v3")],
        )
        .await;
    assert_eq!(gone["error"], "message_not_found");
    // A person's message is not the app's to change.
    let theirs = w
        .ctl(
            "act/post",
            json!({"user": w.user, "channel": w.channel, "text": "mine"}),
        )
        .await["ts"]
        .as_str()
        .expect("ts")
        .to_owned();
    let (_, _, nope) = w
        .api("chat.delete", &[("channel", &w.channel), ("ts", &theirs)])
        .await;
    assert_eq!(nope["error"], "cant_delete_message");
    // The app's own post, its edit and its deletion all came back as events.
    let got = received(&side, 4).await;
    let mut subtypes: Vec<&str> = got
        .iter()
        .map(|r| r.body["event"]["subtype"].as_str().unwrap_or("plain"))
        .collect();
    subtypes.sort_unstable();
    assert_eq!(
        subtypes,
        ["message_changed", "message_deleted", "plain", "plain"]
    );

    let (_, _, info) = w
        .api("conversations.info", &[("channel", &w.channel)])
        .await;
    assert_eq!(
        (
            info["channel"]["is_channel"].clone(),
            info["channel"]["is_member"].clone()
        ),
        (json!(true), json!(true))
    );

    // apps.event.authorizations.list answers with the app-level token only.
    let context = got[0].body["event_context"]
        .as_str()
        .expect("event_context")
        .to_owned();
    let app = w.ctl("apps", json!({"name": "unrelated"})).await;
    let list = |token: String| {
        let (http, url, context) = (
            w.http.clone(),
            format!("{}/api/apps.event.authorizations.list", w.base),
            context.clone(),
        );
        async move {
            http.post(url)
                .bearer_auth(token)
                .form(&[("event_context", context)])
                .send()
                .await
                .expect("req")
                .json::<Value>()
                .await
                .expect("json")
        }
    };
    assert_eq!(list(w.token.clone()).await["error"], "invalid_auth");
    assert_eq!(
        list(app["app_token"].as_str().expect("token").to_owned()).await["error"],
        "invalid_event_context"
    );
}

#[tokio::test]
async fn reorder_window_and_latency_and_tier3_limits() {
    let (side, url) = app_side().await;
    let w = World::new(
        19,
        vec![url],
        &["message.channels"],
        &["chat:write", "channels:history"],
    )
    .await;
    w.ctl(
        "settings",
        json!({"reorder_window": 3, "tier3_per_minute": 2}),
    )
    .await;
    let mut sent = Vec::new();
    for text in ["first", "second", "third"] {
        sent.push(
            w.ctl(
                "act/post",
                json!({"user": w.user, "channel": w.channel, "text": text}),
            )
            .await["ts"]
                .clone(),
        );
    }
    let got = received(&side, 3).await;
    let order: Vec<&str> = got
        .iter()
        .map(|r| r.body["event"]["text"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(
        order,
        ["third", "second", "first"],
        "held back, then released reversed"
    );

    w.ctl(
        "faults",
        json!({"method": "auth.test", "mode": "latency", "latency_ms": 300}),
    )
    .await;
    let started = std::time::Instant::now();
    let (_, _, me) = w.api("auth.test", &[]).await;
    assert_eq!(me["ok"], true);
    assert!(started.elapsed() >= Duration::from_millis(300));

    let root = sent[0].as_str().expect("ts").to_owned();
    for _ in 0..2 {
        let (s, _, _) = w
            .api(
                "conversations.replies",
                &[("channel", &w.channel), ("ts", &root)],
            )
            .await;
        assert_eq!(s, 200);
    }
    let (s, h, body) = w
        .api(
            "conversations.replies",
            &[("channel", &w.channel), ("ts", &root)],
        )
        .await;
    assert_eq!((s, body["error"].as_str()), (429, Some("ratelimited")));
    assert!(h.get("retry-after").is_some());
}

#[tokio::test]
async fn uninstalling_tells_the_app_and_revokes_its_token() {
    let (side, url) = app_side().await;
    let w = World::new(20, vec![url], &["message.channels"], &["chat:write"]).await;
    w.ctl(
        &format!("apps/{}/uninstall", w.app),
        json!({"team_id": w.team}),
    )
    .await;
    let got = received(&side, 1).await;
    assert_eq!(got[0].body["event"]["type"], "app_uninstalled");
    verify(&w.secret, &got[0]);
    let (_, _, body) = w.api("auth.test", &[]).await;
    assert_eq!(body["error"], "token_revoked");
}

impl World {
    /// The status of a control call expected to be refused.
    async fn ctl_status(&self, path: &str, body: Value) -> u16 {
        self.http
            .post(format!("{}/_sim/{path}", self.base))
            .json(&body)
            .send()
            .await
            .expect("control call")
            .status()
            .as_u16()
    }

    /// Another public channel with the person and the app's bot in it.
    async fn second_channel(&self, name: &str) -> String {
        self.ctl(
            "channels",
            json!({"team_id": self.team, "name": name, "kind": "public", "members": [self.user, self.bot_user]}),
        )
        .await["id"]
            .as_str()
            .expect("id")
            .to_owned()
    }

    async fn person_posts(&self, text: &str, thread_ts: Option<&str>) -> String {
        self.ctl(
            "act/post",
            json!({"user": self.user, "channel": self.channel, "text": text, "thread_ts": thread_ts}),
        )
        .await["ts"]
            .as_str()
            .expect("ts")
            .to_owned()
    }

    async fn list(&self, path: &str, key: &str) -> Vec<Value> {
        self.get(path).await[key]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }
}

fn micros(v: &Value) -> u64 {
    v.as_u64()
        .unwrap_or_else(|| panic!("not a micros count: {v}"))
}

#[tokio::test]
async fn the_call_log_tells_arrival_answer_and_the_message_each_call_touched() {
    let w = World::new(21, vec![], &[], &["chat:write", "channels:history"]).await;
    let other = w.second_channel("random").await;
    w.ctl(
        "faults",
        json!({"method": "chat.postMessage", "mode": "latency", "latency_ms": 250}),
    )
    .await;
    let (_, _, posted) = w
        .api(
            "chat.postMessage",
            &[("channel", &w.channel), ("text", "first")],
        )
        .await;
    let ts = posted["ts"].as_str().expect("ts").to_owned();
    let (_, _, up) = w
        .api(
            "chat.update",
            &[("channel", &w.channel), ("ts", &ts), ("text", "second")],
        )
        .await;
    assert_eq!(up["ok"], true, "{up}");
    let (_, _, del) = w
        .api("chat.delete", &[("channel", &w.channel), ("ts", &ts)])
        .await;
    assert_eq!(del["ok"], true, "{del}");
    let (_, _, refused) = w
        .api(
            "chat.postMessage",
            &[("channel", &w.channel), ("text", " ")],
        )
        .await;
    assert_eq!(refused["error"], "no_text");
    let (_, _, elsewhere) = w
        .api(
            "chat.postMessage",
            &[("channel", &other), ("text", "there")],
        )
        .await;
    let other_ts = elsewhere["ts"].as_str().expect("ts").to_owned();

    let here = w
        .list(&format!("calls?channel={}", w.channel), "calls")
        .await;
    let summary: Vec<(&str, Value, &str)> = here
        .iter()
        .map(|c| {
            (
                c["method"].as_str().unwrap_or_default(),
                c["ts"].clone(),
                c["effect"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("chat.postMessage", json!(ts), "applied"),
            ("chat.update", json!(ts), "applied"),
            ("chat.delete", json!(ts), "applied"),
            ("chat.postMessage", Value::Null, "not_applied"),
        ]
    );
    // Arrival is before the fault's latency; the answer after it.
    let slow = &here[0];
    assert!(
        micros(&slow["at_micros"]) >= micros(&slow["received_at_micros"]) + 250_000,
        "{slow}"
    );
    for c in &here {
        assert!(micros(&c["received_at_micros"]) <= micros(&c["at_micros"]));
        assert_eq!(c["injected_ts"], Value::Null);
    }
    let there = w
        .list(
            &format!("calls?method=chat.postMessage&channel={other}"),
            "calls",
        )
        .await;
    assert_eq!(there.len(), 1, "{there:?}");
    assert_eq!(there[0]["ts"], other_ts.as_str());
    assert_eq!(
        w.list("calls?channel=C0NOWHERE", "calls").await,
        Vec::<Value>::new()
    );
}

#[tokio::test]
async fn the_delivery_log_names_the_conversation_message_and_subtype_of_every_attempt() {
    let (side, url) = app_side().await;
    let w = World::new(22, vec![url], &["message.channels"], &[]).await;
    w.ctl("settings", json!({"time_scale": 0.002})).await;
    side.script
        .lock()
        .expect("lock")
        .push_back(Behave::Status(500, false));
    let ts = w.person_posts("hello", None).await;
    // The first attempt fails; its retry succeeds.
    received(&side, 2).await;
    w.ctl(
        "act/edit",
        json!({"user": w.user, "channel": w.channel, "ts": ts, "text": "hello!"}),
    )
    .await;
    w.ctl("act/delete", json!({"channel": w.channel, "ts": ts}))
        .await;
    let other = w.second_channel("random").await;
    let other_ts = w
        .ctl(
            "act/post",
            json!({"user": w.user, "channel": other, "text": "elsewhere"}),
        )
        .await["ts"]
        .as_str()
        .expect("ts")
        .to_owned();
    received(&side, 5).await;

    let here = eventually("four attempts logged", Duration::from_secs(10), || {
        let w = &w;
        async move {
            let d = w
                .list(&format!("deliveries?channel={}", w.channel), "deliveries")
                .await;
            (d.len() == 4).then_some(d)
        }
    })
    .await;
    let summary: Vec<(u64, Value, Value, Value)> = here
        .iter()
        .map(|d| {
            (
                d["attempt"].as_u64().expect("attempt"),
                d["channel"].clone(),
                d["message_ts"].clone(),
                d["subtype"].clone(),
            )
        })
        .collect();
    let (c, t) = (json!(w.channel), json!(ts));
    assert_eq!(
        summary,
        [
            (0, c.clone(), t.clone(), Value::Null),
            (1, c.clone(), t.clone(), Value::Null),
            (0, c.clone(), t.clone(), json!("message_changed")),
            (0, c.clone(), t.clone(), json!("message_deleted")),
        ]
    );
    assert_eq!(here[0]["event_id"], here[1]["event_id"]);
    assert_eq!(here[1]["retry_reason"], "http_error");
    for d in &here {
        assert!(
            micros(&d["sent_at_micros"]) <= micros(&d["at_micros"]),
            "{d}"
        );
    }
    assert!(micros(&here[0]["at_micros"]) <= micros(&here[1]["sent_at_micros"]));
    let there = w
        .list(&format!("deliveries?channel={other}"), "deliveries")
        .await;
    assert_eq!(there.len(), 1, "{there:?}");
    assert_eq!(there[0]["message_ts"], other_ts.as_str());
}

#[tokio::test]
async fn thread_inspection_shows_when_messages_were_created_edited_and_deleted() {
    let w = World::new(23, vec![], &[], &["chat:write", "channels:history"]).await;
    let root = w.person_posts("question", None).await;
    let (_, _, posted) = w
        .api(
            "chat.postMessage",
            &[
                ("channel", &w.channel),
                ("thread_ts", &root),
                ("text", "v1"),
            ],
        )
        .await;
    let bot_ts = posted["ts"].as_str().expect("ts").to_owned();
    for text in ["v2", "v3"] {
        let (_, _, up) = w
            .api(
                "chat.update",
                &[("channel", &w.channel), ("ts", &bot_ts), ("text", text)],
            )
            .await;
        assert_eq!(up["ok"], true, "{up}");
    }
    let oops = w.person_posts("oops", Some(&root)).await;
    w.ctl(
        "act/edit",
        json!({"user": w.user, "channel": w.channel, "ts": oops, "text": "fixed"}),
    )
    .await;
    w.ctl("act/delete", json!({"channel": w.channel, "ts": oops}))
        .await;

    let thread = w
        .list(
            &format!("channels/{}/threads/{root}", w.channel),
            "messages",
        )
        .await;
    let tss: Vec<&str> = thread.iter().filter_map(|m| m["ts"].as_str()).collect();
    assert_eq!(tss, [root.as_str(), bot_ts.as_str(), oops.as_str()]);
    let (q, bot, human) = (&thread[0], &thread[1], &thread[2]);
    assert!(micros(&q["created_at_micros"]) > 0);
    assert_eq!(
        (q["deleted_at_micros"].clone(), q["edits"].clone()),
        (Value::Null, json!([]))
    );
    assert!(micros(&bot["created_at_micros"]) >= micros(&q["created_at_micros"]));
    assert_eq!(bot["text"], "v3", "the current text stays in text");
    let edits = bot["edits"].as_array().expect("edits");
    let texts: Vec<&str> = edits.iter().filter_map(|e| e["text"].as_str()).collect();
    assert_eq!(texts, ["v2", "v3"]);
    let edit_ts: Vec<&str> = edits.iter().filter_map(|e| e["edit_ts"].as_str()).collect();
    assert!(
        bot_ts.as_str() < edit_ts[0] && edit_ts[0] < edit_ts[1],
        "{edit_ts:?}"
    );
    assert!(micros(&edits[0]["at_micros"]) >= micros(&bot["created_at_micros"]));
    assert!(micros(&edits[1]["at_micros"]) >= micros(&edits[0]["at_micros"]));
    assert_eq!(bot["deleted_at_micros"], Value::Null);
    assert_eq!(human["deleted"], true);
    assert!(micros(&human["deleted_at_micros"]) >= micros(&human["created_at_micros"]));
    assert_eq!(human["edits"][0]["text"], "fixed");
    assert_eq!(human["edits"][0]["edit_ts"], human["edited"][1]);
    assert_eq!(human["original_text"], "oops", "the text as first posted");
    assert_eq!(bot["original_text"], "v1");

    // The whole channel, threads and deleted messages included, oldest first.
    let all = w
        .list(&format!("channels/{}/messages", w.channel), "messages")
        .await;
    let all_ts: Vec<&str> = all.iter().filter_map(|m| m["ts"].as_str()).collect();
    assert_eq!(all_ts, tss);
    assert_eq!(all[2]["deleted"], true);

    // Slack's own answer is unchanged: no inspection fields, no deleted message.
    let (_, _, replies) = w
        .api(
            "conversations.replies",
            &[("channel", &w.channel), ("ts", &root)],
        )
        .await;
    let msgs = replies["messages"].as_array().expect("messages");
    assert_eq!(msgs.len(), 2, "{replies}");
    assert_eq!(msgs[1]["text"], "v3");
    for m in msgs {
        for k in [
            "created_at_micros",
            "deleted_at_micros",
            "edits",
            "deleted",
            "original_text",
        ] {
            assert!(m.get(k).is_none(), "replies carry {k}: {m}");
        }
    }
}

#[tokio::test]
async fn inject_reply_lands_a_human_reply_before_the_bots_answer() {
    let (side, url) = app_side().await;
    let w = World::new(
        24,
        vec![url.clone()],
        &["app_mention", "message.channels"],
        &["chat:write", "channels:history"],
    )
    .await;
    w.ctl(
        "settings",
        json!({"posts_per_second": 100.0, "post_burst": 100.0}),
    )
    .await;
    let outsider = w
        .ctl("users", json!({"team_id": w.team, "name": "bo"}))
        .await["id"]
        .as_str()
        .expect("id")
        .to_owned();
    let inject = |extra: Value| {
        let mut f = json!({"method": "chat.postMessage", "mode": "inject_reply"});
        f.as_object_mut()
            .expect("object")
            .extend(extra.as_object().expect("object").clone());
        f
    };
    assert_eq!(w.ctl_status("faults", inject(json!({}))).await, 400);
    assert_eq!(
        w.ctl_status("faults", inject(json!({"user": outsider})))
            .await,
        400,
        "not a member of any channel"
    );
    assert_eq!(
        w.ctl_status(
            "faults",
            inject(json!({"user": w.user, "channel": w.channel, "method": "chat.update"}))
        )
        .await,
        400
    );
    assert_eq!(
        w.get("calls").await["calls"],
        json!([]),
        "refused faults were never armed"
    );

    let root = w.person_posts("question", None).await;
    received(&side, 1).await;
    let crossing = format!("<@{}> wait, one more thing", w.bot_user);
    w.ctl(
        "faults",
        inject(json!({"user": w.user, "text": crossing, "latency_ms": 200})),
    )
    .await;
    // A call that does not authenticate does not set it off.
    let forged = w
        .http
        .post(format!("{}/api/chat.postMessage", w.base))
        .bearer_auth("xoxb-forged")
        .form(&[("channel", w.channel.as_str()), ("text", "x")])
        .send()
        .await
        .expect("req")
        .json::<Value>()
        .await
        .expect("json");
    assert_eq!(forged["error"], "invalid_auth");

    let (status, _, posted) = w
        .api(
            "chat.postMessage",
            &[
                ("channel", &w.channel),
                ("thread_ts", &root),
                ("text", "answer"),
            ],
        )
        .await;
    assert_eq!(
        (status, posted["ok"].clone()),
        (200, json!(true)),
        "{posted}"
    );
    let answer_ts = posted["ts"].as_str().expect("ts").to_owned();

    let thread = w
        .list(
            &format!("channels/{}/threads/{root}", w.channel),
            "messages",
        )
        .await;
    assert_eq!(thread.len(), 3, "{thread:?}");
    let injected = &thread[1];
    let injected_ts = injected["ts"].as_str().expect("ts").to_owned();
    assert_eq!(
        (
            injected["user"].as_str(),
            injected["text"].as_str(),
            injected["thread_ts"].as_str(),
            injected["bot_id"].as_str()
        ),
        (
            Some(w.user.as_str()),
            Some(crossing.as_str()),
            Some(root.as_str()),
            None
        )
    );
    assert_eq!(thread[2]["ts"], answer_ts.as_str());
    assert!(
        ts_key(&injected_ts) < ts_key(&answer_ts),
        "the reply is older than the answer"
    );

    let calls = w.list("calls?method=chat.postMessage", "calls").await;
    let call = calls.last().expect("the answer's call");
    assert_eq!(
        (
            call["injected_ts"].as_str(),
            call["ts"].as_str(),
            call["effect"].as_str()
        ),
        (
            Some(injected_ts.as_str()),
            Some(answer_ts.as_str()),
            Some("applied")
        )
    );
    assert!(micros(&call["at_micros"]) >= micros(&call["received_at_micros"]) + 200_000);
    assert_eq!(calls[0]["injected_ts"], Value::Null, "the forged call");

    // Its events went to the app like any person's message.
    let got = received(&side, 4).await;
    let mut kinds: Vec<&str> = got
        .iter()
        .filter(|r| r.body["event"]["ts"] == injected_ts.as_str())
        .filter_map(|r| r.body["event"]["type"].as_str())
        .collect();
    kinds.sort_unstable();
    assert_eq!(kinds, ["app_mention", "message"]);
    let attempts = eventually("the reply's deliveries", Duration::from_secs(10), || {
        let w = &w;
        let injected_ts = injected_ts.clone();
        async move {
            let d: Vec<Value> = w
                .list("deliveries", "deliveries")
                .await
                .into_iter()
                .filter(|d| d["message_ts"] == injected_ts.as_str())
                .collect();
            (d.len() == 2).then_some(d)
        }
    })
    .await;
    for d in &attempts {
        assert_eq!(
            (d["url"].as_str(), d["channel"].as_str()),
            (Some(url.as_str()), Some(w.channel.as_str()))
        );
    }

    // A reply's ts resolves to its root; no thread_ts means top level; the
    // default text; a fault taken once is gone.
    w.ctl(
        "faults",
        inject(json!({"user": w.user, "channel": w.channel})),
    )
    .await;
    let (_, _, second) = w
        .api(
            "chat.postMessage",
            &[
                ("channel", &w.channel),
                ("thread_ts", &injected_ts),
                ("text", "answer 2"),
            ],
        )
        .await;
    assert_eq!(second["message"]["thread_ts"], root.as_str());
    w.ctl("faults", inject(json!({"user": w.user}))).await;
    w.api(
        "chat.postMessage",
        &[("channel", &w.channel), ("text", "top level")],
    )
    .await;
    w.api(
        "chat.postMessage",
        &[("channel", &w.channel), ("text", "no fault left")],
    )
    .await;
    let calls = w.list("calls?method=chat.postMessage", "calls").await;
    let injected: Vec<Option<&str>> = calls[2..]
        .iter()
        .map(|c| c["injected_ts"].as_str())
        .collect();
    assert!(
        injected[0].is_some() && injected[1].is_some() && injected[2].is_none(),
        "{calls:?}"
    );
    let thread = w
        .list(
            &format!("channels/{}/threads/{root}", w.channel),
            "messages",
        )
        .await;
    assert_eq!(
        thread
            .iter()
            .find(|m| m["ts"] == injected[0].expect("ts"))
            .map(|m| m["text"].clone()),
        Some(json!("a reply that crossed the answer"))
    );
    let top = w
        .list(
            &format!(
                "channels/{}/threads/{}",
                w.channel,
                injected[1].expect("ts")
            ),
            "messages",
        )
        .await;
    assert_eq!(
        (top.len(), top[0]["thread_ts"].clone()),
        (1, Value::Null),
        "{top:?}"
    );
}

#[tokio::test]
async fn a_slow_post_is_applied_even_when_the_client_gives_up() {
    let w = World::new(25, vec![], &[], &["chat:write", "channels:history"]).await;
    let root = w.person_posts("question", None).await;
    w.ctl(
        "faults",
        json!({"method": "chat.postMessage", "mode": "latency", "latency_ms": 1200}),
    )
    .await;
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(300))
        .build()
        .expect("client");
    let err = impatient
        .post(format!("{}/api/chat.postMessage", w.base))
        .bearer_auth(&w.token)
        .form(&[
            ("channel", w.channel.as_str()),
            ("thread_ts", root.as_str()),
            ("text", "late answer"),
        ])
        .send()
        .await
        .expect_err("the client gives up first");
    assert!(err.is_timeout(), "{err}");

    let call = eventually(
        "the post applied after all",
        Duration::from_secs(10),
        || {
            let w = &w;
            async move { w.list("calls?method=chat.postMessage", "calls").await.pop() }
        },
    )
    .await;
    assert_eq!(call["effect"], "applied_client_gone", "{call}");
    assert_eq!(call["http_status"], 200);
    assert!(micros(&call["at_micros"]) >= micros(&call["received_at_micros"]) + 1_200_000);
    let thread = w
        .list(
            &format!("channels/{}/threads/{root}", w.channel),
            "messages",
        )
        .await;
    assert_eq!(thread.len(), 2, "{thread:?}");
    assert_eq!(
        (thread[1]["text"].as_str(), thread[1]["ts"].clone()),
        (Some("late answer"), call["ts"].clone())
    );
}

/// A soak's worth of traffic (10,000 people's messages, 2,000 bot answers,
/// each after reading its thread) in one channel: every call stays cheap
/// and the inspection endpoints still answer.
#[tokio::test]
async fn a_soak_of_ten_thousand_messages_keeps_every_call_cheap() {
    use futures::StreamExt;
    let (side, url) = app_side().await;
    let w = World::new(
        26,
        vec![url],
        &["message.channels"],
        &["chat:write", "channels:history"],
    )
    .await;
    w.ctl(
        "settings",
        json!({"posts_per_second": 1e6, "post_burst": 1e6, "tier3_per_minute": 1_000_000}),
    )
    .await;
    const THREADS: usize = 100;
    const HUMAN: usize = 10_000;
    const ANSWERS: usize = 2_000;
    let started = std::time::Instant::now();
    let mut roots = Vec::new();
    for i in 0..THREADS {
        roots.push(w.person_posts(&format!("question {i}"), None).await);
    }
    let w = &w;
    let roots = &roots;
    futures::stream::iter(THREADS..HUMAN)
        .map(|i| async move {
            w.person_posts(&format!("reply {i}"), Some(&roots[i % THREADS]))
                .await
        })
        .buffer_unordered(8)
        .collect::<Vec<_>>()
        .await;
    futures::stream::iter(0..ANSWERS)
        .map(|i| async move {
            let root = &roots[i % THREADS];
            let (s, _, r) = w
                .api(
                    "conversations.replies",
                    &[("channel", &w.channel), ("ts", root), ("limit", "200")],
                )
                .await;
            assert_eq!((s, r["ok"].clone()), (200, json!(true)), "{r}");
            let (s, _, p) = w
                .api(
                    "chat.postMessage",
                    &[
                        ("channel", &w.channel),
                        ("thread_ts", root),
                        ("text", "answer"),
                    ],
                )
                .await;
            assert_eq!((s, p["ok"].clone()), (200, json!(true)), "{p}");
        })
        .buffer_unordered(8)
        .collect::<Vec<_>>()
        .await;
    let drove = started.elapsed();

    let posts = w.get(&format!("app_posts?app_id={}", w.app)).await;
    let per_thread = posts["per_thread"].as_array().expect("per thread");
    assert_eq!(per_thread.len(), THREADS);
    assert!(per_thread.iter().all(|t| t["count"] == ANSWERS / THREADS));
    let thread = w
        .list(
            &format!("channels/{}/threads/{}", w.channel, roots[0]),
            "messages",
        )
        .await;
    assert_eq!(thread.len(), HUMAN / THREADS + ANSWERS / THREADS);
    assert_eq!(
        w.list(&format!("calls?channel={}", w.channel), "calls")
            .await
            .len(),
        2 * ANSWERS
    );
    received(&side, HUMAN + ANSWERS).await;
    // Generous for a debug build on two busy cores; a cost per call that
    // grew with the channel would take far longer.
    assert!(
        started.elapsed() < Duration::from_secs(120),
        "driving took {drove:?}, all told {:?}",
        started.elapsed()
    );
}

/// The call log keeps a post's unfurl arguments as sent (a form's
/// `true`/`1`/`false`/`0`, a JSON body's booleans; absent when not sent),
/// and threadline's client turns both off unless told otherwise.
#[tokio::test]
async fn the_call_log_keeps_the_unfurl_arguments_of_each_post() {
    let w = World::new(22, vec![], &[], &["chat:write", "channels:history"]).await;
    w.ctl("settings", json!({"post_burst": 10.0})).await;
    for form in [
        vec![("unfurl_links", "false"), ("unfurl_media", "0")],
        vec![("unfurl_links", "1")],
        vec![],
    ] {
        let mut args = vec![
            ("channel", w.channel.as_str()),
            ("text", "see https://example.com"),
        ];
        args.extend(form);
        let (_, _, posted) = w.api("chat.postMessage", &args).await;
        assert_eq!(posted["ok"], true, "{posted}");
    }
    let r: Value = w
        .http
        .post(format!("{}/api/chat.postMessage", w.base))
        .bearer_auth(&w.token)
        .json(&json!({"channel": w.channel, "text": "json", "unfurl_links": false, "unfurl_media": true}))
        .send()
        .await
        .expect("post")
        .json()
        .await
        .expect("json");
    assert_eq!(r["ok"], true, "{r}");
    let web = threadline_slack::WebClient::new(&format!("{}/api/", w.base), Duration::from_secs(5))
        .expect("client");
    for unfurl in [false, true] {
        web.post_reply(&w.token, &w.channel, "", "reply", "", "", unfurl)
            .await
            .expect("posted");
    }
    let calls = w.list("calls?method=chat.postMessage", "calls").await;
    let seen: Vec<(Value, Value)> = calls
        .iter()
        .map(|c| (c["unfurl_links"].clone(), c["unfurl_media"].clone()))
        .collect();
    assert_eq!(
        seen,
        [
            (json!(false), json!(false)),
            (json!(true), Value::Null),
            (Value::Null, Value::Null),
            (json!(false), json!(true)),
            (json!(false), json!(false)),
            (json!(true), json!(true)),
        ]
    );
}

/// Which official SDK a request imitates.
#[derive(Clone, Copy)]
enum Sdk {
    /// python-slack-sdk's `WebClient` (`slack_sdk/web/base_client.py`).
    Python,
    /// node-slack-sdk's `WebClient` (`packages/web-api/src/WebClient.ts`).
    Node,
}

impl Sdk {
    /// The headers the SDK sends with a body of `content_type`.
    fn headers(self, token: Option<&str>, content_type: &str) -> Vec<(&'static str, String)> {
        let mut h = vec![("content-type", content_type.to_owned())];
        match self {
            Sdk::Python => h.push((
                "user-agent",
                "Python/3.12.3 slackclient/3.43.0 Linux/6.8.0".into(),
            )),
            Sdk::Node => {
                h.push((
                    "user-agent",
                    "@slack:web-api/8.0.0 node/22.11.0 linux/6.8.0".into(),
                ));
                h.push(("accept", "application/json".into()));
            }
        }
        if let Some(t) = token {
            h.push(("authorization", format!("Bearer {t}")));
        }
        h
    }

    /// A form body as the SDK encodes it: python through
    /// `urllib.parse.urlencode` (space as `+`, only `A-Za-z0-9_.-~` kept),
    /// node through `node:querystring` (space as `%20`, `A-Za-z0-9-_.!~*'()`
    /// kept).
    fn form(self, pairs: &[(&str, &str)]) -> String {
        let escape = |s: &str| {
            let mut out = String::new();
            for b in s.bytes() {
                let kept = b.is_ascii_alphanumeric()
                    || match self {
                        Sdk::Python => b"_.-~".contains(&b),
                        Sdk::Node => b"-_.!~*'()".contains(&b),
                    };
                if kept {
                    out.push(char::from(b));
                } else if b == b' ' && matches!(self, Sdk::Python) {
                    out.push('+');
                } else {
                    out.push_str(&format!("%{b:02X}"));
                }
            }
            out
        };
        pairs
            .iter()
            .map(|(k, v)| format!("{}={}", escape(k), escape(v)))
            .collect::<Vec<_>>()
            .join("&")
    }
}

/// `json.dumps` as python-slack-sdk calls it: `", "` and `": "` between
/// items, non-ASCII escaped as `\uXXXX`.
fn python_json(v: &Value) -> String {
    use serde::Serialize;
    struct Py;
    impl serde_json::ser::Formatter for Py {
        fn begin_array_value<W: ?Sized + std::io::Write>(
            &mut self,
            w: &mut W,
            first: bool,
        ) -> std::io::Result<()> {
            if first { Ok(()) } else { w.write_all(b", ") }
        }
        fn begin_object_key<W: ?Sized + std::io::Write>(
            &mut self,
            w: &mut W,
            first: bool,
        ) -> std::io::Result<()> {
            if first { Ok(()) } else { w.write_all(b", ") }
        }
        fn begin_object_value<W: ?Sized + std::io::Write>(
            &mut self,
            w: &mut W,
        ) -> std::io::Result<()> {
            w.write_all(b": ")
        }
    }
    let mut buf = Vec::new();
    v.serialize(&mut serde_json::Serializer::with_formatter(&mut buf, Py))
        .expect("json");
    let mut out = String::new();
    for c in String::from_utf8(buf).expect("utf-8").chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            for u in c.encode_utf16(&mut [0; 2]) {
                out.push_str(&format!("\\u{u:04x}"));
            }
        }
    }
    out
}

impl World {
    /// A Web API call put on the wire as given: the verb, the method with
    /// any query string, the headers and the body.
    async fn wire(
        &self,
        verb: reqwest::Method,
        method: &str,
        headers: &[(&str, String)],
        body: impl Into<Vec<u8>>,
    ) -> Value {
        let mut r = self
            .http
            .request(verb, format!("{}/api/{method}", self.base));
        for (k, v) in headers {
            r = r.header(*k, v);
        }
        let body: Vec<u8> = body.into();
        if !body.is_empty() {
            r = r.body(body);
        }
        let r = r.send().await.expect("web api");
        assert_eq!(r.status(), 200, "{method}");
        r.json().await.expect("json")
    }

    /// A POST with a body, as the SDK sends it.
    async fn sdk_post(&self, sdk: Sdk, method: &str, content_type: &str, body: String) -> Value {
        let headers = sdk.headers(Some(&self.token), content_type);
        self.wire(reqwest::Method::POST, method, &headers, body)
            .await
    }
}

/// python-slack-sdk: `chat_postMessage` and `chat_update` send JSON
/// (`application/json;charset=utf-8`, real booleans, blocks and metadata
/// as JSON values, the token only in the header); every other method a
/// form (`convert_bool_to_0_or_1`: booleans as `1`/`0`); `auth.test` has no
/// body at all; the async client sends `http_verb="GET"` methods as GET
/// with a query string.
#[tokio::test]
async fn python_slack_sdk_requests_are_understood() {
    let w = World::new(
        31,
        vec![],
        &[],
        &["chat:write", "channels:history", "channels:read"],
    )
    .await;
    w.ctl("settings", json!({"post_burst": 100.0})).await;
    const JSON: &str = "application/json;charset=utf-8";
    const FORM: &str = "application/x-www-form-urlencoded";

    let me = w
        .sdk_post(Sdk::Python, "auth.test", JSON, String::new())
        .await;
    assert_eq!(me["ok"], true, "{me}");
    assert_eq!(me["user_id"], json!(w.bot_user));
    assert!(me.get("warning").is_none(), "{me}");

    let blocks = json!([{"type": "section", "text": {"type": "mrkdwn", "text": "*café* ☕"}}]);
    let root = w
        .sdk_post(
            Sdk::Python,
            "chat.postMessage",
            JSON,
            python_json(&json!({
                "channel": w.channel, "text": "café ☕", "blocks": blocks,
                "unfurl_links": false, "unfurl_media": true,
                "metadata": {"event_type": "answer", "event_payload": {"n": 1}},
            })),
        )
        .await;
    assert_eq!(root["ok"], true, "{root}");
    assert!(root.get("warning").is_none(), "{root}");
    assert_eq!(root["message"]["text"], "café ☕");
    assert_eq!(root["message"]["blocks"], blocks);
    let root_ts = root["ts"].as_str().expect("ts").to_owned();

    // Attachments alone are a message (`text` is not required with them).
    let attachments =
        json!([{"fallback": "fallback", "text": "an attachment", "color": "#36a64f"}]);
    let att = w
        .sdk_post(
            Sdk::Python,
            "chat.postMessage",
            JSON,
            python_json(&json!({"channel": w.channel, "thread_ts": root_ts,
                                "reply_broadcast": true, "attachments": attachments})),
        )
        .await;
    assert_eq!(att["ok"], true, "{att}");
    assert_eq!(att["message"]["attachments"], attachments);
    assert_eq!(att["message"]["subtype"], "thread_broadcast");

    // chat_update with blocks given as a JSON string (the SDK passes a str through).
    let edited_blocks =
        json!([{"type": "section", "text": {"type": "plain_text", "text": "edited"}}]);
    let up = w
        .sdk_post(
            Sdk::Python,
            "chat.update",
            JSON,
            python_json(
                &json!({"channel": w.channel, "ts": root_ts, "text": "edited",
                                "blocks": edited_blocks.to_string()}),
            ),
        )
        .await;
    assert_eq!(up["ok"], true, "{up}");
    assert_eq!(up["message"]["blocks"], edited_blocks);

    // conversations_replies from the sync client: a form, booleans as 1/0.
    for (flag, with_metadata) in [("1", true), ("0", false)] {
        let replies = w
            .sdk_post(
                Sdk::Python,
                "conversations.replies",
                FORM,
                Sdk::Python.form(&[
                    ("channel", &w.channel),
                    ("ts", &root_ts),
                    ("inclusive", "1"),
                    ("include_all_metadata", flag),
                    ("limit", "10"),
                ]),
            )
            .await;
        assert_eq!(replies["ok"], true, "{replies}");
        assert_eq!(replies["messages"].as_array().map(Vec::len), Some(2));
        assert_eq!(
            replies["messages"][0]["metadata"]["event_type"].as_str(),
            with_metadata.then_some("answer"),
            "include_all_metadata={flag}"
        );
    }
    // The async client sends GET methods as GET with a query string (and
    // its default form content type, no body).
    let query = Sdk::Python.form(&[
        ("channel", &w.channel),
        ("ts", &root_ts),
        ("include_all_metadata", "1"),
    ]);
    let replies = w
        .wire(
            reqwest::Method::GET,
            &format!("conversations.replies?{query}"),
            &Sdk::Python.headers(Some(&w.token), FORM),
            Vec::new(),
        )
        .await;
    assert_eq!(replies["ok"], true, "{replies}");
    assert_eq!(replies["messages"][0]["metadata"]["event_type"], "answer");

    let info = w
        .sdk_post(
            Sdk::Python,
            "conversations.info",
            FORM,
            Sdk::Python.form(&[("channel", &w.channel), ("include_num_members", "0")]),
        )
        .await;
    assert_eq!(info["channel"]["id"], json!(w.channel), "{info}");

    let del = w
        .sdk_post(
            Sdk::Python,
            "chat.delete",
            FORM,
            Sdk::Python.form(&[("channel", &w.channel), ("ts", &root_ts)]),
        )
        .await;
    assert_eq!(del["ok"], true, "{del}");

    // The unfurl arguments arrived as the booleans they were.
    let calls = w.list("calls?method=chat.postMessage", "calls").await;
    assert_eq!(
        (
            calls[0]["unfurl_links"].clone(),
            calls[0]["unfurl_media"].clone()
        ),
        (json!(false), json!(true))
    );

    // A JSON body cannot carry the token: Slack wants it in the header
    // (the SDK moves it there).
    let no_header = w
        .wire(
            reqwest::Method::POST,
            "chat.postMessage",
            &Sdk::Python.headers(None, JSON),
            python_json(&json!({"token": w.token, "channel": w.channel, "text": "x"})),
        )
        .await;
    assert_eq!(no_header["error"], "not_authed", "{no_header}");
}

/// node-slack-sdk: every call is a POST with an
/// `application/x-www-form-urlencoded` body; booleans as `true`/`false`,
/// objects and arrays (blocks, metadata) as JSON strings, the token in the
/// `Authorization` header and, when a call names its own token, in the body
/// too.
#[tokio::test]
async fn node_slack_sdk_requests_are_understood() {
    let w = World::new(
        32,
        vec![],
        &[],
        &["chat:write", "channels:history", "channels:read"],
    )
    .await;
    w.ctl("settings", json!({"post_burst": 100.0})).await;
    const FORM: &str = "application/x-www-form-urlencoded";

    let me = w
        .sdk_post(Sdk::Node, "auth.test", FORM, String::new())
        .await;
    assert_eq!(me["ok"], true, "{me}");

    let blocks =
        json!([{"type": "section", "text": {"type": "mrkdwn", "text": "it's *done* (100%)"}}]);
    let metadata = json!({"event_type": "answer", "event_payload": {"id": "a b"}});
    let post = Sdk::Node.form(&[
        ("channel", &w.channel),
        ("text", "it's done (100%)"),
        ("blocks", &blocks.to_string()),
        ("metadata", &metadata.to_string()),
        ("unfurl_links", "false"),
        ("unfurl_media", "true"),
        ("reply_broadcast", "false"),
    ]);
    assert!(post.contains("text=it's%20done%20(100%25)"), "{post}");
    let root = w.sdk_post(Sdk::Node, "chat.postMessage", FORM, post).await;
    assert_eq!(root["ok"], true, "{root}");
    assert_eq!(root["message"]["text"], "it's done (100%)");
    assert_eq!(root["message"]["blocks"], blocks);
    let root_ts = root["ts"].as_str().expect("ts").to_owned();

    // A call with its own token: the header and the body both carry it.
    let reply = w
        .sdk_post(
            Sdk::Node,
            "chat.postMessage",
            FORM,
            Sdk::Node.form(&[
                ("token", &w.token),
                ("channel", &w.channel),
                ("thread_ts", &root_ts),
                ("text", "in the thread"),
                ("reply_broadcast", "true"),
            ]),
        )
        .await;
    assert_eq!(reply["ok"], true, "{reply}");
    assert_eq!(reply["message"]["subtype"], "thread_broadcast");
    // And the legacy way: the token only in the body.
    let legacy = w
        .wire(
            reqwest::Method::POST,
            "chat.postMessage",
            &Sdk::Node.headers(None, FORM),
            Sdk::Node.form(&[
                ("token", &w.token),
                ("channel", &w.channel),
                ("thread_ts", &root_ts),
                ("text", "token in the body"),
            ]),
        )
        .await;
    assert_eq!(legacy["ok"], true, "{legacy}");

    let replies = w
        .sdk_post(
            Sdk::Node,
            "conversations.replies",
            FORM,
            Sdk::Node.form(&[
                ("channel", &w.channel),
                ("ts", &root_ts),
                ("inclusive", "true"),
                ("include_all_metadata", "true"),
                ("limit", "15"),
            ]),
        )
        .await;
    assert_eq!(replies["ok"], true, "{replies}");
    assert_eq!(replies["messages"].as_array().map(Vec::len), Some(3));
    assert_eq!(replies["messages"][0]["metadata"], metadata);

    let up = w
        .sdk_post(
            Sdk::Node,
            "chat.update",
            FORM,
            Sdk::Node.form(&[
                ("channel", &w.channel),
                ("ts", &root_ts),
                ("text", "edited"),
                ("blocks", "[]"),
            ]),
        )
        .await;
    assert_eq!(
        (up["ok"].clone(), up["text"].clone()),
        (json!(true), json!("edited")),
        "{up}"
    );

    let info = w
        .sdk_post(
            Sdk::Node,
            "conversations.info",
            FORM,
            Sdk::Node.form(&[("channel", &w.channel), ("include_locale", "false")]),
        )
        .await;
    assert_eq!(info["channel"]["is_member"], true, "{info}");

    let del = w
        .sdk_post(
            Sdk::Node,
            "chat.delete",
            FORM,
            Sdk::Node.form(&[("channel", &w.channel), ("ts", &root_ts)]),
        )
        .await;
    assert_eq!(del["ok"], true, "{del}");

    let calls = w.list("calls?method=chat.postMessage", "calls").await;
    assert_eq!(
        (
            calls[0]["unfurl_links"].clone(),
            calls[0]["unfurl_media"].clone()
        ),
        (json!(false), json!(true))
    );
}

/// Slack's `oauth.v2.access` answer (bolt-python's mock of it,
/// `shared/fixtures/slack/web/oauth.v2.access-success.bolt-python.json`):
/// every field slack-sim must answer with, with its JSON type.
const OAUTH_SUCCESS_FIXTURE: &str = r#"{"ok": true, "access_token": "xoxb-17653672481-19874698323-pdFZKVeTuE8sk7oOcBrzbqgy",
  "token_type": "bot", "scope": "chat:write,commands", "bot_user_id": "U0KRQLJ9H", "app_id": "A0KRD7HC3",
  "team": {"name": "Slack Softball Team", "id": "T9TK3CUKW"}, "enterprise": {"name": "slack-sports", "id": "E12345678"},
  "authed_user": {"id": "U1234", "scope": "chat:write", "access_token": "xoxp-1234", "token_type": "user"}}"#;

/// The rotated-token fields (python-slack-sdk's mock,
/// `oauth.v2.access-success_token_rotation.python-slack-sdk.json`).
const ROTATION_FIELDS: [&str; 3] = ["refresh_token", "expires_in", "is_enterprise_install"];

fn same_type(a: &Value, b: &Value) -> bool {
    std::mem::discriminant(a) == std::mem::discriminant(b)
}

/// python-slack-sdk's `oauth_v2_access` sends the client credentials as
/// HTTP Basic (`auth={"client_id", "client_secret"}` becomes
/// `Authorization: Basic base64(id:secret)`) and only `code`,
/// `redirect_uri`, `grant_type`, `refresh_token` in the form, as Slack
/// recommends; node-slack-sdk's `InstallProvider` sends them as form fields.
#[tokio::test]
async fn oauth_v2_access_takes_client_credentials_as_http_basic_or_fields() {
    let w = World::new(33, vec![], &[], &[]).await;
    let app = w.ctl("apps", json!({"name": "Basic"})).await;
    let (id, secret) = (
        app["client_id"].as_str().expect("id").to_owned(),
        app["client_secret"].as_str().expect("secret").to_owned(),
    );
    let install = |id: String| {
        let (http, base, team) = (
            reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .expect("client"),
            w.base.clone(),
            w.team.clone(),
        );
        async move {
            let r = http
                .get(format!("{base}/oauth/v2/authorize"))
                .query(&[
                    ("client_id", id.as_str()),
                    ("scope", "chat:write"),
                    ("redirect_uri", "http://app.example/cb"),
                    ("team", &team),
                ])
                .send()
                .await
                .expect("authorize");
            let location = r.headers()["location"]
                .to_str()
                .expect("location")
                .to_owned();
            location
                .split("code=")
                .nth(1)
                .and_then(|s| s.split('&').next())
                .expect("code")
                .to_owned()
        }
    };
    let exchange = |authorization: Option<String>, form: Vec<(&'static str, String)>| {
        let pairs: Vec<(&str, &str)> = form.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let body = Sdk::Python.form(&pairs);
        let mut headers = Sdk::Python.headers(None, "application/x-www-form-urlencoded");
        if let Some(a) = authorization {
            headers.push(("authorization", a));
        }
        let w = &w;
        async move {
            w.wire(reqwest::Method::POST, "oauth.v2.access", &headers, body)
                .await
        }
    };
    let basic = |id: &str, secret: &str| {
        // base64 as Python's `b64encode(f"{client_id}:{client_secret}")`.
        const B64: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let raw = format!("{id}:{secret}");
        let mut out = String::new();
        for chunk in raw.as_bytes().chunks(3) {
            let n = chunk
                .iter()
                .enumerate()
                .fold(0u32, |n, (i, b)| n | (u32::from(*b) << (16 - 8 * i)));
            for i in 0..4 {
                out.push(if i <= chunk.len() {
                    char::from(B64[((n >> (18 - 6 * i)) & 63) as usize])
                } else {
                    '='
                });
            }
        }
        format!("Basic {out}")
    };
    let code = install(id.clone()).await;
    let with_code = || {
        vec![
            ("code", code.clone()),
            ("redirect_uri", "http://app.example/cb".to_owned()),
        ]
    };

    // Wrong credentials are refused with Slack's codes, and leave the code usable.
    let unknown = exchange(Some(basic("1234.5678", &secret)), with_code()).await;
    let fixture: Value =
        serde_json::from_str(r#"{"error": "invalid_client_id", "ok": false}"#).expect("fixture");
    assert_eq!(
        unknown, fixture,
        "oauth.v2.access-error-invalid_client_id.openapi.json"
    );
    for (authorization, form, error) in [
        (Some(basic(&id, "wrong")), with_code(), "bad_client_secret"),
        (
            Some("Basic !!!".to_owned()),
            with_code(),
            "invalid_client_id",
        ),
        (None, with_code(), "invalid_client_id"),
        // Basic and form fields that name another secret or client.
        (
            Some(basic(&id, &secret)),
            [with_code(), vec![("client_secret", "other".to_owned())]].concat(),
            "bad_client_secret",
        ),
        (
            Some(basic(&id, &secret)),
            [with_code(), vec![("client_id", "1.2".to_owned())]].concat(),
            "invalid_client_id",
        ),
    ] {
        let r = exchange(authorization.clone(), form).await;
        assert_eq!(
            (r["ok"].clone(), r["error"].clone()),
            (json!(false), json!(error)),
            "{authorization:?}: {r}"
        );
    }

    // The right Basic credentials (scheme in any case) complete the install.
    let lower = basic(&id, &secret).replacen("Basic", "basic", 1);
    let ok = exchange(Some(lower), with_code()).await;
    assert_eq!(ok["ok"], true, "{ok}");
    let fixture: Value = serde_json::from_str(OAUTH_SUCCESS_FIXTURE).expect("fixture");
    for (k, v) in fixture.as_object().expect("object") {
        // `enterprise` is null outside an Enterprise organization.
        let null_ok = k == "enterprise";
        assert!(
            ok.get(k)
                .is_some_and(|got| same_type(got, v) || (null_ok && got.is_null())),
            "{k}: {ok}"
        );
    }
    assert!(
        ok["access_token"]
            .as_str()
            .is_some_and(|t| t.starts_with("xoxb-"))
    );
    assert_eq!(ok["team"]["id"], json!(w.team));
    let token = ok["access_token"].as_str().expect("token").to_owned();
    let me = w
        .wire(
            reqwest::Method::POST,
            "auth.test",
            &Sdk::Python.headers(Some(&token), "application/json;charset=utf-8"),
            Vec::new(),
        )
        .await;
    assert_eq!(me["ok"], true, "{me}");
    // Codes are single use, whatever carries the credentials.
    let again = exchange(Some(basic(&id, &secret)), with_code()).await;
    assert_eq!(again["error"], "invalid_code");

    // Basic and form fields that agree; form fields alone (node-slack-sdk).
    let code = install(id.clone()).await;
    let both = exchange(
        Some(basic(&id, &secret)),
        vec![
            ("client_id", id.clone()),
            ("client_secret", secret.clone()),
            ("code", code),
        ],
    )
    .await;
    assert_eq!(both["ok"], true, "{both}");
    let code = install(id.clone()).await;
    let fields = Sdk::Node.form(&[
        ("client_id", &id),
        ("client_secret", &secret),
        ("code", &code),
        ("redirect_uri", "http://app.example/cb"),
    ]);
    let node = w
        .wire(
            reqwest::Method::POST,
            "oauth.v2.access",
            &Sdk::Node.headers(None, "application/x-www-form-urlencoded"),
            fields,
        )
        .await;
    assert_eq!(node["ok"], true, "{node}");

    // Token rotation: python-slack-sdk refreshes with Basic too.
    let rotating = w
        .ctl("apps", json!({"name": "Rotating", "token_rotation": true}))
        .await;
    let (rid, rsecret) = (
        rotating["client_id"].as_str().expect("id").to_owned(),
        rotating["client_secret"]
            .as_str()
            .expect("secret")
            .to_owned(),
    );
    let code = install(rid.clone()).await;
    let first = exchange(Some(basic(&rid, &rsecret)), vec![("code", code)]).await;
    assert_eq!(first["ok"], true, "{first}");
    for k in ROTATION_FIELDS {
        assert!(first.get(k).is_some(), "{k}: {first}");
    }
    let refreshed = exchange(
        Some(basic(&rid, &rsecret)),
        vec![
            ("grant_type", "refresh_token".to_owned()),
            (
                "refresh_token",
                first["refresh_token"].as_str().expect("rt").to_owned(),
            ),
        ],
    )
    .await;
    assert_eq!(refreshed["ok"], true, "{refreshed}");
    assert_ne!(refreshed["access_token"], first["access_token"]);
    let wrong = exchange(
        Some(basic(&rid, &secret)),
        vec![
            ("grant_type", "refresh_token".to_owned()),
            (
                "refresh_token",
                refreshed["refresh_token"].as_str().expect("rt").to_owned(),
            ),
        ],
    )
    .await;
    assert_eq!(wrong["error"], "bad_client_secret");
}

/// How Slack reads a request's content type and body: the media type and
/// its parameters in any case, `charset` (utf-8 or iso-8859-1) there or
/// not — with the warnings Slack gives — and its codes for what it cannot
/// read.
#[tokio::test]
async fn content_types_charsets_and_bad_bodies_answer_as_slack_does() {
    let w = World::new(34, vec![], &[], &["chat:write"]).await;
    w.ctl("settings", json!({"post_burst": 100.0})).await;
    let post = json!({"channel": w.channel, "text": "hi"}).to_string();
    let form = Sdk::Node.form(&[("channel", &w.channel), ("text", "hi")]);
    let send = |content_type: Option<&str>, body: Vec<u8>| {
        let mut headers = vec![("authorization", format!("Bearer {}", w.token))];
        if let Some(c) = content_type {
            headers.push(("content-type", c.to_owned()));
        }
        let w = &w;
        async move {
            w.wire(reqwest::Method::POST, "chat.postMessage", &headers, body)
                .await
        }
    };

    for ct in [
        "application/json;charset=utf-8",
        "Application/JSON; Charset=\"UTF-8\"",
        "application/json; charset=iso-8859-1",
    ] {
        let r = send(Some(ct), post.clone().into_bytes()).await;
        assert_eq!(r["ok"], true, "{ct}: {r}");
        assert!(r.get("warning").is_none(), "{ct}: {r}");
        assert!(r.get("response_metadata").is_none(), "{ct}: {r}");
    }
    for (ct, body, warning) in [
        ("application/json", post.clone(), "missing_charset"),
        (
            "application/x-www-form-urlencoded; charset=utf-8",
            form.clone(),
            "superfluous_charset",
        ),
    ] {
        let r = send(Some(ct), body.into_bytes()).await;
        assert_eq!(
            (
                r["ok"].clone(),
                r["warning"].clone(),
                r["response_metadata"].clone()
            ),
            (json!(true), json!(warning), json!({"warnings": [warning]})),
            "{ct}"
        );
    }
    // A form in iso-8859-1: `%E9` is é.
    let r = send(
        Some("application/x-www-form-urlencoded; charset=ISO-8859-1"),
        format!("channel={}&text=caf%E9", w.channel).into_bytes(),
    )
    .await;
    assert_eq!(r["message"]["text"], "café", "{r}");
    // multipart/form-data, as python-slack-sdk writes it (each part opened by
    // CRLF, the boundary and CRLF).
    let boundary = "--------------3f0c8a1e-9d2b-4c1e-8f00-5c6a7d8e9f01";
    let mut multipart = String::new();
    for (k, v) in [("channel", w.channel.as_str()), ("text", "multi\r\npart")] {
        multipart.push_str(&format!(
            "\r\n--{boundary}\r\nContent-Disposition: form-data; name=\"{k}\"\r\n\r\n{v}"
        ));
    }
    multipart.push_str(&format!("\r\n--{boundary}--\r\n"));
    let ct = format!("multipart/form-data; boundary={boundary}");
    let r = send(Some(&ct), multipart.clone().into_bytes()).await;
    assert_eq!(r["message"]["text"], "multi\r\npart", "{r}");

    let cut = multipart[..multipart.len() - boundary.len() - 8].to_owned();
    let too_many: Vec<Value> = (0..101).map(|i| json!({"text": i.to_string()})).collect();
    let cases: Vec<(Option<&str>, Vec<u8>, &str)> = vec![
        (
            Some("application/json; charset=utf-16"),
            post.clone().into(),
            "invalid_charset",
        ),
        (
            Some("application/xml"),
            b"<a/>".to_vec(),
            "invalid_post_type",
        ),
        (None, form.clone().into(), "missing_post_type"),
        (
            Some("application/json"),
            b"{\"channel\": ".to_vec(),
            "invalid_json",
        ),
        (
            Some("application/json"),
            b"[1, 2]".to_vec(),
            "json_not_object",
        ),
        (
            Some("application/x-www-form-urlencoded"),
            format!("{form}&channels[]=C1").into(),
            "invalid_array_arg",
        ),
        (
            Some("application/x-www-form-urlencoded"),
            format!("channel={}&text=%FF%FE", w.channel).into(),
            "invalid_form_data",
        ),
        (Some(&ct), cut.into(), "invalid_form_data"),
        (
            Some("multipart/form-data"),
            multipart.into(),
            "invalid_form_data",
        ),
        (
            Some("application/x-www-form-urlencoded"),
            format!("{form}&blocks=%5B%7B").into(),
            "invalid_blocks_format",
        ),
        (
            Some("application/json"),
            json!({"channel": w.channel, "blocks": {"type": "section"}})
                .to_string()
                .into(),
            "invalid_blocks_format",
        ),
        (
            Some("application/x-www-form-urlencoded"),
            format!("{form}&metadata=nope").into(),
            "invalid_metadata_format",
        ),
        (
            Some("application/x-www-form-urlencoded"),
            format!("{form}&attachments=%7B%7D").into(),
            "invalid_attachments",
        ),
        (
            Some("application/json"),
            json!({"channel": w.channel, "attachments": too_many})
                .to_string()
                .into(),
            "too_many_attachments",
        ),
    ];
    for (ct, body, error) in cases {
        let r = send(ct, body).await;
        assert_eq!(
            (r["ok"].clone(), r["error"].clone()),
            (json!(false), json!(error)),
            "{ct:?}: {r}"
        );
    }
    // The bearer scheme in any case.
    let r = w
        .wire(
            reqwest::Method::POST,
            "auth.test",
            &[("authorization", format!("bearer {}", w.token))],
            Vec::new(),
        )
        .await;
    assert_eq!(r["ok"], true, "{r}");
}

impl World {
    /// A Web API call with a JSON body, as python-slack-sdk sends the
    /// `chat.*Stream` methods; `token` overrides the app's.
    async fn api_json(&self, method: &str, body: Value, token: Option<&str>) -> (u16, Value) {
        let r = self
            .http
            .post(format!("{}/api/{method}", self.base))
            .bearer_auth(token.unwrap_or(&self.token))
            .header("content-type", "application/json;charset=utf-8")
            .body(body.to_string())
            .send()
            .await
            .expect("web api");
        let s = r.status().as_u16();
        (s, r.json().await.expect("json"))
    }

    /// `conversations.replies` of `root`, its messages.
    async fn thread_of(&self, root: &str) -> Vec<Value> {
        let (_, _, r) = self
            .api(
                "conversations.replies",
                &[
                    ("channel", &self.channel),
                    ("ts", root),
                    ("include_all_metadata", "true"),
                ],
            )
            .await;
        r["messages"].as_array().cloned().unwrap_or_default()
    }
}

fn md(text: &str) -> Value {
    json!([{"type": "markdown_text", "text": text}])
}

/// A streamed reply from start to stop, as Slack's method reference, the
/// SDKs' types and captured events describe it: the message exists from
/// the start (an event with empty text, `streaming_state: in_progress`),
/// grows by appends that keep to the stream's form, and ends with a hidden
/// `message_changed` carrying the whole text, without `edited`.
#[tokio::test]
async fn a_stream_starts_grows_and_stops_as_slacks_does() {
    let (side, url) = app_side().await;
    let w = World::new(
        41,
        vec![url],
        &["message.channels"],
        &["chat:write", "channels:history"],
    )
    .await;
    let root = w.person_posts("question", None).await;
    received(&side, 1).await;
    let stream_args = json!({"channel": w.channel, "thread_ts": root,
                             "recipient_user_id": w.user, "recipient_team_id": w.team});

    // An empty start, as the SDK helpers send for a short reply.
    let (s, start) = w
        .api_json("chat.startStream", stream_args.clone(), None)
        .await;
    assert_eq!((s, start["ok"].clone()), (200, json!(true)), "{start}");
    assert_eq!(start["channel"], w.channel.as_str());
    let ts = start["ts"].as_str().expect("ts").to_owned();
    assert_ne!(ts, root, "the stream is a new message in the thread");
    let got = received(&side, 2).await;
    let opening = &got[1].body["event"];
    assert_eq!(
        (
            opening["type"].as_str(),
            opening.get("subtype"),
            opening["text"].as_str(),
            opening["streaming_state"].as_str(),
            opening["thread_ts"].as_str(),
            opening["bot_id"].as_str(),
        ),
        (
            Some("message"),
            None,
            Some(""),
            Some("in_progress"),
            Some(root.as_str()),
            Some(w.bot_id.as_str())
        ),
        "{opening}"
    );

    // Appends: chunks, as slack_sdk 3.40 and later send text.
    let append = |content: Value| {
        let mut b = json!({"channel": w.channel, "ts": ts});
        b.as_object_mut()
            .expect("object")
            .extend(content.as_object().expect("object").clone());
        b
    };
    let (_, r) = w
        .api_json(
            "chat.appendStream",
            append(json!({"chunks": md("Hello ")})),
            None,
        )
        .await;
    assert_eq!(
        (r["ok"].clone(), r["ts"].clone()),
        (json!(true), json!(ts)),
        "{r}"
    );
    let thread = w.thread_of(&root).await;
    assert_eq!(
        (
            thread[1]["text"].as_str(),
            thread[1]["streaming_state"].as_str()
        ),
        (Some("Hello "), Some("in_progress")),
        "readers see what was streamed so far"
    );
    // Refusals change nothing.
    for (content, code) in [
        (json!({"markdown_text": "x"}), "streaming_mode_mismatch"),
        (json!({}), "markdown_text_or_chunks_required"),
        (
            json!({"markdown_text": "x", "chunks": md("y")}),
            "cannot_provide_both_markdown_text_and_chunks",
        ),
        (
            json!({"chunks": [{"type": "markdown_text"}]}),
            "invalid_chunks",
        ),
        (
            json!({"chunks": [{"type": "poem", "text": "x"}]}),
            "invalid_chunks",
        ),
        (
            json!({"chunks": {"type": "markdown_text"}}),
            "invalid_chunks",
        ),
        (json!({"chunks": md(&"a".repeat(12_001))}), "msg_too_long"),
    ] {
        let (s, r) = w
            .api_json("chat.appendStream", append(content.clone()), None)
            .await;
        assert_eq!(
            (s, r["error"].as_str()),
            (200, Some(code)),
            "{content}: {r}"
        );
    }
    let (_, r) = w
        .api_json(
            "chat.appendStream",
            append(json!({"chunks": [{"type": "task_update", "id": "t1", "title": "Reading the thread", "status": "in_progress"},
                                     {"type": "markdown_text", "text": "wor"}]})),
            None,
        )
        .await;
    assert_eq!(r["ok"], true, "{r}");

    // The stop: the rest, blocks below and metadata.
    let metadata = json!({"event_type": "threadline_reply", "event_payload": {"intent_id": "i-1"}});
    let blocks =
        json!([{"type": "context", "elements": [{"type": "mrkdwn", "text": "AI-generated"}]}]);
    let (_, stop) = w
        .api_json(
            "chat.stopStream",
            append(json!({"chunks": md("ld"), "blocks": blocks, "metadata": metadata})),
            None,
        )
        .await;
    assert_eq!(stop["ok"], true, "{stop}");
    let m = &stop["message"];
    assert_eq!(
        (
            m["text"].as_str(),
            m["streaming_state"].as_str(),
            m["ts"].as_str(),
            m["thread_ts"].as_str(),
            m["bot_id"].as_str(),
            m["parent_user_id"].as_str(),
        ),
        (
            Some("Hello world"),
            Some("completed"),
            Some(ts.as_str()),
            Some(root.as_str()),
            Some(w.bot_id.as_str()),
            Some(w.user.as_str())
        ),
        "{stop}"
    );
    assert_eq!(
        m["blocks"],
        json!([{"type": "task_card", "task_id": "t1", "title": "Reading the thread",
                "status": "in_progress"},
               {"type": "rich_text", "block_id": format!("s{}", ts.replace('.', "")),
                "elements": [{"type": "rich_text_section",
                              "elements": [{"type": "text", "text": "Hello world"}]}]},
               blocks[0]]),
        "its task as a task card, the streamed text as a rich_text block, the stop's blocks below"
    );
    assert_eq!(m["metadata"], metadata);
    assert!(m.get("edited").is_none(), "{m}");
    let got = received(&side, 3).await;
    let changed = &got[2].body["event"];
    assert_eq!(
        (
            changed["subtype"].as_str(),
            changed["hidden"].as_bool(),
            changed["message"]["text"].as_str(),
            changed["message"]["streaming_state"].as_str(),
            changed["previous_message"]["text"].as_str(),
            changed["previous_message"]["streaming_state"].as_str(),
        ),
        (
            Some("message_changed"),
            Some(true),
            Some("Hello world"),
            Some("completed"),
            Some(""),
            Some("in_progress")
        ),
        "{changed}"
    );
    let thread = w.thread_of(&root).await;
    assert_eq!(thread.len(), 2);
    assert!(thread[1].get("edited").is_none(), "{}", thread[1]);
    // Two events in all about the streamed message: none for the appends.
    let about = eventually("both deliveries logged", Duration::from_secs(10), || {
        let (w, ts) = (&w, ts.clone());
        async move {
            let about: Vec<Value> = w
                .list(&format!("deliveries?app_id={}", w.app), "deliveries")
                .await
                .into_iter()
                .filter(|d| d["message_ts"] == ts.as_str())
                .map(|d| d["subtype"].clone())
                .collect();
            (about.len() >= 2).then_some(about)
        }
    })
    .await;
    assert_eq!(about, [Value::Null, json!("message_changed")]);
    assert_eq!(
        (
            thread[1]["text"].as_str(),
            thread[1]["streaming_state"].as_str()
        ),
        (Some("Hello world"), Some("completed"))
    );
    assert_eq!(thread[1]["metadata"], metadata);

    // An ended stream takes nothing more.
    for method in ["chat.appendStream", "chat.stopStream"] {
        let (_, r) = w
            .api_json(method, append(json!({"chunks": md("!")})), None)
            .await;
        assert_eq!(
            r["error"], "message_not_in_streaming_state",
            "{method}: {r}"
        );
    }
    // The call log names the streamed message for every applied call.
    let calls = w.list("calls", "calls").await;
    let streamed: Vec<(&str, &str)> = calls
        .iter()
        .filter(|c| c["ts"] == ts.as_str())
        .map(|c| {
            (
                c["method"].as_str().unwrap_or(""),
                c["outcome"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        streamed,
        [
            ("chat.startStream", "ok"),
            ("chat.appendStream", "ok"),
            ("chat.appendStream", "ok"),
            ("chat.stopStream", "ok")
        ]
    );
    // One reply in the thread, counted once.
    let posts = w.get(&format!("app_posts?app_id={}", w.app)).await;
    assert_eq!(
        posts["per_thread"],
        json!([{"channel": w.channel, "thread_ts": root, "count": 1}])
    );
}

/// Thinking steps: `task_update` and `plan_update` chunks are checked as
/// Slack's reference gives them, a message keeps its tasks by id (the
/// latest status wins), and its history shows them as `task_card` blocks,
/// or one `plan` block in plan mode.
#[tokio::test]
async fn a_streams_tasks_are_checked_kept_by_id_and_shown_as_slack_shows_them() {
    let (side, url) = app_side().await;
    let w = World::new(
        44,
        vec![url],
        &["message.channels"],
        &["chat:write", "channels:history"],
    )
    .await;
    w.ctl(
        "settings",
        json!({"posts_per_second": 100.0, "post_burst": 100.0}),
    )
    .await;
    let root = w.person_posts("question", None).await;
    received(&side, 1).await;
    let args = |extra: Value| {
        let mut a = json!({"channel": w.channel, "thread_ts": root,
                           "recipient_user_id": w.user, "recipient_team_id": w.team});
        for (k, v) in extra.as_object().expect("object") {
            a[k] = v.clone();
        }
        a
    };
    let task = |id: &str, status: &str| json!({"type": "task_update", "id": id, "title": "Step", "status": status});
    let url = json!({"type": "url", "url": "https://example.com/a", "text": "A"});
    for (chunk, code) in [
        (json!({"type": "thinking"}), "invalid_chunks"),
        (
            json!({"type": "task_update", "title": "Step", "status": "pending"}),
            "invalid_chunks",
        ),
        (
            json!({"type": "task_update", "id": "t", "status": "pending"}),
            "invalid_chunks",
        ),
        (task("t", "done"), "invalid_chunks"),
        (
            json!({"type": "markdown_text", "text": "x", "sources": [url]}),
            "invalid_chunks",
        ),
        (
            json!({"type": "plan_update", "title": "Plan", "sources": [url]}),
            "invalid_chunks",
        ),
        (json!({"type": "plan_update"}), "invalid_chunks"),
        (
            {
                let mut t = task("t", "complete");
                t["sources"] = json!([{"type": "url", "text": "A"}]);
                t
            },
            "invalid_chunks",
        ),
    ]
    .into_iter()
    .chain(
        // Each field of a URL source element is required: its type `url`,
        // a web URL, a text to show.
        [
            json!({"url": "https://example.com/a", "text": "A"}),
            json!({"type": "link", "url": "https://example.com/a", "text": "A"}),
            json!({"type": "url", "url": "ftp://example.com/a", "text": "A"}),
            json!({"type": "url", "url": "https://example.com/a", "text": ""}),
            json!({"type": "url", "url": "https://example.com/a"}),
            json!("https://example.com/a"),
        ]
        .into_iter()
        .map(|source| {
            let mut t = task("t", "complete");
            t["sources"] = json!([source]);
            (t, "invalid_chunks")
        }),
    ) {
        let (_, r) = w
            .api_json(
                "chat.startStream",
                args(json!({"chunks": [chunk.clone()]})),
                None,
            )
            .await;
        assert_eq!(r["error"].as_str(), Some(code), "{chunk}: {r}");
    }
    let (_, r) = w
        .api_json(
            "chat.startStream",
            args(json!({"task_display_mode": "list"})),
            None,
        )
        .await;
    assert_eq!(r["error"], "invalid_arguments", "{r}");

    // Timeline: a card per task, updated in place.
    let (_, r) = w
        .api_json(
            "chat.startStream",
            args(json!({"chunks": [task("read", "complete"), task("write", "in_progress")]})),
            None,
        )
        .await;
    let ts = r["ts"].as_str().expect("a stream").to_owned();
    let replies = || async {
        let (_, _, r) = w
            .api(
                "conversations.replies",
                &[("channel", &w.channel), ("ts", &root)],
            )
            .await;
        r["messages"]
            .as_array()
            .and_then(|m| m.iter().find(|m| m["ts"] == ts.as_str()).cloned())
            .expect("the stream in the thread")
    };
    let cards = |m: &Value| -> Vec<(String, String)> {
        m["blocks"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|b| b["type"] == "task_card")
            .map(|b| {
                (
                    b["task_id"].as_str().unwrap().to_owned(),
                    b["status"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    };
    let open = replies().await;
    assert_eq!(
        cards(&open),
        [
            ("read".into(), "complete".into()),
            ("write".into(), "in_progress".into())
        ],
        "shown while the stream is open: {open}"
    );
    let mut done = task("write", "error");
    done["details"] = "Stopped early.".into();
    done["sources"] = json!([url]);
    let (_, r) = w
        .api_json(
            "chat.stopStream",
            json!({"channel": w.channel, "ts": ts,
                   "chunks": [{"type": "markdown_text", "text": "Hi"}, done]}),
            None,
        )
        .await;
    assert_eq!(r["ok"], true, "{r}");
    let m = replies().await;
    assert_eq!(
        cards(&m),
        [
            ("read".into(), "complete".into()),
            ("write".into(), "error".into())
        ]
    );
    let write = &m["blocks"][1];
    assert_eq!(write["details"]["type"], "rich_text", "{write}");
    assert_eq!(
        write["details"]["elements"][0]["elements"][0]["text"],
        "Stopped early."
    );
    assert_eq!(write["sources"], json!([url]));
    assert_eq!(
        m["blocks"][2]["type"], "rich_text",
        "the text below its tasks"
    );

    // Plan: one plan block with its title and tasks.
    let (_, r) = w
        .api_json(
            "chat.startStream",
            args(json!({"task_display_mode": "plan",
                        "chunks": [{"type": "plan_update", "title": "Looking"}, task("a", "pending")]})),
            None,
        )
        .await;
    let ts = r["ts"].as_str().expect("a stream").to_owned();
    let (_, r) = w
        .api_json(
            "chat.stopStream",
            json!({"channel": w.channel, "ts": ts, "chunks": [task("a", "complete")]}),
            None,
        )
        .await;
    assert_eq!(r["ok"], true, "{r}");
    let plan = &r["message"]["blocks"][0];
    assert_eq!(
        (
            plan["type"].as_str(),
            plan["title"].as_str(),
            plan["tasks"][0]["status"].as_str()
        ),
        (Some("plan"), Some("Looking"), Some("complete")),
        "{plan}"
    );
    assert_eq!(plan["tasks"].as_array().map(Vec::len), Some(1));
}

/// Who may stream where, and how a stream ends when nobody stops it: the
/// recipient channels require, another app's refusal, the person's Stop,
/// the stream's lifetime, the Tier 2 budget of starts, and a human reply
/// injected when an append arrives.
#[tokio::test]
async fn streams_refuse_what_slack_refuses_and_end_by_stop_or_lifetime() {
    let (side, url) = app_side().await;
    let w = World::new(
        42,
        vec![url],
        &["message.channels"],
        &["chat:write", "channels:history"],
    )
    .await;
    w.ctl(
        "settings",
        json!({"posts_per_second": 100.0, "post_burst": 100.0}),
    )
    .await;
    let root = w.person_posts("question", None).await;
    received(&side, 1).await;
    let args = json!({"channel": w.channel, "thread_ts": root,
                      "recipient_user_id": w.user, "recipient_team_id": w.team});
    let without = |key: &str| {
        let mut a = args.clone();
        a.as_object_mut().expect("object").remove(key);
        a
    };
    for (body, code) in [
        (without("recipient_user_id"), "missing_recipient_user_id"),
        (without("recipient_team_id"), "missing_recipient_team_id"),
        (
            {
                let mut a = args.clone();
                a["recipient_user_id"] = "U0NOBODY00".into();
                a
            },
            "user_not_found",
        ),
        (
            {
                let mut a = args.clone();
                a["channel"] = "C0NOWHERE0".into();
                a
            },
            "channel_not_found",
        ),
        (
            {
                let mut a = args.clone();
                a["markdown_text"] = "x".repeat(12_001).into();
                a
            },
            "msg_too_long",
        ),
    ] {
        let (_, r) = w.api_json("chat.startStream", body.clone(), None).await;
        assert_eq!(r["error"].as_str(), Some(code), "{body}: {r}");
    }

    // Text given at the start sets the stream's form.
    let mut with_text = args.clone();
    with_text["markdown_text"] = "Thinking".into();
    let (_, r) = w.api_json("chat.startStream", with_text, None).await;
    let ts = r["ts"].as_str().expect("ts").to_owned();
    let (_, r) = w
        .api_json(
            "chat.appendStream",
            json!({"channel": w.channel, "ts": ts, "chunks": md("x")}),
            None,
        )
        .await;
    assert_eq!(r["error"], "streaming_mode_mismatch", "{r}");

    // Another app in the workspace may not touch it.
    let other = w.ctl("apps", json!({"name": "Other"})).await;
    let other_token = w
        .ctl(
            &format!("apps/{}/installs", other["id"].as_str().expect("id")),
            json!({"team_id": w.team, "scopes": ["chat:write"], "join_channels": [w.channel]}),
        )
        .await["bot_token"]
        .as_str()
        .expect("token")
        .to_owned();
    for method in ["chat.appendStream", "chat.stopStream"] {
        let (_, r) = w
            .api_json(
                method,
                json!({"channel": w.channel, "ts": ts, "markdown_text": "mine"}),
                Some(&other_token),
            )
            .await;
        assert_eq!(r["error"], "message_not_owned_by_app", "{method}: {r}");
    }
    // A message that was posted, not streamed, is not a stream.
    let (_, _, posted) = w
        .api(
            "chat.postMessage",
            &[
                ("channel", &w.channel),
                ("thread_ts", &root),
                ("text", "plain"),
            ],
        )
        .await;
    let (_, r) = w
        .api_json(
            "chat.appendStream",
            json!({"channel": w.channel, "ts": posted["ts"], "markdown_text": "more"}),
            None,
        )
        .await;
    assert_eq!(r["error"], "message_not_in_streaming_state", "{r}");

    // The person presses Stop: appends are refused as stopped by the user.
    w.ctl("act/stop_stream", json!({"channel": w.channel, "ts": ts}))
        .await;
    let (_, r) = w
        .api_json(
            "chat.appendStream",
            json!({"channel": w.channel, "ts": ts, "markdown_text": " more"}),
            None,
        )
        .await;
    assert_eq!(r["error"], "stopped_by_user", "{r}");
    let (_, r) = w
        .api_json(
            "chat.stopStream",
            json!({"channel": w.channel, "ts": ts}),
            None,
        )
        .await;
    assert_eq!(r["error"], "message_not_in_streaming_state", "{r}");
    let thread = w.thread_of(&root).await;
    let stopped = thread
        .iter()
        .find(|m| m["ts"] == ts.as_str())
        .expect("streamed");
    assert_eq!(
        (
            stopped["text"].as_str(),
            stopped["streaming_state"].as_str()
        ),
        (Some("Thinking"), Some("completed"))
    );
    assert_eq!(
        stopped["blocks"][0]["elements"][0]["elements"][0]["text"], "Thinking",
        "stopped by the person, it still renders its text: {stopped}"
    );
    assert_eq!(
        w.ctl_status("act/stop_stream", json!({"channel": w.channel, "ts": ts}))
            .await,
        400,
        "a stream ends once"
    );

    // A stream still open at its lifetime ends as errored, with its text.
    let (_, r) = w.api_json("chat.startStream", args.clone(), None).await;
    let short = r["ts"].as_str().expect("ts").to_owned();
    let (_, r) = w
        .api_json(
            "chat.appendStream",
            json!({"channel": w.channel, "ts": short, "chunks": md("partial")}),
            None,
        )
        .await;
    assert_eq!(r["ok"], true, "{r}");
    w.ctl("settings", json!({"stream_lifetime_ms": 1})).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let (_, r) = w
        .api_json(
            "chat.appendStream",
            json!({"channel": w.channel, "ts": short, "chunks": md(" more")}),
            None,
        )
        .await;
    assert_eq!(r["error"], "message_not_in_streaming_state", "{r}");
    let thread = w.thread_of(&root).await;
    let expired = thread
        .iter()
        .find(|m| m["ts"] == short.as_str())
        .expect("streamed");
    assert_eq!(
        (
            expired["text"].as_str(),
            expired["streaming_state"].as_str()
        ),
        (Some("partial"), Some("errored"))
    );
    w.ctl("settings", json!({"stream_lifetime_ms": 300_000}))
        .await;

    // A human reply injected when an append arrives lands in the stream's
    // thread before the append is applied.
    let (_, r) = w.api_json("chat.startStream", args.clone(), None).await;
    let live = r["ts"].as_str().expect("ts").to_owned();
    w.ctl(
        "faults",
        json!({"method": "chat.appendStream", "mode": "inject_reply", "user": w.user,
               "text": "actually, never mind"}),
    )
    .await;
    let (_, r) = w
        .api_json(
            "chat.appendStream",
            json!({"channel": w.channel, "ts": live, "chunks": md("Sure")}),
            None,
        )
        .await;
    assert_eq!(r["ok"], true, "{r}");
    let call = w
        .list("calls?method=chat.appendStream", "calls")
        .await
        .into_iter()
        .find(|c| !c["injected_ts"].is_null())
        .expect("the append carried the injected reply");
    let injected = call["injected_ts"].as_str().expect("ts").to_owned();
    let thread = w.thread_of(&root).await;
    let reply = thread
        .iter()
        .find(|m| m["ts"] == injected.as_str())
        .expect("the injected reply is in the stream's thread");
    assert_eq!(reply["text"], "actually, never mind");

    // The open stream cannot be edited; its calls are logged in its
    // thread; deleted, it ends as deleted and takes nothing more.
    let (_, _, r) = w
        .api(
            "chat.update",
            &[("channel", &w.channel), ("ts", &live), ("text", "edited")],
        )
        .await;
    assert_eq!(r["error"], "cant_update_message", "{r}");
    let appends = w.list("calls?method=chat.appendStream", "calls").await;
    let live_append = appends
        .iter()
        .find(|c| c["ts"] == live.as_str())
        .expect("the live stream's append");
    assert_eq!(live_append["thread_ts"], root.as_str(), "{live_append}");
    let (_, _, r) = w
        .api("chat.delete", &[("channel", &w.channel), ("ts", &live)])
        .await;
    assert_eq!(r["ok"], true, "{r}");
    let (_, r) = w
        .api_json(
            "chat.appendStream",
            json!({"channel": w.channel, "ts": live, "chunks": md("late")}),
            None,
        )
        .await;
    assert_eq!(r["error"], "message_not_found", "{r}");
    let inspected = w
        .list(
            &format!("channels/{}/threads/{root}", w.channel),
            "messages",
        )
        .await;
    let gone = inspected
        .iter()
        .find(|m| m["ts"] == live.as_str())
        .expect("kept for inspection");
    assert_eq!(gone["stream"]["ended"], "deleted", "{gone}");

    // Tier 2 (three starts taken so far this minute): a start the channel's
    // post budget refuses takes nothing from it, and the budget's end is a 429.
    w.ctl(
        "settings",
        json!({"tier2_per_minute": 5, "posts_per_second": 0.0001, "post_burst": 1.0}),
    )
    .await;
    let (_, r) = w.api_json("chat.startStream", args.clone(), None).await;
    assert_eq!(r["ok"], true, "the fourth start: {r}");
    let (s, r) = w.api_json("chat.startStream", args.clone(), None).await;
    assert_eq!(
        (s, r["error"].as_str()),
        (429, Some("ratelimited")),
        "no post budget: {r}"
    );
    w.ctl(
        "settings",
        json!({"posts_per_second": 100.0, "post_burst": 100.0}),
    )
    .await;
    // (the channel's bucket refills at 100 a second)
    tokio::time::sleep(Duration::from_millis(50)).await;
    let (_, r) = w.api_json("chat.startStream", args.clone(), None).await;
    assert_eq!(r["ok"], true, "the refused start took no Tier 2 slot: {r}");
    let (s, r) = w.api_json("chat.startStream", args.clone(), None).await;
    assert_eq!(
        (s, r["error"].as_str()),
        (429, Some("ratelimited")),
        "Tier 2 spent: {r}"
    );
}

impl World {
    /// The assistant state of one thread, as inspection shows it.
    async fn assistant_thread(&self, channel: &str, ts: &str) -> Value {
        self.list(&format!("assistant_threads?channel={channel}"), "threads")
            .await
            .into_iter()
            .find(|t| t["thread_ts"] == ts)
            .unwrap_or(Value::Null)
    }
}

/// The assistant pane as Slack's reference and the SDKs describe it: a
/// person opens it (a thread in their DM with the app, whose root is
/// `assistant_app_thread`) and the app hears `assistant_thread_started`
/// with the channel they look at, then `assistant_thread_context_changed`;
/// a status shows until the app replies, is cleared, or two minutes pass;
/// prompts and titles need an assistant thread and `assistant:write`.
#[tokio::test]
async fn the_assistant_pane_starts_threads_shows_a_status_and_takes_prompts_and_titles() {
    let (side, url) = app_side().await;
    let w = World::new(
        43,
        vec![url],
        &[
            "assistant_thread_started",
            "assistant_thread_context_changed",
            "message.im",
        ],
        &["chat:write", "assistant:write", "im:history"],
    )
    .await;
    w.ctl(
        "settings",
        json!({"posts_per_second": 100.0, "post_burst": 100.0}),
    )
    .await;
    let opened = w
        .ctl(
            "act/assistant_open",
            json!({"user": w.user, "app_id": w.app, "context_channel": w.channel}),
        )
        .await;
    let dm = opened["channel"].as_str().expect("channel").to_owned();
    let thread = opened["ts"].as_str().expect("ts").to_owned();
    assert!(dm.starts_with('D'), "{dm}");
    let got = received(&side, 1).await;
    verify(&w.secret, &got[0]);
    let e = &got[0].body["event"];
    assert_eq!(e["type"], "assistant_thread_started", "{e}");
    assert_eq!(
        e["assistant_thread"],
        json!({"user_id": w.user, "channel_id": dm, "thread_ts": thread,
               "context": {"channel_id": w.channel, "team_id": w.team, "enterprise_id": null}})
    );
    assert!(e["event_ts"].is_string());
    // The thread's root is the app's `assistant_app_thread` message.
    let (_, _, r) = w
        .api(
            "conversations.replies",
            &[("channel", &dm), ("ts", &thread)],
        )
        .await;
    assert_eq!(r["messages"][0]["subtype"], "assistant_app_thread", "{r}");
    // A second opening reuses the DM, with a new thread.
    let again = w
        .ctl(
            "act/assistant_open",
            json!({"user": w.user, "app_id": w.app}),
        )
        .await;
    assert_eq!(again["channel"], dm.as_str());
    assert_ne!(again["ts"], thread.as_str());
    let got = received(&side, 2).await;
    assert_eq!(
        got[1].body["event"]["assistant_thread"]["context"],
        json!({})
    );
    // The person looks at another channel.
    let other = w.second_channel("random").await;
    w.ctl(
        "act/assistant_context",
        json!({"channel": dm, "thread_ts": thread, "context_channel": other}),
    )
    .await;
    let got = received(&side, 3).await;
    let e = &got[2].body["event"];
    assert_eq!(e["type"], "assistant_thread_context_changed");
    assert_eq!(
        e["assistant_thread"]["context"]["channel_id"],
        other.as_str()
    );
    // Inspection keeps every channel looked at from the thread.
    assert_eq!(
        w.assistant_thread(&dm, &thread).await["looked_at"],
        json!([w.channel, other])
    );

    // A status, refused when malformed, shown when set.
    let status = |extra: Value| {
        let mut b = json!({"channel_id": dm, "thread_ts": thread});
        b.as_object_mut()
            .expect("object")
            .extend(extra.as_object().expect("object").clone());
        b
    };
    for (body, code) in [
        (status(json!({})), "invalid_arguments"),
        (
            status(json!({"status": "x", "loading_messages": vec!["m"; 11]})),
            "invalid_arguments",
        ),
        (
            json!({"channel_id": dm, "thread_ts": "1.000001", "status": "x"}),
            "invalid_thread_ts",
        ),
        (
            json!({"channel_id": "D0NOWHERE0", "thread_ts": thread, "status": "x"}),
            "channel_not_found",
        ),
    ] {
        let (_, r) = w
            .api_json("assistant.threads.setStatus", body.clone(), None)
            .await;
        assert_eq!(r["error"].as_str(), Some(code), "{body}: {r}");
    }
    assert!(
        w.assistant_thread(&dm, &thread).await["statuses"]
            .as_array()
            .is_some_and(Vec::is_empty)
    );
    let (_, r) = w
        .api_json(
            "assistant.threads.setStatus",
            status(json!({"status": "is thinking…", "loading_messages": ["Reading the thread"]})),
            None,
        )
        .await;
    assert_eq!(r, json!({"ok": true}));
    assert_eq!(
        w.assistant_thread(&dm, &thread).await["showing"],
        json!([{"app_id": w.app, "status": "is thinking…", "loading_messages": ["Reading the thread"]}])
    );
    // The app's reply in the thread ends it.
    let (_, _, r) = w
        .api(
            "chat.postMessage",
            &[
                ("channel", &dm),
                ("thread_ts", &thread),
                ("text", "the answer"),
            ],
        )
        .await;
    assert_eq!(r["ok"], true, "{r}");
    let t = w.assistant_thread(&dm, &thread).await;
    assert_eq!(
        (t["showing"].clone(), t["statuses"][0]["ended"].clone()),
        (json!([]), json!("replied"))
    );
    // The thread's root is the app's, but only the reply is a post.
    let posts = w
        .get(&format!("app_posts?app_id={}&channel={dm}", w.app))
        .await;
    assert_eq!(
        posts["per_thread"],
        json!([{"channel": dm, "thread_ts": thread, "count": 1}])
    );
    // An empty status clears one; two minutes (scaled here) end another.
    w.api_json(
        "assistant.threads.setStatus",
        status(json!({"status": "again"})),
        None,
    )
    .await;
    w.api_json(
        "assistant.threads.setStatus",
        status(json!({"status": ""})),
        None,
    )
    .await;
    assert_eq!(
        w.assistant_thread(&dm, &thread).await["statuses"][1]["ended"],
        "cleared"
    );
    w.ctl("settings", json!({"assistant_status_timeout_ms": 200}))
        .await;
    w.api_json(
        "assistant.threads.setStatus",
        status(json!({"status": "slow"})),
        None,
    )
    .await;
    // (recorded whether or not it already timed out on a slow machine)
    assert_eq!(
        w.assistant_thread(&dm, &thread).await["statuses"][2]["status"],
        "slow"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t = w.assistant_thread(&dm, &thread).await;
    assert_eq!(
        (t["showing"].clone(), t["statuses"][2]["ended"].clone()),
        (json!([]), json!("timeout"))
    );
    // A status given as something other than text is refused, and the
    // statuses stay as they were.
    let (_, r) = w
        .api_json(
            "assistant.threads.setStatus",
            status(json!({"status": ["not", "text"]})),
            None,
        )
        .await;
    assert_eq!(r["error"], "invalid_arguments", "{r}");
    assert_eq!(
        w.assistant_thread(&dm, &thread).await["statuses"]
            .as_array()
            .map(Vec::len),
        Some(3)
    );

    // Suggested prompts and a title, on assistant threads only.
    let prompts = json!([{"title": "Summarise", "message": "Summarise this channel"},
                         {"title": "Explain", "message": "Explain the last error"}]);
    let (_, r) = w
        .api_json(
            "assistant.threads.setSuggestedPrompts",
            status(json!({"prompts": prompts, "title": "Try"})),
            None,
        )
        .await;
    assert_eq!(r["ok"], true, "{r}");
    for bad in [
        json!([]),
        json!([{"title": "no message"}]),
        json!(vec![json!({"title": "t", "message": "m"}); 5]),
    ] {
        let (_, r) = w
            .api_json(
                "assistant.threads.setSuggestedPrompts",
                status(json!({"prompts": bad})),
                None,
            )
            .await;
        assert_eq!(r["error"], "invalid_arguments", "{bad}: {r}");
    }
    let channel_root = w.person_posts("not an assistant thread", None).await;
    let (_, r) = w
        .api_json(
            "assistant.threads.setTitle",
            json!({"channel_id": w.channel, "thread_ts": channel_root, "title": "x"}),
            None,
        )
        .await;
    assert_eq!(r["error"], "invalid_thread_ts", "{r}");
    let (_, r) = w
        .api_json(
            "assistant.threads.setTitle",
            status(json!({"title": "Exit code 137"})),
            None,
        )
        .await;
    assert_eq!(r["ok"], true, "{r}");
    let t = w.assistant_thread(&dm, &thread).await;
    assert_eq!(
        (&t["title"], &t["suggested_prompts"], &t["prompts_title"]),
        (&json!("Exit code 137"), &prompts, &json!("Try"))
    );
    // A status in a channel thread needs no assistant thread.
    let (_, r) = w
        .api_json(
            "assistant.threads.setStatus",
            json!({"channel_id": w.channel, "thread_ts": channel_root, "status": "is reading…"}),
            None,
        )
        .await;
    assert_eq!(r["ok"], true, "{r}");

    // Without assistant:write: a status with chat:write, no title.
    let w2 = World::new(44, vec![], &[], &["chat:write"]).await;
    let opened = w2
        .ctl(
            "act/assistant_open",
            json!({"user": w2.user, "app_id": w2.app}),
        )
        .await;
    let body = json!({"channel_id": opened["channel"], "thread_ts": opened["ts"],
                      "status": "x", "title": "x"});
    let (_, r) = w2
        .api_json("assistant.threads.setStatus", body.clone(), None)
        .await;
    assert_eq!(r["ok"], true, "{r}");
    let (_, r) = w2.api_json("assistant.threads.setTitle", body, None).await;
    assert_eq!(
        (r["error"].as_str(), r["needed"].as_str()),
        (Some("missing_scope"), Some("assistant:write")),
        "{r}"
    );
}

/// A control call that may be refused: its status and body.
async fn ctl_raw(w: &World, path: &str, body: Value) -> (u16, Value) {
    let r = w
        .http
        .post(format!("{}/_sim/{path}", w.base))
        .json(&body)
        .send()
        .await
        .expect("control call");
    (r.status().as_u16(), r.json().await.expect("json"))
}

/// The fields of a form body, in order.
fn form_fields(raw: &[u8]) -> Vec<(String, String)> {
    serde_urlencoded::from_bytes(raw).expect("a form body")
}

/// A message with a section button (with `block_id` and `style`), and an
/// `actions` block without a `block_id` holding a button and a select.
fn button_blocks() -> Value {
    json!([
        {"type": "section", "block_id": "ask",
         "text": {"type": "mrkdwn", "text": "Ship it?"},
         "accessory": {"type": "button", "action_id": "approve", "style": "primary",
                       "text": {"type": "plain_text", "text": "Approve"}, "value": "yes"}},
        {"type": "actions", "elements": [
            {"type": "button", "action_id": "reject",
             "text": {"type": "plain_text", "text": "Reject"}, "value": "no"},
            {"type": "static_select", "action_id": "pick",
             "placeholder": {"type": "plain_text", "text": "Pick"},
             "options": [{"text": {"type": "plain_text", "text": "A"}, "value": "a"}]}
        ]}
    ])
}

#[tokio::test]
async fn a_click_sends_one_signed_block_actions_form_shaped_like_slacks() {
    let (side, url) = app_side().await;
    let w = World::new(31, vec![], &[], &[]).await;
    w.ctl(
        "settings",
        json!({"posts_per_second": 100.0, "post_burst": 100.0}),
    )
    .await;
    // An app created with its interactivity URL, posting a message with buttons.
    let app = w
        .ctl("apps", json!({"name": "Clicky", "interactivity_url": url}))
        .await;
    let app_id = app["id"].as_str().expect("id").to_owned();
    let secret = app["signing_secret"].as_str().expect("secret").to_owned();
    assert_eq!(app["interactivity_url"], url.as_str());
    let inst = w
        .ctl(
            &format!("apps/{app_id}/installs"),
            json!({"team_id": w.team, "scopes": ["chat:write"], "join_channels": [w.channel]}),
        )
        .await;
    let metadata = json!({"event_type": "threadline_reply", "event_payload": {"intent_id": "i-9"}});
    let posted: Value = w
        .http
        .post(format!("{}/api/chat.postMessage", w.base))
        .bearer_auth(inst["bot_token"].as_str().expect("token"))
        .form(&[
            ("channel", w.channel.as_str()),
            ("text", "Ship it?"),
            ("blocks", &button_blocks().to_string()),
            ("metadata", &metadata.to_string()),
        ])
        .send()
        .await
        .expect("post")
        .json()
        .await
        .expect("json");
    assert_eq!(posted["ok"], true, "{posted}");
    let ts = posted["ts"].as_str().expect("ts").to_owned();

    let click = |action_id: &str| {
        w.ctl(
            "act/click",
            json!({"user": w.user, "channel": w.channel, "ts": ts, "action_id": action_id}),
        )
    };
    let entry = click("approve").await;
    assert_eq!(entry["status"], 200, "{entry}");
    assert_eq!(
        keys(&entry),
        [
            "action_id",
            "app_id",
            "channel",
            "elapsed_ms",
            "id",
            "message_ts",
            "status",
            "team_id",
            "user",
            "value"
        ]
    );
    assert_eq!(
        (
            &entry["id"],
            &entry["app_id"],
            &entry["team_id"],
            &entry["user"]
        ),
        (&json!(1), &json!(app_id), &json!(w.team), &json!(w.user))
    );
    assert_eq!(
        (
            &entry["channel"],
            &entry["message_ts"],
            &entry["action_id"],
            &entry["value"]
        ),
        (
            &json!(w.channel),
            &json!(ts),
            &json!("approve"),
            &json!("yes")
        )
    );
    assert!(entry["elapsed_ms"].as_u64().is_some());

    // What arrived: a signed form with one field, `payload`.
    let got = received(&side, 1).await;
    let r = &got[0];
    assert_eq!(
        r.headers.get("content-type").map(|v| v.as_bytes()),
        Some(&b"application/x-www-form-urlencoded"[..])
    );
    verify(&secret, r);
    let mut tampered = r.clone();
    tampered.raw.extend_from_slice(b"&x=1");
    let v = Verifier::new(vec![SigningSecret::new(&secret).expect("secret")]).expect("verifier");
    assert!(
        v.verify(
            tampered
                .headers
                .get("x-slack-request-timestamp")
                .map(|h| h.as_bytes()),
            tampered
                .headers
                .get("x-slack-signature")
                .map(|h| h.as_bytes()),
            &tampered.raw,
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("clock")
                .as_secs() as i64,
        )
        .is_err(),
        "a tampered body fails the signature"
    );
    let fields = form_fields(&r.raw);
    assert_eq!(fields.len(), 1);
    assert_eq!(fields[0].0, "payload");
    let p: Value = serde_json::from_str(&fields[0].1).expect("payload is JSON");
    assert_eq!(
        keys(&p),
        [
            "actions",
            "api_app_id",
            "channel",
            "container",
            "enterprise",
            "is_enterprise_install",
            "message",
            "response_url",
            "state",
            "team",
            "token",
            "trigger_id",
            "type",
            "user"
        ]
    );
    assert_eq!(p["type"], "block_actions");
    assert_eq!(
        p["user"],
        json!({"id": w.user, "username": "ana", "name": "ana", "team_id": w.team})
    );
    assert_eq!(p["api_app_id"], app_id.as_str());
    assert_eq!(p["token"], app["verification_token"]);
    assert_eq!(
        p["container"],
        json!({"type": "message", "message_ts": ts, "channel_id": w.channel, "is_ephemeral": false})
    );
    let trigger: Vec<&str> = p["trigger_id"]
        .as_str()
        .expect("trigger")
        .split('.')
        .collect();
    assert!(
        trigger.len() == 3
            && trigger[..2]
                .iter()
                .all(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
            && !trigger[2].is_empty(),
        "{trigger:?}"
    );
    assert_eq!(p["team"], json!({"id": w.team, "domain": "acme"}));
    assert_eq!(p["enterprise"], Value::Null);
    assert_eq!(p["is_enterprise_install"], false);
    assert_eq!(p["channel"], json!({"id": w.channel, "name": "general"}));
    assert_eq!(p["state"], json!({"values": {}}));
    assert!(
        p["response_url"]
            .as_str()
            .expect("response_url")
            .starts_with(&format!("{}/actions/{}/", w.base, w.team)),
        "{}",
        p["response_url"]
    );
    // The message as the Web API shows it, blocks in, metadata out.
    let m = &p["message"];
    assert_eq!(
        (
            &m["type"],
            &m["ts"],
            &m["text"],
            &m["app_id"],
            &m["bot_id"],
            &m["team"]
        ),
        (
            &json!("message"),
            &json!(ts),
            &json!("Ship it?"),
            &json!(app_id),
            &inst["bot_id"],
            &json!(w.team)
        )
    );
    assert!(m.get("metadata").is_none(), "{m}");
    assert_eq!(m["blocks"][0], button_blocks()[0]);
    let derived = m["blocks"][1]["block_id"]
        .as_str()
        .expect("a block_id")
        .to_owned();
    assert_eq!(
        p["actions"],
        json!([{"action_id": "approve", "block_id": "ask", "type": "button", "style": "primary",
                "text": {"type": "plain_text", "text": "Approve"}, "value": "yes",
                "action_ts": p["actions"][0]["action_ts"]}])
    );
    let action_ts = p["actions"][0]["action_ts"].as_str().expect("action_ts");
    assert!(
        ts_key(action_ts) > ts_key(&ts),
        "an action_ts after the message"
    );

    // A button of an `actions` block without a block_id: the same derived
    // id in the message and the action, click after click; no style.
    side.script
        .lock()
        .expect("lock")
        .push_back(Behave::Status(500, false));
    let entry = click("reject").await;
    assert_eq!((&entry["id"], &entry["status"]), (&json!(2), &json!(500)));
    click("reject").await;
    let got = received(&side, 3).await;
    let payloads: Vec<Value> = got[1..]
        .iter()
        .map(|r| serde_json::from_str(&form_fields(&r.raw)[0].1).expect("json"))
        .collect();
    for p in &payloads {
        assert_eq!(p["actions"][0]["block_id"], derived.as_str());
        assert_eq!(p["message"]["blocks"][1]["block_id"], derived.as_str());
        assert_eq!(p["actions"][0]["value"], "no");
        assert!(p["actions"][0].get("style").is_none());
    }
    assert_ne!(
        payloads[0]["trigger_id"], payloads[1]["trigger_id"],
        "each click has its own trigger_id"
    );
    // Not retried after the 500: exactly the three clicks arrived.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(side.got.lock().expect("lock").len(), 3);
    let log = w.get("interactions").await;
    assert_eq!(log["ok"], true);
    let statuses: Vec<(u64, Value)> = log["interactions"]
        .as_array()
        .expect("interactions")
        .iter()
        .map(|i| (i["id"].as_u64().expect("id"), i["status"].clone()))
        .collect();
    assert_eq!(
        statuses,
        [(1, json!(200)), (2, json!(500)), (3, json!(200))]
    );
    w.ctl("reset", json!({})).await;
    assert_eq!(w.get("interactions").await["interactions"], json!([]));
}

#[tokio::test]
async fn a_reply_in_a_thread_names_its_thread_and_an_org_install_its_enterprise() {
    let (side, url) = app_side().await;
    let base = serve(threadline_slack_sim::router(Sim::new(32))).await;
    let w = World {
        base,
        http: reqwest::Client::new(),
        team: String::new(),
        user: String::new(),
        channel: String::new(),
        app: String::new(),
        secret: String::new(),
        token: String::new(),
        bot_user: String::new(),
        bot_id: String::new(),
    };
    let team = w
        .ctl(
            "teams",
            json!({"name": "Grid One", "enterprise_id": "E0GRID"}),
        )
        .await["id"]
        .as_str()
        .expect("id")
        .to_owned();
    let user = w.ctl("users", json!({"team_id": team, "name": "bo"})).await["id"]
        .as_str()
        .expect("id")
        .to_owned();
    let other = w.ctl("users", json!({"team_id": team, "name": "cy"})).await["id"]
        .as_str()
        .expect("id")
        .to_owned();
    let channel = w
        .ctl(
            "channels",
            json!({"team_id": team, "name": "dm", "kind": "im", "members": [user, other]}),
        )
        .await["id"]
        .as_str()
        .expect("id")
        .to_owned();
    let app = w
        .ctl("apps", json!({"name": "Org", "interactivity_url": url}))
        .await;
    let app_id = app["id"].as_str().expect("id").to_owned();
    let inst = w
        .ctl(
            &format!("apps/{app_id}/installs"),
            json!({"team_id": "E0GRID", "scopes": ["chat:write"], "join_channels": [channel]}),
        )
        .await;
    assert_eq!(inst["is_enterprise_install"], true);
    let root = w
        .ctl(
            "act/post",
            json!({"user": user, "channel": channel, "text": "help"}),
        )
        .await["ts"]
        .as_str()
        .expect("ts")
        .to_owned();
    let posted: Value = w
        .http
        .post(format!("{}/api/chat.postMessage", w.base))
        .bearer_auth(inst["bot_token"].as_str().expect("token"))
        .form(&[
            ("channel", channel.as_str()),
            ("thread_ts", root.as_str()),
            ("text", "Ship it?"),
            ("blocks", &button_blocks().to_string()),
        ])
        .send()
        .await
        .expect("post")
        .json()
        .await
        .expect("json");
    let ts = posted["ts"].as_str().expect("ts").to_owned();
    let entry = w
        .ctl(
            "act/click",
            json!({"user": user, "channel": channel, "ts": ts, "action_id": "approve"}),
        )
        .await;
    assert_eq!(entry["status"], 200, "{entry}");
    let got = received(&side, 1).await;
    let p: Value = serde_json::from_str(&form_fields(&got[0].raw)[0].1).expect("json");
    assert_eq!(p["container"]["thread_ts"], root.as_str());
    assert_eq!(p["message"]["thread_ts"], root.as_str());
    assert_eq!(p["message"]["parent_user_id"], user.as_str());
    assert_eq!(p["team"], Value::Null);
    assert_eq!(p["enterprise"], json!({"id": "E0GRID", "name": "E0GRID"}));
    assert_eq!(p["is_enterprise_install"], true);
    assert_eq!(p["user"]["team_id"], team.as_str());
    assert_eq!(
        p["channel"],
        json!({"id": channel, "name": "directmessage"})
    );
    assert!(
        p["response_url"]
            .as_str()
            .expect("url")
            .contains("/actions/E0GRID/")
    );
}

#[tokio::test]
async fn clicks_are_refused_without_a_button_a_posting_app_or_its_url() {
    let (_side, url) = app_side().await;
    let w = World::new(33, vec![], &[], &["chat:write"]).await;
    let click = |ts: &str, action_id: &str| {
        ctl_raw(
            &w,
            "act/click",
            json!({"user": w.user, "channel": w.channel, "ts": ts, "action_id": action_id}),
        )
    };
    let (_, _, posted) = w
        .api(
            "chat.postMessage",
            &[
                ("channel", &w.channel),
                ("text", "Ship it?"),
                ("blocks", &button_blocks().to_string()),
            ],
        )
        .await;
    let ts = posted["ts"].as_str().expect("ts").to_owned();

    // The app has no interactivity URL yet.
    let (s, b) = click(&ts, "approve").await;
    assert_eq!(s, 400, "{b}");
    assert!(
        b["error"]
            .as_str()
            .expect("error")
            .contains("no interactivity request URL"),
        "{b}"
    );
    let (s, b) = ctl_raw(
        &w,
        &format!("apps/{}/interactivity", w.app),
        json!({"url": "ftp://nope"}),
    )
    .await;
    assert_eq!(s, 400, "{b}");
    let set = w
        .ctl(
            &format!("apps/{}/interactivity", w.app),
            json!({"url": url}),
        )
        .await;
    assert_eq!(set, json!({"ok": true, "url": url}));
    assert_eq!(click(&ts, "approve").await.0, 200);

    // No such button; a select is not a button.
    let (s, b) = click(&ts, "nothing").await;
    assert_eq!(s, 400, "{b}");
    assert!(
        b["error"]
            .as_str()
            .expect("error")
            .contains("no button with action_id \"nothing\""),
        "{b}"
    );
    let (s, b) = click(&ts, "pick").await;
    assert_eq!(s, 400, "{b}");
    assert!(
        b["error"]
            .as_str()
            .expect("error")
            .contains("static_select"),
        "{b}"
    );

    // A person's message (blocks and all) was not posted by an app.
    let human = w
        .ctl(
            "act/post",
            json!({"user": w.user, "channel": w.channel, "text": "mine", "blocks": button_blocks()}),
        )
        .await["ts"]
        .as_str()
        .expect("ts")
        .to_owned();
    let (s, b) = click(&human, "approve").await;
    assert_eq!(s, 400, "{b}");
    assert!(
        b["error"]
            .as_str()
            .expect("error")
            .contains("not posted by an app"),
        "{b}"
    );

    // Absent and deleted messages are not found; unknown channels and users neither.
    let (s, _) = click("1.000001", "approve").await;
    assert_eq!(s, 404);
    let (s, _) = ctl_raw(
        &w,
        "act/click",
        json!({"user": "UNOBODY", "channel": w.channel, "ts": ts, "action_id": "approve"}),
    )
    .await;
    assert_eq!(s, 404);
    let (_, _, deleted) = w
        .api("chat.delete", &[("channel", &w.channel), ("ts", &ts)])
        .await;
    assert_eq!(deleted["ok"], true, "{deleted}");
    let (s, b) = click(&ts, "approve").await;
    assert_eq!(s, 404, "{b}");

    // Cleared: clicks go nowhere again.
    let (_, _, posted) = w
        .api(
            "chat.postMessage",
            &[
                ("channel", &w.channel),
                ("text", "again"),
                ("blocks", &button_blocks().to_string()),
            ],
        )
        .await;
    let cleared = w
        .ctl(
            &format!("apps/{}/interactivity", w.app),
            json!({"url": null}),
        )
        .await;
    assert_eq!(cleared, json!({"ok": true, "url": null}));
    let (s, _) = click(posted["ts"].as_str().expect("ts"), "approve").await;
    assert_eq!(s, 400);
    // Only the one good click was sent.
    let log = w.get("interactions").await;
    assert_eq!(log["interactions"].as_array().map(Vec::len), Some(1));
}

#[tokio::test]
async fn an_app_that_never_answers_a_click_times_out_at_the_deadline_without_blocking_the_world() {
    // Accepts connections and never answers.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let silent_url = format!(
        "http://{}/slack/interactivity",
        silent.local_addr().expect("addr")
    );
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = silent.accept().await {
            held.push(s);
        }
    });
    // A port nobody listens on.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let closed_url = format!("http://{}/", closed.local_addr().expect("addr"));
    drop(closed);

    let w = World::new(34, vec![], &[], &["chat:write"]).await;
    let (_, _, posted) = w
        .api(
            "chat.postMessage",
            &[
                ("channel", &w.channel),
                ("text", "Ship it?"),
                ("blocks", &button_blocks().to_string()),
            ],
        )
        .await;
    let ts = posted["ts"].as_str().expect("ts").to_owned();
    let wr = &w;
    let set_url = |u: String| {
        let path = format!("apps/{}/interactivity", wr.app);
        async move { wr.ctl(&path, json!({"url": u})).await }
    };
    let click = || {
        w.ctl(
            "act/click",
            json!({"user": w.user, "channel": w.channel, "ts": ts, "action_id": "approve"}),
        )
    };

    // Slack's 3 seconds; the world answers meanwhile.
    set_url(silent_url).await;
    let started = std::time::Instant::now();
    let (entry, during) = tokio::join!(click(), async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let t = std::time::Instant::now();
        let (_, _, auth) = w.api("auth.test", &[]).await;
        w.get("interactions").await;
        (auth, t.elapsed())
    });
    assert_eq!(entry["status"], "timeout", "{entry}");
    let ms = entry["elapsed_ms"].as_u64().expect("elapsed_ms");
    assert!((2900..4500).contains(&ms), "{ms} ms");
    assert!(started.elapsed() >= Duration::from_millis(2900));
    assert_eq!(during.0["ok"], true);
    assert!(
        during.1 < Duration::from_millis(1000),
        "the Web API answered while a click waited ({:?})",
        during.1
    );

    // The deadline is the delivery deadline setting.
    w.ctl("settings", json!({"delivery_deadline_ms": 300}))
        .await;
    let entry = click().await;
    assert_eq!(entry["status"], "timeout", "{entry}");
    let ms = entry["elapsed_ms"].as_u64().expect("elapsed_ms");
    assert!((250..1500).contains(&ms), "{ms} ms");

    // Nobody listening: a connection error, at once.
    set_url(closed_url).await;
    let entry = click().await;
    assert_eq!(entry["status"], "connect_error", "{entry}");
    let log = w.get("interactions").await["interactions"].clone();
    let statuses: Vec<&Value> = log
        .as_array()
        .expect("interactions")
        .iter()
        .map(|i| &i["status"])
        .collect();
    assert_eq!(
        statuses,
        [
            &json!("timeout"),
            &json!("timeout"),
            &json!("connect_error")
        ]
    );
}

/// `conversations.history` with `form`; the answer.
async fn history(w: &World, form: &[(&str, &str)]) -> Value {
    let mut f = vec![("channel", w.channel.as_str())];
    f.extend_from_slice(form);
    let (s, _, v) = w.api("conversations.history", &f).await;
    assert_eq!(s, 200, "{v}");
    v
}

fn texts(v: &Value) -> Vec<String> {
    v["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .map(|m| m["text"].as_str().unwrap_or_default().to_owned())
        .collect()
}

#[tokio::test]
async fn history_is_newest_first_top_level_and_broadcasts_paged_with_slacks_rules() {
    let w = World::new(35, vec![], &[], &["chat:write", "channels:history"]).await;
    w.ctl(
        "settings",
        json!({"posts_per_second": 1000.0, "post_burst": 1000.0}),
    )
    .await;
    let wr = &w;
    let post = |text: &str, thread_ts: Option<&str>, broadcast: bool| {
        let mut body = json!({"user": w.user, "channel": w.channel, "text": text,
                              "reply_broadcast": broadcast});
        if let Some(t) = thread_ts {
            body["thread_ts"] = t.into();
        }
        async move {
            wr.ctl("act/post", body).await["ts"]
                .as_str()
                .expect("ts")
                .to_owned()
        }
    };
    let t1 = post("one", None, false).await;
    post("reply in one", Some(&t1), false).await;
    post("broadcast from one", Some(&t1), true).await;
    let t2 = post("two", None, false).await;
    let metadata = json!({"event_type": "threadline_reply", "event_payload": {"intent_id": "h-1"}});
    let (_, _, bot) = w
        .api(
            "chat.postMessage",
            &[
                ("channel", &w.channel),
                ("text", "bot three"),
                ("metadata", &metadata.to_string()),
            ],
        )
        .await;
    let t3 = bot["ts"].as_str().expect("ts").to_owned();
    let gone = post("deleted four", None, false).await;
    w.ctl("act/delete", json!({"channel": w.channel, "ts": gone}))
        .await;
    let t5 = post("five", None, false).await;

    let all = history(&w, &[]).await;
    assert_eq!(all["ok"], true, "{all}");
    assert_eq!(
        texts(&all),
        ["five", "bot three", "two", "broadcast from one", "one"]
    );
    assert_eq!(
        (&all["has_more"], &all["pin_count"]),
        (&json!(false), &json!(0))
    );
    assert!(all.get("response_metadata").is_none(), "{all}");
    let msgs = all["messages"].as_array().expect("messages");
    // Metadata only when asked; the root shows its replies; the broadcast
    // names its thread and carries the root.
    assert!(msgs[1].get("metadata").is_none());
    assert_eq!(msgs[1]["bot_id"], w.bot_id.as_str());
    assert_eq!(msgs[4]["reply_count"], 2);
    assert_eq!(msgs[4]["thread_ts"], t1.as_str());
    assert_eq!(msgs[3]["subtype"], "thread_broadcast");
    assert_eq!(msgs[3]["thread_ts"], t1.as_str());
    assert_eq!(msgs[3]["root"]["ts"], t1.as_str());
    let with_md = history(&w, &[("include_all_metadata", "true")]).await;
    assert_eq!(with_md["messages"][1]["metadata"], metadata);

    // Pages of two, newest first, each message once.
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let mut form = vec![("limit", "2".to_owned())];
        if let Some(c) = &cursor {
            form.push(("cursor", c.clone()));
        }
        let form: Vec<(&str, &str)> = form.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let page = history(&w, &form).await;
        pages += 1;
        seen.extend(texts(&page));
        match page["response_metadata"]["next_cursor"].as_str() {
            Some(c) if page["has_more"] == true => cursor = Some(c.to_owned()),
            _ => break,
        }
    }
    assert_eq!(pages, 3);
    assert_eq!(seen, texts(&all));
    let bad = history(&w, &[("cursor", "!!")]).await;
    assert_eq!(bad["error"], "invalid_cursor");

    // Bounds: exclusive unless `inclusive`.
    let between = history(&w, &[("oldest", &t2), ("latest", &t5)]).await;
    assert_eq!(texts(&between), ["bot three"]);
    let between = history(&w, &[("oldest", &t2), ("latest", &t5), ("inclusive", "1")]).await;
    assert_eq!(texts(&between), ["five", "bot three", "two"]);
    let before = history(&w, &[("latest", &t3), ("limit", "1")]).await;
    assert_eq!(texts(&before), ["two"]);
    assert_eq!(before["has_more"], true);

    // The limit is clamped to 999.
    for i in 0..1000 {
        w.ctl(
            "act/post",
            json!({"user": w.user, "channel": w.channel, "text": format!("m{i}")}),
        )
        .await;
    }
    let big = history(&w, &[("limit", "5000")]).await;
    assert_eq!(big["messages"].as_array().map(Vec::len), Some(999));
    assert_eq!(big["has_more"], true);
    assert_eq!(big["messages"][0]["text"], "m999");
    let default = history(&w, &[]).await;
    assert_eq!(default["messages"].as_array().map(Vec::len), Some(100));
}

#[tokio::test]
async fn history_needs_the_kinds_scope_membership_and_keeps_to_the_non_marketplace_limits() {
    let w = World::new(
        36,
        vec![],
        &[],
        &["chat:write", "channels:history", "groups:history"],
    )
    .await;
    for i in 0..20 {
        w.ctl(
            "act/post",
            json!({"user": w.user, "channel": w.channel, "text": format!("m{i}")}),
        )
        .await;
    }
    // A private channel without the bot; a public one without it; a DM
    // with the bot but no im:history.
    let wr = &w;
    let mk = |name: &str, kind: &str, members: Vec<&str>| {
        let body = json!({"team_id": w.team, "name": name, "kind": kind, "members": members});
        async move {
            wr.ctl("channels", body).await["id"]
                .as_str()
                .expect("id")
                .to_owned()
        }
    };
    let private_out = mk("secret", "private", vec![&w.user]).await;
    let public_out = mk("elsewhere", "public", vec![&w.user]).await;
    let dm = mk("dm", "im", vec![&w.user, &w.bot_user]).await;
    let call = |channel: String| async move {
        wr.api("conversations.history", &[("channel", &channel)])
            .await
            .2
    };
    assert_eq!(call(private_out).await["error"], "channel_not_found");
    assert_eq!(call(public_out).await["error"], "not_in_channel");
    let missing = call(dm).await;
    assert_eq!(
        (&missing["error"], &missing["needed"]),
        (&json!("missing_scope"), &json!("im:history"))
    );
    assert_eq!(call("CNOWHERE".into()).await["error"], "channel_not_found");
    let (_, _, none) = w.api("conversations.history", &[]).await;
    assert_eq!(none["error"], "channel_not_found");

    // Tier 3, per method: the 51st call in a minute waits.
    w.ctl("settings", json!({"tier3_per_minute": 2})).await;
    assert_eq!(history(&w, &[]).await["ok"], true);
    assert_eq!(history(&w, &[]).await["ok"], true);
    let (s, h, b) = w
        .api("conversations.history", &[("channel", &w.channel)])
        .await;
    assert_eq!((s, &b["error"]), (429, &json!("ratelimited")));
    assert!(h.get("retry-after").is_some());

    // A non-Marketplace app: 15 messages at most (and by default), one call a minute.
    let app = w
        .ctl(
            "apps",
            json!({"name": "Limited", "non_marketplace_limits": true}),
        )
        .await;
    let inst = w
        .ctl(&format!("apps/{}/installs", app["id"].as_str().expect("id")), json!({"team_id": w.team, "scopes": ["channels:history"], "join_channels": [w.channel]}))
        .await;
    let limited = || {
        w.http
            .post(format!("{}/api/conversations.history", w.base))
            .bearer_auth(inst["bot_token"].as_str().expect("token"))
            .form(&[("channel", w.channel.as_str()), ("limit", "200")])
            .send()
    };
    let r = limited().await.expect("req");
    let page: Value = r.json().await.expect("json");
    assert_eq!(page["messages"].as_array().map(Vec::len), Some(15));
    assert_eq!(page["has_more"], true);
    let r = limited().await.expect("req");
    assert_eq!(r.status(), 429);
}

#[tokio::test]
async fn the_testkit_workspace_sets_the_url_clicks_and_reads_the_log() {
    let (side, url) = app_side().await;
    let base = serve(threadline_slack_sim::router(Sim::new(37))).await;
    let ws = threadline_testkit::sim::SimWorkspace::create(&base, json!({}), &["chat:write"], None)
        .await;
    ws.set_interactivity_url(&url).await;
    let posted: Value = ws
        .http
        .post(format!("{base}/api/chat.postMessage"))
        .bearer_auth(ws.token())
        .form(&[
            ("channel", ws.channel.as_str()),
            ("text", "Ship it?"),
            ("blocks", &button_blocks().to_string()),
        ])
        .send()
        .await
        .expect("post")
        .json()
        .await
        .expect("json");
    let ts = posted["ts"].as_str().expect("ts");
    let entry = ws.click(&ws.user, &ws.channel, ts, "approve").await;
    assert_eq!(
        (&entry["status"], &entry["value"], &entry["app_id"]),
        (&json!(200), &json!("yes"), &json!(ws.app_id()))
    );
    received(&side, 1).await;
    assert_eq!(ws.interactions().await, json!([entry]));
}

#[tokio::test]
async fn a_message_is_doubled_as_another_ts_with_its_client_msg_id_and_replayed_late() {
    let (side, url) = app_side().await;
    let w = World::new(
        21,
        vec![url],
        &["app_mention", "message.channels"],
        &["chat:write", "channels:history"],
    )
    .await;
    let text = format!("<@{}> one action", w.bot_user);
    let ts = w
        .ctl(
            "act/post",
            json!({"user": w.user, "channel": w.channel, "text": text}),
        )
        .await["ts"]
        .as_str()
        .expect("ts")
        .to_owned();
    let copy = w
        .ctl("act/double", json!({"channel": w.channel, "ts": ts}))
        .await["ts"]
        .as_str()
        .expect("the copy's ts")
        .to_owned();
    assert!(ts_key(&copy) > ts_key(&ts));
    // Four events, both messages' app_mention and message, each carrying
    // the one client_msg_id; both messages show in the channel.
    let got = received(&side, 4).await;
    let mut by_ts: Vec<(String, String, String)> = got
        .iter()
        .map(|r| {
            verify(&w.secret, r);
            let e = &r.body["event"];
            let s = |k: &str| e[k].as_str().unwrap_or_default().to_owned();
            (s("ts"), s("type"), s("client_msg_id"))
        })
        .collect();
    by_ts.sort();
    let id = by_ts[0].2.clone();
    assert!(!id.is_empty());
    assert_eq!(
        by_ts,
        [
            (ts.clone(), "app_mention".into(), id.clone()),
            (ts.clone(), "message".into(), id.clone()),
            (copy.clone(), "app_mention".into(), id.clone()),
            (copy.clone(), "message".into(), id.clone()),
        ]
    );
    let (_, _, history) = w
        .api("conversations.history", &[("channel", w.channel.as_str())])
        .await;
    let shown: Vec<(&str, &str, &str)> = history["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .map(|m| {
            (
                m["ts"].as_str().unwrap_or_default(),
                m["client_msg_id"].as_str().unwrap_or_default(),
                m["text"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        shown,
        [
            (copy.as_str(), id.as_str(), text.as_str()),
            (ts.as_str(), id.as_str(), text.as_str())
        ]
    );
    // A bot's message has no client_msg_id: not doubled.
    let r = w
        .http
        .post(format!("{}/_sim/act/double", w.base))
        .json(&json!({"channel": w.channel, "ts": "1.000001"}))
        .send()
        .await
        .expect("call");
    assert_eq!(r.status().as_u16(), 404);

    // Replayed late: the message dated 15 minutes ago, its events carrying
    // that event_time.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs();
    let late = w
        .ctl(
            "act/post",
            json!({"user": w.user, "channel": w.channel, "text": "replayed", "late_by_secs": 900}),
        )
        .await["ts"]
        .as_str()
        .expect("ts")
        .to_owned();
    let (secs, _) = ts_key(&late);
    assert!((now - 902..=now - 898).contains(&secs), "{late} vs {now}");
    let got = received(&side, 5).await;
    let e = &got[4].body;
    assert_eq!(e["event"]["ts"], late.as_str());
    assert_eq!(e["event_time"].as_u64(), Some(secs));
}
