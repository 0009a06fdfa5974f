//! The `response_url` of a click, served as Slack documents it: an
//! ephemeral answer for the person who clicked, `in_channel`,
//! `replace_original`, `delete_original`, 5 uses within 30 minutes, and
//! the errors of a used, expired, unknown URL or an empty answer.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, State};
use serde_json::{Value, json};
use threadline_slack_sim::Sim;
use threadline_testkit::eventually;

/// What the fake app received, by path (`interactivity` or `events`).
type Got = Arc<Mutex<Vec<(String, Bytes)>>>;

async fn receive(State(got): State<Got>, Path(path): Path<String>, body: Bytes) {
    got.lock().expect("lock").push((path, body));
}

async fn serve(router: axum::Router) -> String {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = l.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(l, router).await });
    format!("http://{addr}")
}

/// A workspace with two people in a public channel and an app (events
/// and interactivity at a fake endpoint) that posted a message with a
/// button.
struct Scene {
    base: String,
    http: reqwest::Client,
    got: Got,
    user: String,
    other: String,
    channel: String,
    app: String,
    token: String,
    bot_id: String,
    /// The message with the button.
    ts: String,
}

impl Scene {
    async fn new(seed: u64) -> Self {
        let got = Got::default();
        let app_url = serve(
            axum::Router::new()
                .route("/slack/{path}", axum::routing::post(receive))
                .with_state(got.clone()),
        )
        .await;
        let base = serve(threadline_slack_sim::router(Sim::new(seed))).await;
        let mut s = Self {
            base,
            http: reqwest::Client::new(),
            got,
            user: String::new(),
            other: String::new(),
            channel: String::new(),
            app: String::new(),
            token: String::new(),
            bot_id: String::new(),
            ts: String::new(),
        };
        s.ctl(
            "settings",
            json!({"posts_per_second": 100.0, "post_burst": 100.0}),
        )
        .await;
        let team = s.ctl("teams", json!({"name": "Acme"})).await["id"].clone();
        s.user = s.id("users", json!({"team_id": team, "name": "ana"})).await;
        s.other = s.id("users", json!({"team_id": team, "name": "bo"})).await;
        s.channel = s
            .id(
                "channels",
                json!({"team_id": team, "name": "general", "kind": "public", "members": [s.user, s.other]}),
            )
            .await;
        s.app = s
            .id(
                "apps",
                json!({"name": "Clicky", "events": ["message.channels"],
                       "request_urls": [format!("{app_url}/slack/events")],
                       "interactivity_url": format!("{app_url}/slack/interactivity")}),
            )
            .await;
        let inst = s
            .ctl(
                &format!("apps/{}/installs", s.app),
                json!({"team_id": team, "scopes": ["chat:write", "channels:history"], "join_channels": [s.channel]}),
            )
            .await;
        s.token = inst["bot_token"].as_str().expect("token").into();
        s.bot_id = inst["bot_id"].as_str().expect("bot id").into();
        let blocks = json!([{"type": "section", "block_id": "ask",
            "text": {"type": "mrkdwn", "text": "Ship it?"},
            "accessory": {"type": "button", "action_id": "approve",
                          "text": {"type": "plain_text", "text": "Approve"}, "value": "yes"}}]);
        let posted = s
            .api(
                "chat.postMessage",
                &[
                    ("channel", &s.channel),
                    ("text", "Ship it?"),
                    ("blocks", &blocks.to_string()),
                ],
            )
            .await;
        s.ts = posted["ts"].as_str().expect("ts").into();
        // (the app hears its own post)
        assert_eq!(s.events(0).await.len(), 0);
        s
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

    async fn id(&self, path: &str, body: Value) -> String {
        self.ctl(path, body).await["id"]
            .as_str()
            .expect("id")
            .into()
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

    async fn api(&self, method: &str, form: &[(&str, &str)]) -> Value {
        let v: Value = self
            .http
            .post(format!("{}/api/{method}", self.base))
            .bearer_auth(&self.token)
            .form(form)
            .send()
            .await
            .expect("web api")
            .json()
            .await
            .expect("json");
        assert_eq!(v["ok"], true, "{method}: {v}");
        v
    }

    /// `user` clicks the button; the `response_url` of the payload the app got.
    async fn click(&self, user: &str) -> String {
        let before = self.received("interactivity").len();
        let entry = self
            .ctl(
                "act/click",
                json!({"user": user, "channel": self.channel, "ts": self.ts, "action_id": "approve"}),
            )
            .await;
        assert_eq!(entry["status"], 200, "{entry}");
        let forms = self.received("interactivity");
        assert_eq!(forms.len(), before + 1);
        let fields: Vec<(String, String)> =
            serde_urlencoded::from_bytes(&forms[before]).expect("form");
        let payload: Value = serde_json::from_str(&fields[0].1).expect("payload");
        payload["response_url"]
            .as_str()
            .expect("response_url")
            .into()
    }

    fn received(&self, path: &str) -> Vec<Bytes> {
        self.got
            .lock()
            .expect("lock")
            .iter()
            .filter(|(p, _)| p == path)
            .map(|(_, b)| b.clone())
            .collect()
    }

    /// The events the app got after the one of its own post with the
    /// button, once `n` have arrived.
    async fn events(&self, n: usize) -> Vec<Value> {
        eventually(&format!("{n} events"), Duration::from_secs(10), || {
            let got: Vec<Value> = self
                .received("events")
                .iter()
                .skip(1)
                .map(|b| serde_json::from_slice(b).expect("event json"))
                .collect();
            async move { (got.len() >= n).then_some(got) }
        })
        .await
    }

    /// POSTs `body` to a response_url as JSON: (status, answer).
    async fn respond(&self, url: &str, body: &Value) -> (u16, Value) {
        self.respond_raw(url, body.to_string()).await
    }

    async fn respond_raw(&self, url: &str, body: String) -> (u16, Value) {
        let r = self
            .http
            .post(url)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .expect("response_url");
        let status = r.status().as_u16();
        assert_eq!(
            r.headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok()),
            Some("application/json; charset=utf-8")
        );
        (status, r.json().await.expect("json"))
    }

    /// The channel as stored, deleted messages included.
    async fn channel_messages(&self) -> Vec<Value> {
        self.get(&format!("channels/{}/messages", self.channel))
            .await["messages"]
            .as_array()
            .expect("messages")
            .clone()
    }

    async fn uses(&self) -> Vec<Value> {
        self.get("responses").await["responses"]
            .as_array()
            .expect("responses")
            .clone()
    }
}

fn keys(v: &Value) -> Vec<&str> {
    let mut k: Vec<&str> = v
        .as_object()
        .expect("object")
        .keys()
        .map(String::as_str)
        .collect();
    k.sort_unstable();
    k
}

#[tokio::test]
async fn an_ephemeral_answer_shows_to_the_clicker_only_and_stays_out_of_the_history() {
    let s = Scene::new(51).await;
    let url = s.click(&s.user).await;
    let url_id = url.rsplit('/').nth(1).expect("n").to_owned();

    // Issued for the click: its app, channel, message and person.
    let issued = &s.get("responses").await["response_urls"];
    assert_eq!(issued.as_array().map(Vec::len), Some(1), "{issued}");
    assert_eq!(
        keys(&issued[0]),
        [
            "app_id",
            "channel",
            "id",
            "issued_at_micros",
            "message_ts",
            "team_id",
            "url",
            "user",
            "uses"
        ]
    );
    assert_eq!(
        (
            &issued[0]["id"],
            &issued[0]["url"],
            &issued[0]["app_id"],
            &issued[0]["channel"],
            &issued[0]["message_ts"],
            &issued[0]["user"],
            &issued[0]["uses"]
        ),
        (
            &json!(url_id),
            &json!(url),
            &json!(s.app),
            &json!(s.channel),
            &json!(s.ts),
            &json!(s.user),
            &json!(0)
        )
    );

    // The default response_type is ephemeral.
    let (status, body) = s.respond(&url, &json!({"text": "Only you see this"})).await;
    assert_eq!((status, &body), (200, &json!({"ok": true})));

    let eph = s.get("ephemerals").await["ephemerals"].clone();
    assert_eq!(eph.as_array().map(Vec::len), Some(1), "{eph}");
    let e = &eph[0];
    assert_eq!(
        (
            &e["channel"],
            &e["user"],
            &e["text"],
            &e["app_id"],
            &e["bot_id"],
            &e["via"],
            &e["thread_ts"]
        ),
        (
            &json!(s.channel),
            &json!(s.user),
            &json!("Only you see this"),
            &json!(s.app),
            &json!(s.bot_id),
            &json!("response_url"),
            &Value::Null
        )
    );
    assert_eq!(
        s.get(&format!("ephemerals?user={}", s.other)).await["ephemerals"],
        json!([]),
        "the other member sees nothing"
    );
    // Not in the channel: only the button's message is there, for the
    // emulator's own view and for conversations.history.
    let stored: Vec<Value> = s.channel_messages().await;
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0]["ts"], s.ts.as_str());
    let history = s
        .api("conversations.history", &[("channel", &s.channel)])
        .await;
    assert_eq!(history["messages"].as_array().map(Vec::len), Some(1));

    // An ephemeral in a thread names it; still out of the history.
    let (status, _) = s
        .respond(
            &url,
            &json!({"text": "In the thread", "response_type": "ephemeral", "thread_ts": s.ts}),
        )
        .await;
    assert_eq!(status, 200);
    let eph = s.get(&format!("ephemerals?user={}", s.user)).await["ephemerals"].clone();
    assert_eq!(eph[1]["thread_ts"], s.ts.as_str());
    assert_eq!(s.channel_messages().await.len(), 1);

    // The log: each use, exactly.
    let uses = s.uses().await;
    assert_eq!(uses.len(), 2);
    assert_eq!(
        keys(&uses[0]),
        [
            "app_id",
            "at_micros",
            "channel",
            "delete_original",
            "http_status",
            "message_ts",
            "replace_original",
            "response_type",
            "result",
            "seq",
            "text",
            "thread_ts",
            "ts",
            "url_id",
            "use_number",
            "user"
        ]
    );
    assert_eq!(
        uses[0],
        json!({"seq": 1, "url_id": url_id, "app_id": s.app, "user": s.user, "channel": s.channel,
               "message_ts": s.ts, "response_type": "ephemeral", "replace_original": false,
               "delete_original": false, "thread_ts": null, "text": "Only you see this",
               "result": "ok", "http_status": 200, "use_number": 1, "ts": eph[0]["ts"],
               "at_micros": uses[0]["at_micros"]})
    );
    assert_eq!(
        (&uses[1]["use_number"], &uses[1]["thread_ts"]),
        (&json!(2), &json!(s.ts))
    );
    assert_eq!(s.get("responses").await["response_urls"][0]["uses"], 2);
}

#[tokio::test]
async fn replace_original_replaces_the_message_in_place_and_in_channel_posts_as_the_bot() {
    let s = Scene::new(52).await;
    let url = s.click(&s.user).await;
    let done = json!([{"type": "section", "block_id": "done",
                       "text": {"type": "mrkdwn", "text": "Shipped by ana"}}]);
    // As Slack's own examples send the flag: a string.
    let (status, body) = s
        .respond(
            &url,
            &json!({"replace_original": "true", "text": "Shipped", "blocks": done}),
        )
        .await;
    assert_eq!((status, &body), (200, &json!({"ok": true})));
    let stored = s.channel_messages().await;
    assert_eq!(stored.len(), 1, "replaced, not added");
    let m = &stored[0];
    assert_eq!(
        (&m["ts"], &m["text"], &m["blocks"], &m["deleted"]),
        (&json!(s.ts), &json!("Shipped"), &done, &json!(false))
    );
    assert!(m["edited"].is_array(), "marked edited: {m}");
    let history = s
        .api("conversations.history", &[("channel", &s.channel)])
        .await;
    assert_eq!(history["messages"][0]["text"], "Shipped");
    let events = s.events(1).await;
    assert_eq!(events[0]["event"]["subtype"], "message_changed");
    assert_eq!(events[0]["event"]["message"]["ts"], s.ts.as_str());
    assert_eq!(events[0]["event"]["previous_message"]["text"], "Ship it?");
    assert_eq!(s.get("ephemerals").await["ephemerals"], json!([]));

    // in_channel, in the button's thread: a message from the app's bot.
    let (status, _) = s
        .respond(
            &url,
            &json!({"response_type": "in_channel", "text": "Done, everyone", "thread_ts": s.ts}),
        )
        .await;
    assert_eq!(status, 200);
    let stored = s.channel_messages().await;
    assert_eq!(stored.len(), 2);
    let posted = &stored[1];
    assert_eq!(
        (
            &posted["text"],
            &posted["bot_id"],
            &posted["app_id"],
            &posted["thread_ts"]
        ),
        (
            &json!("Done, everyone"),
            &json!(s.bot_id),
            &json!(s.app),
            &json!(s.ts)
        )
    );
    let events = s.events(2).await;
    assert_eq!(events[1]["event"]["ts"], posted["ts"]);
    let uses = s.uses().await;
    assert_eq!(uses[1]["ts"], posted["ts"]);
    assert_eq!(uses[1]["response_type"], "in_channel");
    assert_eq!(uses[0]["replace_original"], true);
    assert_eq!(uses[0]["ts"], Value::Null);

    // delete_original deletes the message the button was on.
    let (status, _) = s.respond(&url, &json!({"delete_original": true})).await;
    assert_eq!(status, 200);
    let stored = s.channel_messages().await;
    assert_eq!(
        (&stored[0]["ts"], &stored[0]["deleted"]),
        (&json!(s.ts), &json!(true))
    );
    // (it has a reply, the in-channel post: Slack keeps a tombstone)
    let events = s.events(3).await;
    assert_eq!(events[2]["event"]["subtype"], "message_changed");
    assert_eq!(events[2]["event"]["message"]["subtype"], "tombstone");
    assert_eq!(events[2]["event"]["message"]["ts"], s.ts.as_str());
    // The original is gone: replacing it again is refused, not counted.
    let (status, body) = s
        .respond(&url, &json!({"replace_original": true, "text": "again"}))
        .await;
    assert_eq!(
        (status, &body),
        (404, &json!({"ok": false, "error": "message_not_found"}))
    );
    assert_eq!(s.get("responses").await["response_urls"][0]["uses"], 3);
}

#[tokio::test]
async fn a_response_url_answers_five_times_then_says_used_url() {
    let s = Scene::new(53).await;
    let url = s.click(&s.user).await;
    for i in 1..=5 {
        let (status, body) = s.respond(&url, &json!({"text": format!("#{i}")})).await;
        assert_eq!((status, &body), (200, &json!({"ok": true})), "use {i}");
    }
    let (status, body) = s.respond(&url, &json!({"text": "#6"})).await;
    assert_eq!(
        (status, &body),
        (404, &json!({"ok": false, "error": "used_url"}))
    );
    let texts: Vec<Value> = s.get("ephemerals").await["ephemerals"]
        .as_array()
        .expect("ephemerals")
        .iter()
        .map(|e| e["text"].clone())
        .collect();
    assert_eq!(texts, ["#1", "#2", "#3", "#4", "#5"]);
    let uses = s.uses().await;
    assert_eq!(
        uses.iter()
            .map(|u| (u["result"].clone(), u["use_number"].clone()))
            .collect::<Vec<_>>(),
        [
            (json!("ok"), json!(1)),
            (json!("ok"), json!(2)),
            (json!("ok"), json!(3)),
            (json!("ok"), json!(4)),
            (json!("ok"), json!(5)),
            (json!("used_url"), Value::Null)
        ]
    );
    assert_eq!(uses[5]["text"], "#6");
    assert_eq!(uses[5]["http_status"], 404);
    // Another click has its own URL, with its own five uses.
    let fresh = s.click(&s.user).await;
    assert_ne!(fresh, url);
    assert_eq!(s.respond(&fresh, &json!({"text": "new"})).await.0, 200);
}

#[tokio::test]
async fn an_expired_response_url_says_expired_url() {
    let s = Scene::new(54).await;
    s.ctl("settings", json!({"response_url_ttl_ms": 400})).await;
    let url = s.click(&s.user).await;
    assert_eq!(s.respond(&url, &json!({"text": "in time"})).await.0, 200);
    tokio::time::sleep(Duration::from_millis(600)).await;
    let (status, body) = s.respond(&url, &json!({"text": "too late"})).await;
    assert_eq!(
        (status, &body),
        (404, &json!({"ok": false, "error": "expired_url"}))
    );
    let eph = s.get("ephemerals").await["ephemerals"].clone();
    assert_eq!(eph.as_array().map(Vec::len), Some(1));
    assert_eq!(eph[0]["text"], "in time");
    let uses = s.uses().await;
    assert_eq!(uses[1]["result"], "expired_url");
    // Slack's 30 minutes by default.
    let settings = s.ctl("settings", json!({})).await;
    assert_eq!(settings["response_url_ttl_ms"], 400);
    let fresh = Scene::new(55).await.ctl("settings", json!({})).await;
    assert_eq!(fresh["response_url_ttl_ms"], 1_800_000);
}

#[tokio::test]
async fn an_empty_answer_says_no_text_and_a_bad_one_is_refused_without_using_the_url() {
    let s = Scene::new(56).await;
    let url = s.click(&s.user).await;
    for empty in [
        json!({}),
        json!({"text": "  "}),
        json!({"blocks": []}),
        json!({"response_type": "in_channel"}),
        json!({"replace_original": true}),
    ] {
        let (status, body) = s.respond(&url, &empty).await;
        assert_eq!(
            (status, &body),
            (400, &json!({"ok": false, "error": "no_text"})),
            "{empty}"
        );
    }
    let (status, body) = s.respond_raw(&url, "text=hello".into()).await;
    assert_eq!(
        (status, &body),
        (400, &json!({"ok": false, "error": "invalid_payload"}))
    );
    let (status, body) = s.respond(&url, &json!({"text": "x", "blocks": "no"})).await;
    assert_eq!(
        (status, &body),
        (400, &json!({"ok": false, "error": "invalid_blocks"}))
    );
    // A URL never issued: another secret, another id.
    let (head, _) = url.rsplit_once('/').expect("secret");
    let (status, body) = s
        .respond(&format!("{head}/NOTTHESECRET"), &json!({"text": "x"}))
        .await;
    assert_eq!(
        (status, &body),
        (404, &json!({"ok": false, "error": "no_service"}))
    );
    let uses = s.uses().await;
    assert_eq!(uses.len(), 8);
    assert!(uses.iter().all(|u| u["use_number"].is_null()));
    assert_eq!(uses[5]["response_type"], Value::Null, "no body to read");
    assert_eq!(uses[7]["user"], Value::Null, "no URL to name");
    assert_eq!(s.get("ephemerals").await["ephemerals"], json!([]));
    assert_eq!(s.channel_messages().await.len(), 1);
    // None of them used the URL up.
    let (status, _) = s.respond(&url, &json!({"text": "finally"})).await;
    assert_eq!(status, 200);
    assert_eq!(s.uses().await[8]["use_number"], 1);
}
