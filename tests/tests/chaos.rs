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
    let settings = chaos::settings();
    let extra: Vec<(&str, String)> = settings.iter().map(|(k, v)| (*k, v.clone())).collect();
    let mut s = Stack::start(&extra).await;
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
