//! Mid-flight failures of the parts around the services: the broker
//! restarted while an answer is being made, a kill switch engaged while the
//! model runs. Judged by Slack's ground truth.

use std::time::Duration;

use serde_json::json;
use threadline_store::testing::{audit, decisions, installations, receipts};
use threadline_testkit::eventually;
use threadline_tests::broker::Broker;
use threadline_tests::{Stack, cli, sim_get};

async fn decision_calling(s: &Stack) {
    eventually("the model call started", Duration::from_secs(20), || {
        let pool = s.db.pool.clone();
        async move {
            let n = decisions::count_with_status(&pool, "calling").await.ok()?;
            (n > 0).then_some(())
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_broker_killed_and_restarted_mid_answer_still_gives_exactly_one_reply() {
    let mut broker = Broker::start().await;
    let s = Stack::start(&[
        ("NATS_URL", broker.url()),
        ("THREADLINE_BUILTIN_LATENCY_MS", "2000".to_owned()),
        ("THREADLINE_REDELIVERY_MS", "3000".to_owned()),
    ])
    .await;
    let root = s
        .post(&format!("<@{}> is the broker fine?", s.bot_user), None)
        .await;
    decision_calling(&s).await;
    // The broker dies while the model works, and comes back a moment later
    // with its file store: the proposal is published once it is reachable.
    broker.down().await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    broker.up().await;
    let answers = s.wait_answers(&root, 1).await;
    assert_eq!(answers.len(), 1, "{answers:?}");
    // Work posted while it was down also gets through.
    let second = s.post(&format!("<@{}> and now?", s.bot_user), None).await;
    assert_eq!(s.wait_answers(&second, 1).await.len(), 1);
    s.assert_at_most_one_reply_per_message().await;
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_switch_engaged_while_the_model_runs_posts_nothing() {
    let s = Stack::start(&[("THREADLINE_BUILTIN_LATENCY_MS", "2000".to_owned())]).await;
    let root = s
        .post(&format!("<@{}> drop the table?", s.bot_user), None)
        .await;
    decision_calling(&s).await;
    let out = cli(
        &[
            "kill-switch",
            "engage",
            "--installation",
            &installations::first_id(&s.db.pool)
                .await
                .expect("installation")
                .to_string(),
            "--reason",
            "incident",
            "--by",
            "oncall",
        ],
        &[("DATABASE_URL", s.db.url.clone())],
    )
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The model's answer arrives after the switch: checked again before
    // posting, it is suppressed.
    let status = eventually("the decision settled", Duration::from_secs(20), || {
        let pool = s.db.pool.clone();
        async move {
            let st = decisions::any_decision_status(&pool).await.ok()?;
            (st != "calling" && st != "proposed").then_some(st)
        }
    })
    .await;
    assert_eq!(status, "suppressed");
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(s.answers(&root).await.is_empty());
    let posts = sim_get(&s.sim, "calls?method=chat.postMessage").await;
    assert_eq!(posts["calls"], json!([]), "Slack was never asked to post");
    let audit = audit::count_audit_entries(&s.db.pool, "operator", "kill_switch_engaged", "oncall")
        .await
        .expect("audit");
    assert_eq!(audit, 1, "the operator's action is in the audit log");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_database_down_before_and_after_the_intake_commit_loses_nothing_and_answers_once() {
    let s = Stack::start(&[
        ("THREADLINE_BUILTIN_LATENCY_MS", "500".to_owned()),
        ("THREADLINE_INSTALLATION_CACHE_MS", "0".to_owned()),
        // (the spool's own tests are tests/spool.rs)
        ("THREADLINE_SPOOL_ENABLED", "false".to_owned()),
    ])
    .await;
    // Before: Postgres is unreachable when Slack delivers. Without a spool
    // the gateway answers 503, Slack retries, and a retry lands once it is
    // back.
    s.db.take_down().await;
    let first = s
        .post(&format!("<@{}> before the commit?", s.bot_user), None)
        .await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    s.db.bring_up().await;
    assert_eq!(s.wait_answers(&first, 1).await.len(), 1);
    let refused = sim_get(&s.sim, "deliveries").await["deliveries"]
        .as_array()
        .map(|d| d.iter().filter(|x| x["status"] == 503).count())
        .unwrap_or(0);
    assert!(refused > 0, "the gateway refused while Postgres was down");

    // After: the receipt is committed (Slack has its 200), then Postgres
    // goes away while the work is in flight, and comes back.
    let second = s
        .post(&format!("<@{}> after the commit?", s.bot_user), None)
        .await;
    eventually("the receipt committed", Duration::from_secs(10), || {
        let pool = s.db.pool.clone();
        let second = second.clone();
        async move {
            let n = receipts::count_receipts_of_message(&pool, &second)
                .await
                .ok()?;
            (n > 0).then_some(())
        }
    })
    .await;
    s.db.take_down().await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    s.db.bring_up().await;
    assert_eq!(s.wait_answers(&second, 1).await.len(), 1);
    s.assert_at_most_one_reply_per_message().await;
    // The answer can land while another event of the thread (the bot's own
    // reply fed back) is still being processed: every acknowledged event
    // must reach a terminal state, not at that very instant.
    eventually(
        "every acknowledged event finished",
        Duration::from_secs(30),
        || async {
            let open = receipts::count_open_receipts(&s.db.pool).await.ok()?;
            (open == 0).then_some(())
        },
    )
    .await;
    s.stop().await;
}
