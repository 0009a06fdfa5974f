//! The publisher against slack-sim, real Postgres and real NATS. Ground
//! truth is the emulator's count of app posts, not threadline's records.

use std::time::Duration;

use async_nats::jetstream;
use prost::Message as _;
use serde_json::{Value, json};
use threadline_proto::v1::ProposalReady;
use threadline_publisher::{Handler, PublisherConfig};
use threadline_runtime::bus::Topology;
use threadline_runtime::config::Source;
use threadline_runtime::worker::Disposition;
use threadline_store::testing::{
    audit, decisions, installations, intents, outbox, receipts, server, threads,
};
use threadline_store::tokens::SealedPair;
use threadline_tenancy::secrets::{Seal as _, TokenKeys, token_aad};
use threadline_testkit::{TestDb, delete_streams, nats_url, unique_prefix};
use uuid::Uuid;

struct Env {
    db: TestDb,
    js: jetstream::Context,
    prefix: String,
    sim: String,
    http: reqwest::Client,
    token: String,
    app: String,
    channel: String,
    inst: Uuid,
    keys: String,
    /// The sim app's client id and secret.
    client: (String, String),
}

impl Env {
    async fn new() -> Self {
        Self::build(false).await
    }

    /// With token rotation: the installation's token is about to expire.
    async fn rotating() -> Self {
        Self::build(true).await
    }

    async fn build(rotation: bool) -> Self {
        let sim = threadline_slack_sim::Sim::new(21);
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let base = format!("http://{}", l.local_addr().expect("addr"));
        tokio::spawn(async move { axum_serve(l, sim).await });
        let ws = threadline_testkit::sim::SimWorkspace::create(
            &base,
            json!({"token_rotation": rotation}),
            &["chat:write", "channels:history"],
            None,
        )
        .await;
        let (http, team, user, channel, app) = (
            ws.http.clone(),
            ws.team.clone(),
            ws.user.clone(),
            ws.channel.clone(),
            ws.app_id(),
        );
        let client = (
            ws.app["client_id"].as_str().expect("client id").to_owned(),
            ws.app["client_secret"]
                .as_str()
                .expect("client secret")
                .to_owned(),
        );
        let inst_sim = ws.install.clone();
        let token = ws.token();
        let db = TestDb::new().await;
        let keys = TokenKeys::generate_entry("k1");
        let cipher = TokenKeys::parse(&keys.clone().into()).expect("keys");
        let inst = Uuid::now_v7();
        let sealed = cipher
            .seal(token.as_bytes(), &token_aad(&inst, "bot"))
            .expect("seal");
        installations::insert_installation(
            &db.pool,
            &installations::NewInstallation {
                id: inst,
                app_id: &app,
                team_id: &team,
                bot_user_id: inst_sim["bot_user_id"].as_str().expect("bot user id"),
                bot_id: inst_sim["bot_id"].as_str().expect("bot id"),
                bot_token_sealed: Some(&sealed.bytes),
                bot_token_key_id: Some(&sealed.key_id),
                status: "active",
            },
        )
        .await
        .expect("installation");
        if let Some(refresh) = inst_sim["refresh_token"].as_str() {
            let sealed = cipher
                .seal(refresh.as_bytes(), &token_aad(&inst, "refresh"))
                .expect("seal");
            installations::set_refresh_token_expiring(
                &db.pool,
                inst,
                SealedPair {
                    bytes: &sealed.bytes,
                    key_id: &sealed.key_id,
                },
                60,
            )
            .await
            .expect("refresh token");
        }
        let js = jetstream::new(async_nats::connect(nats_url()).await.expect("nats"));
        let prefix = unique_prefix();
        Topology::new(prefix.clone())
            .declare(&js)
            .await
            .expect("topology");
        let env = Self {
            db,
            js,
            prefix,
            sim: base,
            http,
            token,
            app,
            channel,
            inst,
            keys,
            client,
        };
        env.user_post(&user).await;
        env
    }

    async fn user_post(&self, user: &str) {
        let root: Value = self
            .http
            .post(format!("{}/_sim/act/post", self.sim))
            .json(&json!({"user": user, "channel": self.channel, "text": "is prod down?"}))
            .send()
            .await
            .expect("post")
            .json()
            .await
            .expect("json");
        threads::insert_thread(
            &self.db.pool,
            self.inst,
            &self.channel,
            root["ts"].as_str().expect("ts"),
            1,
        )
        .await
        .expect("thread");
    }

    async fn root(&self) -> String {
        threads::one_thread_root(&self.db.pool).await.expect("root")
    }

    fn handler(&self, extra: &[(&str, &str)]) -> Handler {
        let api = format!("{}/api/", self.sim);
        let mut src = Source::from_pairs([
            ("DATABASE_URL", self.db.url.as_str()),
            ("THREADLINE_BUS_PREFIX", self.prefix.as_str()),
            ("SLACK_API_URL", api.as_str()),
            ("THREADLINE_TOKEN_KEYS", self.keys.as_str()),
            ("THREADLINE_POST_SPACING_MS", "0"),
            ("THREADLINE_RECONCILE_READS", "2"),
            ("THREADLINE_RECONCILE_WINDOW_MS", "200"),
            ("THREADLINE_SLACK_TIMEOUT_MS", "500"),
        ]);
        for (k, v) in extra {
            src = src.with(*k, *v);
        }
        threadline_publisher::handler(
            PublisherConfig::from_source(&src).expect("config"),
            self.db.pool.clone(),
            self.js.clone(),
        )
        .expect("handler")
    }

    /// A triggering message, its receipt, turn and proposed decision.
    async fn proposal(&self, text: &str) -> (Uuid, Vec<u8>) {
        let root = self.root().await;
        let source_ts = format!("{}1", &root[..root.len() - 1]);
        let (receipt, decision, event_id) = (
            Uuid::now_v7(),
            Uuid::now_v7(),
            format!("Ev{}", &Uuid::now_v7().simple().to_string()[20..]),
        );
        receipts::insert_receipt(
            &self.db.pool,
            &receipts::ReceiptFixture {
                id: receipt,
                installation_id: self.inst,
                api_app_id: &self.app,
                event_id: &event_id,
                event_type: "app_mention",
                channel_id: &self.channel,
                message_ts: Some(&source_ts),
                thread_ts: &root,
                state: "done",
                ..Default::default()
            },
        )
        .await
        .expect("receipt");
        threads::insert_user_message(
            &self.db.pool,
            self.inst,
            &self.channel,
            &source_ts,
            &root,
            "q",
        )
        .await
        .expect("message");
        threads::insert_turn(
            &self.db.pool,
            self.inst,
            &self.channel,
            &source_ts,
            receipt,
            "mention",
        )
        .await
        .expect("turn");
        let body = format!("{text}\n\n_AI-generated — verify before relying on it_");
        decisions::insert_proposed_decision(
            &self.db.pool,
            &decisions::ProposedDecision {
                id: decision,
                receipt_id: receipt,
                installation_id: self.inst,
                event_id: &event_id,
                channel_id: &self.channel,
                root_ts: &root,
                source_ts: &source_ts,
                thread_version: 1,
                body_text: &body,
                output_hash: "hash",
            },
        )
        .await
        .expect("decision");
        let p = ProposalReady {
            schema_version: 1,
            decision_id: decision.to_string(),
            receipt_id: receipt.to_string(),
            installation_id: self.inst.to_string(),
            event_id,
            channel_id: self.channel.clone(),
            root_ts: root,
            source_ts,
            thread_version: 1,
            action_kind: "thread_reply".into(),
            text: body,
            body_hash: "hash".into(),
            ..Default::default()
        };
        (decision, p.encode_to_vec())
    }

    /// Runs the handler as the broker would: again after each requested delay.
    async fn until_done(&self, h: &Handler, payload: &[u8]) -> usize {
        for attempt in 1..=12 {
            match h.handle(payload).await {
                Disposition::Done => return attempt,
                Disposition::Defer(d) => tokio::time::sleep(d.min(Duration::from_secs(3))).await,
                Disposition::Transient => tokio::time::sleep(Duration::from_millis(500)).await,
                Disposition::Fail(why) | Disposition::Retry(why) | Disposition::Poison(why) => {
                    panic!("failed: {why}")
                }
            }
        }
        panic!("not done after 12 deliveries");
    }

    async fn app_posts(&self) -> i64 {
        let v: Value = self
            .http
            .get(format!("{}/_sim/app_posts?app_id={}", self.sim, self.app))
            .send()
            .await
            .expect("get")
            .json()
            .await
            .expect("json");
        v["per_thread"]
            .as_array()
            .map(|a| a.iter().map(|x| x["count"].as_i64().unwrap_or(0)).sum())
            .unwrap_or(0)
    }

    async fn intent(&self) -> (String, bool, Option<String>) {
        let i = intents::one_intent_outcome(&self.db.pool)
            .await
            .expect("intent");
        (i.state, i.reconciled, i.error_code)
    }

    async fn decision(&self, id: Uuid) -> (String, Option<String>) {
        decisions::decision_status(&self.db.pool, id)
            .await
            .expect("decision")
    }

    async fn fault(&self, f: Value) {
        self.http
            .post(format!("{}/_sim/faults", self.sim))
            .json(&f)
            .send()
            .await
            .expect("fault");
    }

    async fn cleanup(self) {
        delete_streams(&self.js, &self.prefix).await;
    }
}

async fn axum_serve(l: tokio::net::TcpListener, sim: threadline_slack_sim::Sim) {
    let _ = threadline_slack_sim::run(sim, l, std::future::pending()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_publishers_on_one_proposal_post_once_into_the_root() {
    let env = Env::new().await;
    let (decision, payload) = env.proposal("It is up.").await;
    let (a, b) = (env.handler(&[]), env.handler(&[]));
    let (ra, rb) = tokio::join!(env.until_done(&a, &payload), env.until_done(&b, &payload));
    assert!(ra >= 1 && rb >= 1);
    assert_eq!(env.app_posts().await, 1, "one reply in Slack");
    assert_eq!(env.intent().await, ("sent".into(), false, None));
    assert_eq!(env.decision(decision).await.0, "published");
    let thread: Value = env
        .http
        .get(format!(
            "{}/_sim/channels/{}/threads/{}",
            env.sim,
            env.channel,
            env.root().await
        ))
        .send()
        .await
        .expect("get")
        .json()
        .await
        .expect("json");
    let reply = &thread["messages"][1];
    assert_eq!(
        reply["thread_ts"],
        env.root().await.as_str(),
        "posted into the thread root"
    );
    assert_eq!(reply["metadata"]["event_type"], "threadline_reply");
    let p = ProposalReady::decode(payload.as_slice()).expect("decode");
    let answered = threads::turn_answered(&env.db.pool, &p.source_ts)
        .await
        .expect("turn");
    assert!(answered);
    env.cleanup().await;
}

/// The publisher checks what the decision row holds again before posting:
/// a body written past the output policy (unescaped model text, as a
/// compromised service with the shared database role could store) is never
/// posted; the decision is cancelled with its reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_body_past_the_output_policy_is_never_posted() {
    let env = Env::new().await;
    let (decision, payload) = env
        .proposal("<!here> pay <https://evil.example|your invoice>")
        .await;
    let h = env.handler(&[]);
    env.until_done(&h, &payload).await;
    assert_eq!(env.app_posts().await, 0, "nothing posted");
    assert_eq!(
        env.decision(decision).await,
        ("cancelled".into(), Some("body_refused".into()))
    );
    // What the policy lets through is posted as usual.
    let (ok, payload) = env.proposal("Pay &lt;nobody&gt; today.").await;
    env.until_done(&h, &payload).await;
    assert_eq!(env.app_posts().await, 1);
    assert_eq!(env.decision(ok).await.0, "published");
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thread_that_moved_on_is_reconsidered_not_answered() {
    let env = Env::new().await;
    let (decision, payload) = env.proposal("Old answer.").await;
    // A human reply lands after inference read version 1.
    threads::set_thread_version(&env.db.pool, env.inst, &env.channel, &env.root().await, 2)
        .await
        .expect("bump");
    let h = env.handler(&[]);
    env.until_done(&h, &payload).await;
    env.until_done(&h, &payload).await;
    assert_eq!(env.app_posts().await, 0, "the old answer is never posted");
    assert_eq!(
        env.decision(decision).await,
        ("stale".into(), Some("thread_changed".into()))
    );
    // The reconsideration is queued in the outbox by the transaction that
    // made the decision stale (the relay publishes it), once.
    let queued: Vec<(String, String)> = outbox::topics_and_msg_ids(&env.db.pool)
        .await
        .expect("outbox");
    let root = env.root().await;
    assert_eq!(
        queued,
        vec![(
            "reconsider".to_owned(),
            format!("recon:{}:{}:{root}:1", env.inst, env.channel)
        )],
        "one coalesced reconsideration"
    );
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_source_cancels_and_a_kill_switch_stops_the_post() {
    let env = Env::new().await;
    let (decision, payload) = env.proposal("Answer.").await;
    let source = ProposalReady::decode(payload.as_slice())
        .expect("decode")
        .source_ts;
    threads::set_message_deleted(&env.db.pool, env.inst, &env.channel, &source, true)
        .await
        .expect("delete");
    let h = env.handler(&[]);
    env.until_done(&h, &payload).await;
    assert_eq!(
        env.decision(decision).await,
        ("cancelled".into(), Some("source_deleted".into()))
    );
    threads::set_message_deleted(&env.db.pool, env.inst, &env.channel, &source, false)
        .await
        .expect("undelete");
    decisions::set_decision_status(&env.db.pool, decision, "proposed")
        .await
        .expect("reset");
    threadline_store::kill_switches::set(
        &env.db.pool,
        "feature",
        "replies",
        true,
        Some("drill"),
        "ops",
    )
    .await
    .expect("engage");
    env.until_done(&h, &payload).await;
    assert_eq!(
        env.decision(decision).await,
        ("suppressed".into(), Some("feature:replies".into()))
    );
    assert_eq!(env.app_posts().await, 0);
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_storm_delays_the_post_and_it_lands_once() {
    let env = Env::new().await;
    let (_, payload) = env.proposal("Later.").await;
    env.fault(
        json!({"method": "chat.postMessage", "mode": "ratelimited", "retry_after": 1, "times": 2}),
    )
    .await;
    let h = env.handler(&[]);
    let deliveries = env.until_done(&h, &payload).await;
    assert!(
        deliveries >= 3,
        "two 429s, then the post ({deliveries} deliveries)"
    );
    assert_eq!(env.app_posts().await, 1);
    assert_eq!(env.intent().await.0, "sent");
    let calls: Value = env
        .http
        .get(format!("{}/_sim/calls?method=chat.postMessage", env.sim))
        .send()
        .await
        .expect("get")
        .json()
        .await
        .expect("json");
    assert_eq!(
        calls["calls"].as_array().map(Vec::len),
        Some(3),
        "no extra posting attempts"
    );
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_response_is_reconciled_into_one_message() {
    let env = Env::new().await;
    let (_, payload) = env.proposal("Landed quietly.").await;
    env.fault(json!({"method": "chat.postMessage", "mode": "lost_response", "latency_ms": 3000}))
        .await;
    let h = env.handler(&[]);
    env.until_done(&h, &payload).await;
    assert_eq!(
        env.intent().await,
        ("sent".into(), true, None),
        "found by its metadata"
    );
    assert_eq!(env.app_posts().await, 1);
    let calls: Value = env
        .http
        .get(format!("{}/_sim/calls?method=chat.postMessage", env.sim))
        .send()
        .await
        .expect("get")
        .json()
        .await
        .expect("json");
    assert_eq!(
        calls["calls"].as_array().map(Vec::len),
        Some(1),
        "never posted again"
    );
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_outcome_with_no_message_is_held_not_reposted() {
    let env = Env::new().await;
    let (_, payload) = env.proposal("Maybe.").await;
    env.fault(json!({"method": "chat.postMessage", "mode": "http_error", "status": 503}))
        .await;
    let h = env.handler(&[]);
    env.until_done(&h, &payload).await;
    assert_eq!(
        env.intent().await,
        ("held".into(), false, Some("no_evidence_of_post".into()))
    );
    assert_eq!(env.app_posts().await, 0, "zero extra posts");
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publisher_killed_after_slack_accepted_is_reconciled_after_restart() {
    let env = Env::new().await;
    let (decision, payload) = env.proposal("Before the crash.").await;
    // The dead worker's state: claimed, posted (Slack has it), never recorded.
    let intent = Uuid::now_v7();
    let p = ProposalReady::decode(payload.as_slice()).expect("decode");
    intents::insert_sending_intent(
        &env.db.pool,
        &intents::IntentFixture {
            id: intent,
            installation_id: env.inst,
            event_id: &p.event_id,
            action_kind: "thread_reply",
            receipt_id: Uuid::parse_str(&p.receipt_id).expect("id"),
            decision_id: decision,
            channel_id: &env.channel,
            root_ts: &p.root_ts,
            body_hash: "hash",
        },
        1,
        300.0,
    )
    .await
    .expect("intent");
    let metadata = json!({"event_type": "threadline_reply", "event_payload": {"intent_id": intent.to_string()}}).to_string();
    let r: Value = env
        .http
        .post(format!("{}/api/chat.postMessage", env.sim))
        .bearer_auth(&env.token)
        .form(&[
            ("channel", env.channel.as_str()),
            ("thread_ts", p.root_ts.as_str()),
            ("text", p.text.as_str()),
            ("metadata", metadata.as_str()),
        ])
        .send()
        .await
        .expect("post")
        .json()
        .await
        .expect("json");
    assert_eq!(r["ok"], true);
    let h = env.handler(&[]);
    env.until_done(&h, &payload).await;
    assert_eq!(env.intent().await, ("sent".into(), true, None));
    assert_eq!(env.app_posts().await, 1, "still one message");
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reviewed_proposal_posts_only_once_approved() {
    let env = Env::new().await;
    let (decision, payload) = env.proposal("Pinging everyone.").await;
    decisions::send_decision_to_review(&env.db.pool, decision, &["mass_mention".to_owned()])
        .await
        .expect("review");
    let mut p = ProposalReady::decode(payload.as_slice()).expect("decode");
    p.needs_review = true;
    p.review_reasons = vec!["mass_mention".into()];
    let payload = p.encode_to_vec();
    let h = env.handler(&[]);
    env.until_done(&h, &payload).await;
    assert_eq!(env.app_posts().await, 0, "waiting for a reviewer");
    decisions::approve_decision(&env.db.pool, decision, "ana")
        .await
        .expect("approve");
    env.until_done(&h, &payload).await;
    assert_eq!(env.app_posts().await, 1);
    assert_eq!(env.decision(decision).await.0, "published");
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_unprocessed_event_in_the_thread_makes_the_publisher_wait_not_give_up() {
    let env = Env::new().await;
    let (decision, payload) = env.proposal("Wait for it.").await;
    // Something newer in the thread, accepted but not yet processed.
    let pending = Uuid::now_v7();
    receipts::insert_receipt(
        &env.db.pool,
        &receipts::ReceiptFixture {
            id: pending,
            installation_id: env.inst,
            api_app_id: &env.app,
            event_id: "EvLATER",
            event_type: "message",
            channel_id: &env.channel,
            message_ts: None,
            thread_ts: &env.root().await,
            state: "accepted",
            received_in: 1.0,
            ..Default::default()
        },
    )
    .await
    .expect("receipt");
    let h = env.handler(&[]);
    assert!(
        matches!(h.handle(&payload).await, Disposition::Defer(_)),
        "not stale: wait, without spending a delivery"
    );
    assert_eq!(env.app_posts().await, 0);
    // It turns out to change nothing (an unchanged edit): the answer goes out.
    receipts::set_receipt_state(
        &env.db.pool,
        pending,
        "ignored",
        Some("edit_without_text_change"),
    )
    .await
    .expect("processed");
    env.until_done(&h, &payload).await;
    assert_eq!(env.app_posts().await, 1);
    assert_eq!(env.decision(decision).await.0, "published");
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_outcome_is_still_reconciled_after_a_kill_switch_is_engaged() {
    let env = Env::new().await;
    let (decision, payload) = env.proposal("Landed before the switch.").await;
    env.fault(json!({"method": "chat.postMessage", "mode": "lost_response", "latency_ms": 3000}))
        .await;
    let h = env.handler(&[]);
    assert!(
        matches!(h.handle(&payload).await, Disposition::Defer(_)),
        "outcome unknown"
    );
    threadline_store::kill_switches::set(&env.db.pool, "global", "", true, Some("incident"), "ops")
        .await
        .expect("engage");
    env.until_done(&h, &payload).await;
    // Reading is not posting: the landed reply is recorded, nothing more is posted.
    assert_eq!(env.intent().await, ("sent".into(), true, None));
    assert_eq!(env.decision(decision).await.0, "published");
    assert_eq!(env.app_posts().await, 1);
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_about_to_expire_is_refreshed_before_posting() {
    let env = Env::rotating().await;
    let (_, payload) = env.proposal("Fresh token.").await;
    let before: Vec<u8> = threadline_store::tokens::read(&env.db.pool, env.inst)
        .await
        .expect("token")
        .expect("installation")
        .bot_sealed
        .expect("bot token");
    let h = env.handler(&[
        ("SLACK_CLIENT_ID", &env.client.0),
        ("SLACK_CLIENT_SECRET", &env.client.1),
    ]);
    env.until_done(&h, &payload).await;
    assert_eq!(env.app_posts().await, 1);
    let stored = threadline_store::tokens::read(&env.db.pool, env.inst)
        .await
        .expect("token")
        .expect("installation");
    let (after, hours): (Vec<u8>, f64) = (
        stored.bot_sealed.expect("bot token"),
        stored.expires_in.expect("expiry") / 3600.0,
    );
    assert_ne!(before, after, "a new token was stored");
    assert!(hours > 11.0, "valid for another {hours} hours");
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_refresh_disables_the_installation_instead_of_looping() {
    let env = Env::rotating().await;
    let (decision, payload) = env.proposal("Never sent.").await;
    // Slack no longer knows the refresh token threadline holds (revoked).
    let cipher = env.cipher();
    let gone = cipher
        .seal(b"xoxe-1-revoked", &token_aad(&env.inst, "refresh"))
        .expect("seal");
    installations::set_refresh_token(&env.db.pool, env.inst, &gone.bytes, &gone.key_id)
        .await
        .expect("revoked refresh token");
    let h = env.handler(&[
        ("SLACK_CLIENT_ID", &env.client.0),
        ("SLACK_CLIENT_SECRET", &env.client.1),
    ]);
    env.until_done(&h, &payload).await;
    assert_eq!(env.app_posts().await, 0);
    assert_eq!(
        env.installation_state().await,
        (
            "disabled".into(),
            Some("token_refresh_failed".into()),
            false
        )
    );
    assert_eq!(
        env.decision(decision).await,
        ("cancelled".into(), Some("installation_unavailable".into()))
    );
    env.cleanup().await;
}

/// A wrong client secret is threadline's configuration, not the
/// installation's fault: nothing is disabled, the work waits for the fix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_client_credentials_disable_no_installation() {
    use secrecy::ExposeSecret as _;
    let env = Env::rotating().await;
    let wrong = threadline_tenancy::tokens::Refresher {
        client_secret: "wrong-secret".to_owned().into(),
        ..env.refresher()
    };
    env.expire(5).await;
    let err = env
        .bot_token(&wrong)
        .await
        .expect_err("an expired token and no refresh: an error");
    assert!(
        err.downcast_ref::<threadline_tenancy::tokens::RefreshUnavailable>()
            .is_some(),
        "transient, got {err:#}"
    );
    assert_eq!(
        env.refresh_calls().await,
        vec![("bad_client_secret".to_owned(), "not_applied".to_owned())]
    );
    assert_eq!(
        env.installation_state().await,
        ("active".into(), None, true)
    );
    // Fixed, the same installation refreshes.
    let t = env
        .bot_token(&env.refresher())
        .await
        .expect("refresh")
        .expect("token");
    assert!(env.slack_accepts(t.expose_secret()).await);
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_posts_of_one_intent_in_slack_are_an_incident_held_never_a_third() {
    let env = Env::new().await;
    let (_, payload) = env.proposal("Exactly once.").await;
    env.fault(json!({"method": "chat.postMessage", "mode": "lost_response", "latency_ms": 3000}))
        .await;
    let h = env.handler(&[]);
    // The post lands, its response is lost: the outcome is unknown.
    assert!(!matches!(h.handle(&payload).await, Disposition::Done));
    assert_eq!(env.intent().await.0, "unknown");
    // Something else (a broken replica, a replayed request) posts the same
    // intent again: Slack now shows two replies carrying its metadata.
    let root = env.root().await;
    let thread: Value = env
        .http
        .get(format!(
            "{}/_sim/channels/{}/threads/{root}",
            env.sim, env.channel
        ))
        .send()
        .await
        .expect("thread")
        .json()
        .await
        .expect("json");
    let ours = thread["messages"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["app_id"].is_string()).cloned())
        .expect("the landed reply");
    let again: Value = env
        .http
        .post(format!("{}/api/chat.postMessage", env.sim))
        .bearer_auth(&env.token)
        .form(&[
            ("channel", env.channel.as_str()),
            ("thread_ts", root.as_str()),
            ("text", ours["text"].as_str().expect("text")),
            ("metadata", &ours["metadata"].to_string()),
        ])
        .send()
        .await
        .expect("second post")
        .json()
        .await
        .expect("json");
    assert_eq!(again["ok"], true, "{again}");
    assert_eq!(env.app_posts().await, 2);
    // Reconciliation sees both: the incident is held for an operator and
    // nothing more is posted.
    env.until_done(&h, &payload).await;
    assert_eq!(
        env.intent().await,
        ("held".into(), false, Some("duplicate_posts_found".into()))
    );
    assert_eq!(env.app_posts().await, 2, "never a third");
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sources_own_message_twin_still_in_flight_is_not_waited_for() {
    let env = Env::new().await;
    let (decision, payload) = env.proposal("Right away.").await;
    let source: String = receipts::one_message_ts_of_type(&env.db.pool, "app_mention")
        .await
        .expect("source")
        .expect("message ts");
    // The `message` event of the same mention, not yet processed: the same
    // message being created, no change to the thread.
    receipts::insert_receipt(
        &env.db.pool,
        &receipts::ReceiptFixture {
            id: Uuid::now_v7(),
            installation_id: env.inst,
            api_app_id: &env.app,
            event_id: "EvTWIN",
            event_type: "message",
            channel_id: &env.channel,
            message_ts: Some(&source),
            thread_ts: &env.root().await,
            state: "accepted",
            ..Default::default()
        },
    )
    .await
    .expect("twin");
    let h = env.handler(&[]);
    assert!(matches!(h.handle(&payload).await, Disposition::Done));
    assert_eq!(env.app_posts().await, 1);
    assert_eq!(env.decision(decision).await.0, "published");
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_decision_for_an_event_already_answered_is_settled_not_left_proposed() {
    let env = Env::new().await;
    let (first, payload) = env.proposal("The answer.").await;
    let h = env.handler(&[]);
    env.until_done(&h, &payload).await;
    assert_eq!(env.decision(first).await.0, "published");
    // A reconsideration raced the post and made another decision for the
    // same event (at a later version).
    let mut p = ProposalReady::decode(payload.as_slice()).expect("decode");
    let second = Uuid::now_v7();
    decisions::copy_decision_at_version(&env.db.pool, second, first, 2)
        .await
        .expect("second decision");
    p.decision_id = second.to_string();
    p.thread_version = 2;
    assert!(matches!(
        h.handle(&p.encode_to_vec()).await,
        Disposition::Done
    ));
    assert_eq!(
        env.decision(second).await,
        ("superseded".into(), Some("already_answered".into()))
    );
    assert_eq!(env.app_posts().await, 1, "answered once");
    env.cleanup().await;
}

/// An installation whose granted scopes lack chat:write gets no post: the
/// decision is cancelled with the missing scope as its reason, and Slack is
/// never asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_chat_write_the_answer_is_refused_with_its_reason_and_never_posted() {
    let env = Env::new().await;
    installations::set_scopes(
        &env.db.pool,
        env.inst,
        &["app_mentions:read", "channels:history"],
    )
    .await
    .expect("scopes");
    let (decision, payload) = env.proposal("Here is the answer.").await;
    let h = env.handler(&[]);
    env.until_done(&h, &payload).await;
    assert_eq!(
        env.decision(decision).await,
        ("cancelled".into(), Some("missing_scope:chat:write".into()))
    );
    assert_eq!(env.app_posts().await, 0, "Slack was not asked to post");
    let reason: Option<String> =
        audit::decision_outcome_reason(&env.db.pool, decision, "cancelled")
            .await
            .expect("audit")
            .flatten();
    assert_eq!(
        reason.as_deref(),
        Some("missing_scope:chat:write"),
        "audited"
    );
    env.cleanup().await;
}

/// A context-builder backlog must not disable the guard: an event of the
/// thread accepted long ago and still unprocessed holds the answer back,
/// however old it is (the guard used to give up after ten minutes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_of_the_thread_unprocessed_for_eleven_minutes_still_holds_the_answer() {
    let env = Env::new().await;
    let (decision, payload) = env.proposal("Hold on.").await;
    let backlog = Uuid::now_v7();
    receipts::insert_receipt(
        &env.db.pool,
        &receipts::ReceiptFixture {
            id: backlog,
            installation_id: env.inst,
            api_app_id: &env.app,
            event_id: "EvBACKLOG",
            event_type: "message",
            channel_id: &env.channel,
            message_ts: None,
            thread_ts: &env.root().await,
            state: "accepted",
            event_time_in: -660.0,
            received_in: -660.0,
            updated_in: -660.0,
        },
    )
    .await
    .expect("receipt");
    let h = env.handler(&[]);
    match h.handle(&payload).await {
        Disposition::Defer(d) => assert!(
            d <= Duration::from_secs(11),
            "waits {d:?}, then looks again"
        ),
        other => panic!("must wait for the backlog, got {other:?}"),
    }
    assert_eq!(
        env.app_posts().await,
        0,
        "nothing posted past an unprocessed event"
    );
    receipts::set_receipt_state(&env.db.pool, backlog, "done", None)
        .await
        .expect("processed");
    env.until_done(&h, &payload).await;
    assert_eq!(env.app_posts().await, 1);
    assert_eq!(env.decision(decision).await.0, "published");
    env.cleanup().await;
}

/// One reply per source event whatever the action kind: an approved tool
/// action for an event already answered is settled, never posted (it used
/// to be stopped only by the version check).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_action_for_an_event_already_answered_is_never_posted() {
    let env = Env::new().await;
    let (first, payload) = env.proposal("The answer.").await;
    let h = env.handler(&[]);
    env.until_done(&h, &payload).await;
    assert_eq!(env.decision(first).await.0, "published");
    let tool = Uuid::now_v7();
    decisions::insert_decision_for_event_of(
        &env.db.pool,
        &decisions::DecisionForEvent {
            id: tool,
            of: first,
            receipt_id: Uuid::now_v7(),
            thread_version: 1,
            status: "approved",
            action_kind: "tool:restart_service",
            review_reasons: &["action_beyond_reply".to_owned()],
            reviewed_by: Some("ana"),
            body_text: "Restarting it.",
            output_hash: "h2",
        },
    )
    .await
    .expect("tool decision");
    // (the same thread version: only "already answered" can stop it)
    let mut p = ProposalReady::decode(payload.as_slice()).expect("decode");
    p.decision_id = tool.to_string();
    p.action_kind = "tool:restart_service".into();
    assert!(matches!(
        h.handle(&p.encode_to_vec()).await,
        Disposition::Done
    ));
    assert_eq!(
        env.decision(tool).await,
        ("superseded".into(), Some("already_answered".into()))
    );
    assert_eq!(env.app_posts().await, 1, "one reply for the event");
    env.cleanup().await;
}

/// A feature switch governs the actions of its feature: `tools` stops an
/// approved tool action inside the claim, `replies` does not stop it, and
/// an unknown feature would govern nothing (the CLI refuses to engage one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tools_switch_stops_a_tool_action_at_the_claim() {
    // The `replies` switch governs thread replies, not actions: a tool
    // action goes out under it (a second environment), and stops under
    // `tools`.
    let other = Env::new().await;
    let (tool, tool_payload) = other.proposal("Restarting the cache.").await;
    decisions::approve_decision_as_action(
        &other.db.pool,
        tool,
        "tool:restart_cache",
        &["action_beyond_reply".to_owned()],
        "ana",
    )
    .await
    .expect("tool decision");
    threadline_store::kill_switches::set(
        &other.db.pool,
        "feature",
        "replies",
        true,
        Some("x"),
        "ops",
    )
    .await
    .expect("engage");
    let h = other.handler(&[]);
    other.until_done(&h, &tool_payload).await;
    assert_eq!(other.decision(tool).await.0, "published");
    assert_eq!(other.app_posts().await, 1);
    other.cleanup().await;

    let env = Env::new().await;
    let (decision, payload) = env.proposal("Restarting the service.").await;
    decisions::approve_decision_as_action(
        &env.db.pool,
        decision,
        "tool:restart_service",
        &["action_beyond_reply".to_owned()],
        "ana",
    )
    .await
    .expect("tool decision");
    threadline_store::kill_switches::set(
        &env.db.pool,
        "feature",
        "tools",
        true,
        Some("incident"),
        "ops",
    )
    .await
    .expect("engage");
    let h = env.handler(&[]);
    env.until_done(&h, &payload).await;
    assert_eq!(
        env.decision(decision).await,
        ("suppressed".into(), Some("feature:tools".into()))
    );
    assert_eq!(env.app_posts().await, 0);
    let claim = threadline_publisher::intents::check_and_claim(
        &env.db.pool,
        &threadline_publisher::intents::Proposal {
            installation: env.inst,
            receipt: Uuid::now_v7(),
            decision,
            event_id: "EvOTHER",
            action_kind: "tool:restart_service",
            channel: &env.channel,
            root_ts: &env.root().await,
            source_ts: "1.000001",
            version: 1,
            body_hash: "h",
            channel_ref: None,
        },
        300.0,
        0.0,
    )
    .await
    .expect("claim");
    assert_eq!(
        claim,
        threadline_publisher::intents::Verdict::Suppressed("feature:tools".into()),
        "seen inside the claim's own transaction"
    );
    env.cleanup().await;
}

/// A post that Slack refused with 429 on every attempt is given up with
/// its reason on the decision (said to the operator), never left proposed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_post_refused_with_429_on_every_attempt_is_given_up_with_its_reason() {
    let env = Env::new().await;
    let (decision, payload) = env.proposal("Too busy.").await;
    env.fault(
        json!({"method": "chat.postMessage", "mode": "ratelimited", "retry_after": 1, "times": 0}),
    )
    .await;
    let h = env.handler(&[("THREADLINE_POST_MAX_ATTEMPTS", "2")]);
    env.until_done(&h, &payload).await;
    assert_eq!(
        env.decision(decision).await,
        ("cancelled".into(), Some("rate_limited_too_often".into()))
    );
    assert_eq!(
        env.intent().await,
        (
            "failed_permanent".into(),
            false,
            Some("rate_limited_too_often".into())
        )
    );
    assert_eq!(env.app_posts().await, 0);
    env.cleanup().await;
}

/// A 429 pauses the channel it came from, not the workspace: another
/// channel of the same installation posts at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_in_one_channel_leaves_the_other_channels_of_the_workspace_posting() {
    let env = Env::new().await;
    let (_, payload) = env.proposal("Busy channel.").await;
    env.fault(
        json!({"method": "chat.postMessage", "mode": "ratelimited", "retry_after": 60, "times": 1}),
    )
    .await;
    let h = env.handler(&[]);
    match h.handle(&payload).await {
        Disposition::Defer(d) => assert!(
            d >= Duration::from_secs(60),
            "waits out Retry-After, got {d:?}"
        ),
        other => panic!("expected a deferral, got {other:?}"),
    }
    let paused: Vec<String> = intents::channels_paused_beyond(&env.db.pool, 30.0)
        .await
        .expect("budgets");
    assert_eq!(paused, vec![env.channel.clone()], "only that channel waits");
    // The workspace's other channel is not held back.
    let wait = threadline_publisher::intents::reserve_slot(&env.db.pool, env.inst, "C0OTHER", 1.0)
        .await
        .expect("slot");
    assert_eq!(wait, None);
    env.cleanup().await;
}

/// A proposal whose answer read the thread's root and the question, and a
/// person's reply after both that it did not read: an answer the reply
/// crossed once it is posted.
struct Crossed {
    decision: Uuid,
    p: ProposalReady,
    root: String,
    /// The person's reply: one second after the newest message the answer
    /// read.
    crossing: String,
    /// A ts `secs` whole seconds after the newest message the answer read
    /// (whole seconds: a ts's last digits say nothing of its order with the
    /// root's).
    later: Box<dyn Fn(u64) -> String>,
}

impl Env {
    async fn crossed_answer(&self) -> Crossed {
        let (decision, payload) = self.proposal("The answer.").await;
        let p = ProposalReady::decode(payload.as_slice()).expect("decode");
        let root = self.root().await;
        decisions::set_decision_context(
            &self.db.pool,
            decision,
            &[root.clone(), p.source_ts.clone()],
        )
        .await
        .expect("context");
        let newest = root.as_str().max(p.source_ts.as_str()).to_owned();
        let later = move |secs: u64| {
            let (whole, micros) = newest.split_once('.').expect("a Slack ts");
            format!("{}.{micros}", whole.parse::<u64>().expect("seconds") + secs)
        };
        let crossing = later(1);
        let inserted = threads::insert_user_message(
            &self.db.pool,
            self.inst,
            &self.channel,
            &crossing,
            &root,
            "wait",
        )
        .await
        .expect("message");
        assert!(inserted, "message: a new ts");
        Crossed {
            decision,
            p,
            root,
            crossing,
            later: Box::new(later),
        }
    }
}

/// A post Slack accepted is recorded whatever became of its intent: from
/// `held` it is `sent` (late, its decision published, its turn answered);
/// a second post of an intent already sent is kept as an incident; and a
/// human message of the thread the answer did not read is recorded as
/// crossing it in flight, with its reconsideration queued in the outbox by
/// the same transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_post_is_recorded_whatever_became_of_its_intent_and_a_crossing_is_seen() {
    use threadline_publisher::intents::{PostRecord, record_post};
    let env = Env::new().await;
    let Crossed {
        decision,
        p,
        root,
        crossing,
        later,
    } = env.crossed_answer().await;
    let intent = Uuid::now_v7();
    intents::insert_held_intent(
        &env.db.pool,
        &intents::IntentFixture {
            id: intent,
            installation_id: env.inst,
            event_id: &p.event_id,
            action_kind: "thread_reply",
            receipt_id: Uuid::parse_str(&p.receipt_id).expect("receipt"),
            decision_id: decision,
            channel_id: &env.channel,
            root_ts: &root,
            body_hash: "hash",
        },
        "no_evidence_of_post",
    )
    .await
    .expect("held intent");
    let reply_ts = later(2);
    let r = record_post(&env.db.pool, intent, decision, &reply_ts, false)
        .await
        .expect("recorded");
    assert_eq!(r.outcome, PostRecord::Late);
    assert_eq!(r.crossed, vec![crossing.clone()]);
    let intents::IntentLateRecord {
        state,
        reconciled,
        late,
    } = intents::intent_late_record(&env.db.pool, intent)
        .await
        .expect("intent");
    assert_eq!((state.as_str(), reconciled, late), ("sent", true, true));
    assert_eq!(env.decision(decision).await.0, "published");
    let answered = threads::turn_answered(&env.db.pool, &p.source_ts)
        .await
        .expect("turn");
    assert!(answered);
    let queued: Vec<String> = outbox::msg_ids_of_topic(&env.db.pool, "reconsider")
        .await
        .expect("outbox");
    assert_eq!(queued, [format!("recon:crossed:{intent}:{crossing}")]);
    // The same record again changes nothing; another ts is an incident.
    assert_eq!(
        record_post(&env.db.pool, intent, decision, &reply_ts, false)
            .await
            .expect("again")
            .outcome,
        PostRecord::Already
    );
    let second = later(3);
    assert_eq!(
        record_post(&env.db.pool, intent, decision, &second, false)
            .await
            .expect("duplicate")
            .outcome,
        PostRecord::Duplicate
    );
    let (slack_ts, extra): (Option<String>, Vec<String>) =
        intents::intent_posts(&env.db.pool, intent)
            .await
            .expect("intent");
    assert_eq!((slack_ts, extra), (Some(reply_ts), vec![second]));
    env.cleanup().await;
}

/// Many records in one transaction (the handlers' group commit) come out
/// as the same records one after another would: an intent named twice in
/// a batch is recorded once and then seen as recorded (`Already` with its
/// ts, a `Duplicate` incident with another), a missing intent is
/// `Missing`, and a crossing message is recorded, with its
/// reconsideration, for every answer it crossed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_post_records_reads_as_the_same_records_one_by_one() {
    use threadline_publisher::intents::{PostRecord, PostToRecord, record_posts};
    let env = Env::new().await;
    let Crossed {
        decision,
        p,
        root,
        crossing,
        later,
    } = env.crossed_answer().await;
    // A held intent and one in flight, both posts of the same answer.
    let (held, sending) = (Uuid::now_v7(), Uuid::now_v7());
    let fixture = |id: Uuid, event_id: &'static str| intents::IntentFixture {
        id,
        installation_id: env.inst,
        event_id,
        action_kind: "thread_reply",
        receipt_id: Uuid::parse_str(&p.receipt_id).expect("receipt"),
        decision_id: decision,
        channel_id: &env.channel,
        root_ts: &root,
        body_hash: "hash",
    };
    intents::insert_held_intent(
        &env.db.pool,
        &fixture(held, "EvHELD"),
        "no_evidence_of_post",
    )
    .await
    .expect("held intent");
    intents::insert_sending_intent(&env.db.pool, &fixture(sending, "EvSENDING"), 1, 1.0)
        .await
        .expect("sending intent");
    let (first, other, second) = (later(2), later(3), later(4));
    let post = |intent: Uuid, ts: &str| PostToRecord {
        intent,
        decision,
        ts: ts.to_owned(),
        reconciled: false,
    };
    let batch = [
        post(held, &first),
        post(sending, &other),
        post(Uuid::now_v7(), &first),
        post(held, &first),
        post(held, &second),
    ];
    let recorded = record_posts(&env.db.pool, &batch).await.expect("recorded");
    let outcomes: Vec<PostRecord> = recorded.iter().map(|r| r.outcome).collect();
    assert_eq!(
        outcomes,
        [
            PostRecord::Late,
            PostRecord::Sent,
            PostRecord::Missing,
            PostRecord::Already,
            PostRecord::Duplicate
        ]
    );
    // The crossing is news once per answer it crossed, not per record.
    let crossed: Vec<&[String]> = recorded.iter().map(|r| r.crossed.as_slice()).collect();
    let one = [crossing.clone()];
    assert_eq!(crossed, [&one[..], &one[..], &[], &[], &[]]);
    let mut queued = outbox::msg_ids_of_topic(&env.db.pool, "reconsider")
        .await
        .expect("outbox");
    queued.sort();
    let mut expected = vec![
        format!("recon:crossed:{held}:{crossing}"),
        format!("recon:crossed:{sending}:{crossing}"),
    ];
    expected.sort();
    assert_eq!(queued, expected);
    let late = intents::intent_late_record(&env.db.pool, held)
        .await
        .expect("held");
    assert_eq!(
        (late.state.as_str(), late.reconciled, late.late),
        ("sent", true, true)
    );
    let on_time = intents::intent_late_record(&env.db.pool, sending)
        .await
        .expect("sending");
    assert_eq!(
        (on_time.state.as_str(), on_time.reconciled, on_time.late),
        ("sent", false, false)
    );
    assert_eq!(
        intents::intent_posts(&env.db.pool, held)
            .await
            .expect("held"),
        (Some(first), vec![second])
    );
    assert_eq!(
        intents::intent_posts(&env.db.pool, sending)
            .await
            .expect("sending"),
        (Some(other), vec![])
    );
    assert_eq!(env.decision(decision).await.0, "published");
    assert!(
        threads::turn_answered(&env.db.pool, &p.source_ts)
            .await
            .expect("turn")
    );
    env.cleanup().await;
}

/// Without metadata (Slack dropped it), evidence is the approved body's
/// hash inside the intent's window — never a message already recorded as
/// another intent's post, nor one created before the intent's first try.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evidence_without_metadata_is_the_body_hash_in_the_window_never_another_intents_post() {
    use sha2::Digest as _;
    use threadline_publisher::reconcile::{Owned, Thread, read};
    let env = Env::new().await;
    let root = env.root().await;
    let web =
        threadline_slack::WebClient::new(&format!("{}/api/", env.sim), Duration::from_secs(5))
            .expect("client");
    let text = "The fallback answer.";
    let post = |t: &'static str| {
        let (http, sim, token, channel, root) = (
            env.http.clone(),
            env.sim.clone(),
            env.token.clone(),
            env.channel.clone(),
            root.clone(),
        );
        async move {
            let v: Value = http
                .post(format!("{sim}/api/chat.postMessage"))
                .bearer_auth(token)
                .form(&[
                    ("channel", channel.as_str()),
                    ("thread_ts", root.as_str()),
                    ("text", t),
                ])
                .send()
                .await
                .expect("post")
                .json()
                .await
                .expect("json");
            v["ts"].as_str().expect("posted").to_owned()
        }
    };
    let earlier = post(text).await;
    // The earlier post belongs to another intent of the thread.
    intents::insert_sent_intent(
        &env.db.pool,
        &intents::IntentFixture {
            id: Uuid::now_v7(),
            installation_id: env.inst,
            event_id: "EvEARLIER",
            action_kind: "thread_reply",
            receipt_id: Uuid::now_v7(),
            decision_id: Uuid::now_v7(),
            channel_id: &env.channel,
            root_ts: &root,
            body_hash: "h",
        },
        &earlier,
    )
    .await
    .expect("the other intent");
    let hash = hex::encode(sha2::Sha256::digest(text.as_bytes()));
    let bot_id = threadline_store::tokens::read(&env.db.pool, env.inst)
        .await
        .expect("bot")
        .expect("installation")
        .bot_id;
    // An intent whose post's outcome is unknown, its first try `ago`
    // seconds ago (negative: in the future).
    let subject = |event: &'static str, ago: f64| {
        let (pool, inst, channel, root, hash, bot_id) = (
            env.db.pool.clone(),
            env.inst,
            env.channel.clone(),
            root.clone(),
            hash.clone(),
            bot_id.clone(),
        );
        async move {
            let intent = Uuid::now_v7();
            intents::insert_intent(
                &pool,
                &intents::IntentFixture {
                    id: intent,
                    installation_id: inst,
                    event_id: event,
                    action_kind: "thread_reply",
                    receipt_id: Uuid::now_v7(),
                    decision_id: Uuid::now_v7(),
                    channel_id: &channel,
                    root_ts: &root,
                    body_hash: &hash,
                },
                "unknown",
                &intents::Standing {
                    attempts: 1,
                    sending_secs_ago: Some(ago),
                    ever_unknown: true,
                    ..Default::default()
                },
            )
            .await
            .expect("the intent");
            let thread = Thread {
                installation: inst,
                channel: &channel,
                root_ts: &root,
            };
            Owned::load(&pool, intent, thread, &bot_id, 30.0, true)
                .await
                .expect("evidence")
        }
    };
    let seen = read(&web, &env.token, &subject("EvA", 1.0).await)
        .await
        .expect("read");
    assert_eq!(
        seen.read.post(),
        None,
        "another intent's post is no evidence"
    );
    let ours = post(text).await;
    let seen = read(&web, &env.token, &subject("EvB", 1.0).await)
        .await
        .expect("read");
    assert_eq!(seen.read.post(), Some(ours.as_str()));
    let seen = read(&web, &env.token, &subject("EvC", -30.0).await)
        .await
        .expect("read");
    assert_eq!(
        seen.read.post(),
        None,
        "nothing from before the intent's first try"
    );
    env.cleanup().await;
}

/// The re-check right before the HTTP call: a thread changed after the
/// claim stops the post (stale), a claim older than a post may start is
/// expired (given back unposted), a claim another attempt took over is
/// lost, and an event of the thread accepted after the claim makes it wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_recheck_before_the_post_stops_what_changed_after_the_claim() {
    use threadline_publisher::intents::{Fence, Verdict, check_and_claim, fence, release};
    let env = Env::new().await;
    let (decision, payload) = env.proposal("Checked twice.").await;
    let p = ProposalReady::decode(payload.as_slice()).expect("decode");
    let root = env.root().await;
    let proposal = threadline_publisher::intents::Proposal {
        installation: env.inst,
        receipt: Uuid::parse_str(&p.receipt_id).expect("receipt"),
        decision,
        event_id: &p.event_id,
        action_kind: "thread_reply",
        channel: &env.channel,
        root_ts: &root,
        source_ts: &p.source_ts,
        version: 1,
        body_hash: "hash",
        channel_ref: None,
    };
    let Verdict::Claimed(claim) = check_and_claim(&env.db.pool, &proposal, 300.0, 0.0)
        .await
        .expect("claim")
    else {
        panic!("claimed")
    };
    assert_eq!(
        fence(&env.db.pool, &proposal, &claim, 60.0)
            .await
            .expect("fence"),
        Fence::Go
    );
    // An event of the thread accepted after the claim: wait for it.
    let later = Uuid::now_v7();
    receipts::insert_receipt(
        &env.db.pool,
        &receipts::ReceiptFixture {
            id: later,
            installation_id: env.inst,
            api_app_id: &env.app,
            event_id: "EvAFTER",
            event_type: "message",
            channel_id: &env.channel,
            message_ts: None,
            thread_ts: &root,
            state: "accepted",
            ..Default::default()
        },
    )
    .await
    .expect("receipt");
    assert!(matches!(
        fence(&env.db.pool, &proposal, &claim, 60.0)
            .await
            .expect("fence"),
        Fence::Waiting(_)
    ));
    // It changed the thread.
    receipts::set_receipt_state(&env.db.pool, later, "done", None)
        .await
        .expect("processed");
    threads::set_thread_version(&env.db.pool, env.inst, &env.channel, &root, 2)
        .await
        .expect("bump");
    assert_eq!(
        fence(&env.db.pool, &proposal, &claim, 60.0)
            .await
            .expect("fence"),
        Fence::Stale
    );
    threads::set_thread_version(&env.db.pool, env.inst, &env.channel, &root, 1)
        .await
        .expect("back");
    // The worker stalled between the claim and the post.
    intents::set_sending_since(&env.db.pool, claim.id, 120.0)
        .await
        .expect("old claim");
    assert_eq!(
        fence(&env.db.pool, &proposal, &claim, 60.0)
            .await
            .expect("fence"),
        Fence::Expired
    );
    assert!(
        release(&env.db.pool, &claim, "claim_expired_unposted", 0.0)
            .await
            .expect("release")
    );
    assert_eq!(env.intent().await.0, "pending");
    // Claimed again by another attempt: the first one's claim is lost.
    let Verdict::Claimed(again) = check_and_claim(&env.db.pool, &proposal, 300.0, 0.0)
        .await
        .expect("claim")
    else {
        panic!("claimed again")
    };
    assert_eq!(again.attempt, claim.attempt + 1);
    assert_eq!(
        fence(&env.db.pool, &proposal, &claim, 60.0)
            .await
            .expect("fence"),
        Fence::Lost
    );
    assert!(
        !release(&env.db.pool, &claim, "late", 0.0)
            .await
            .expect("release"),
        "an old attempt cannot give back a newer claim"
    );
    assert_eq!(env.app_posts().await, 0);
    env.cleanup().await;
}

/// The checks and the claim are one statement, and the channel's post
/// slot is taken in it before the intent is written: a claim that loses the
/// race to create the intent (another publisher's insert, not yet committed
/// when the statement began) must give the slot back, or the channel would
/// wait a spacing for a post that never happened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_that_loses_the_race_for_a_new_intent_gives_its_post_slot_back() {
    use threadline_publisher::intents::{Verdict, reserve_slot};
    let env = Env::new().await;
    let (decision, payload) = env.proposal("Raced.").await;
    let p = ProposalReady::decode(payload.as_slice()).expect("decode");
    let root = env.root().await;
    let receipt = Uuid::parse_str(&p.receipt_id).expect("receipt");
    // Another publisher creates the intent and has not committed yet.
    let mut other = env.db.pool.begin().await.expect("begin");
    intents::insert_pending_intent(
        &mut other,
        &intents::IntentFixture {
            id: Uuid::now_v7(),
            installation_id: env.inst,
            event_id: &p.event_id,
            action_kind: "thread_reply",
            receipt_id: receipt,
            decision_id: decision,
            channel_id: &env.channel,
            root_ts: &root,
            body_hash: "other",
        },
    )
    .await
    .expect("the other publisher's intent");
    let claiming = spawn_claim(&env, &p, decision, &root, 60.0);
    wait_for_a_lock_wait(&env).await;
    other.commit().await.expect("commit");
    let verdict = claiming.await.expect("join").expect("claim");
    assert!(
        matches!(verdict, Verdict::NotNow(_)),
        "the intent is the other publisher's: {verdict:?}"
    );
    let states: Vec<(String, i32)> = intents::intent_states_by_event(&env.db.pool, &p.event_id)
        .await
        .expect("intents");
    assert_eq!(states, vec![("pending".to_owned(), 0)], "nothing claimed");
    assert_eq!(
        reserve_slot(&env.db.pool, env.inst, &env.channel, 1.0)
            .await
            .expect("slot"),
        None,
        "the slot the lost claim took is free again"
    );
    assert_eq!(env.app_posts().await, 0);
    env.cleanup().await;
}

/// Runs the publisher's checks and claim of `p` (thread version 1) on a
/// task of its own.
fn spawn_claim(
    env: &Env,
    p: &ProposalReady,
    decision: Uuid,
    root: &str,
    spacing: f64,
) -> tokio::task::JoinHandle<sqlx::Result<threadline_publisher::intents::Verdict>> {
    let (pool, inst, channel, root, event_id, source_ts) = (
        env.db.pool.clone(),
        env.inst,
        env.channel.clone(),
        root.to_owned(),
        p.event_id.clone(),
        p.source_ts.clone(),
    );
    let receipt = Uuid::parse_str(&p.receipt_id).expect("receipt");
    tokio::spawn(async move {
        let proposal = threadline_publisher::intents::Proposal {
            installation: inst,
            receipt,
            decision,
            event_id: &event_id,
            action_kind: "thread_reply",
            channel: &channel,
            root_ts: &root,
            source_ts: &source_ts,
            version: 1,
            body_hash: "hash",
            channel_ref: None,
        };
        threadline_publisher::intents::check_and_claim(&pool, &proposal, 300.0, spacing).await
    })
}

/// Returns once some session of the test's database waits for a lock.
async fn wait_for_a_lock_wait(env: &Env) {
    for _ in 0..500 {
        let blocked: i64 = server::sessions_waiting_for_a_lock(&env.db.pool)
            .await
            .expect("activity");
        if blocked > 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("nothing waited for the lock");
}

/// The checks read one snapshot, taken before the statement waits for the
/// thread row: a content change that commits while the claim waits for it
/// is seen through the locked row's newer version, and the proposal is
/// stale, never claimed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thread_change_committed_while_the_claim_waits_for_the_thread_row_makes_it_stale() {
    use threadline_publisher::intents::Verdict;
    let env = Env::new().await;
    let (decision, payload) = env.proposal("Waited.").await;
    let p = ProposalReady::decode(payload.as_slice()).expect("decode");
    let root = env.root().await;
    // The context-builder records a new message and bumps the version.
    let mut change = env.db.pool.begin().await.expect("begin");
    threads::bump_thread_version(&mut change, env.inst, &env.channel, &root)
        .await
        .expect("bump");
    let claiming = spawn_claim(&env, &p, decision, &root, 0.0);
    wait_for_a_lock_wait(&env).await;
    change.commit().await.expect("commit");
    let verdict = claiming.await.expect("join").expect("claim");
    assert_eq!(verdict, Verdict::Stale);
    let intents: i64 = intents::count_intents_by_event(&env.db.pool, &p.event_id)
        .await
        .expect("intents");
    assert_eq!(intents, 0, "nothing claimed");
    assert_eq!(env.app_posts().await, 0);
    env.cleanup().await;
}

/// A withdrawn intent (released, or paused by a 429) is claimed again only
/// once it is due, and the claim says how long that is (not a short retry
/// that would spin until then), while the channel's slot stays free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_withdrawn_intent_not_yet_due_waits_until_it_is() {
    use threadline_publisher::intents::{Verdict, reserve_slot};
    let env = Env::new().await;
    let (decision, payload) = env.proposal("Later.").await;
    let p = ProposalReady::decode(payload.as_slice()).expect("decode");
    let root = env.root().await;
    intents::insert_withdrawn_intent(
        &env.db.pool,
        &intents::IntentFixture {
            id: Uuid::now_v7(),
            installation_id: env.inst,
            event_id: &p.event_id,
            action_kind: "thread_reply",
            receipt_id: Uuid::parse_str(&p.receipt_id).expect("receipt"),
            decision_id: decision,
            channel_id: &env.channel,
            root_ts: &root,
            body_hash: "hash",
        },
        1,
        30.0,
    )
    .await
    .expect("withdrawn intent");
    let verdict = spawn_claim(&env, &p, decision, &root, 1.0)
        .await
        .expect("join")
        .expect("claim");
    match verdict {
        Verdict::NotNow(w) => assert!((20.0..=30.0).contains(&w), "waits until due: {w}"),
        other => panic!("not claimable yet: {other:?}"),
    }
    assert_eq!(
        reserve_slot(&env.db.pool, env.inst, &env.channel, 1.0)
            .await
            .expect("slot"),
        None,
        "no slot spent on it"
    );
    env.cleanup().await;
}

/// A re-post first reads the thread: an earlier attempt's post found there
/// is recorded, credited to the decision whose text Slack holds, and the
/// decision that asked for the re-post is settled as already answered —
/// nothing is posted again, and nothing is left `proposed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repost_finds_the_earlier_post_credits_its_decision_and_settles_the_new_one() {
    use sha2::Digest as _;
    let env = Env::new().await;
    let (first, payload) = env.proposal("The first answer.").await;
    let p = ProposalReady::decode(payload.as_slice()).expect("decode");
    let root = env.root().await;
    let text: String = threadline_store::decisions::load(&env.db.pool, first)
        .await
        .expect("text")
        .expect("decision")
        .body_text
        .expect("body");
    let hash = hex::encode(sha2::Sha256::digest(text.as_bytes()));
    decisions::set_decision_output_hash(&env.db.pool, first, &hash)
        .await
        .expect("hash");
    // An earlier attempt of the intent did reach Slack (its answer was lost).
    let intent = Uuid::now_v7();
    intents::insert_pending_intent_once_unknown(
        &env.db.pool,
        &intents::IntentFixture {
            id: intent,
            installation_id: env.inst,
            event_id: &p.event_id,
            action_kind: "thread_reply",
            receipt_id: Uuid::parse_str(&p.receipt_id).expect("receipt"),
            decision_id: first,
            channel_id: &env.channel,
            root_ts: &root,
            body_hash: &hash,
        },
        1,
    )
    .await
    .expect("intent");
    let metadata = json!({"event_type": "threadline_reply", "event_payload": {"intent_id": intent.to_string()}}).to_string();
    let posted: Value = env
        .http
        .post(format!("{}/api/chat.postMessage", env.sim))
        .bearer_auth(&env.token)
        .form(&[
            ("channel", env.channel.as_str()),
            ("thread_ts", root.as_str()),
            ("text", text.as_str()),
            ("metadata", metadata.as_str()),
        ])
        .send()
        .await
        .expect("post")
        .json()
        .await
        .expect("json");
    let earlier = posted["ts"].as_str().expect("posted").to_owned();
    // A reconsideration made another decision for the event, at the same
    // version, and its proposal comes for the re-post.
    let second = Uuid::now_v7();
    decisions::insert_decision_for_event_of(
        &env.db.pool,
        &decisions::DecisionForEvent {
            id: second,
            of: first,
            receipt_id: Uuid::now_v7(),
            thread_version: 1,
            status: "proposed",
            action_kind: "thread_reply",
            review_reasons: &[],
            reviewed_by: None,
            body_text: "The second answer.",
            output_hash: "h2",
        },
    )
    .await
    .expect("second decision");
    let mut p2 = p.clone();
    p2.decision_id = second.to_string();
    let h = env.handler(&[]);
    env.until_done(&h, &p2.encode_to_vec()).await;
    assert_eq!(env.intent().await, ("sent".into(), true, None));
    let slack_ts: Option<String> = intents::one_intent_slack_ts(&env.db.pool)
        .await
        .expect("ts");
    assert_eq!(slack_ts.as_deref(), Some(earlier.as_str()));
    assert_eq!(
        env.decision(first).await.0,
        "published",
        "the text Slack holds"
    );
    assert_eq!(
        env.decision(second).await,
        ("superseded".into(), Some("already_answered".into()))
    );
    assert_eq!(env.app_posts().await, 1, "nothing posted again");
    env.cleanup().await;
}

/// An intent whose outcome is unknown cannot be reconciled once its
/// installation has lost its token (uninstalled, revoked): it is held with
/// the reason, never left for the sweeper to hand around for ever; and an
/// intent waiting to be retried whose decision was discarded meanwhile is
/// withdrawn, not driven again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn intents_nothing_can_finish_are_held_or_withdrawn() {
    let env = Env::new().await;
    let (decision, payload) = env.proposal("Lost for words.").await;
    let p = ProposalReady::decode(payload.as_slice()).expect("decode");
    let intent = Uuid::now_v7();
    intents::insert_unknown_intent(
        &env.db.pool,
        &intents::IntentFixture {
            id: intent,
            installation_id: env.inst,
            event_id: &p.event_id,
            action_kind: "thread_reply",
            receipt_id: Uuid::parse_str(&p.receipt_id).expect("receipt"),
            decision_id: decision,
            channel_id: &env.channel,
            root_ts: &env.root().await,
            body_hash: "hash",
        },
        1,
    )
    .await
    .expect("intent");
    installations::disable_without_bot_token(&env.db.pool, env.inst)
        .await
        .expect("uninstalled");
    let h = env.handler(&[]);
    env.until_done(&h, &payload).await;
    assert_eq!(
        env.intent().await,
        (
            "held".into(),
            false,
            Some("installation_unavailable".into())
        )
    );

    let env = Env::new().await;
    let (decision, payload) = env.proposal("Try again later.").await;
    env.fault(json!({"method": "chat.postMessage", "mode": "ratelimited", "retry_after": 1}))
        .await;
    let h = env.handler(&[]);
    assert!(matches!(h.handle(&payload).await, Disposition::Defer(_)));
    assert_eq!(env.intent().await.0, "failed_retryable");
    // The thread moved on while the post waited out its Retry-After.
    decisions::set_decision_status_and_reason(
        &env.db.pool,
        decision,
        "stale",
        Some("thread_changed"),
    )
    .await
    .expect("stale");
    env.until_done(&h, &payload).await;
    assert_eq!(env.intent().await.0, "withdrawn");
    assert_eq!(env.app_posts().await, 0);
    env.cleanup().await;
}

// ---- token refresh, judged from Slack's side ----

impl Env {
    fn refresher(&self) -> threadline_tenancy::tokens::Refresher {
        threadline_tenancy::tokens::Refresher {
            web: threadline_slack::WebClient::new(
                &format!("{}/api/", self.sim),
                Duration::from_secs(10),
            )
            .expect("client"),
            client_id: self.client.0.clone(),
            client_secret: self.client.1.clone().into(),
        }
    }

    /// The installation's bot token as a service would get it, refreshing
    /// with `refresher` when it is due.
    async fn bot_token(
        &self,
        refresher: &threadline_tenancy::tokens::Refresher,
    ) -> anyhow::Result<Option<secrecy::SecretString>> {
        threadline_tenancy::tokens::bot_token(
            &self.db.pool,
            &self.cipher(),
            Some(refresher),
            self.inst,
        )
        .await
    }

    fn cipher(&self) -> TokenKeys {
        TokenKeys::parse(&self.keys.clone().into()).expect("keys")
    }

    /// The installation's token expired `secs` ago (negative: expires in).
    async fn expire(&self, secs: i64) {
        installations::expire_bot_token(&self.db.pool, self.inst, secs)
            .await
            .expect("expire");
    }

    /// Slack's record of the refresh exchanges it received: (outcome, effect).
    async fn refresh_calls(&self) -> Vec<(String, String)> {
        let v: Value = self
            .http
            .get(format!("{}/_sim/calls?method=oauth.v2.access", self.sim))
            .send()
            .await
            .expect("calls")
            .json()
            .await
            .expect("json");
        v["calls"]
            .as_array()
            .expect("calls")
            .iter()
            .map(|c| {
                (
                    c["outcome"].as_str().unwrap_or_default().to_owned(),
                    c["effect"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect()
    }

    /// Whether Slack accepts `token` (`auth.test`).
    async fn slack_accepts(&self, token: &str) -> bool {
        let v: Value = self
            .http
            .post(format!("{}/api/auth.test", self.sim))
            .bearer_auth(token)
            .send()
            .await
            .expect("auth.test")
            .json()
            .await
            .expect("json");
        v["ok"] == json!(true)
    }

    async fn installation_state(&self) -> (String, Option<String>, bool) {
        let s = installations::installation_state(&self.db.pool, self.inst)
            .await
            .expect("installation");
        (s.status, s.disabled_reason, s.has_tokens)
    }
}

/// Eight handlers in two processes (two pools) need the token of one
/// rotating installation at once, its token already expired and Slack slow
/// to answer the refresh: Slack sees one refresh, every handler gets the
/// token it granted, and the installation stays active.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_refreshes_across_replicas_make_one_exchange_and_share_its_token() {
    use secrecy::ExposeSecret as _;
    let env = Env::rotating().await;
    env.expire(5).await;
    env.fault(
        json!({"method": "oauth.v2.access", "mode": "latency", "latency_ms": 800, "times": 10}),
    )
    .await;
    let other_pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(3)
        .connect(&env.db.url)
        .await
        .expect("second replica's pool");
    let (refresher, cipher) = (
        std::sync::Arc::new(env.refresher()),
        std::sync::Arc::new(env.cipher()),
    );
    let mut tasks = Vec::new();
    for i in 0..8 {
        let pool = if i % 2 == 0 {
            env.db.pool.clone()
        } else {
            other_pool.clone()
        };
        let (refresher, cipher, inst) = (refresher.clone(), cipher.clone(), env.inst);
        tasks.push(tokio::spawn(async move {
            threadline_tenancy::tokens::bot_token(&pool, &cipher, Some(&refresher), inst)
                .await
                .map(|t| t.map(|t| t.expose_secret().to_owned()))
        }));
    }
    let mut tokens = std::collections::BTreeSet::new();
    for t in tasks {
        let token = t.await.expect("task").expect("a token, not an error");
        tokens.insert(token.expect("the installation still has a token"));
    }
    assert_eq!(
        env.refresh_calls().await,
        vec![("ok".to_owned(), "applied".to_owned())],
        "Slack saw exactly one refresh"
    );
    assert_eq!(tokens.len(), 1, "every handler got the one granted token");
    let token = tokens.into_iter().next().expect("token");
    assert_ne!(token, env.token, "a new token, not the expired one");
    assert!(
        env.slack_accepts(&token).await,
        "Slack accepts the shared token"
    );
    assert_eq!(
        env.installation_state().await,
        ("active".into(), None, true)
    );
    // The next need for the token (its new expiry far off) asks Slack nothing.
    let again = env
        .bot_token(&refresher)
        .await
        .expect("token")
        .expect("some");
    assert_eq!(again.expose_secret(), token);
    assert_eq!(env.refresh_calls().await.len(), 1);
    env.cleanup().await;
}

/// Every answer to a refresh that is not a definite refusal keeps the
/// installation and its tokens: the caller gets the current token while it
/// is still valid and a transient error once it has expired, and a refresh
/// that Slack did not apply succeeds on the next try.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transient_refresh_answers_keep_the_installation_and_are_retried() {
    use secrecy::ExposeSecret as _;
    let env = Env::rotating().await;
    let refresher = env.refresher();
    let bot_token = || env.bot_token(&refresher);
    for fault in [
        json!({"mode": "ratelimited", "retry_after": 1}),
        json!({"mode": "http_error", "status": 503}),
        json!({"mode": "malformed"}),
    ] {
        let mode = fault["mode"].as_str().expect("mode").to_owned();
        let mut f = fault.clone();
        f["method"] = json!("oauth.v2.access");
        f["times"] = json!(2);
        env.fault(f).await;
        // Still valid for a minute: the current token serves.
        env.expire(-60).await;
        let before = env.refresh_calls().await.len();
        let t = bot_token()
            .await
            .unwrap_or_else(|e| panic!("{mode}: {e:#}"))
            .unwrap_or_else(|| panic!("{mode}: the installation lost its token"));
        assert_eq!(
            env.refresh_calls().await.len(),
            before + 1,
            "{mode}: one exchange"
        );
        assert!(
            env.slack_accepts(t.expose_secret()).await,
            "{mode}: the current token"
        );
        // Expired: the same answer is a transient error, never a disabling.
        env.expire(5).await;
        let err = bot_token()
            .await
            .err()
            .unwrap_or_else(|| panic!("{mode}: an expired token whose refresh failed is an error"));
        assert!(
            err.downcast_ref::<threadline_tenancy::tokens::RefreshUnavailable>()
                .is_some(),
            "{mode}: transient, got {err:#}"
        );
        assert_eq!(
            env.installation_state().await,
            ("active".into(), None, true),
            "{mode}: kept"
        );
        // Slack did not apply it: the next try refreshes.
        let t = bot_token()
            .await
            .unwrap_or_else(|e| panic!("{mode}: retry: {e:#}"))
            .expect("token");
        assert!(
            env.slack_accepts(t.expose_secret()).await,
            "{mode}: the refreshed token works"
        );
        assert_eq!(
            env.refresh_calls().await.len(),
            before + 3,
            "{mode}: three exchanges in all"
        );
    }
    env.cleanup().await;
    // `internal_error` and `fatal_error` may come after Slack applied the
    // exchange (it did, in the emulator): not a reason to disable. The
    // refresh token was spent, though, so the next exchange is refused: the
    // installation is then disabled as a lost refresh (reinstall), not as a
    // revocation.
    for mode in ["internal_error", "fatal_error"] {
        let env = Env::rotating().await;
        let refresher = env.refresher();
        env.fault(json!({"method": "oauth.v2.access", "mode": mode}))
            .await;
        env.expire(5).await;
        let err = env
            .bot_token(&refresher)
            .await
            .err()
            .unwrap_or_else(|| panic!("{mode}: an error"));
        assert!(
            err.downcast_ref::<threadline_tenancy::tokens::RefreshUnavailable>()
                .is_some(),
            "{mode}: transient, got {err:#}"
        );
        assert_eq!(
            env.refresh_calls().await,
            vec![(mode.to_owned(), "applied".to_owned())]
        );
        assert_eq!(
            env.installation_state().await,
            ("active".into(), None, true),
            "{mode}: kept"
        );
        let after = env
            .bot_token(&refresher)
            .await
            .unwrap_or_else(|e| panic!("{mode}: {e:#}"));
        assert!(
            after.is_none(),
            "{mode}: the spent refresh token cannot be used"
        );
        assert_eq!(
            env.installation_state().await,
            ("disabled".into(), Some("token_refresh_lost".into()), false),
            "{mode}"
        );
        env.cleanup().await;
    }
}

/// A refusal disables only the installation that still holds the refused
/// refresh token: a refresh token stored meanwhile stands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_of_a_refresh_token_already_replaced_does_not_disable() {
    use secrecy::ExposeSecret as _;
    let env = Env::rotating().await;
    let refresher = env.refresher();
    env.expire(5).await;
    // Another replica is slow to store what it got: meanwhile Slack refuses
    // the old refresh token to us. Modelled by Slack refusing once while the
    // row is switched to new tokens by "the other replica".
    let good = env
        .bot_token(&refresher)
        .await
        .expect("refresh")
        .expect("token");
    let row = threadline_store::tokens::read(&env.db.pool, env.inst)
        .await
        .expect("row")
        .expect("installation");
    let stored: (Vec<u8>, String, Vec<u8>, String) = (
        row.bot_sealed.expect("bot token"),
        row.bot_key_id.expect("bot key id"),
        row.refresh_sealed.expect("refresh token"),
        row.refresh_key_id.expect("refresh key id"),
    );
    // Put back a spent refresh token, as seen by a replica that read the
    // row before the refresh: Slack refuses it (invalid_refresh_token).
    let spent = env
        .cipher()
        .seal(b"xoxe-1-spent", &token_aad(&env.inst, "refresh"))
        .expect("seal");
    installations::set_refresh_token_expiring(
        &env.db.pool,
        env.inst,
        SealedPair {
            bytes: &spent.bytes,
            key_id: &spent.key_id,
        },
        -5,
    )
    .await
    .expect("spent");
    // The other replica stores its tokens while the refusal is in flight.
    env.fault(json!({"method": "oauth.v2.access", "mode": "latency", "latency_ms": 3000}))
        .await;
    let (pool, inst) = (env.db.pool.clone(), env.inst);
    let restore = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        installations::set_tokens(
            &pool,
            inst,
            SealedPair {
                bytes: &stored.0,
                key_id: &stored.1,
            },
            SealedPair {
                bytes: &stored.2,
                key_id: &stored.3,
            },
            12 * 3600,
        )
        .await
        .expect("restore");
    });
    let t = env
        .bot_token(&refresher)
        .await
        .expect("no error")
        .expect("the stored tokens stand");
    restore.await.expect("restore");
    assert_eq!(
        env.refresh_calls().await.last().map(|c| c.0.clone()),
        Some("invalid_refresh_token".to_owned()),
        "Slack refused the spent token"
    );
    assert_eq!(t.expose_secret(), good.expose_secret());
    assert_eq!(
        env.installation_state().await,
        ("active".into(), None, true)
    );
    env.cleanup().await;
}

/// The refresh lease lives in the row: a holder whose database connections
/// are cut while it waits for Slack keeps it, and another replica waits for
/// its result instead of exchanging the same refresh token again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refresh_keeps_its_lease_when_the_database_connections_drop() {
    use secrecy::ExposeSecret as _;
    let env = Env::rotating().await;
    env.expire(5).await;
    env.fault(
        json!({"method": "oauth.v2.access", "mode": "latency", "latency_ms": 3000, "times": 1}),
    )
    .await;
    let (refresher, cipher) = (
        std::sync::Arc::new(env.refresher()),
        std::sync::Arc::new(env.cipher()),
    );
    let holder = {
        let (pool, refresher, cipher, inst) = (
            env.db.pool.clone(),
            refresher.clone(),
            cipher.clone(),
            env.inst,
        );
        tokio::spawn(async move {
            threadline_tenancy::tokens::bot_token(&pool, &cipher, Some(&refresher), inst)
                .await
                .map(|t| t.map(|t| t.expose_secret().to_owned()))
        })
    };
    // The exchange is in flight (the lease taken) …
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let leased: bool = installations::refresh_leased(&env.db.pool, env.inst)
            .await
            .expect("lease");
        if leased {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no lease taken");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // … when every connection to the database is cut (a failover).
    let admin = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&env.db.url)
        .await
        .expect("admin");
    server::terminate_other_sessions(&admin)
        .await
        .expect("terminate");
    // Another replica needs the token now.
    let other = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect(&env.db.url)
        .await
        .expect("second replica's pool");
    let second = threadline_tenancy::tokens::bot_token(&other, &cipher, Some(&refresher), env.inst)
        .await
        .expect("the holder's result, not an error")
        .expect("a token");
    let first = holder
        .await
        .expect("task")
        .expect("the holder stored its tokens")
        .expect("a token");
    assert_eq!(
        second.expose_secret(),
        first,
        "both use the one granted token"
    );
    assert_eq!(
        env.refresh_calls().await,
        vec![("ok".to_owned(), "applied".to_owned())],
        "Slack saw one exchange"
    );
    assert_eq!(
        env.installation_state().await,
        ("active".into(), None, true)
    );
    assert!(env.slack_accepts(&first).await);
    env.cleanup().await;
}
