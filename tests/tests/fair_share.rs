//! Fair share across installations in the workers' loop, against a real
//! JetStream: one installation's backlog does not queue another's message
//! behind it, an installation holds no more than its share while another
//! waits, and a lone installation still gets every slot, with no message
//! handed back.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream;
use prost::Message as _;
use threadline_proto::v1::ContextReady;
use threadline_runtime::bus::{Topic, Topology};
use threadline_runtime::shutdown::CancellationToken;
use threadline_runtime::worker::{self, Disposition};
use threadline_testkit::{delete_streams, eventually, nats_url, unique_prefix};

const A: &str = "0190c2f4-0000-7000-8000-00000000000a";
const B: &str = "0190c2f4-0000-7000-8000-00000000000b";

#[derive(Default)]
struct Log {
    /// Installations in the order their messages started, with how many of
    /// that installation's messages were running then (itself included).
    started: Vec<(&'static str, usize)>,
    in_flight: usize,
    most_in_flight: usize,
    running_a: usize,
    running_b: usize,
    /// Deliveries after the first (messages handed back or redelivered).
    redelivered: usize,
    done: usize,
}

/// Publishes `backlog` (installation per message) to the contexts subject,
/// then runs a worker with `concurrency` slots and the given share over it,
/// each message taking 300 ms; `later` is published once the worker has
/// started `later.0` messages. Returns the log once every message is done.
async fn run(
    backlog: &[&'static str],
    concurrency: usize,
    share: u8,
    later: Option<(usize, &'static str)>,
) -> Log {
    let js = jetstream::new(async_nats::connect(nats_url()).await.expect("nats"));
    let prefix = unique_prefix();
    let topology = Topology::new(prefix.clone()).with_tenant_share(share);
    topology.declare(&js).await.expect("topology");
    let publish = |n: usize, inst: &'static str| {
        let (js, subject) = (js.clone(), topology.subject(Topic::Contexts));
        async move {
            let m = ContextReady {
                schema_version: 1,
                installation_id: inst.to_owned(),
                receipt_id: format!("0190c2f4-0000-7000-8000-{n:012}"),
                ..Default::default()
            };
            js.publish(subject, m.encode_to_vec().into())
                .await
                .expect("publish")
                .await
                .expect("ack");
        }
    };
    for (n, inst) in backlog.iter().enumerate() {
        publish(n, inst).await;
    }
    let log = Arc::new(Mutex::new(Log::default()));
    let shutdown = CancellationToken::new();
    let worker = {
        let (log, shutdown, js, topology) =
            (log.clone(), shutdown.clone(), js.clone(), topology.clone());
        tokio::spawn(async move {
            worker::run(
                js,
                topology,
                Arc::new(threadline_tenancy::dead_letter::Letters::new(None)),
                Topic::Contexts,
                concurrency,
                shutdown,
                move |msg| {
                    let log = log.clone();
                    async move {
                        let inst = ContextReady::decode(&msg.payload[..])
                            .expect("decodes")
                            .installation_id;
                        let who = if inst == A { A } else { B };
                        {
                            let mut l = log.lock().expect("log");
                            let mine = if who == A {
                                &mut l.running_a
                            } else {
                                &mut l.running_b
                            };
                            *mine += 1;
                            let mine = *mine;
                            l.started.push((who, mine));
                            l.in_flight += 1;
                            l.most_in_flight = l.most_in_flight.max(l.in_flight);
                            if msg.info().is_ok_and(|i| i.delivered > 1) {
                                l.redelivered += 1;
                            }
                        }
                        tokio::time::sleep(Duration::from_millis(300)).await;
                        let mut l = log.lock().expect("log");
                        if who == A {
                            l.running_a -= 1;
                        } else {
                            l.running_b -= 1;
                        }
                        l.in_flight -= 1;
                        l.done += 1;
                        Disposition::Done
                    }
                },
            )
            .await
        })
    };
    if let Some((after, inst)) = later {
        eventually("the worker under way", Duration::from_secs(30), || {
            let log = log.clone();
            async move { (log.lock().expect("log").started.len() >= after).then_some(()) }
        })
        .await;
        publish(backlog.len(), inst).await;
    }
    let total = backlog.len() + usize::from(later.is_some());
    eventually("every message handled", Duration::from_secs(60), || {
        let log = log.clone();
        async move { (log.lock().expect("log").done == total).then_some(()) }
    })
    .await;
    shutdown.cancel();
    worker.await.expect("worker").expect("worker ran");
    delete_streams(&js, &prefix).await;
    Arc::try_unwrap(log)
        .ok()
        .expect("the worker is gone")
        .into_inner()
        .expect("log")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_installations_backlog_does_not_queue_another_behind_it() {
    // Twelve messages of A, then one of B, for a worker with two slots: in
    // arrival order (as before fair share) B would start last.
    let mut backlog = vec![A; 12];
    backlog.push(B);
    let log = run(&backlog, 2, 50, None).await;
    let b_at = log
        .started
        .iter()
        .position(|(t, _)| *t == B)
        .expect("B ran");
    // Reading ahead takes a few pulls of one batch per slot, so a slot or
    // two may free before B's message is read: B still starts in the first
    // half, not last.
    assert!(
        b_at <= 6,
        "B started after {b_at} of A's messages: {:?}",
        log.started
    );
    assert_eq!(log.started.len(), 13, "every message ran once");
    assert_eq!(log.redelivered, 0, "nothing handed back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_arriving_behind_a_running_backlog_gets_the_next_slot() {
    // A alone fills both slots; B arrives while A's backlog runs.
    let log = run(&[A; 12], 2, 50, Some((3, B))).await;
    let b_at = log
        .started
        .iter()
        .position(|(t, _)| *t == B)
        .expect("B ran");
    let a_between = log.started[3..b_at].len();
    assert!(
        a_between <= 3,
        "{a_between} of A's messages started after B arrived and before it: {:?}",
        log.started
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_installation_holds_no_more_than_its_share_while_another_waits() {
    // Four slots, a share of half: two floods.
    let mut backlog = vec![A; 12];
    backlog.extend([B; 12]);
    let log = run(&backlog, 4, 50, None).await;
    let first_b = log
        .started
        .iter()
        .position(|(t, _)| *t == B)
        .expect("B ran");
    let last_b = log
        .started
        .iter()
        .rposition(|(t, _)| *t == B)
        .expect("B ran");
    // Once B's work is seen (its first start) and while some of it waits
    // (up to its last start), A never starts beyond two running.
    for (t, running) in &log.started[first_b..last_b] {
        if *t == A {
            assert!(
                *running <= 2,
                "A ran {running} at once while B waited: {:?}",
                log.started
            );
        }
    }
    assert_eq!(log.started.len(), 24, "every message ran once");
    assert_eq!(log.redelivered, 0, "nothing handed back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_installation_still_gets_every_slot() {
    let log = run(&[A; 8], 2, 50, None).await;
    assert_eq!(log.started.len(), 8, "each message ran once");
    assert_eq!(
        log.most_in_flight, 2,
        "with nobody else waiting, the share does not idle a slot"
    );
    let pairs = log
        .started
        .iter()
        .filter(|(_, running)| *running == 2)
        .count();
    assert!(
        pairs >= 3,
        "both slots in use for most of the backlog: {:?}",
        log.started
    );
    assert_eq!(log.redelivered, 0, "nothing handed back");
}
