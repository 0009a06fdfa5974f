//! A short chaos soak in CI (`make chaos` runs a longer one): random human
//! activity across three workspaces of two channels, Slack retries, lost
//! responses, 429s, posts applied after the client gave up, replies
//! injected the moment an answer reaches Slack, every service SIGKILLed
//! once mid-flight, services frozen past the stale time, a 90 s Postgres
//! outage and a NATS outage longer than the ack wait; judged by the oracle
//! from Slack's side and by threadline's records for what Slack cannot show.

use threadline_tests::broker::Broker;
use threadline_tests::{ORACLE_GRACE, Stack, chaos};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_adversarial_soak_keeps_every_invariant_as_slack_shows_it() {
    let seed = std::env::var("THREADLINE_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_261_129);
    let mut broker = Broker::start().await;
    let mut settings = chaos::settings();
    settings.push(("NATS_URL", broker.url()));
    let extra: Vec<(&str, String)> = settings.iter().map(|(k, v)| (*k, v.clone())).collect();
    let mut s = Stack::start(&extra).await;
    let mut adversary = chaos::Adversary::full();
    adversary.pauses = 2;
    let report = chaos::soak(
        &mut s,
        Some(&mut broker),
        &chaos::Config {
            seed,
            events: 160,
            extra_workspaces: 2,
            extra_channels: 1,
            rate: 5.0,
            adversary,
            grace: ORACLE_GRACE,
        },
    )
    .await;
    println!("{}", report.render());
    let f = &report.faults;
    assert_eq!(
        f.get("service_killed"),
        Some(&4),
        "each service killed once: {f:?}"
    );
    assert_eq!(f.get("postgres_outage"), Some(&1), "{f:?}");
    assert_eq!(f.get("nats_outage"), Some(&1), "{f:?}");
    assert_eq!(
        f.get("publisher_paused"),
        Some(&1),
        "the publisher frozen past the stale time: {f:?}"
    );
    assert_eq!(f.get("context_builder_paused"), Some(&1), "{f:?}");
    assert!(report.replies > 10, "the soak produced replies");
    assert!(report.violations.is_empty(), "{}", report.render());
    s.unjudged = Some("judged by the soak");
    s.stop().await;
    drop(broker);
}
