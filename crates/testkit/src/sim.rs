//! A slack-sim workspace for tests: a team, a person, a public channel and
//! an app installed there, created through the emulator's control API.

use serde_json::{Value, json};

pub struct SimWorkspace {
    /// The emulator's base URL (`http://127.0.0.1:PORT`).
    pub base: String,
    pub http: reqwest::Client,
    pub team: String,
    pub user: String,
    pub channel: String,
    /// The app as the control API returned it (id, secrets, client credentials).
    pub app: Value,
    /// The installation (bot user, bot id, tokens).
    pub install: Value,
}

fn id(v: &Value, field: &str) -> String {
    v[field]
        .as_str()
        .unwrap_or_else(|| panic!("slack-sim answer without {field}: {v}"))
        .to_owned()
}

impl SimWorkspace {
    /// Creates the workspace on the emulator at `base`. `app` holds the
    /// app's fields (`name` is added); `channel_id` pins the channel's id.
    pub async fn create(
        base: &str,
        mut app: Value,
        scopes: &[&str],
        channel_id: Option<&str>,
    ) -> Self {
        let http = reqwest::Client::new();
        let ctl = |path: String, body: Value| {
            let (http, url) = (http.clone(), format!("{base}/_sim/{path}"));
            async move {
                http.post(url)
                    .json(&body)
                    .send()
                    .await
                    .expect("slack-sim")
                    .json::<Value>()
                    .await
                    .expect("json")
            }
        };
        let team = id(&ctl("teams".into(), json!({"name": "Acme"})).await, "id");
        let user = id(
            &ctl("users".into(), json!({"team_id": team, "name": "ana"})).await,
            "id",
        );
        let mut channel =
            json!({"team_id": team, "name": "ops", "kind": "public", "members": [user]});
        if let Some(c) = channel_id {
            channel["id"] = c.into();
        }
        let channel = id(&ctl("channels".into(), channel).await, "id");
        app["name"] = json!("Threadline");
        let app = ctl("apps".into(), app).await;
        let install = ctl(
            format!("apps/{}/installs", id(&app, "id")),
            json!({"team_id": team, "scopes": scopes, "join_channels": [channel]}),
        )
        .await;
        Self {
            base: base.to_owned(),
            http,
            team,
            user,
            channel,
            app,
            install,
        }
    }

    pub fn app_id(&self) -> String {
        id(&self.app, "id")
    }

    pub fn bot_user(&self) -> String {
        id(&self.install, "bot_user_id")
    }

    pub fn bot_id(&self) -> String {
        id(&self.install, "bot_id")
    }

    pub fn token(&self) -> String {
        id(&self.install, "bot_token")
    }

    /// POSTs to the control API.
    pub async fn ctl(&self, path: &str, body: Value) -> Value {
        let r = self
            .http
            .post(format!("{}/_sim/{path}", self.base))
            .json(&body)
            .send()
            .await
            .expect("slack-sim");
        assert!(r.status().is_success(), "slack-sim {path}: {}", r.status());
        r.json().await.expect("json")
    }

    /// GETs from the inspection API.
    pub async fn get(&self, path: &str) -> Value {
        self.http
            .get(format!("{}/_sim/{path}", self.base))
            .send()
            .await
            .expect("slack-sim")
            .json()
            .await
            .expect("json")
    }

    /// Sets where the app's interactions (button clicks) go.
    pub async fn set_interactivity_url(&self, url: &str) {
        self.ctl(
            &format!("apps/{}/interactivity", self.app_id()),
            json!({"url": url}),
        )
        .await;
    }

    /// `user` clicks the button `action_id` on the message `ts` in
    /// `channel`; returns the interaction's log entry once the app
    /// answered (or did not in time).
    pub async fn click(&self, user: &str, channel: &str, ts: &str, action_id: &str) -> Value {
        self.ctl(
            "act/click",
            json!({"user": user, "channel": channel, "ts": ts, "action_id": action_id}),
        )
        .await
    }

    /// Every interaction sent so far, in the order their outcomes were known.
    pub async fn interactions(&self) -> Value {
        self.get("interactions").await["interactions"].take()
    }

    /// The app-level token (`xapp-…`), for `apps.connections.open`.
    pub fn app_token(&self) -> String {
        id(&self.app, "app_token")
    }

    /// Turns Socket Mode on or off: events and clicks go over the app's
    /// WebSocket connections instead of its request URLs.
    pub async fn set_socket_mode(&self, enabled: bool) {
        self.ctl(
            &format!("apps/{}/socket_mode", self.app_id()),
            json!({"enabled": enabled}),
        )
        .await;
    }

    /// `apps.connections.open` with the app-level token; returns the
    /// single-use `ws://` URL.
    pub async fn socket_url(&self) -> String {
        let v: Value = self
            .http
            .post(format!("{}/api/apps.connections.open", self.base))
            .bearer_auth(self.app_token())
            .send()
            .await
            .expect("slack-sim")
            .json()
            .await
            .expect("json");
        id(&v, "url")
    }

    /// Sends a `disconnect` message with `reason` over one connection of
    /// the app (every one when `None`); `refresh_requested` and
    /// `link_disabled` close it `close_after_ms` later (default 1 s).
    pub async fn socket_disconnect(
        &self,
        reason: &str,
        connection: Option<u64>,
        close_after_ms: Option<u64>,
    ) -> Value {
        self.ctl(
            "socket/disconnect",
            json!({"app_id": self.app_id(), "reason": reason, "connection": connection,
                   "close_after_ms": close_after_ms}),
        )
        .await
    }

    /// The app's open Socket Mode connections and the log of everything
    /// sent and received on them: `{"connections": […], "log": […]}`.
    pub async fn socket_log(&self) -> Value {
        self.get(&format!("socket?app_id={}", self.app_id())).await
    }

    /// Every delivery attempt of the app's events so far.
    pub async fn deliveries(&self) -> Value {
        self.get(&format!("deliveries?app_id={}", self.app_id()))
            .await["deliveries"]
            .take()
    }

    /// The person posts (a reply when `thread_ts` is given); returns its ts.
    pub async fn post(&self, text: &str, thread_ts: Option<&str>) -> String {
        let mut body = json!({"user": self.user, "channel": self.channel, "text": text});
        if let Some(t) = thread_ts {
            body["thread_ts"] = t.into();
        }
        id(&self.ctl("act/post", body).await, "ts")
    }
}
