//! Every change of a thread acknowledged to Slack is in the answer, whatever
//! order the changes reach the thread store in: two edits of a question made
//! within one second, acknowledged while the broker was down, then the
//! database down, both back before the answer is posted. The answer must
//! read the question's last text (judged from Slack's side: the text the
//! built-in model states it read, and the oracle).
//!
//! Slack's `edited.ts` has whole seconds, so two edits within a second carry
//! the same one; and edits reach the thread store in whatever order the
//! outbox, the broker and the workers give them after an outage. One
//! question's edits are delivered in the order they were made, the other's
//! reversed (as Slack may deliver them), so that neither "the first applied
//! wins" nor "the last applied wins" can pass.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::json;
use threadline_store::testing::decisions;
use threadline_testkit::eventually;
use threadline_tests::broker::Broker;
use threadline_tests::oracle::{digest, stated};
use threadline_tests::{Stack, sim_ctl, sim_get};

/// How many `message_changed` deliveries threadline acknowledged.
async fn edits_acknowledged(s: &Stack) -> usize {
    let d = sim_get(&s.sim, "deliveries").await;
    d["deliveries"]
        .as_array()
        .map(|d| {
            d.iter()
                .filter(|x| x["subtype"] == "message_changed" && x["status"] == 200)
                .count()
        })
        .unwrap_or(0)
}

/// Waits until the wall clock is early in a second, so that two edits made
/// now fall within one second (and carry the same `edited.ts`).
async fn start_of_a_second() {
    loop {
        let frac = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_millis())
            .unwrap_or(0);
        if frac < 300 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(u64::from(1000 - frac) + 5)).await;
    }
}

async fn edit(s: &Stack, ts: &str, text: &str) {
    sim_ctl(
        &s.sim,
        "act/edit",
        json!({"user": s.user, "channel": s.channel, "ts": ts, "text": text}),
    )
    .await;
}

/// The text an answer in thread `root` states it read for message `ts`.
async fn digest_read(s: &Stack, root: &str, ts: &str) -> String {
    let answers = s.wait_answers(root, 2).await;
    assert_eq!(
        answers.len(),
        2,
        "one answer to each question: {answers:#?}"
    );
    let text = answers[1]["text"].as_str().unwrap_or_default();
    let st = stated(text).unwrap_or_else(|| panic!("the answer states what it read: {text}"));
    assert_eq!(st.answering, ts, "{text}");
    st.read
        .iter()
        .find(|(t, _)| t == ts)
        .map(|(_, d)| d.clone())
        .unwrap_or_else(|| panic!("the answer read the question: {text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edits_acknowledged_while_the_broker_then_the_database_were_down_are_in_the_answer() {
    let mut broker = Broker::start().await;
    let s = Stack::start(&[
        ("NATS_URL", broker.url()),
        ("THREADLINE_BUILTIN_LATENCY_MS", "3000".to_owned()),
        ("THREADLINE_REDELIVERY_MS", "3000".to_owned()),
        // One event at a time: the edits reach the thread store in the order
        // Slack delivered them, every run.
        ("THREADLINE_CONTEXT_CONCURRENCY", "1".to_owned()),
    ])
    .await;
    // Two threads, each with a question in reply whose answer is on its
    // way (the model is working on the question as first written).
    let mut roots = Vec::new();
    for name in ["in order", "reversed"] {
        let root = s
            .post(&format!("<@{}> a thread {name}?", s.bot_user), None)
            .await;
        roots.push((name, root));
    }
    let mut questions = Vec::new();
    for (name, root) in roots {
        s.wait_answers(&root, 1).await;
        let q = s
            .post(
                &format!("<@{}> the question {name}", s.bot_user),
                Some(&root),
            )
            .await;
        questions.push((name, root, q));
    }
    eventually("both model calls started", Duration::from_secs(20), || {
        let pool = s.db.pool.clone();
        async move {
            let n = decisions::count_with_status(&pool, "calling").await.ok()?;
            (n >= 2).then_some(())
        }
    })
    .await;

    // The broker goes away; each question is edited twice within a second,
    // and the gateway acknowledges every edit (receipt and outbox row).
    broker.down().await;
    for (name, _, q) in &questions {
        let reversed = *name == "reversed";
        if reversed {
            // Slack delivers these two edits in the opposite order.
            sim_ctl(&s.sim, "settings", json!({"reorder_window": 2})).await;
        }
        start_of_a_second().await;
        edit(&s, q, &format!("<@{}> first edit {name}", s.bot_user)).await;
        edit(&s, q, &format!("<@{}> last edit {name}", s.bot_user)).await;
        let want = if reversed { 4 } else { 2 };
        eventually(
            "the edits acknowledged",
            Duration::from_secs(20),
            || async { (edits_acknowledged(&s).await >= want).then_some(()) },
        )
        .await;
        if reversed {
            sim_ctl(&s.sim, "settings", json!({"reorder_window": 0})).await;
        }
    }
    // Then the database goes away too; the broker comes back while it is
    // down, then the database.
    s.db.take_down().await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    broker.up().await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    s.db.bring_up().await;

    // Each answer read its question as last edited (Slack's side: the text
    // the built-in model states it read).
    for (name, root, q) in &questions {
        let last = format!("<@{}> last edit {name}", s.bot_user);
        assert_eq!(
            digest_read(&s, root, q).await,
            digest(&last),
            "the answer in the thread '{name}' read the question's last text"
        );
    }
    s.assert_at_most_one_reply_per_message().await;
    // (the oracle judges the run too when the stack stops)
    s.stop().await;
    drop(broker);
}
