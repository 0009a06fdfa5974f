//! Human review in Slack, judged from Slack's side: a risky answer is held
//! and asked about in the installation's review channel, with Approve /
//! Reject buttons; a click arrives as a signed interactivity request at the
//! gateway. The services run as processes; slack-sim's messages, call log
//! and interaction log say what happened.

use std::time::Duration;

use serde_json::{Value, json};
use threadline_domain::review::{APPROVE_ACTION, REJECT_ACTION};
use threadline_testkit::eventually;
use threadline_tests::{Stack, cli, first_installation, sim_ctl, sim_get};

const RISKY: &str = "Heads up <!channel>: restart the pool, then watch the queue drain.";

struct Review {
    s: Stack,
    inst: String,
    channel: String,
    reviewer: String,
    other: String,
}

/// A stack whose model always answers `RISKY` (held for review), with a
/// review channel where `rita` reviews and `otto`, also a member, does not.
async fn review_stack() -> Review {
    review_stack_with(&[]).await
}

async fn review_stack_with(extra: &[(&'static str, String)]) -> Review {
    let r = review_stack_unset(extra, true).await;
    setup(&r, &r.channel).await;
    r
}

/// Sets up review in Slack for the stack's installation in `channel`, with
/// `rita` as the reviewer.
async fn setup(r: &Review, channel: &str) -> String {
    run_cli(
        &r.s,
        &[
            "review",
            "setup",
            "--installation",
            &r.inst,
            "--channel",
            channel,
            "--reviewers",
            &r.reviewer,
        ],
    )
    .await
}

/// The review stack before `review setup`; the bot is a member of the
/// review channel when `bot_in_channel`.
async fn review_stack_unset(extra: &[(&'static str, String)], bot_in_channel: bool) -> Review {
    let (url, _) = threadline_tests::fixed_model(RISKY).await;
    let mut settings = vec![
        ("THREADLINE_MODEL_PROVIDER", "openai".to_owned()),
        ("THREADLINE_MODEL_NAME", "m".to_owned()),
        ("THREADLINE_MODEL_BASE_URL", url),
    ];
    settings.extend(extra.iter().cloned());
    let mut s = Stack::start(&settings).await;
    s.unjudged = Some("the test's model does not state what it read");
    let user = |name: &str| {
        let (sim, team) = (&s.sim, s.team.clone());
        let name = name.to_owned();
        async move {
            sim_ctl(sim, "users", json!({"team_id": team, "name": name})).await["id"]
                .as_str()
                .expect("user id")
                .to_owned()
        }
    };
    let reviewer = user("rita").await;
    let other = user("otto").await;
    let mut members = vec![reviewer.clone(), other.clone()];
    if bot_in_channel {
        members.push(s.bot_user.clone());
    }
    let channel = sim_ctl(
        &s.sim,
        "channels",
        json!({"team_id": s.team, "name": "answers-review", "kind": "public",
               "members": members}),
    )
    .await["id"]
        .as_str()
        .expect("channel id")
        .to_owned();
    let gateway = s.services[0].base_url.clone();
    sim_ctl(
        &s.sim,
        &format!("apps/{}/interactivity", s.app),
        json!({"url": format!("{gateway}/slack/interactions")}),
    )
    .await;
    let inst = first_installation(&s).await;
    Review {
        s,
        inst,
        channel,
        reviewer,
        other,
    }
}

fn env(s: &Stack) -> Vec<(&'static str, String)> {
    vec![
        ("DATABASE_URL", s.db.url.clone()),
        ("NATS_URL", threadline_testkit::nats_url()),
        ("THREADLINE_BUS_PREFIX", s.prefix.clone()),
    ]
}

async fn run_cli(s: &Stack, args: &[&str]) -> String {
    let out = cli(args, &env(s)).await;
    assert!(
        out.status.success(),
        "threadline {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The app's messages in the review channel, oldest first.
async fn requests(r: &Review) -> Vec<Value> {
    let v = sim_get(&r.s.sim, &format!("channels/{}/messages", r.channel)).await;
    let mut m: Vec<Value> = v["messages"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|m| m["app_id"].is_string())
        .collect();
    m.sort_by(|a, b| {
        let ts = |m: &Value| m["ts"].as_str().unwrap_or("").parse::<f64>().unwrap_or(0.0);
        ts(a).total_cmp(&ts(b))
    });
    m
}

async fn wait_requests(r: &Review, n: usize) -> Vec<Value> {
    eventually(
        &format!("{n} review request(s) in the review channel"),
        Duration::from_secs(30),
        || async move {
            let m = requests(r).await;
            (m.len() >= n).then_some(m)
        },
    )
    .await
}

/// The person asks the question the model answers riskily; the thread's
/// root, and the review request that follows with its ts.
async fn ask(r: &Review) -> (String, Value, String) {
    let root =
        r.s.post(
            &format!("<@{}> how do I fix the backlog?", r.s.bot_user),
            None,
        )
        .await;
    let req = wait_requests(r, 1).await.remove(0);
    let ts = req["ts"].as_str().expect("ts").to_owned();
    (root, req, ts)
}

/// The gateway's `/metrics` text.
async fn gateway_metrics(r: &Review) -> String {
    reqwest::get(format!("{}/metrics", r.s.services[0].base_url))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text")
}

fn has_buttons(m: &Value) -> bool {
    m["blocks"]
        .as_array()
        .is_some_and(|b| b.iter().any(|b| b["type"] == "actions"))
}

fn shown_text(m: &Value) -> String {
    m["blocks"].to_string() + m["text"].as_str().unwrap_or("")
}

async fn click(r: &Review, user: &str, ts: &str, action: &str) -> Value {
    sim_ctl(
        &r.s.sim,
        "act/click",
        json!({"user": user, "channel": r.channel, "ts": ts, "action_id": action}),
    )
    .await
}

/// Waits until the request at `ts` no longer has buttons and shows `what`.
async fn wait_outcome(r: &Review, ts: &str, what: &str) -> Value {
    eventually(
        &format!("the review request says {what:?}"),
        Duration::from_secs(30),
        || async move {
            let m = requests(r).await.into_iter().find(|m| m["ts"] == ts)?;
            (!has_buttons(&m) && shown_text(&m).contains(what)).then_some(m)
        },
    )
    .await
}

async fn status(r: &Review, decision: &str) -> String {
    threadline_store::testing::decisions::decision_status(
        &r.s.db.pool,
        decision.parse().expect("uuid"),
    )
    .await
    .expect("status")
    .0
}

/// A click on a button the message does not have (any more): slack-sim
/// has nothing to send.
async fn click_without_button(r: &Review, user: &str, ts: &str, action: &str) {
    let late = reqwest::Client::new()
        .post(format!("{}/_sim/act/click", r.s.sim.base_url))
        .json(&json!({"user": user, "channel": r.channel, "ts": ts, "action_id": action}))
        .send()
        .await
        .expect("click");
    assert!(late.status().is_client_error(), "{}", late.status());
}

/// What only `user` sees (ephemeral messages), once there are `n`.
async fn ephemerals_of(r: &Review, user: &str, n: usize) -> Vec<Value> {
    eventually(
        &format!("{n} ephemeral message(s) for {user}"),
        Duration::from_secs(20),
        || async move {
            let v = sim_get(&r.s.sim, &format!("ephemerals?user={user}")).await;
            let e = v["ephemerals"].as_array().cloned().unwrap_or_default();
            (e.len() >= n).then_some(e)
        },
    )
    .await
}

fn decision_of(m: &Value) -> String {
    m["blocks"]
        .as_array()
        .and_then(|b| b.iter().find(|b| b["type"] == "actions"))
        .and_then(|a| a["elements"][0]["value"].as_str())
        .expect("the request's buttons name its decision")
        .to_owned()
}

/// A reviewer's double click approves once: exactly one answer reaches the
/// thread, escaped; a member who is not a reviewer is refused (nothing
/// changes in Slack or in the decision); the request then shows who
/// approved it and where it was posted, without buttons.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_review_by_button_posts_once_under_double_clicks_and_refuses_a_non_reviewer() {
    let r = review_stack().await;
    let (root, req, ts) = ask(&r).await;
    let decision = decision_of(&req);
    let shown = shown_text(&req);
    assert!(has_buttons(&req), "{req}");
    assert!(
        shown.contains("restart the pool") && shown.contains("&lt;!channel&gt;"),
        "the request shows the answer, escaped: {shown}"
    );
    assert!(!shown.contains("<!channel>"), "never a live ping: {shown}");
    assert!(shown.contains("mass_mention"), "the reason: {shown}");
    assert!(r.s.answers(&root).await.is_empty(), "held until approved");

    // A member of the review channel who is not a reviewer.
    let refused = click(&r, &r.other, &ts, APPROVE_ACTION).await;
    assert_eq!(refused["status"], 200, "{refused}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(status(&r, &decision).await, "review");
    assert!(r.s.answers(&root).await.is_empty());
    let updates = sim_get(&r.s.sim, "calls?method=chat.update").await;
    assert_eq!(updates["calls"], json!([]), "the request is unchanged");
    // Only they are told why, through the click's response_url.
    let told = ephemerals_of(&r, &r.other, 1).await;
    assert!(
        told[0]["text"]
            .as_str()
            .is_some_and(|t| t.contains("reviewers") && t.contains("not counted")),
        "{told:?}"
    );
    assert_eq!(told[0]["channel"], json!(r.channel));
    assert!(
        !requests(&r).await.iter().any(|m| m["text"]
            .as_str()
            .is_some_and(|t| t.contains("not counted"))),
        "nothing said in the channel"
    );

    // The reviewer clicks Approve twice at once.
    let (a, b) = tokio::join!(
        click(&r, &r.reviewer, &ts, APPROVE_ACTION),
        click(&r, &r.reviewer, &ts, APPROVE_ACTION)
    );
    assert_eq!((&a["status"], &b["status"]), (&json!(200), &json!(200)));
    let answers = r.s.wait_answers(&root, 1).await;
    assert_eq!(answers.len(), 1, "one answer: {answers:?}");
    let text = answers[0]["text"].as_str().expect("text");
    assert!(text.starts_with("Heads up &lt;!channel&gt;"), "{text}");
    let done = wait_outcome(
        &r,
        &ts,
        &format!(
            "Approved by <@{}>: posted in <#{}>.",
            r.reviewer, r.s.channel
        ),
    )
    .await;
    assert!(!has_buttons(&done));
    // The click that came second is told it changed nothing; the reviewer
    // whose click counted is told nothing.
    let told = ephemerals_of(&r, &r.reviewer, 1).await;
    assert!(
        told[0]["text"].as_str().is_some_and(
            |t| t.contains("already approved") && t.ends_with("your click changed nothing.")
        ),
        "{told:?}"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(ephemerals_of(&r, &r.reviewer, 1).await.len(), 1);
    // Both clicks reached the gateway: one recorded the approval, the
    // other found it approved; the request was updated once.
    let metrics = gateway_metrics(&r).await;
    let clicks = |outcome: &str| {
        metrics
            .lines()
            .find(|l| {
                l.starts_with(&format!(
                    "threadline_review_clicks_total{{outcome=\"{outcome}\"}}"
                ))
            })
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|n| n.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    assert_eq!(
        (
            clicks("recorded"),
            clicks("not_waiting"),
            clicks("not_a_reviewer")
        ),
        (1.0, 1.0, 1.0),
        "{metrics}"
    );
    let updates: Vec<Value> = sim_get(&r.s.sim, "calls?method=chat.update").await["calls"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|c| c["ts"] == json!(ts))
        .collect();
    assert_eq!(updates.len(), 1, "{updates:?}");
    let posts = sim_get(&r.s.sim, "calls?method=chat.postMessage").await["calls"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let in_thread: Vec<&Value> = posts
        .iter()
        .filter(|c| c["channel"] == json!(r.s.channel))
        .collect();
    assert_eq!(in_thread.len(), 1, "one post into the thread: {posts:?}");
    assert_eq!(status(&r, &decision).await, "published");
    let reviewed_by =
        threadline_store::testing::decisions::reviewed_by(&r.s.db.pool, decision.parse().unwrap())
            .await
            .expect("reviewed_by");
    assert_eq!(
        reviewed_by.as_deref(),
        Some(format!("slack:{}", r.reviewer).as_str())
    );

    // The buttons are gone: a late click has nothing to press.
    click_without_button(&r, &r.reviewer, &ts, REJECT_ACTION).await;
    assert_eq!(r.s.answers(&root).await.len(), 1);
    assert_eq!(requests(&r).await.len(), 1, "one request for one decision");
    r.s.stop().await;
}

/// A proposal whose thread moved on while it waited for review is
/// discarded without anyone clicking: the request says so and loses its
/// buttons, the thread is reconsidered (the new answer is asked about in a
/// request of its own), and a rejection of that one posts nothing and says
/// who rejected it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_that_went_stale_in_review_is_not_posted_and_the_request_says_so() {
    let r = review_stack().await;
    let (root, first, ts) = ask(&r).await;
    let decision = decision_of(&first);
    // The thread moves on while the answer waits.
    r.s.post("never mind, the queue drained on its own", Some(&root))
        .await;
    eventually(
        "the reply is in the thread store",
        Duration::from_secs(30),
        || {
            let pool = r.s.db.pool.clone();
            let root = root.clone();
            async move {
                let v = threadline_store::testing::threads::version_of(&pool, &root)
                    .await
                    .ok()??;
                (v >= 2).then_some(())
            }
        },
    )
    .await;
    // Nobody clicks: the request says what became of the answer.
    wait_outcome(
        &r,
        &ts,
        "The thread changed while this waited for review: not posted. The thread is being reconsidered.",
    )
    .await;
    assert_eq!(status(&r, &decision).await, "stale");
    // The old request has no buttons left to approve it with.
    click_without_button(&r, &r.reviewer, &ts, APPROVE_ACTION).await;
    // Reconsidered: the answer to the thread as it is now waits again.
    let second = eventually(
        "a request for the reconsidered answer",
        Duration::from_secs(30),
        || async {
            requests(&r)
                .await
                .into_iter()
                .find(|m| m["ts"] != json!(ts) && has_buttons(m))
        },
    )
    .await;
    let ts2 = second["ts"].as_str().expect("ts").to_owned();
    assert_ne!(decision_of(&second), decision);
    let c = click(&r, &r.reviewer, &ts2, REJECT_ACTION).await;
    assert_eq!(c["status"], 200, "{c}");
    wait_outcome(
        &r,
        &ts2,
        &format!("Rejected by <@{}>: not posted.", r.reviewer),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(r.s.answers(&root).await.is_empty(), "nothing was posted");
    assert_eq!(requests(&r).await.len(), 2);
    r.s.stop().await;
}

/// A signed click that is not on the decision's own request (another
/// message's ts), one that names no decision, and one for a decision of
/// another installation are refused; the CLI sees the same decision and
/// decides it, and the request follows the CLI's verdict.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_clicks_are_refused_and_the_cli_shares_the_path() {
    let r = review_stack().await;
    let (root, req, ts) = ask(&r).await;
    let decision = decision_of(&req);
    let gateway = format!("{}/slack/interactions", r.s.services[0].base_url);
    let signed = |payload: Value| {
        let gateway = gateway.clone();
        async move {
            let body = serde_urlencoded::to_string([("payload", payload.to_string())]).unwrap();
            let now = threadline_testkit::slack::now_unix();
            let (ts, sig) = threadline_testkit::slack::signature(
                threadline_testkit::slack::TEST_SECRET,
                now,
                body.as_bytes(),
            );
            reqwest::Client::new()
                .post(gateway)
                .header("content-type", "application/x-www-form-urlencoded")
                .header("x-slack-request-timestamp", ts)
                .header("x-slack-signature", sig)
                .body(body)
                .send()
                .await
                .expect("gateway")
                .status()
                .as_u16()
        }
    };
    let payload = |message_ts: &str, value: &str, team: &str| {
        json!({"type": "block_actions", "api_app_id": r.s.app, "team": {"id": team, "domain": "acme"},
               "user": {"id": r.reviewer, "team_id": team},
               "container": {"type": "message", "channel_id": r.channel, "message_ts": message_ts},
               "actions": [{"action_id": APPROVE_ACTION, "block_id": "threadline_review",
                            "value": value, "type": "button", "action_ts": "1.2"}]})
    };
    // Another message of the channel (the person's own).
    let elsewhere = r.s.post_as(&r.reviewer, &r.channel, "looking", None).await;
    assert_eq!(signed(payload(&elsewhere, &decision, &r.s.team)).await, 200);
    assert_eq!(signed(payload(&ts, "not-a-decision", &r.s.team)).await, 400);
    // A workspace threadline does not serve.
    assert_eq!(signed(payload(&ts, &decision, "T0NOTOURS")).await, 200);
    // Another workspace threadline serves, whose reviewer is the same id:
    // the decision is not its installation's.
    let other = r.s.add_workspace("Beta").await;
    let inst2 = other.inst.to_string();
    run_cli(
        &r.s,
        &[
            "review",
            "setup",
            "--installation",
            &inst2,
            "--channel",
            &r.channel,
            "--reviewers",
            &r.reviewer,
        ],
    )
    .await;
    assert_eq!(signed(payload(&ts, &decision, &other.team)).await, 200);
    // Unsigned: refused before anything is read.
    let unsigned = reqwest::Client::new()
        .post(&gateway)
        .form(&[("payload", payload(&ts, &decision, &r.s.team).to_string())])
        .send()
        .await
        .expect("gateway");
    assert_eq!(unsigned.status().as_u16(), 401);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        status(&r, &decision).await,
        "review",
        "no forged click counted"
    );
    let metrics = gateway_metrics(&r).await;
    for outcome in [
        "not_the_request",
        "other_installation",
        "no_installation",
        "malformed",
    ] {
        assert!(
            metrics.contains(&format!(
                "threadline_review_clicks_total{{outcome=\"{outcome}\"}} 1"
            )),
            "{outcome}: {metrics}"
        );
    }
    // An operator cannot pose as a Slack reviewer.
    let posing = cli(
        &[
            "review",
            "approve",
            &decision,
            "--by",
            &format!("slack:{}", r.reviewer),
        ],
        &env(&r.s),
    )
    .await;
    assert!(!posing.status.success());

    // The CLI rejects it; the request shows the operator's verdict.
    let out = run_cli(&r.s, &["review", "reject", &decision, "--by", "ana"]).await;
    assert!(out.contains("rejected"), "{out}");
    wait_outcome(&r, &ts, "Rejected by `ana` (CLI): not posted.").await;
    // The CLI's verdict took the buttons away too.
    click_without_button(&r, &r.reviewer, &ts, APPROVE_ACTION).await;
    assert_eq!(status(&r, &decision).await, "rejected");
    let settings = run_cli(&r.s, &["review", "settings", "--installation", &r.inst]).await;
    let settings: Value = serde_json::from_str(&settings).expect("json");
    assert_eq!(settings["channel_id"], json!(r.channel));
    assert_eq!(settings["reviewers"], json!([r.reviewer]));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(r.s.answers(&root).await.is_empty());
    r.s.stop().await;
}

/// A review request whose post Slack accepted but whose answer was lost is
/// looked for in the review channel's history (by its metadata) before any
/// second post: one request, and its buttons work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_review_request_whose_answer_was_lost_is_found_not_posted_twice() {
    let r = review_stack_with(&[("THREADLINE_SLACK_TIMEOUT_MS", "1000".to_owned())]).await;
    sim_ctl(
        &r.s.sim,
        "faults",
        json!({"method": "chat.postMessage", "mode": "lost_response", "channel": r.channel,
               "latency_ms": 20000}),
    )
    .await;
    let (root, req, ts) = ask(&r).await;
    eventually(
        "the request is found in the channel's history",
        Duration::from_secs(30),
        || async {
            let h = sim_get(&r.s.sim, "calls?method=conversations.history").await;
            h["calls"]
                .as_array()
                .is_some_and(|c| !c.is_empty())
                .then_some(())
        },
    )
    .await;
    // Found, it is the decision's request: a click on it counts.
    let c = eventually("the click is counted", Duration::from_secs(30), || async {
        let c = click(&r, &r.reviewer, &ts, APPROVE_ACTION).await;
        let d = decision_of(&req);
        (status(&r, &d).await != "review").then_some(c)
    })
    .await;
    assert_eq!(c["status"], 200, "{c}");
    assert_eq!(r.s.wait_answers(&root, 1).await.len(), 1);
    wait_outcome(&r, &ts, "posted in").await;
    let to_review = posts_to_review(&r).await;
    assert_eq!(to_review.len(), 1, "one request posted: {to_review:?}");
    assert_eq!(requests(&r).await.len(), 1);
    r.s.stop().await;
}

/// A review request Slack applies only after the publisher stopped
/// waiting for its answer (outcome unknown) is not posted again while it
/// may still land, and a reviewer's click on it before threadline found it
/// counts (the click proves Slack holds it). It then shows its outcome.
/// Posted again at the first read that missed it, the request showed
/// twice, and the copy not recorded kept buttons no click could use.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_review_request_that_lands_late_is_posted_once_and_a_click_on_it_counts() {
    let r = review_stack_with(&[
        ("THREADLINE_SLACK_TIMEOUT_MS", "1000".to_owned()),
        // (one read every 10 s: the click comes before the next)
        ("THREADLINE_RECONCILE_WINDOW_MS", "30000".to_owned()),
    ])
    .await;
    sim_ctl(
        &r.s.sim,
        "faults",
        json!({"method": "chat.postMessage", "mode": "latency", "channel": r.channel,
               "latency_ms": 6000}),
    )
    .await;
    let (root, req, ts) = ask(&r).await;
    let d = decision_of(&req);
    let c = click(&r, &r.reviewer, &ts, APPROVE_ACTION).await;
    assert_eq!(c["status"], 200, "{c}");
    eventually("the click is counted", Duration::from_secs(8), || async {
        (status(&r, &d).await != "review").then_some(())
    })
    .await;
    assert_eq!(r.s.wait_answers(&root, 1).await.len(), 1);
    wait_outcome(&r, &ts, "posted in").await;
    // Once the slow post has landed, the channel holds one request.
    eventually(
        "the slow post is applied",
        Duration::from_secs(20),
        || async {
            let posts = sim_get(&r.s.sim, "calls?method=chat.postMessage").await;
            posts["calls"]
                .as_array()?
                .iter()
                .any(|c| c["channel"] == json!(r.channel) && c["effect"] == "applied_client_gone")
                .then_some(())
        },
    )
    .await;
    let shown = requests(&r).await;
    assert_eq!(
        shown.len(),
        1,
        "one request in the review channel: {shown:?}"
    );
    r.s.stop().await;
}

/// A review request Slack applies only after its window has passed (its
/// outcome unknown, not found when read) is held as a reply would be: not
/// posted again, and found by a late check once it lands. One request, and
/// its buttons work. The faults after the slow post are what a second post
/// would meet: posted again after the window, a 429 used to give the claim
/// back as if nothing were out, and the next attempt posted without
/// reading the channel: two requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_review_request_that_lands_after_its_window_is_held_and_found_not_posted_again() {
    let r = review_stack_with(&[
        ("THREADLINE_SLACK_TIMEOUT_MS", "1000".to_owned()),
        ("THREADLINE_RECONCILE_WINDOW_MS", "1500".to_owned()),
        ("THREADLINE_LATE_CHECK_MS", "2000".to_owned()),
    ])
    .await;
    for fault in [
        json!({"method": "chat.postMessage", "mode": "latency", "channel": r.channel,
               "latency_ms": 6000}),
        json!({"method": "chat.postMessage", "mode": "ratelimited", "channel": r.channel,
               "retry_after": 1}),
        json!({"method": "chat.postMessage", "mode": "latency", "channel": r.channel,
               "latency_ms": 3000}),
    ] {
        sim_ctl(&r.s.sim, "faults", fault).await;
    }
    let (root, req, ts) = ask(&r).await;
    // Longer than a second post after the 429 would take to land.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let to_review = posts_to_review(&r).await;
    assert_eq!(to_review.len(), 1, "one request posted: {to_review:?}");
    assert_eq!(requests(&r).await.len(), 1);
    // Found by a late check, not by a click: held first, then found.
    eventually(
        "the held request is found",
        Duration::from_secs(30),
        || async { (review_outcomes(&r, "found").await > 0).then_some(()) },
    )
    .await;
    assert!(
        review_outcomes(&r, "held").await > 0,
        "held before it was found"
    );
    let d = decision_of(&req);
    let c = click(&r, &r.reviewer, &ts, APPROVE_ACTION).await;
    assert_eq!(c["status"], 200, "{c}");
    eventually("the click is counted", Duration::from_secs(10), || async {
        (status(&r, &d).await != "review").then_some(())
    })
    .await;
    assert_eq!(r.s.wait_answers(&root, 1).await.len(), 1);
    wait_outcome(&r, &ts, "posted in").await;
    r.s.stop().await;
}

/// slack-sim's `chat.postMessage` calls to the review channel, whatever
/// came of them.
async fn posts_to_review(r: &Review) -> Vec<Value> {
    let calls = sim_get(&r.s.sim, "calls?method=chat.postMessage").await;
    calls["calls"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|c| c["channel"] == json!(r.channel))
        .collect()
}

/// The count of `threadline_review_requests_total{outcome}` lines in the
/// services' metrics (one per publisher that counted it).
async fn review_outcomes(r: &Review, outcome: &str) -> usize {
    let m = r.s.metrics().await;
    m.lines()
        .filter(|l| {
            l.starts_with("threadline_review_requests_total")
                && l.contains(&format!("outcome=\"{outcome}\""))
        })
        .count()
}

/// A review request held for the late checks (its post timed out and it
/// was not in the channel past the window) is still looked for after its
/// answer was decided with the CLI. Once Slack applies it, the sweeper
/// finds it, and it shows the outcome without buttons: no request is left
/// asking about an answer already decided, and none is posted twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_review_request_decided_meanwhile_shows_the_outcome_once_it_lands() {
    let r = review_stack_with(&[
        ("THREADLINE_SLACK_TIMEOUT_MS", "1000".to_owned()),
        ("THREADLINE_RECONCILE_WINDOW_MS", "1500".to_owned()),
        ("THREADLINE_LATE_CHECK_MS", "2000".to_owned()),
    ])
    .await;
    sim_ctl(
        &r.s.sim,
        "faults",
        json!({"method": "chat.postMessage", "mode": "latency", "channel": r.channel,
               "latency_ms": 9000}),
    )
    .await;
    r.s.post(
        &format!("<@{}> how do I fix the backlog?", r.s.bot_user),
        None,
    )
    .await;
    eventually("the request is held", Duration::from_secs(20), || async {
        (review_outcomes(&r, "held").await > 0).then_some(())
    })
    .await;
    assert!(requests(&r).await.is_empty(), "not in Slack yet");
    let waiting: Value =
        serde_json::from_str(&run_cli(&r.s, &["review", "list"]).await).expect("json");
    let decision = waiting[0]["id"]
        .as_str()
        .expect("a decision waits")
        .to_owned();
    let out = run_cli(&r.s, &["review", "reject", &decision, "--by", "ana"]).await;
    assert!(out.contains("rejected"), "{out}");
    let req = wait_requests(&r, 1).await.remove(0);
    let ts = req["ts"].as_str().expect("ts").to_owned();
    wait_outcome(&r, &ts, "Rejected by `ana` (CLI): not posted.").await;
    assert!(
        review_outcomes(&r, "found").await > 0,
        "found by a late check"
    );
    let to_review = posts_to_review(&r).await;
    assert_eq!(to_review.len(), 1, "one request posted: {to_review:?}");
    r.s.stop().await;
}

/// An answer held for review before review in Slack was set up is asked
/// about once it is; a request Slack refused (the bot not in the channel)
/// is asked again by the next setup, once the bot is in; each is asked
/// about once, and the approval posts the answer once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_waiting_before_setup_or_refused_are_asked_about_by_the_next_setup() {
    let r = review_stack_unset(&[], false).await;
    let root =
        r.s.post(
            &format!("<@{}> how do I fix the backlog?", r.s.bot_user),
            None,
        )
        .await;
    let decision = eventually(
        "the answer waits for review",
        Duration::from_secs(30),
        || async {
            let v = cli(&["review", "list"], &env(&r.s)).await;
            let list: Value = serde_json::from_slice(&v.stdout).ok()?;
            list.as_array()?.first()?["id"].as_str().map(str::to_owned)
        },
    )
    .await;
    // Set up in a channel the bot is not in: Slack refuses the request.
    setup(&r, &r.channel).await;
    eventually(
        "Slack refused the request",
        Duration::from_secs(30),
        || async {
            let calls = sim_get(&r.s.sim, "calls?method=chat.postMessage").await;
            calls["calls"]
                .as_array()?
                .iter()
                .any(|c| {
                    c["channel"] == json!(r.channel) && c["outcome"] == json!("not_in_channel")
                })
                .then_some(())
        },
    )
    .await;
    assert!(requests(&r).await.is_empty());
    // The bot is invited; the operator runs setup again.
    sim_ctl(
        &r.s.sim,
        &format!("channels/{}/members", r.channel),
        json!({"user_id": r.s.bot_user}),
    )
    .await;
    setup(&r, &r.channel).await;
    let req = wait_requests(&r, 1).await.remove(0);
    assert_eq!(decision_of(&req), decision);
    let ts = req["ts"].as_str().expect("ts").to_owned();
    // Setting up again asks nothing more: the request is there.
    setup(&r, &r.channel).await;
    let c = click(&r, &r.reviewer, &ts, APPROVE_ACTION).await;
    assert_eq!(c["status"], 200, "{c}");
    assert_eq!(r.s.wait_answers(&root, 1).await.len(), 1);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(requests(&r).await.len(), 1, "asked once");
    assert_eq!(r.s.answers(&root).await.len(), 1, "posted once");
    r.s.stop().await;
}
