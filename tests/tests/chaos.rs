//! A short chaos soak in CI (`make chaos` runs a longer one): random human
//! activity across three workspaces, Slack retries, lost responses, 429s,
//! and every service SIGKILLed once mid-flight and restarted; then the
//! invariants are checked from Slack's ground truth.

use std::time::Duration;

use threadline_tests::{Stack, chaos};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_chaos_soak_with_every_service_killed_keeps_every_invariant() {
    let seed = std::env::var("THREADLINE_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_261_129);
    let mut s = Stack::start(&[
        ("THREADLINE_BUILTIN_LATENCY_MS", "400".to_owned()),
        ("THREADLINE_SLACK_TIMEOUT_MS", "800".to_owned()),
        ("THREADLINE_RECONCILE_WINDOW_MS", "1500".to_owned()),
        // A killed worker's message comes back after 3 s (not a minute),
        // and a post whose publisher died is taken as unknown after 4 s.
        ("THREADLINE_REDELIVERY_MS", "3000".to_owned()),
        ("THREADLINE_SENDING_STALE_MS", "4000".to_owned()),
        // A killed inference's model call is taken over after 2 × 1 s + 10 s.
        ("THREADLINE_MODEL_TIMEOUT_MS", "1000".to_owned()),
    ])
    .await;
    let report = chaos::soak(
        &mut s,
        &chaos::Config {
            seed,
            steps: 48,
            extra_workspaces: 2,
            kills: true,
            max_pause: Duration::from_millis(250),
        },
    )
    .await;
    println!("{}", report.render());
    assert_eq!(report.kills, 4, "each service was killed once");
    assert!(report.replies > 0, "the soak produced replies");
    assert!(report.violations.is_empty(), "{}", report.render());
    s.stop().await;
}
