//! A short chaos soak in CI (`make chaos` runs a longer one): random human
//! activity across three workspaces of two channels and the assistant pane,
//! answers streamed (whole where a channel has streaming off), held for
//! review and clicked by a simulated reviewer; Slack retries, lost
//! responses, 429s, posts applied after the client gave up, replies
//! injected the moment an answer reaches Slack, faults on the stream
//! methods and streams Slack expires, people's messages Slack delivers
//! twice, questions it delivers late (skipped, noted or answered by their
//! workspace's policy), every service SIGKILLed once mid-flight and the
//! publisher again with a stream open, services frozen past the stale
//! time, a 90 s Postgres outage and a NATS outage longer than the ack
//! wait; judged by the oracle from Slack's side and by
//! threadline's records for what Slack cannot show.

use threadline_tests::broker::Broker;
use threadline_tests::{ORACLE_GRACE, chaos};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_adversarial_soak_keeps_every_invariant_as_slack_shows_it() {
    let seed = std::env::var("THREADLINE_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_261_129);
    let mut broker = Broker::start().await;
    let mut s = chaos::start_stack(Some(broker.url())).await;
    let mut adversary = chaos::Adversary::full();
    adversary.pauses = 2;
    let report = chaos::soak(
        &mut s,
        Some(&mut broker),
        &chaos::Config {
            seed,
            events: 200,
            extra_workspaces: 2,
            extra_channels: 1,
            rate: 5.0,
            adversary,
            grace: ORACLE_GRACE,
            stream_fault_percent: 15,
        },
    )
    .await;
    println!("{}", report.render());
    let f = &report.faults;
    assert_eq!(
        f.get("service_killed"),
        Some(&6),
        "each service killed once (the relay too), the publisher once more: {f:?}"
    );
    assert_eq!(f.get("postgres_outage"), Some(&1), "{f:?}");
    assert!(
        f.get("agent_tab_opened").is_some_and(|n| *n > 0),
        "the agent Messages tab opened after the app moved to it: {f:?}"
    );
    assert!(
        f.get("burst").is_some_and(|n| *n > 0),
        "people sent quick bursts of questions (double texting): {f:?}"
    );
    assert_eq!(f.get("nats_outage"), Some(&1), "{f:?}");
    assert_eq!(
        f.get("publisher_paused"),
        Some(&2),
        "the publisher frozen past the stale time, once more with a stream open: {f:?}"
    );
    assert_eq!(f.get("context_builder_paused"), Some(&1), "{f:?}");
    assert!(
        f.get("publisher_killed_mid_stream").unwrap_or(&0)
            + f.get("publisher_paused_mid_stream").unwrap_or(&0)
            > 0,
        "the publisher killed or frozen with a stream open: {f:?}"
    );
    // Every stream fault fired, as Slack's call log shows.
    for kind in [
        "stop_429",
        "append_429",
        "start_response_lost",
        "stop_response_lost",
        "start_503_not_applied",
        "not_in_streaming_state",
    ] {
        assert!(
            report.stream_faults.get(kind).is_some_and(|n| *n > 0),
            "the stream fault {kind} fired: {:?}",
            report.stream_faults
        );
    }
    // Every form of answer, and what answers nothing, occurred.
    for (form, n) in [
        ("posted whole", report.whole),
        ("approved by a reviewer", report.approved),
        ("streamed", report.streamed),
        ("in the pane", report.pane),
        (
            "questions of the agent Messages tab answered",
            report.agent_tab_answered,
        ),
        ("streams ended early", report.ended_early),
        (
            "streams Slack expired",
            report.expired + report.expired_answered + report.expired_closed,
        ),
        ("review requests", report.review_requests),
        ("rejected", report.rejected),
    ] {
        assert!(n > 0, "{form}: none in\n{}", report.render());
    }
    // Slack's late and doubled deliveries occurred: a person's message
    // delivered twice, and a late question under each late-event policy.
    assert!(
        report.doubled > 0,
        "no doubled delivery in\n{}",
        report.render()
    );
    for policy in ["note", "skip", "answer"] {
        assert!(
            report.late.get(policy).is_some_and(|n| *n > 0),
            "no late question under `{policy}` in\n{}",
            report.render()
        );
    }
    // People rated answers, and some changed their minds.
    assert!(
        report.feedback_clicks > report.feedback_verdicts && report.feedback_verdicts > 0,
        "feedback clicks (with some changes of mind) in\n{}",
        report.render()
    );
    assert!(report.violations.is_empty(), "{}", report.render());
    s.unjudged = Some("judged by the soak");
    s.stop().await;
    drop(broker);
}
