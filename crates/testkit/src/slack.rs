//! Signed Slack deliveries for tests: the same bytes and headers Slack sends.

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use threadline_slack::{SigningSecret, sign};

pub const TEST_SECRET: &str = "test-signing-secret-0123456789ab";

pub fn now_unix() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// `(X-Slack-Request-Timestamp, X-Slack-Signature)` for `body` at `ts`.
pub fn signature(secret: &str, ts: i64, body: &[u8]) -> (String, String) {
    let ts = ts.to_string();
    let sig = sign(
        &SigningSecret::new(secret).expect("non-empty secret"),
        &ts,
        body,
    );
    (ts, sig)
}

/// An `app_mention` envelope shaped like Slack's (from the bolt-python
/// fixture), with the given identity.
pub fn app_mention(app: &str, team: &str, event_id: &str, channel: &str, ts: &str) -> Value {
    let mut v: Value = serde_json::from_slice(&crate::fixture(
        "events/app_mention_authorizations.bolt-python.json",
    ))
    .expect("fixture parses");
    v["api_app_id"] = json!(app);
    v["team_id"] = json!(team);
    v["enterprise_id"] = Value::Null;
    v["event_id"] = json!(event_id);
    v["event"]["channel"] = json!(channel);
    v["event"]["ts"] = json!(ts);
    v["event"]["event_ts"] = json!(ts);
    v["event"]["team"] = json!(team);
    v["authorizations"][0]["team_id"] = json!(team);
    v["authorizations"][0]["enterprise_id"] = Value::Null;
    v
}

/// POSTs a signed body to `url` with optional retry headers.
pub async fn deliver(
    client: &reqwest::Client,
    url: &str,
    secret: &str,
    body: &[u8],
    retry: Option<(u32, &str)>,
) -> reqwest::Result<reqwest::Response> {
    let (ts, sig) = signature(secret, now_unix(), body);
    let mut req = client
        .post(url)
        .header("content-type", "application/json")
        .header("x-slack-request-timestamp", ts)
        .header("x-slack-signature", sig)
        .body(body.to_vec());
    if let Some((num, reason)) = retry {
        req = req
            .header("x-slack-retry-num", num.to_string())
            .header("x-slack-retry-reason", reason);
    }
    req.send().await
}

/// Registers an active installation for `(app, team)` directly (no token).
pub async fn seed_installation(pool: &sqlx::PgPool, app: &str, team: &str) -> uuid::Uuid {
    threadline_store::testing::installations::insert_active_installation(
        pool,
        uuid::Uuid::now_v7(),
        app,
        team,
    )
    .await
    .expect("seeding an installation")
}
