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

    /// The person posts (a reply when `thread_ts` is given); returns its ts.
    pub async fn post(&self, text: &str, thread_ts: Option<&str>) -> String {
        let mut body = json!({"user": self.user, "channel": self.channel, "text": text});
        if let Some(t) = thread_ts {
            body["thread_ts"] = t.into();
        }
        id(&self.ctl("act/post", body).await, "ts")
    }
}
