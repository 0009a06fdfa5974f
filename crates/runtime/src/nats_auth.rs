//! Who may do what on the bus. With authorization on, every process logs in
//! to NATS as the user of its role (`NATS_USER`, `NATS_PASSWORD`), and the
//! broker lets each user publish and subscribe only where its role's work
//! is. The rights of every role are derived here, in one place, from the
//! topology ([`Topology`]: subjects, streams, consumers), and `threadline
//! nats auth` renders them as nats-server's `authorization` block, so the
//! broker's configuration is generated from the code, never hand-written.
//!
//! | user | what it does on the bus |
//! |---|---|
//! | `gateway` | nothing: the internet-facing intake only writes Postgres (it connects to report readiness) |
//! | `relay` | the outbox relay (the gateway binary with `THREADLINE_RELAY_ENABLED=true`, run apart from the public gateway): publishes the topics the outbox carries (events, reconsider, proposals) and declares the topology |
//! | `context-builder` | pulls events and reconsider, publishes contexts |
//! | `inference` | pulls contexts, publishes proposals |
//! | `publisher` | pulls proposals, re-publishes a proposal it gave up waiting on |
//! | `operator` | the CLI: every subject under the prefix and the JetStream API |
//!
//! A worker may also dead-letter what it pulls (`<prefix>.dlq.<topic>`),
//! read its streams' and consumer's info, pull (`$JS.API.CONSUMER.MSG.NEXT`)
//! and acknowledge (`$JS.ACK`) on its own consumers, and receive replies on
//! its own inbox prefix (`_INBOX.<user>`), so no user can read another's
//! replies or deliveries. Passwords are not in the rendered block: it names
//! an environment variable per user (`NATS_PASSWORD_<USER>`) that
//! nats-server reads at start (and refuses to start without).

use crate::bus::{Topic, Topology};

pub use crate::config::NatsEndpoint;
pub use crate::nats_role::Role;

/// Subjects a user may publish to and subscribe to (allow lists; an empty
/// list allows nothing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Permissions {
    pub publish: Vec<String>,
    pub subscribe: Vec<String>,
}

impl Permissions {
    /// Whether `subject` matches one of `patterns` (NATS wildcards: `*` one
    /// token, `>` the rest).
    pub fn allows(patterns: &[String], subject: &str) -> bool {
        patterns.iter().any(|p| subject_matches(p, subject))
    }
}

fn subject_matches(pattern: &str, subject: &str) -> bool {
    let mut p = pattern.split('.');
    let mut s = subject.split('.');
    loop {
        match (p.next(), s.next()) {
            (Some(">"), Some(_)) => return true,
            (Some("*"), Some(_)) => {}
            (Some(a), Some(b)) if a == b => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

/// What `role` may do on the bus of `topology`: the one place the
/// broker's permissions come from.
pub fn permissions(topology: &Topology, role: Role) -> Permissions {
    let inbox = format!("{}.>", role.inbox_prefix());
    let mut publish: Vec<String> = Vec::new();
    match role {
        Role::Operator => {
            // The CLI lists, replays and drops dead letters and declares the
            // topology: the whole prefix and the JetStream API.
            publish.push(format!("{}.>", topology.prefix()));
            publish.push("$JS.API.>".to_owned());
            publish.push("$JS.ACK.>".to_owned());
        }
        _ => {
            for topic in role.publishes() {
                publish.push(topology.subject(*topic));
            }
            for topic in role.consumes() {
                publish.push(topology.dead_letter_subject(*topic));
            }
            for stream in role.streams(topology) {
                publish.push(format!("$JS.API.STREAM.INFO.{stream}"));
                if role.declares() {
                    publish.push(format!("$JS.API.STREAM.CREATE.{stream}"));
                    publish.push(format!("$JS.API.STREAM.UPDATE.{stream}"));
                }
            }
            if role.declares() {
                for topic in Topic::ALL {
                    let (stream, consumer) = (topology.stream(topic), topic.consumer());
                    publish.push(format!("$JS.API.CONSUMER.CREATE.{stream}.{consumer}"));
                    publish.push(format!("$JS.API.CONSUMER.INFO.{stream}.{consumer}"));
                }
            }
            for topic in role.consumes() {
                let (stream, consumer) = (topology.stream(*topic), topic.consumer());
                if !role.declares() {
                    publish.push(format!("$JS.API.CONSUMER.INFO.{stream}.{consumer}"));
                }
                publish.push(format!("$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}"));
                publish.push(format!("$JS.ACK.{stream}.{consumer}.>"));
            }
        }
    }
    Permissions {
        publish,
        subscribe: vec![inbox],
    }
}

/// How `threadline nats auth` writes the block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// nats-server's configuration syntax: `authorization { users = [...] }`
    /// with each password a variable (`$NATS_PASSWORD_GATEWAY`) that
    /// nats-server reads from its environment.
    Conf,
    /// JSON for the NATS Helm chart's `config.merge` (`{"authorization":
    /// …}`), each password as the chart's raw form `<< $NATS_PASSWORD_… >>`.
    Helm,
}

/// The `authorization` block for every role of `topology`.
pub fn render(topology: &Topology, format: Format) -> String {
    match format {
        Format::Conf => render_conf(topology),
        Format::Helm => {
            let users: Vec<serde_json::Value> = Role::ALL
                .into_iter()
                .map(|role| {
                    serde_json::json!({
                        "user": role.user(),
                        "password": format!("<< ${} >>", role.password_variable()),
                        "permissions": permissions_json(&permissions(topology, role)),
                    })
                })
                .collect();
            let doc = serde_json::json!({ "authorization": { "users": users } });
            let mut text = serde_json::to_string_pretty(&doc).unwrap_or_default();
            text.push('\n');
            text
        }
    }
}

fn permissions_json(p: &Permissions) -> serde_json::Value {
    let side = |allow: &[String]| {
        if allow.is_empty() {
            serde_json::json!({ "deny": [">"] })
        } else {
            serde_json::json!({ "allow": allow })
        }
    };
    serde_json::json!({ "publish": side(&p.publish), "subscribe": side(&p.subscribe) })
}

fn quoted(s: &str) -> String {
    serde_json::Value::String(s.to_owned()).to_string()
}

fn render_conf(topology: &Topology) -> String {
    let side = |name: &str, allow: &[String]| -> String {
        // An empty allow list would allow everything: nothing is `deny >`.
        let (kind, list) = if allow.is_empty() {
            ("deny", vec![quoted(">")])
        } else {
            ("allow", allow.iter().map(|s| quoted(s)).collect())
        };
        let mut out = format!("        {name}: {{\n          {kind}: [\n");
        for s in list {
            out.push_str(&format!("            {s}\n"));
        }
        out.push_str("          ]\n        }\n");
        out
    };
    let mut out = format!(
        "# threadline's NATS users for the bus prefix {} (rendered by `threadline nats auth`).\n\
         # nats-server reads each password from its environment ({} …) and does not\n\
         # start without them.\n\
         authorization {{\n  users = [\n",
        quoted(topology.prefix()),
        Role::Gateway.password_variable(),
    );
    for role in Role::ALL {
        let p = permissions(topology, role);
        out.push_str("    {\n");
        out.push_str(&format!("      user: {}\n", quoted(role.user())));
        out.push_str(&format!("      password: ${}\n", role.password_variable()));
        out.push_str("      permissions: {\n");
        out.push_str(&side("publish", &p.publish));
        out.push_str(&side("subscribe", &p.subscribe));
        out.push_str("      }\n    }\n");
    }
    out.push_str("  ]\n}\n");
    out
}

/// A new random password for a NATS user: `p` and 32 random bytes in hex.
/// nats-server parses the value of the variable a password names as a
/// configuration value, so a password must start with a letter: `1234` would
/// be a number and `12e5ab` a parse error, and the server would not start.
pub fn generate_password() -> String {
    use chacha20poly1305::aead::{KeyInit as _, OsRng};
    let key = chacha20poly1305::XChaCha20Poly1305::generate_key(&mut OsRng);
    format!("p{}", hex::encode(key))
}

pub use crate::bus_refusal::{Refusal, refusal, report};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{DEFAULT_NATS_URL, Source};

    fn t() -> Topology {
        Topology::new("tl")
    }

    fn can_publish(role: Role, subject: &str) -> bool {
        Permissions::allows(&permissions(&t(), role).publish, subject)
    }

    #[test]
    fn the_public_gateway_may_only_spool() {
        let p = permissions(&t(), Role::Gateway);
        assert_eq!(
            p.publish,
            vec![
                "tl.spool".to_owned(),
                "$JS.API.STREAM.INFO.TL_SPOOL".to_owned()
            ],
            "publishing a delivery and reading the spool's depth, nothing else"
        );
        assert_eq!(p.subscribe, vec!["_INBOX.gateway.>".to_owned()]);
        for subject in [
            "tl.events",
            "tl.proposals",
            "$JS.API.CONSUMER.MSG.NEXT.TL_SPOOL.spool-drainer",
            "$JS.ACK.TL_SPOOL.spool-drainer.1.2.3.4.5",
            "$JS.API.STREAM.UPDATE.TL_SPOOL",
            "$JS.API.STREAM.PURGE.TL_SPOOL",
        ] {
            assert!(!can_publish(Role::Gateway, subject), "{subject}");
        }
        // The drainer (beside the relay) pulls it; the publisher only
        // reads its depth.
        assert!(can_publish(
            Role::Relay,
            "$JS.API.CONSUMER.MSG.NEXT.TL_SPOOL.spool-drainer"
        ));
        assert!(can_publish(Role::Publisher, "$JS.API.STREAM.INFO.TL_SPOOL"));
        assert!(!can_publish(Role::Publisher, "tl.spool"));
        assert!(!can_publish(
            Role::Publisher,
            "$JS.API.CONSUMER.MSG.NEXT.TL_SPOOL.spool-drainer"
        ));
    }

    #[test]
    fn only_the_producers_publish_proposals() {
        for role in Role::ALL {
            let expected = matches!(
                role,
                Role::Inference | Role::Publisher | Role::Relay | Role::Operator
            );
            assert_eq!(can_publish(role, "tl.proposals"), expected, "{role}");
        }
        assert!(!can_publish(Role::Inference, "tl.events"));
        assert!(!can_publish(Role::Inference, "tl.contexts"));
        assert!(!can_publish(Role::ContextBuilder, "tl.proposals"));
        assert!(can_publish(Role::ContextBuilder, "tl.contexts"));
        assert!(can_publish(Role::ContextBuilder, "tl.dlq.events"));
        assert!(!can_publish(Role::ContextBuilder, "tl.dlq.contexts"));
    }

    #[test]
    fn workers_pull_and_ack_only_their_own_consumers() {
        assert!(can_publish(
            Role::Inference,
            "$JS.API.CONSUMER.MSG.NEXT.TL_CONTEXTS.inference"
        ));
        assert!(can_publish(
            Role::Inference,
            "$JS.ACK.TL_CONTEXTS.inference.1.2.3.4.5"
        ));
        assert!(!can_publish(
            Role::Inference,
            "$JS.API.CONSUMER.MSG.NEXT.TL_PROPOSALS.publisher"
        ));
        assert!(!can_publish(
            Role::Inference,
            "$JS.ACK.TL_PROPOSALS.publisher.1.2.3.4.5"
        ));
        for role in [Role::ContextBuilder, Role::Inference, Role::Publisher] {
            for verb in ["CREATE", "UPDATE", "DELETE", "PURGE"] {
                assert!(
                    !can_publish(role, &format!("$JS.API.STREAM.{verb}.TL_PROPOSALS")),
                    "{role} {verb}"
                );
            }
            assert!(!can_publish(
                role,
                "$JS.API.CONSUMER.CREATE.TL_EVENTS.context-builder"
            ));
        }
        assert!(can_publish(Role::Relay, "$JS.API.STREAM.UPDATE.TL_DLQ"));
        assert!(can_publish(
            Role::Relay,
            "$JS.API.CONSUMER.CREATE.TL_RECONSIDER.context-builder-reconsider"
        ));
        assert!(!can_publish(Role::Relay, "$JS.API.STREAM.DELETE.TL_EVENTS"));
        assert!(!can_publish(
            Role::Relay,
            "$JS.API.CONSUMER.MSG.NEXT.TL_EVENTS.context-builder"
        ));
    }

    #[test]
    fn each_user_receives_replies_only_on_its_own_inbox() {
        for role in Role::ALL {
            let subs = permissions(&t(), role).subscribe;
            for other in Role::ALL {
                let reply = format!("{}.abc.1", other.inbox_prefix());
                assert_eq!(
                    Permissions::allows(&subs, &reply),
                    role == other,
                    "{role} reading {other}'s replies"
                );
            }
            assert!(!Permissions::allows(&subs, "_INBOX.abc"));
            assert!(!Permissions::allows(&subs, "tl.proposals"));
        }
    }

    #[test]
    fn every_topic_has_one_consumer_role_and_a_producer() {
        for topic in Topic::ALL {
            let consumers: Vec<Role> = Role::ALL
                .into_iter()
                .filter(|r| r.consumes().contains(&topic))
                .collect();
            assert_eq!(consumers.len(), 1, "{topic:?}: {consumers:?}");
            assert!(
                Role::ALL.iter().any(|r| r.publishes().contains(&topic)),
                "{topic:?} has no producer"
            );
        }
    }

    #[test]
    fn subjects_follow_the_prefix() {
        let p = permissions(&Topology::new("t9"), Role::Inference);
        assert!(p.publish.contains(&"t9.proposals".to_owned()), "{p:?}");
        assert!(
            p.publish
                .contains(&"$JS.API.STREAM.INFO.T9_CONTEXTS".to_owned())
        );
        assert!(!p.publish.iter().any(|s| s.contains("tl.")), "{p:?}");
    }

    #[test]
    fn renderings_name_every_user_and_no_secret() {
        let conf = render(&t(), Format::Conf);
        let helm = render(&t(), Format::Helm);
        let doc: serde_json::Value = serde_json::from_str(&helm).expect("json");
        let users = doc["authorization"]["users"].as_array().expect("users");
        assert_eq!(users.len(), Role::ALL.len());
        for role in Role::ALL {
            assert!(conf.contains(&format!(
                "user: \"{}\"\n      password: ${}\n",
                role.user(),
                role.password_variable()
            )));
            let u = users
                .iter()
                .find(|u| u["user"] == role.user())
                .expect("user");
            assert_eq!(
                u["password"],
                format!("<< ${} >>", role.password_variable())
            );
        }
        assert_eq!(
            Role::ContextBuilder.password_variable(),
            "NATS_PASSWORD_CONTEXT_BUILDER"
        );
    }

    #[test]
    fn the_deployed_values_are_what_the_code_renders() {
        // deploy/k8s/nats/authorization.json is this rendering for the
        // deployments' prefix; scripts/deploy-check.sh checks that the NATS
        // Helm values carry exactly it.
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../deploy/k8s/nats/authorization.json"
        );
        let committed = std::fs::read_to_string(path).expect("authorization.json");
        assert!(
            committed == render(&t(), Format::Helm),
            "deploy/k8s/nats/authorization.json differs from the code's permissions; regenerate it:\n  \
             threadline nats auth --prefix tl --format helm > deploy/k8s/nats/authorization.json"
        );
    }

    #[test]
    fn credentials_are_both_or_neither_and_never_shown() {
        let src = |pairs: &[(&str, &str)]| Source::from_pairs(pairs.iter().copied());
        let e = NatsEndpoint::from_source(&src(&[])).expect("anonymous");
        assert_eq!(e.role(), None);
        assert_eq!(e.url(), DEFAULT_NATS_URL);
        for (pairs, key) in [
            (&[("NATS_USER", "inference")][..], "NATS_PASSWORD"),
            (&[("NATS_PASSWORD", "pw")][..], "NATS_USER"),
            (
                &[("NATS_USER", "root"), ("NATS_PASSWORD", "pw")][..],
                "NATS_USER",
            ),
            (
                &[
                    ("NATS_USER", "relay"),
                    ("NATS_PASSWORD", "pw"),
                    ("NATS_URL", "nats://a:b@h:4222"),
                ][..],
                "NATS_URL",
            ),
        ] {
            let err = NatsEndpoint::from_source(&src(pairs))
                .expect_err(key)
                .to_string();
            assert!(err.contains(key), "{err}");
            assert!(!err.contains("pw"), "{err}");
        }
        let e = NatsEndpoint::from_source(&src(&[
            ("NATS_USER", "publisher"),
            ("NATS_PASSWORD", "hunter2-secret"),
        ]))
        .expect("valid");
        assert_eq!(e.role(), Some(Role::Publisher));
        assert!(!format!("{e:?}").contains("hunter2"), "{e:?}");
    }

    #[test]
    fn refusals_are_told_apart() {
        use async_nats::{Event, ServerError};
        assert_eq!(
            refusal(&Event::ServerError(ServerError::AuthorizationViolation)),
            Some(Refusal::Login)
        );
        let m = "Permissions Violation for Publish to \"tl.proposals\"".to_owned();
        assert_eq!(
            refusal(&Event::ServerError(ServerError::Other(m.clone()))),
            Some(Refusal::Permission(m))
        );
        assert_eq!(refusal(&Event::Connected), None);
        assert_eq!(
            refusal(&Event::ServerError(ServerError::Other("slow".into()))),
            None
        );
    }

    #[test]
    fn generated_passwords_are_strings_to_nats_server() {
        let a = generate_password();
        assert_eq!(a.len(), 65);
        assert!(a.starts_with('p'), "{a}");
        assert!(a[1..].bytes().all(|b| b.is_ascii_hexdigit()), "{a}");
        assert_ne!(a, generate_password());
    }

    #[test]
    fn wildcards_match_as_nats_does() {
        assert!(subject_matches("a.>", "a.b.c"));
        assert!(!subject_matches("a.>", "a"));
        assert!(subject_matches("a.*.c", "a.b.c"));
        assert!(!subject_matches("a.*", "a.b.c"));
        assert!(subject_matches("a.b", "a.b"));
        assert!(!subject_matches("a.b", "a.bc"));
    }
}
