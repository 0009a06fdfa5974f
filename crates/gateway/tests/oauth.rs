//! The OAuth install flow against slack-sim's consent page and
//! `oauth.v2.access`, with a real database.

use std::time::Duration;

use reqwest::header::{COOKIE, LOCATION, SET_COOKIE};
use serde_json::{Value, json};
use threadline_gateway::GatewayConfig;
use threadline_runtime::config::Source;
use threadline_runtime::shutdown::CancellationToken;
use threadline_store::testing;
use threadline_tenancy::secrets::{Sealed, TokenKeys, token_aad};
use threadline_testkit::slack::TEST_SECRET;
use threadline_testkit::{TestDb, eventually, nats_url, unique_prefix};

struct Flow {
    db: TestDb,
    gw: String,
    sim: String,
    team: String,
    app: String,
    keys: String,
    http: reqwest::Client,
    stop: CancellationToken,
}

impl Flow {
    async fn new() -> Self {
        let sim_listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let sim = format!("http://{}", sim_listener.local_addr().expect("addr"));
        tokio::spawn(threadline_slack_sim::run(
            threadline_slack_sim::Sim::new(3),
            sim_listener,
            std::future::pending(),
        ));
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .expect("client");
        let ctl = |path: &str, body: Value| {
            let (http, url) = (http.clone(), format!("{sim}/_sim/{path}"));
            async move {
                http.post(url)
                    .json(&body)
                    .send()
                    .await
                    .expect("sim")
                    .json::<Value>()
                    .await
                    .expect("json")
            }
        };
        let team = ctl("teams", json!({"name": "Acme"})).await["id"]
            .as_str()
            .expect("team")
            .to_owned();
        let app = ctl("apps", json!({"name": "Threadline"})).await;
        let db = TestDb::new().await;
        let keys = TokenKeys::generate_entry("k1");
        let public = TokenKeys::parse(&keys.clone().into())
            .expect("keys")
            .public_entries();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let gw = format!("http://{}", listener.local_addr().expect("addr"));
        let src = Source::from_pairs([
            ("DATABASE_URL", db.url.clone()),
            ("NATS_URL", nats_url()),
            ("THREADLINE_BUS_PREFIX", unique_prefix()),
            ("SLACK_SIGNING_SECRET", TEST_SECRET.to_owned()),
            ("SLACK_API_URL", format!("{sim}/api/")),
            ("SLACK_AUTHORIZE_URL", format!("{sim}/oauth/v2/authorize")),
            (
                "SLACK_CLIENT_ID",
                app["client_id"].as_str().expect("client id").to_owned(),
            ),
            (
                "SLACK_CLIENT_SECRET",
                app["client_secret"].as_str().expect("secret").to_owned(),
            ),
            (
                "THREADLINE_OAUTH_REDIRECT_URL",
                format!("{gw}/slack/oauth/callback"),
            ),
            // The gateway seals to the public key; the private half stays
            // with this test, standing in for the services that open tokens.
            ("THREADLINE_TOKEN_PUBLIC_KEYS", public),
            ("THREADLINE_RELAY_ENABLED", "false".to_owned()),
        ]);
        let cfg = GatewayConfig::from_source(&src).expect("config");
        let stop = CancellationToken::new();
        tokio::spawn(threadline_gateway::run(cfg, listener, stop.clone()));
        let f = Self {
            db,
            gw,
            sim,
            team,
            app: app["id"].as_str().expect("app id").to_owned(),
            keys,
            http,
            stop,
        };
        eventually("gateway", Duration::from_secs(10), || {
            let (http, url) = (f.http.clone(), format!("{}/healthz", f.gw));
            async move {
                http.get(url)
                    .send()
                    .await
                    .ok()
                    .filter(|r| r.status().is_success())
            }
        })
        .await;
        f
    }

    /// `/slack/install` → (Slack's consent URL, the browser cookie).
    async fn start(&self) -> (String, String) {
        let r = self
            .http
            .get(format!("{}/slack/install", self.gw))
            .send()
            .await
            .expect("install");
        assert_eq!(r.status(), 302);
        let location = r.headers()[LOCATION].to_str().expect("location").to_owned();
        let cookie = r.headers()[SET_COOKIE]
            .to_str()
            .expect("cookie")
            .split(';')
            .next()
            .expect("pair")
            .to_owned();
        assert!(
            location.starts_with(&format!("{}/oauth/v2/authorize?", self.sim)),
            "{location}"
        );
        assert!(
            location.contains(
                "scope=app_mentions%3Aread%2Cchannels%3Ahistory%2Cchannels%3Aread%2Cchat%3Awrite"
            ),
            "least privilege: {location}"
        );
        (location, cookie)
    }

    /// The person approves in the workspace: Slack redirects to the callback.
    async fn approve(&self, consent: &str) -> String {
        self.approve_in(consent, &self.team).await
    }

    /// Approval in workspace (or, for an org admin, enterprise) `who`.
    async fn approve_in(&self, consent: &str, who: &str) -> String {
        let r = self
            .http
            .get(format!("{consent}&team={who}"))
            .send()
            .await
            .expect("consent");
        assert_eq!(r.status(), 303);
        r.headers()[LOCATION].to_str().expect("callback").to_owned()
    }

    async fn callback(&self, url: &str, cookie: &str) -> (u16, String) {
        let r = self
            .http
            .get(url)
            .header(COOKIE, cookie)
            .send()
            .await
            .expect("callback");
        (r.status().as_u16(), r.text().await.expect("page"))
    }

    /// Opens the stored token of installation `id` and asks Slack whose it is.
    async fn auth_test(&self, id: uuid::Uuid, key_id: String, sealed: Vec<u8>) -> Value {
        let cipher = TokenKeys::parse(&self.keys.clone().into()).expect("keys");
        let token = cipher
            .open(
                &Sealed {
                    key_id,
                    bytes: sealed,
                },
                &token_aad(&id, "bot"),
            )
            .expect("the sealed token opens");
        self.http
            .post(format!("{}/api/auth.test", self.sim))
            .bearer_auth(secrecy::ExposeSecret::expose_secret(&token))
            .send()
            .await
            .expect("auth.test")
            .json()
            .await
            .expect("json")
    }

    async fn installations(&self) -> i64 {
        testing::installations::count_installations(&self.db.pool)
            .await
            .expect("count")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_install_stores_the_workspace_with_its_token_sealed() {
    let f = Flow::new().await;
    let (consent, cookie) = f.start().await;
    let callback = f.approve(&consent).await;
    let (status, page) = f.callback(&callback, &cookie).await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("threadline is installed") && page.contains("Acme"));
    let installed = testing::installations::first_installation(&f.db.pool)
        .await
        .expect("installation");
    let (id, team, bot_id, scopes, sealed, key) = (
        installed.id,
        installed.team_id.expect("a workspace install has its team"),
        installed.bot_id,
        installed.scopes,
        installed.bot_token_sealed.expect("a sealed bot token"),
        installed.bot_token_key_id.expect("the sealing key's id"),
    );
    assert_eq!(team, f.team);
    assert!(bot_id.starts_with('B'));
    assert_eq!(
        scopes,
        [
            "app_mentions:read",
            "channels:history",
            "channels:read",
            "chat:write"
        ]
    );
    assert!(!sealed.windows(5).any(|w| w == b"xoxb-"), "stored sealed");
    // The sealed token is the one Slack issued: it works.
    let me = f.auth_test(id, key, sealed).await;
    assert_eq!(me["ok"], true);
    // The same callback again: the state is single use.
    let (status, page) = f.callback(&callback, &cookie).await;
    assert_eq!(status, 400, "{page}");
    // Reinstalling updates in place.
    let (consent, cookie) = f.start().await;
    let callback = f.approve(&consent).await;
    assert_eq!(f.callback(&callback, &cookie).await.0, 200);
    assert_eq!(f.installations().await, 1);
    f.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_expired_missing_and_declined_states_install_nothing() {
    let f = Flow::new().await;
    // Another browser's callback.
    let (consent, _mine) = f.start().await;
    let callback = f.approve(&consent).await;
    let (_, other_cookie) = f.start().await;
    assert_eq!(f.callback(&callback, &other_cookie).await.0, 400);
    assert_eq!(f.callback(&callback, "").await.0, 400, "no cookie");
    // Expired.
    let (consent, cookie) = f.start().await;
    let callback = f.approve(&consent).await;
    testing::oauth_states::expire_oauth_states(&f.db.pool)
        .await
        .expect("expire");
    assert_eq!(f.callback(&callback, &cookie).await.0, 400);
    // Missing state, made-up state, and a person declining at Slack.
    let base = format!("{}/slack/oauth/callback", f.gw);
    assert_eq!(f.callback(&format!("{base}?code=x"), &cookie).await.0, 400);
    assert_eq!(
        f.callback(&format!("{base}?code=x&state=forged"), &cookie)
            .await
            .0,
        400
    );
    let (status, page) = f
        .callback(&format!("{base}?error=access_denied&state=x"), &cookie)
        .await;
    assert_eq!(status, 400);
    assert!(page.contains("access_denied"));
    assert_eq!(f.installations().await, 0);
    f.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_org_wide_install_serves_every_workspace_of_the_enterprise_and_no_other() {
    let f = Flow::new().await;
    let team = |name: &str, enterprise: Option<&str>| {
        let (http, url) = (f.http.clone(), format!("{}/_sim/teams", f.sim));
        let body = json!({"name": name, "enterprise_id": enterprise});
        async move {
            let v: Value = http
                .post(url)
                .json(&body)
                .send()
                .await
                .expect("sim")
                .json()
                .await
                .expect("json");
            v["id"].as_str().expect("team id").to_owned()
        }
    };
    let sales = team("Acme Sales", Some("E0ACME")).await;
    let ops = team("Acme Ops", Some("E0ACME")).await;
    // An org admin approves for the whole enterprise.
    let (consent, cookie) = f.start().await;
    let callback = f.approve_in(&consent, "E0ACME").await;
    let (status, page) = f.callback(&callback, &cookie).await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("E0ACME"), "{page}");
    let installed = testing::installations::first_installation(&f.db.pool)
        .await
        .expect("installation");
    let (id, org_wide, enterprise, team_id, sealed, key) = (
        installed.id,
        installed.is_enterprise_install,
        installed.enterprise_id,
        installed.team_id,
        installed.bot_token_sealed.expect("a sealed bot token"),
        installed.bot_token_key_id.expect("the sealing key's id"),
    );
    assert_eq!(
        (org_wide, enterprise.as_deref(), team_id),
        (true, Some("E0ACME"), None),
        "an org-wide install has no workspace"
    );
    let me = f.auth_test(id, key, sealed).await;
    assert_eq!(
        (&me["ok"], &me["is_enterprise_install"]),
        (&json!(true), &json!(true))
    );

    // Events from either workspace of the enterprise, authorised org-wide as
    // Slack sends them, resolve to the one installation; a workspace
    // outside it (even claiming the enterprise inside the event) does not.
    let org_event = |team: &str, event_id: &str, enterprise: &str| {
        let mut v =
            threadline_testkit::slack::app_mention(&f.app, team, event_id, "C0ORG", "1.000001");
        v["enterprise_id"] = json!(enterprise);
        v["authorizations"] = json!([{"enterprise_id": enterprise, "team_id": null,
            "user_id": "U0BOT", "is_bot": true, "is_enterprise_install": true}]);
        serde_json::to_vec(&v).expect("json")
    };
    let events = format!("{}/slack/events", f.gw);
    for (team, event, enterprise) in [
        (sales.as_str(), "EvSALES", "E0ACME"),
        (ops.as_str(), "EvOPS", "E0ACME"),
        ("T0ELSEWHERE", "EvELSE", "E0OTHER"),
    ] {
        let r = threadline_testkit::slack::deliver(
            &f.http,
            &events,
            TEST_SECRET,
            &org_event(team, event, enterprise),
            None,
        )
        .await
        .expect("deliver");
        assert_eq!(r.status(), 200);
    }
    let receipts = testing::receipts::event_installations(&f.db.pool)
        .await
        .expect("receipts");
    assert_eq!(
        receipts,
        [
            ("EvOPS".to_owned(), Some(id)),
            ("EvSALES".to_owned(), Some(id))
        ]
    );
    let rejected = testing::rejections::rejected_events(&f.db.pool)
        .await
        .expect("rejections");
    assert_eq!(
        rejected,
        [(Some("EvELSE".to_owned()), "unknown_installation".to_owned())]
    );
    f.stop.cancel();
}

/// The Slack app manifest asks for exactly the scopes the install link
/// requests by default (least privilege, and nothing the code then lacks).
#[test]
fn the_app_manifest_requests_exactly_the_default_bot_scopes() {
    let manifest =
        std::fs::read_to_string(threadline_testkit::repo_root().join("deploy/slack/manifest.yaml"))
            .expect("deploy/slack/manifest.yaml");
    // The uncommented list items under oauth_config.scopes.bot.
    let mut in_bot = false;
    let mut listed = Vec::new();
    for line in manifest.lines() {
        let trimmed = line.trim();
        if trimmed == "bot:" {
            in_bot = true;
            continue;
        }
        if in_bot {
            if let Some(scope) = trimmed.strip_prefix("- ") {
                listed.push(scope.to_owned());
            } else if !trimmed.starts_with('#') && !trimmed.is_empty() {
                break;
            }
        }
    }
    let mut default: Vec<String> = threadline_gateway::oauth::DEFAULT_BOT_SCOPES
        .split(',')
        .map(str::to_owned)
        .collect();
    listed.sort();
    default.sort();
    assert!(!listed.is_empty(), "no bot scopes found in the manifest");
    assert_eq!(listed, default);
}

/// The manifest sends interactivity (review clicks) and events to the
/// gateway's own routes.
#[test]
fn the_app_manifest_points_at_the_gateway_routes() {
    let manifest =
        std::fs::read_to_string(threadline_testkit::repo_root().join("deploy/slack/manifest.yaml"))
            .expect("deploy/slack/manifest.yaml");
    let urls: Vec<&str> = manifest
        .lines()
        .filter_map(|l| l.trim().strip_prefix("request_url: "))
        .collect();
    assert_eq!(
        urls,
        [
            "https://threadline.example.com/slack/events",
            "https://threadline.example.com/slack/interactions"
        ]
    );
    assert!(manifest.contains("interactivity:\n") && manifest.contains("is_enabled: true"));
}

/// The opt-in items of a manifest (`# - x`: commented out, DMs are denied
/// by default): the scopes and the events.
fn opt_in(file: &str) -> (String, Vec<String>) {
    let manifest = std::fs::read_to_string(threadline_testkit::repo_root().join(file)).expect(file);
    let optional = manifest
        .lines()
        .filter_map(|l| l.trim().strip_prefix("# - "))
        .map(|item| item.split_whitespace().next().unwrap_or("").to_owned())
        .collect();
    (manifest, optional)
}

/// The agent messaging experience (the default manifest's) and the
/// assistant pane (the manifest for existing apps that keep it): each
/// offers the pane's scopes and exactly the events the code handles for
/// it, as opt-in items.
#[test]
fn the_app_manifests_offer_exactly_each_experiences_scopes_and_events() {
    for (file, events, feature) in [
        (
            "deploy/slack/manifest.yaml",
            threadline_gateway::oauth::AGENT_EVENTS,
            "\n  agent_view:\n    agent_description: ",
        ),
        (
            "deploy/slack/manifest-assistant-view.yaml",
            threadline_gateway::oauth::PANE_EVENTS,
            "\n  assistant_view:\n    assistant_description: ",
        ),
    ] {
        let (manifest, optional) = opt_in(file);
        for scope in threadline_gateway::oauth::PANE_BOT_SCOPES.split(',') {
            assert!(
                optional.iter().any(|o| o == scope),
                "{file}: {scope} in {optional:?}"
            );
        }
        let offered: Vec<&str> = optional
            .iter()
            .map(String::as_str)
            .filter(|o| {
                o.starts_with("message.") || o.starts_with("assistant_") || o.starts_with("app_")
            })
            .collect();
        assert_eq!(offered, events, "{file}");
        assert!(manifest.contains(feature), "{file}");
    }
}
