//! What the bot posts cannot ping a channel or leak through an unfurl,
//! judged from Slack's side: the services run as processes, an
//! OpenAI-compatible endpoint started here plays a model that writes
//! Slack markup, and slack-sim's call log and messages say what happened.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use threadline_testkit::eventually;
use threadline_tests::{Stack, cli, sim_get};

async fn stack_with_model(answer: &'static str) -> (Stack, Arc<Mutex<usize>>) {
    let (url, calls) = threadline_tests::fixed_model(answer).await;
    let mut s = Stack::start(&[
        ("THREADLINE_MODEL_PROVIDER", "openai".to_owned()),
        ("THREADLINE_MODEL_BASE_URL", url),
        ("THREADLINE_MODEL_NAME", "m".to_owned()),
    ])
    .await;
    s.unjudged = Some("the test's model does not state what it read");
    (s, calls)
}

/// slack-sim's `chat.postMessage` calls, oldest first.
async fn posts(s: &Stack) -> Vec<Value> {
    sim_get(&s.sim, "calls?method=chat.postMessage").await["calls"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn env(s: &Stack) -> Vec<(&'static str, String)> {
    vec![
        ("DATABASE_URL", s.db.url.clone()),
        ("NATS_URL", threadline_testkit::nats_url()),
        ("THREADLINE_BUS_PREFIX", s.prefix.clone()),
    ]
}

async fn run_cli(s: &Stack, args: &[&str]) {
    let out = cli(args, &env(s)).await;
    assert!(
        out.status.success(),
        "threadline {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A model answer with `<!channel>` and a disguised link is held for a
/// reviewer: Slack gets no call at all. Approved, it reaches Slack with
/// only escaped forms in its text and blocks, and unfurling off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_answer_that_pings_the_channel_waits_for_review_and_posts_escaped() {
    let (s, calls) = stack_with_model(
        "Heads up <!channel>: the fix is <https://evil.example/x?k=v|in the runbook> & done.",
    )
    .await;
    let root = s
        .post(&format!("<@{}> where is the fix?", s.bot_user), None)
        .await;
    let decision: uuid::Uuid = eventually(
        "the answer waits for a reviewer",
        Duration::from_secs(30),
        || {
            let pool = s.db.pool.clone();
            async move {
                threadline_store::testing::decisions::decision_id_with_status(&pool, "review")
                    .await
                    .ok()
                    .flatten()
            }
        },
    )
    .await;
    assert_eq!(*calls.lock().expect("lock"), 1, "the model was asked");
    let reasons = threadline_store::testing::decisions::review_reasons(&s.db.pool, decision)
        .await
        .expect("reasons");
    assert_eq!(reasons, ["mass_mention", "disguised_link"]);
    // Slack's side: nothing was posted, not even attempted.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(posts(&s).await, Vec::<Value>::new());
    assert!(s.answers(&root).await.is_empty());

    // A reviewer approves: what Slack holds is the escaped text.
    run_cli(
        &s,
        &["review", "approve", &decision.to_string(), "--by", "ana"],
    )
    .await;
    let answers = s.wait_answers(&root, 1).await;
    assert_eq!(answers.len(), 1);
    let escaped = "Heads up &lt;!channel&gt;: the fix is \
                   &lt;https://evil.example/x?k=v|in the runbook&gt; &amp; done.";
    let text = answers[0]["text"].as_str().expect("text");
    let section = answers[0]["blocks"][0]["text"]["text"]
        .as_str()
        .expect("section");
    assert!(text.starts_with(escaped), "{text}");
    assert_eq!(section, escaped);
    for field in [text, section] {
        assert!(!field.contains('<') && !field.contains('>'), "{field}");
    }
    let calls = posts(&s).await;
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(
        (&calls[0]["unfurl_links"], &calls[0]["unfurl_media"]),
        (&json!(false), &json!(false))
    );
    s.stop().await;
}

/// Unfurling is off unless the policy allows it: the installation's
/// switch, overridden per channel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unfurling_follows_the_installation_and_channel_policy() {
    let (s, _) = stack_with_model("The runbook is at https://example.com/runbook").await;
    let inst = threadline_store::testing::installations::first_id(&s.db.pool)
        .await
        .expect("installation");
    let inst = inst.to_string();
    let mut seen = Vec::new();
    for (i, step) in [
        &[][..],
        &["policy", "set", "--installation", &inst, "--unfurl", "on"][..],
        &[
            "policy",
            "channel",
            "--installation",
            &inst,
            "--channel",
            &s.channel,
            "--unfurl",
            "off",
        ][..],
        &[
            "policy",
            "channel",
            "--installation",
            &inst,
            "--channel",
            &s.channel,
            "--unfurl",
            "inherit",
        ][..],
    ]
    .into_iter()
    .enumerate()
    {
        if !step.is_empty() {
            run_cli(&s, step).await;
        }
        let root = s
            .post(
                &format!("<@{}> where is the runbook? ({i})", s.bot_user),
                None,
            )
            .await;
        let answers = s.wait_answers(&root, 1).await;
        assert_eq!(answers.len(), 1);
        let call = posts(&s)
            .await
            .into_iter()
            .find(|c| c["ts"] == answers[0]["ts"])
            .expect("the call that made the answer");
        seen.push((call["unfurl_links"].clone(), call["unfurl_media"].clone()));
    }
    assert_eq!(
        seen,
        [
            (json!(false), json!(false)),
            (json!(true), json!(true)),
            (json!(false), json!(false)),
            (json!(true), json!(true)),
        ]
    );
    let out = cli(&["policy", "show", "--installation", &inst], &env(&s)).await;
    let shown: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(shown["unfurl"], true);
    assert_eq!(shown["channels"][0]["unfurl"], Value::Null);
    s.stop().await;
}
