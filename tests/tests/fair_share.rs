//! Fair share across installations in the workers' loop, against a real
//! JetStream: one installation's backlog does not queue another's message
//! behind it, and a lone installation still gets every slot.

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
    /// Installations in the order their messages started.
    started: Vec<&'static str>,
    in_flight: usize,
    most_in_flight: usize,
    done: usize,
}

/// Publishes `backlog` (installation per message) to the contexts subject,
/// then runs a worker with `concurrency` slots and the given share over it,
/// each message taking 300 ms; returns the log once every message is done.
async fn run(backlog: &[&'static str], concurrency: usize, share: u8) -> Log {
    let js = jetstream::new(async_nats::connect(nats_url()).await.expect("nats"));
    let prefix = unique_prefix();
    let topology = Topology::new(prefix.clone()).with_tenant_share(share);
    topology.declare(&js).await.expect("topology");
    for (n, inst) in backlog.iter().enumerate() {
        let m = ContextReady {
            schema_version: 1,
            installation_id: (*inst).to_owned(),
            receipt_id: format!("0190c2f4-0000-7000-8000-{n:012}"),
            ..Default::default()
        };
        js.publish(topology.subject(Topic::Contexts), m.encode_to_vec().into())
            .await
            .expect("publish")
            .await
            .expect("ack");
    }
    let log = Arc::new(Mutex::new(Log::default()));
    let shutdown = CancellationToken::new();
    let worker = {
        let (log, shutdown, js, topology) = (log.clone(), shutdown.clone(), js.clone(), topology.clone());
        tokio::spawn(async move {
            worker::run(js, topology, Topic::Contexts, concurrency, shutdown, move |msg| {
                let log = log.clone();
                async move {
                    let inst = ContextReady::decode(&msg.payload[..]).expect("decodes").installation_id;
                    let who = if inst == A { A } else { B };
                    {
                        let mut l = log.lock().expect("log");
                        l.started.push(who);
                        l.in_flight += 1;
                        l.most_in_flight = l.most_in_flight.max(l.in_flight);
                    }
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    let mut l = log.lock().expect("log");
                    l.in_flight -= 1;
                    l.done += 1;
                    Disposition::Done
                }
            })
            .await
        })
    };
    let total = backlog.len();
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
    // Twelve messages of A, then one of B, for a worker with two slots.
    let mut backlog = vec![A; 12];
    backlog.push(B);

    // Without a share (100%), B waits behind A's whole backlog: the
    // scenario is one where a tenant is stalled.
    let unfair = run(&backlog, 2, 100).await;
    assert_eq!(unfair.started.iter().position(|t| *t == B), Some(12));

    // With A held to one slot of two while work waits behind its messages,
    // the worker reads on to B's message and runs it in the other slot.
    let fair = run(&backlog, 2, 50).await;
    let b_at = fair.started.iter().position(|t| *t == B).expect("B ran");
    assert!(
        b_at <= 2,
        "B started after {b_at} of A's messages: {:?}",
        fair.started
    );
    // Handed back, not lost: every one of A's messages ran once.
    assert_eq!(fair.started.iter().filter(|t| **t == A).count(), 12);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_installation_still_gets_every_slot() {
    let log = run(&[A; 8], 2, 50).await;
    assert_eq!(log.started.len(), 8, "each message ran once");
    assert_eq!(
        log.most_in_flight, 2,
        "with nobody else waiting, the share does not idle a slot"
    );
}
