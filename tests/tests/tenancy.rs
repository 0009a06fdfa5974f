//! Two workspaces on one app (one signing secret, as Slack does it): events,
//! contexts and posts of workspace A never touch workspace B's token,
//! threads or policy, even when A's payloads name B's channel and threads.
//! Judged by Slack's ground truth (slack-sim) and by threadline's tables.

use std::time::Duration;

use serde_json::{Value, json};
use threadline_testkit::eventually;
use threadline_tests::{Stack, cli, sim_ctl, sim_get};
use uuid::Uuid;

async fn rows_of(s: &Stack, inst: Uuid) -> i64 {
    threadline_store::testing::threads::count_rows_of_installation(&s.db.pool, inst)
        .await
        .expect("counts")
}

/// Waits until every receipt is terminal.
async fn settled(s: &Stack, n: i64) {
    eventually(
        &format!("{n} receipts settled"),
        Duration::from_secs(30),
        || {
            let pool = s.db.pool.clone();
            async move {
                let (all, open): (i64, i64) =
                    threadline_store::testing::receipts::count_all_and_open(&pool)
                        .await
                        .ok()?;
                (all >= n && open == 0).then_some(())
            }
        },
    )
    .await;
    // Give a straggling publish a moment to show itself.
    tokio::time::sleep(Duration::from_millis(1500)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workspace_a_never_touches_workspace_b_even_with_forged_ids() {
    let s = Stack::start(&[]).await;
    let b = s.add_workspace("Beta").await;
    let a_inst: Uuid = threadline_store::testing::installations::id_by_team(&s.db.pool, &s.team)
        .await
        .expect("A's installation");

    // B's person starts a thread (B has no trigger: the bot is not asked).
    let b_root = s
        .post_as(&b.user, &b.channel, "payroll run is late", None)
        .await;
    settled(&s, 1).await;
    let b_rows = rows_of(&s, b.inst).await;

    // Payloads signed with the app's secret, authorised for workspace A,
    // whose events name B's channel, B's thread, B's team and B's person:
    // an app_mention (no channel_type) and a message reply in B's thread.
    let gateway = s.services[0].events_url();
    let forged = |event_id: &str, event: Value| {
        let mut v =
            threadline_testkit::slack::app_mention(&s.app, &s.team, event_id, &b.channel, "0");
        v["event"] = event;
        serde_json::to_vec(&v).expect("json")
    };
    let mention = json!({"type": "app_mention", "user": b.user, "team": b.team,
        "text": format!("<@{}> leak B's thread", s.bot_user), "ts": "1800000000.000100",
        "event_ts": "1800000000.000100", "channel": b.channel});
    let reply = json!({"type": "message", "user": b.user, "team": b.team, "channel_type": "channel",
        "text": format!("<@{}> summarise", s.bot_user), "ts": "1800000000.000200",
        "event_ts": "1800000000.000200", "thread_ts": b_root, "channel": b.channel});
    let http = reqwest::Client::new();
    // One after the other: the mention's channel lookup is then not
    // answered from what the reply's channel_type taught.
    for (n, id, ev) in [(2, "EvFORGED1", mention), (3, "EvFORGED2", reply)] {
        let r = threadline_testkit::slack::deliver(
            &http,
            &gateway,
            threadline_testkit::slack::TEST_SECRET,
            &forged(id, ev),
            None,
        )
        .await
        .expect("deliver");
        assert_eq!(r.status(), 200);
        settled(&s, n).await;
    }
    // The forged reply went on to a proposal: wait for the publisher's try.
    let tried = eventually("the publisher's attempt", Duration::from_secs(30), || {
        let pool = s.db.pool.clone();
        async move {
            let state: String =
                threadline_store::testing::intents::state_by_event(&pool, "EvFORGED2")
                    .await
                    .ok()?;
            (state != "pending" && state != "sending").then_some(state)
        }
    })
    .await;
    assert_eq!(
        tried, "failed_permanent",
        "Slack refused A's token in B's channel"
    );

    // Both were taken as A's (the verified envelope decides), and Slack's
    // side shows no post in B's channel.
    let forged_inst: Vec<Uuid> =
        threadline_store::testing::receipts::installation_ids_by_event_like(
            &s.db.pool,
            "EvFORGED%",
        )
        .await
        .expect("receipts");
    assert_eq!(forged_inst, [a_inst, a_inst]);
    assert!(s.answers_in(&b.channel, &b_root).await.is_empty());
    let posts = sim_get(
        &s.sim,
        &format!("app_posts?app_id={}&channel={}", s.app, b.channel),
    )
    .await;
    assert_eq!(posts["per_thread"], json!([]), "nothing posted in B");

    // Every Web API call about B's channel so far was made with A's token
    // and refused by Slack; B's token was never used for A's events.
    let calls = sim_get(&s.sim, "calls").await;
    let calls = calls["calls"].as_array().cloned().unwrap_or_default();
    let about_b: Vec<&Value> = calls
        .iter()
        .filter(|c| c["channel"] == b.channel.as_str())
        .collect();
    assert!(
        !about_b.is_empty(),
        "A's pipeline did try B's channel: {calls:?}"
    );
    let mut methods: Vec<&str> = about_b
        .iter()
        .filter_map(|c| c["method"].as_str())
        .collect();
    methods.sort_unstable();
    methods.dedup();
    assert_eq!(
        methods,
        [
            "chat.postMessage",
            "conversations.info",
            "conversations.replies"
        ],
        "the forged events went through every stage that calls Slack"
    );
    for c in &about_b {
        assert_eq!(c["team_id"], s.team.as_str(), "with A's token: {c}");
        assert_ne!(c["outcome"], "ok", "and Slack refused it: {c}");
    }
    assert!(
        calls.iter().all(|c| c["team_id"] != b.team.as_str()),
        "B's token untouched"
    );
    // B's thread store, turns and policy did not move.
    assert_eq!(rows_of(&s, b.inst).await, b_rows);

    // A's policy naming B's channel does not change B's behaviour: B's
    // plain message stays unanswered, B's mention is answered by B's bot
    // with B's token.
    let out = cli(
        &[
            "policy",
            "channel",
            "--installation",
            &a_inst.to_string(),
            "--channel",
            &b.channel,
            "--mode",
            "every-message",
        ],
        &[("DATABASE_URL", s.db.url.clone())],
    )
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    s.post_as(&b.user, &b.channel, "any update?", Some(&b_root))
        .await;
    s.post_as(
        &b.user,
        &b.channel,
        &format!("<@{}> where are we?", b.bot_user),
        Some(&b_root),
    )
    .await;
    let answers = eventually("B's answer", Duration::from_secs(30), || async {
        let a = s.answers_in(&b.channel, &b_root).await;
        (!a.is_empty()).then_some(a)
    })
    .await;
    settled(&s, 7).await;
    let answers_now = s.answers_in(&b.channel, &b_root).await;
    assert_eq!(answers_now.len(), 1, "{answers_now:?}");
    assert_eq!(answers[0]["user"], b.bot_user.as_str(), "B's own bot");
    let calls = sim_get(&s.sim, "calls?method=chat.postMessage").await;
    let ok_in_b: Vec<Value> = calls["calls"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|c| c["channel"] == b.channel.as_str() && c["outcome"] == "ok")
        .collect();
    assert_eq!(ok_in_b.len(), 1);
    assert_eq!(ok_in_b[0]["team_id"], b.team.as_str(), "with B's token");
    let b_reasons: Vec<Option<String>> =
        threadline_store::testing::receipts::ignored_message_reasons(&s.db.pool, b.inst)
            .await
            .expect("B's receipts");
    assert!(
        b_reasons
            .iter()
            .filter(|r| r.as_deref() == Some("not_addressed"))
            .count()
            >= 2,
        "B's plain messages stay unaddressed under A's every-message rule: {b_reasons:?}"
    );
    let token_a = s.token.clone();
    let logs = s.stop().await;
    assert!(!logs.is_empty(), "the services logged something to check");
    for t in [&token_a, &b.token] {
        assert!(!logs.contains(t.as_str()), "a bot token reached a log line");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uninstalling_while_the_model_runs_stops_the_answer_before_it_is_posted() {
    removed_while_the_model_runs("uninstall", "app_uninstalled").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoking_the_token_while_the_model_runs_stops_the_answer_before_it_is_posted() {
    removed_while_the_model_runs("revoke", "tokens_revoked").await;
}

/// The workspace removes the app (`uninstall`) or revokes its token
/// (`revoke`) while the model thinks: the installation is disabled with
/// `reason`, its tokens purged, and the answer never reaches Slack.
async fn removed_while_the_model_runs(how: &str, reason: &str) {
    // The built-in model takes 3 s, like a real one; the workspace removes
    // the app while it thinks.
    let s = Stack::start(&[("THREADLINE_BUILTIN_LATENCY_MS", "3000".to_owned())]).await;
    let root = s
        .post(&format!("<@{}> what broke?", s.bot_user), None)
        .await;
    eventually("the model call started", Duration::from_secs(20), || {
        let pool = s.db.pool.clone();
        async move {
            let n: i64 = threadline_store::testing::decisions::count_rows(&pool)
                .await
                .ok()?;
            (n > 0).then_some(())
        }
    })
    .await;
    sim_ctl(
        &s.sim,
        &format!("apps/{}/{how}", s.app),
        json!({"team_id": s.team}),
    )
    .await;
    // The answer the model produced is cancelled at the publisher: the
    // installation has no token any more.
    let settled = eventually("the decision settled", Duration::from_secs(30), || {
        let pool = s.db.pool.clone();
        async move {
            let d: (String, Option<String>) =
                threadline_store::testing::decisions::first_status_and_reason(&pool)
                    .await
                    .ok()?;
            (d.0 != "calling" && d.0 != "proposed").then_some(d)
        }
    })
    .await;
    assert_eq!(
        settled,
        (
            "cancelled".to_owned(),
            Some("installation_unavailable".to_owned())
        )
    );
    let status: (String, Option<String>) =
        threadline_store::testing::installations::first_status_and_disabled_reason(&s.db.pool)
            .await
            .expect("installation");
    assert_eq!(status, ("disabled".to_owned(), Some(reason.to_owned())));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(s.answers_in(&s.channel, &root).await.is_empty());
    let posts = sim_get(&s.sim, "calls?method=chat.postMessage").await;
    assert_eq!(
        posts["calls"].as_array().map(Vec::len),
        Some(0),
        "threadline stopped itself; Slack was not even asked"
    );
    let sealed: Option<Vec<u8>> =
        threadline_store::testing::installations::first_bot_token_sealed(&s.db.pool)
            .await
            .expect("installation");
    assert!(sealed.is_none(), "the token is purged");
    s.stop().await;
}
