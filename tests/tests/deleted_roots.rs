//! A thread's root deleted while it has replies, as Slack does it: the
//! root stays as a tombstone ("This message was deleted.", by USLACKBOT),
//! announced as a `message_changed` whose message is the tombstone, not as
//! `message_deleted`; `conversations.replies` still reads the thread. A
//! question deleted so is withdrawn like any deleted question, and an
//! answer whose post's outcome was unknown is found in the thread.
//! Judged from Slack's side (its messages and call log).

use std::time::Duration;

use serde_json::json;
use threadline_store::testing::decisions;
use threadline_testkit::eventually;
use threadline_tests::{Stack, ok_calls, sim_ctl};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_question_deleted_while_its_thread_has_replies_gets_no_answer() {
    let s = Stack::start(&[("THREADLINE_BUILTIN_LATENCY_MS", "2500".to_owned())]).await;
    let bot = s.bot_user.clone();
    let q = s.post(&format!("<@{bot}> what broke?"), None).await;
    // (a reply that asks nothing: the thread has a reply)
    s.post("same here", Some(&q)).await;
    eventually(
        "the model is answering",
        Duration::from_secs(20),
        || async {
            let n = decisions::count_with_status(&s.db.pool, "calling")
                .await
                .ok()?;
            (n >= 1).then_some(())
        },
    )
    .await;
    s.delete(&q).await;
    // Slack announced it as the root's change to a tombstone.
    eventually(
        "the tombstone announced",
        Duration::from_secs(20),
        || async {
            let events = threadline_tests::sim_get(&s.sim, "deliveries").await;
            events["deliveries"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|d| {
                    d["message_ts"] == q.as_str()
                        && d["subtype"] == "message_changed"
                        && d["status"] == 200
                })
                .then_some(())
        },
    )
    .await;
    eventually("the answer withdrawn", Duration::from_secs(30), || async {
        let open = decisions::count_with_status(&s.db.pool, "calling")
            .await
            .ok()?
            + decisions::count_with_status(&s.db.pool, "proposed")
                .await
                .ok()?;
        (open == 0).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        ok_calls(&s.sim, "chat.postMessage").await.is_empty(),
        "nothing said about a deleted question"
    );
    assert!(ok_calls(&s.sim, "chat.startStream").await.is_empty());
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_whose_post_was_lost_is_found_under_its_deleted_questions_tombstone() {
    let s = Stack::start(&[]).await;
    let bot = s.bot_user.clone();
    sim_ctl(
        &s.sim,
        "faults",
        json!({"method": "chat.postMessage", "mode": "lost_response"}),
    )
    .await;
    let q = s.post(&format!("<@{bot}> is the build green?"), None).await;
    // The answer shows in Slack; its response never came back. The person
    // deletes the question: its thread has a reply, so Slack keeps a
    // tombstone, and reading the thread finds the answer.
    s.wait_answers(&q, 1).await;
    s.delete(&q).await;
    let state = eventually("the post found", Duration::from_secs(60), || async {
        let r = threadline_store::testing::intents::first_state_and_error_code(&s.db.pool)
            .await
            .ok()?;
        (r.0 != "sending" && r.0 != "unknown" && r.0 != "reconciling").then_some(r)
    })
    .await;
    assert_eq!(state.0, "sent", "{state:?}");
    let reads = ok_calls(&s.sim, "conversations.replies").await;
    assert!(!reads.is_empty(), "the thread was read for evidence");
    assert_eq!(
        ok_calls(&s.sim, "chat.postMessage").await.len(),
        1,
        "posted once"
    );
    s.stop().await;
}
