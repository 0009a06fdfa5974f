//! The demo's Slack story as an end-to-end test: every chapter's
//! expectations, judged from slack-sim's ground truth and threadline's
//! tables, and no duplicate reply anywhere.

use threadline_tests::story;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_story_holds_every_invariant() {
    let s = story::start(&[]).await;
    let told = story::play(&s).await;
    let report = told.report();
    for c in &told.chapters {
        assert!(c.verdict.is_ok(), "{}\n\n{report}", c.title);
    }
    assert_eq!(told.totals.duplicate_replies, 0, "{report}");
    // Judged from Slack's side too: every question of the story either has
    // its one reply or a reason, and no reply missed what Slack delivered.
    assert!(told.oracle.violations.is_empty(), "{report}");
    assert_eq!(
        (told.oracle.questions, told.oracle.answered),
        (12, 11),
        "twelve questions, one stopped by the kill switch: {report}"
    );
    assert_eq!(
        told.totals.ended_early, 1,
        "the streamed chapter's stream: {report}"
    );
    assert!(told.totals.stale >= 2, "{report}");
    assert!(told.totals.reconciled >= 1, "{report}");
    assert!(told.passed());
    s.stop().await;
}
