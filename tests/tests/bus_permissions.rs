//! The bus as a trust boundary. A private nats-server runs with the
//! authorization `threadline nats auth` renders from the code: each role
//! logs in as its own user, may publish exactly the subjects of its work,
//! and nothing else (the internet-facing gateway not even events, let alone
//! a proposal); and with every service logged in as its own user, a mention
//! is still answered.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream;
use threadline_runtime::bus::{Topic, Topology};
use threadline_runtime::config::{CommonConfig, Source};
use threadline_runtime::nats_auth::{Permissions, Role, permissions};
use threadline_testkit::{eventually, unique_prefix};
use threadline_tests::broker::{Broker, Logins};
use threadline_tests::{Stack, cli};

/// The settings of a threadline process logged in as `role`.
fn settings(broker: &Broker, prefix: &str, role: Option<Role>) -> Vec<(&'static str, String)> {
    let mut v = vec![
        ("NATS_URL", broker.url()),
        ("THREADLINE_BUS_PREFIX", prefix.to_owned()),
    ];
    if let Some(role) = role {
        v.extend(logins(broker).env(role));
    }
    v
}

fn logins(broker: &Broker) -> &Logins {
    broker.logins().expect("a broker with authorization")
}

/// Connects as threadline's services do (`bus::connect`), as `role`.
async fn connect(broker: &Broker, prefix: &str, role: Role) -> (jetstream::Context, Topology) {
    let common =
        CommonConfig::from_source(&Source::from_pairs(settings(broker, prefix, Some(role))))
            .expect("settings");
    let client = threadline_runtime::bus::connect(&common.nats_url, "threadline-test")
        .await
        .expect("connect");
    let mut js = jetstream::new(client);
    // A refused publish never gets its PubAck: do not wait long for it.
    js.set_timeout(Duration::from_secs(3));
    (js, Topology::from_config(&common))
}

/// A plain client logged in as `role` that keeps what the broker complains
/// about.
async fn watched(broker: &Broker, role: Role) -> (async_nats::Client, Arc<Mutex<Vec<String>>>) {
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let sink = seen.clone();
    let client = async_nats::ConnectOptions::new()
        .user_and_password(role.user().to_owned(), logins(broker).password(role))
        .custom_inbox_prefix(role.inbox_prefix())
        .event_callback(move |event| {
            let sink = sink.clone();
            async move {
                if let async_nats::Event::ServerError(e) = event {
                    sink.lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(e.to_string());
                }
            }
        })
        .connect(broker.url())
        .await
        .expect("connect");
    (client, seen)
}

async fn refused(seen: &Arc<Mutex<Vec<String>>>, what: &str, subject: &str) {
    let needle = format!("Permissions Violation for {what} to \"{subject}\"");
    eventually(&needle, Duration::from_secs(10), || {
        let seen = seen.clone();
        let needle = needle.clone();
        async move {
            let seen = seen.lock().unwrap_or_else(|p| p.into_inner());
            seen.iter().any(|m| m.contains(&needle)).then_some(())
        }
    })
    .await;
}

async fn messages(js: &jetstream::Context, stream: &str) -> u64 {
    js.get_stream(stream)
        .await
        .expect("stream")
        .cached_info()
        .state
        .messages
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_user_publishes_only_its_own_subjects_and_the_gateway_no_proposal() {
    let prefix = unique_prefix();
    let broker = Broker::start_with_authorization(&prefix).await;

    // Nobody gets in without a user.
    let anonymous = async_nats::ConnectOptions::new()
        .connect(broker.url())
        .await
        .expect_err("the broker refuses an anonymous connection");
    assert!(
        anonymous.to_string().contains("authorization"),
        "{anonymous}"
    );

    // Only a declaring user sets the bus up; the others check it is there
    // and may not change it.
    let (inference_js, inference_topology) = connect(&broker, &prefix, Role::Inference).await;
    let err = inference_topology
        .declare(&inference_js)
        .await
        .expect_err("nothing is declared yet");
    assert!(format!("{err:#}").contains("may not declare"), "{err:#}");
    // The public gateway only spools: it may not declare the spool either.
    let (gateway_js, gateway_topology) = connect(&broker, &prefix, Role::Gateway).await;
    let err = gateway_topology
        .declare(&gateway_js)
        .await
        .expect_err("the gateway declares nothing");
    assert!(format!("{err:#}").contains("may not declare"), "{err:#}");
    let out = cli(
        &["nats", "declare"],
        &settings(&broker, &prefix, Some(Role::Operator)),
    )
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    inference_topology
        .declare(&inference_js)
        .await
        .expect("inference finds its streams and consumer");

    // Every user publishes on every work and dead-letter subject: the
    // broker acknowledges exactly what the code's permissions allow.
    let (admin, _) = connect(&broker, &prefix, Role::Operator).await;
    let t = Topology::new(prefix.clone());
    let subjects: Vec<(String, String)> = Topic::ALL
        .into_iter()
        .flat_map(|topic| {
            [
                (t.subject(topic), t.stream(topic)),
                (t.dead_letter_subject(topic), t.dead_letter_stream()),
            ]
        })
        .collect();
    let mut expected: std::collections::HashMap<String, u64> = Default::default();
    let mut clients = Vec::new();
    for role in Role::ALL {
        clients.push((role, connect(&broker, &prefix, role).await.0));
    }
    // Every (user, subject) at once: a refused publish waits out its PubAck.
    let tries = clients.iter().flat_map(|(role, js)| {
        subjects.iter().map(move |(subject, stream)| async move {
            let acked = match js.publish(subject.clone(), "probe".into()).await {
                Ok(ack) => ack.await.is_ok(),
                Err(_) => false,
            };
            (*role, subject, stream, acked)
        })
    });
    for (role, subject, stream, acked) in futures::future::join_all(tries).await {
        let may = Permissions::allows(&permissions(&t, role).publish, subject);
        assert_eq!(
            acked, may,
            "{role} publishing on {subject}: acknowledged {acked}, permitted {may}"
        );
        if acked {
            *expected.entry(stream.clone()).or_default() += 1;
        }
    }
    assert!(
        expected.get(&t.stream(Topic::Proposals)).copied() > Some(0),
        "the producers' proposals were stored (the check above can tell)"
    );
    for (_, stream) in &subjects {
        assert_eq!(
            messages(&admin, stream).await,
            expected.get(stream).copied().unwrap_or(0),
            "{stream} holds exactly the permitted publishes"
        );
    }

    // The CLI logs in as the operator: it lists the dead letters.
    let out = cli(
        &["dlq", "list"],
        &settings(&broker, &prefix, Some(Role::Operator)),
    )
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let letters: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(
        letters.as_array().map(|a| a.len() as u64),
        expected.get(&t.dead_letter_stream()).copied(),
        "{letters}"
    );

    // The headline case, with the broker's own words: the gateway's user
    // cannot publish a proposal, and the proposals stream is unchanged.
    let proposals = t.stream(Topic::Proposals);
    let before = messages(&admin, &proposals).await;
    let (gateway, seen) = watched(&broker, Role::Gateway).await;
    let gateway_js = {
        let mut js = jetstream::new(gateway.clone());
        js.set_timeout(Duration::from_secs(3));
        js
    };
    let subject = t.subject(Topic::Proposals);
    let ack = gateway_js
        .publish(subject.clone(), "forged proposal".into())
        .await
        .expect("sent");
    assert!(ack.await.is_err(), "no PubAck for the gateway's proposal");
    refused(&seen, "Publish", &subject).await;
    assert_eq!(messages(&admin, &proposals).await, before);

    // Nor may it read proposals, pull the publisher's consumer, or read
    // another user's replies (where pulled messages arrive); inference may
    // not read every inbox either.
    let _sub = gateway.subscribe(subject.clone()).await.expect("sent");
    refused(&seen, "Subscription", &subject).await;
    let _sub = gateway
        .subscribe(format!("{}.>", Role::Publisher.inbox_prefix()))
        .await
        .expect("sent");
    refused(
        &seen,
        "Subscription",
        &format!("{}.>", Role::Publisher.inbox_prefix()),
    )
    .await;
    let next = format!(
        "$JS.API.CONSUMER.MSG.NEXT.{proposals}.{}",
        Topic::Proposals.consumer()
    );
    gateway
        .publish(next.clone(), "{\"batch\":1}".into())
        .await
        .expect("sent");
    refused(&seen, "Publish", &next).await;
    let (inference, seen) = watched(&broker, Role::Inference).await;
    let _sub = inference.subscribe("_INBOX.>").await.expect("sent");
    refused(&seen, "Subscription", "_INBOX.>").await;
    assert_eq!(messages(&admin, &proposals).await, before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_service_logged_in_as_its_own_user_answers_a_mention() {
    let prefix = unique_prefix();
    let broker = Broker::start_with_authorization(&prefix).await;
    // Everything logged, to show that no password is.
    let s = Stack::start_with_logins(
        &[("NATS_URL", broker.url()), ("RUST_LOG", "debug".to_owned())],
        logins(&broker),
    )
    .await;
    assert_eq!(
        s.prefix, prefix,
        "the users' permissions are for this prefix"
    );
    let root = s
        .post(&format!("<@{}> are the locks on?", s.bot_user), None)
        .await;
    let answers = s.wait_answers(&root, 1).await;
    assert_eq!(answers.len(), 1, "{answers:?}");
    let metrics = s.metrics().await;
    let logs = s.stop().await;
    // No password reaches a log or a metric.
    for role in Role::ALL {
        let password = logins(&broker).password(role);
        assert!(
            !logs.contains(&password) && !metrics.contains(&password),
            "the password of {role} was logged"
        );
    }
    // Nothing any service did was refused by the broker.
    assert!(
        !logs.contains("NATS refused"),
        "a service was refused by the broker:\n{logs}"
    );
    assert!(
        !metrics.contains("threadline_bus_refusals_total"),
        "{metrics}"
    );
}
