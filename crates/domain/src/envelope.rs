//! The outer body Slack POSTs to the Events API request URL.

use serde_json::Value;

use crate::event::{EventError, EventRef};
use crate::ids::{AppId, EnterpriseId, EventId, IdError, TeamId, UserId};

#[derive(Debug, Clone, PartialEq)]
pub enum Envelope {
    /// Slack checking the request URL; answered by echoing `challenge`.
    UrlVerification {
        challenge: String,
    },
    EventCallback(Box<EventCallback>),
    /// Slack telling us it is dropping events for this app (more than 30,000
    /// an hour for a workspace). An operator alert, never a job.
    AppRateLimited {
        api_app_id: Option<AppId>,
        team_id: Option<TeamId>,
        minute_rate_limited: Option<i64>,
    },
    /// An envelope type threadline does not handle; kept, not rejected.
    Other {
        envelope_type: String,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub struct EventCallback {
    pub api_app_id: AppId,
    pub team_id: Option<TeamId>,
    pub enterprise_id: Option<EnterpriseId>,
    pub event_id: EventId,
    /// Seconds since the epoch, as Slack sent it.
    pub event_time: i64,
    pub authorizations: Vec<Authorization>,
    pub is_ext_shared_channel: bool,
    pub event: EventRef,
    /// The inner `event` object exactly as received, forwarded on the bus.
    pub event_json: Value,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Authorization {
    pub enterprise_id: Option<EnterpriseId>,
    pub team_id: Option<TeamId>,
    pub user_id: Option<UserId>,
    pub is_bot: bool,
    pub is_enterprise_install: bool,
}

/// What identifies the installation an event belongs to. Taken from the
/// envelope's first `authorizations` entry when present (it names the
/// installation the event is visible to, which differs from `team_id` in
/// shared channels), else from the envelope's `team_id` / `enterprise_id`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct InstallationKey {
    pub app_id: AppId,
    pub team_id: Option<TeamId>,
    pub enterprise_id: Option<EnterpriseId>,
    pub is_enterprise_install: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvelopeError {
    #[error("body is not valid JSON")]
    NotJson,
    #[error("body is not a JSON object")]
    NotAnObject,
    #[error("`{field}` is missing")]
    Missing { field: &'static str },
    #[error("`{field}` has the wrong JSON type")]
    WrongType { field: &'static str },
    #[error("`{field}`: {source}")]
    BadId {
        field: &'static str,
        #[source]
        source: IdError,
    },
    #[error(transparent)]
    Event(#[from] EventError),
}

impl EnvelopeError {
    /// A short, content-free reason code for rejection records and metrics.
    pub fn reason_code(&self) -> &'static str {
        match self {
            Self::NotJson => "malformed_json",
            Self::NotAnObject => "malformed_envelope",
            Self::Missing { .. } => "missing_field",
            Self::WrongType { .. } => "wrong_type",
            Self::BadId { .. } => "bad_identifier",
            Self::Event(_) => "malformed_event",
        }
    }
}

fn opt_str<'a>(obj: &'a Value, field: &'static str) -> Result<Option<&'a str>, EnvelopeError> {
    match obj.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(EnvelopeError::WrongType { field }),
    }
}

fn opt_id<T>(
    obj: &Value,
    field: &'static str,
    parse: impl Fn(String) -> Result<T, IdError>,
) -> Result<Option<T>, EnvelopeError> {
    opt_str(obj, field)?
        .map(|s| parse(s.to_owned()).map_err(|source| EnvelopeError::BadId { field, source }))
        .transpose()
}

fn req_id<T>(
    obj: &Value,
    field: &'static str,
    parse: impl Fn(String) -> Result<T, IdError>,
) -> Result<T, EnvelopeError> {
    opt_id(obj, field, parse)?.ok_or(EnvelopeError::Missing { field })
}

fn opt_bool(obj: &Value, field: &'static str) -> Result<bool, EnvelopeError> {
    match obj.get(field) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(EnvelopeError::WrongType { field }),
    }
}

impl Envelope {
    pub fn parse(body: &[u8]) -> Result<Self, EnvelopeError> {
        let root: Value = serde_json::from_slice(body).map_err(|_| EnvelopeError::NotJson)?;
        Self::from_value(root)
    }

    pub fn from_value(mut root: Value) -> Result<Self, EnvelopeError> {
        if !root.is_object() {
            return Err(EnvelopeError::NotAnObject);
        }
        let envelope_type = opt_str(&root, "type")?
            .ok_or(EnvelopeError::Missing { field: "type" })?
            .to_owned();
        match envelope_type.as_str() {
            "url_verification" => Ok(Self::UrlVerification {
                challenge: opt_str(&root, "challenge")?
                    .ok_or(EnvelopeError::Missing { field: "challenge" })?
                    .to_owned(),
            }),
            "app_rate_limited" => Ok(Self::AppRateLimited {
                api_app_id: opt_id(&root, "api_app_id", AppId::parse)?,
                team_id: opt_id(&root, "team_id", TeamId::parse)?,
                minute_rate_limited: root.get("minute_rate_limited").and_then(Value::as_i64),
            }),
            "event_callback" => {
                let event_json = root
                    .get_mut("event")
                    .map(Value::take)
                    .ok_or(EnvelopeError::Missing { field: "event" })?;
                let event = EventRef::parse(&event_json)?;
                let authorizations = match root.get("authorizations") {
                    None | Some(Value::Null) => Vec::new(),
                    Some(Value::Array(items)) => items
                        .iter()
                        .map(parse_authorization)
                        .collect::<Result<_, _>>()?,
                    Some(_) => {
                        return Err(EnvelopeError::WrongType {
                            field: "authorizations",
                        });
                    }
                };
                let event_time =
                    match root.get("event_time") {
                        Some(Value::Number(n)) => n.as_i64().and_then(event_time_seconds).ok_or(
                            EnvelopeError::WrongType {
                                field: "event_time",
                            },
                        )?,
                        None | Some(Value::Null) => {
                            return Err(EnvelopeError::Missing {
                                field: "event_time",
                            });
                        }
                        Some(_) => {
                            return Err(EnvelopeError::WrongType {
                                field: "event_time",
                            });
                        }
                    };
                Ok(Self::EventCallback(Box::new(EventCallback {
                    api_app_id: req_id(&root, "api_app_id", AppId::parse)?,
                    team_id: opt_id(&root, "team_id", TeamId::parse)?,
                    enterprise_id: opt_id(&root, "enterprise_id", EnterpriseId::parse)?,
                    event_id: req_id(&root, "event_id", EventId::parse)?,
                    event_time,
                    authorizations,
                    is_ext_shared_channel: opt_bool(&root, "is_ext_shared_channel")?,
                    event,
                    event_json,
                })))
            }
            _ => Ok(Self::Other { envelope_type }),
        }
    }
}

fn parse_authorization(v: &Value) -> Result<Authorization, EnvelopeError> {
    if !v.is_object() {
        return Err(EnvelopeError::WrongType {
            field: "authorizations",
        });
    }
    Ok(Authorization {
        enterprise_id: opt_id(v, "enterprise_id", EnterpriseId::parse)?,
        team_id: opt_id(v, "team_id", TeamId::parse)?,
        user_id: opt_id(v, "user_id", UserId::parse)?,
        is_bot: opt_bool(v, "is_bot")?,
        is_enterprise_install: opt_bool(v, "is_enterprise_install")?,
    })
}

/// `event_time` as seconds since the epoch. Slack documents seconds, yet
/// its own `app_mention` example carries microseconds, and milliseconds are
/// a common slip. Each unit is read only in the range where it means a time
/// between 1973-03-03 and the year 5138, so the ranges cannot overlap and a
/// real value in seconds (below 10^11) is never rescaled.
pub fn event_time_seconds(raw: i64) -> Option<i64> {
    const E11: i64 = 100_000_000_000;
    const E14: i64 = 100_000_000_000_000;
    const E17: i64 = 100_000_000_000_000_000;
    match raw {
        0..E11 => Some(raw),
        E11..E14 => Some(raw / 1_000),
        E14..E17 => Some(raw / 1_000_000),
        _ => None,
    }
}

/// The installation an event belongs to: the first `authorizations` entry
/// when present, else the envelope's `team_id` / `enterprise_id`.
fn installation_key(
    app_id: &AppId,
    team_id: Option<&TeamId>,
    enterprise_id: Option<&EnterpriseId>,
    first: Option<&Authorization>,
) -> InstallationKey {
    match first {
        Some(a) if a.is_enterprise_install => InstallationKey {
            app_id: app_id.clone(),
            team_id: None,
            enterprise_id: a.enterprise_id.clone().or_else(|| enterprise_id.cloned()),
            is_enterprise_install: true,
        },
        Some(a) => InstallationKey {
            app_id: app_id.clone(),
            team_id: a.team_id.clone().or_else(|| team_id.cloned()),
            enterprise_id: a.enterprise_id.clone().or_else(|| enterprise_id.cloned()),
            is_enterprise_install: false,
        },
        None => InstallationKey {
            app_id: app_id.clone(),
            team_id: team_id.cloned(),
            enterprise_id: enterprise_id.cloned(),
            is_enterprise_install: false,
        },
    }
}

impl EventCallback {
    pub fn installation_key(&self) -> InstallationKey {
        installation_key(
            &self.api_app_id,
            self.team_id.as_ref(),
            self.enterprise_id.as_ref(),
            self.authorizations.first(),
        )
    }
}

/// What identifies an `event_callback` delivery, read leniently from a body
/// that [`Envelope::parse`] refused: enough to record it durably as
/// `unparsed`, deduplicate its retries and find its installation. Only
/// identifiers are kept, never text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryIdentity {
    pub api_app_id: AppId,
    pub event_id: EventId,
    pub team_id: Option<TeamId>,
    pub enterprise_id: Option<EnterpriseId>,
    /// `event.type` when it is a Slack type name.
    pub event_type: Option<String>,
    /// `event_time` in seconds, when it reads as a time.
    pub event_time: Option<i64>,
    first_authorization: Option<Authorization>,
}

impl DeliveryIdentity {
    /// The identity of a JSON object whose `type` is `event_callback` and
    /// which carries well-formed `event_id` and `api_app_id` strings and a
    /// team (`team_id` or `authorizations[0].team_id`) or an enterprise
    /// (`enterprise_id` or `authorizations[0].enterprise_id`). Anything else
    /// has no identity: a delivery without one cannot be kept.
    pub fn from_body(body: &[u8]) -> Option<Self> {
        Self::from_value(&serde_json::from_slice(body).ok()?)
    }

    pub fn from_value(root: &Value) -> Option<Self> {
        if root.get("type")?.as_str()? != "event_callback" {
            return None;
        }
        let id = |obj: &Value, field: &str| obj.get(field)?.as_str().map(str::to_owned);
        let api_app_id = AppId::parse(id(root, "api_app_id")?).ok()?;
        let event_id = EventId::parse(id(root, "event_id")?).ok()?;
        let first = root
            .get("authorizations")
            .and_then(|a| a.get(0))
            .filter(|a| a.is_object());
        let lenient_bool = |obj: &Value, field: &str| obj.get(field).and_then(Value::as_bool);
        let first_authorization = first.map(|a| Authorization {
            enterprise_id: id(a, "enterprise_id").and_then(|s| EnterpriseId::parse(s).ok()),
            team_id: id(a, "team_id").and_then(|s| TeamId::parse(s).ok()),
            user_id: id(a, "user_id").and_then(|s| UserId::parse(s).ok()),
            is_bot: lenient_bool(a, "is_bot").unwrap_or(false),
            is_enterprise_install: lenient_bool(a, "is_enterprise_install").unwrap_or(false),
        });
        let team_id = id(root, "team_id").and_then(|s| TeamId::parse(s).ok());
        let enterprise_id = id(root, "enterprise_id").and_then(|s| EnterpriseId::parse(s).ok());
        let has_tenant = team_id.is_some()
            || enterprise_id.is_some()
            || first_authorization
                .as_ref()
                .is_some_and(|a| a.team_id.is_some() || a.enterprise_id.is_some());
        if !has_tenant {
            return None;
        }
        let event_type = root
            .get("event")
            .and_then(|e| e.get("type"))
            .and_then(Value::as_str)
            .filter(|t| crate::event::check_name("type", t).is_ok())
            .map(str::to_owned);
        let event_time = root
            .get("event_time")
            .and_then(Value::as_i64)
            .and_then(event_time_seconds);
        Some(Self {
            api_app_id,
            event_id,
            team_id,
            enterprise_id,
            event_type,
            event_time,
            first_authorization,
        })
    }

    pub fn installation_key(&self) -> InstallationKey {
        installation_key(
            &self.api_app_id,
            self.team_id.as_ref(),
            self.enterprise_id.as_ref(),
            self.first_authorization.as_ref(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{EventKind, MessageSubtype};
    use std::path::PathBuf;

    fn fixture(name: &str) -> Vec<u8> {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/slack/events")
            .join(name);
        std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    fn callback(name: &str) -> EventCallback {
        match Envelope::parse(&fixture(name)).expect(name) {
            Envelope::EventCallback(cb) => *cb,
            other => panic!("{name}: not an event_callback: {other:?}"),
        }
    }

    #[test]
    fn every_event_fixture_parses() {
        let dir =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/slack/events");
        let mut seen = 0;
        for entry in std::fs::read_dir(dir).expect("fixtures dir") {
            let path = entry.expect("entry").path();
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default()
                .to_owned();
            if !name.ends_with(".json") || name.contains("event-only") {
                continue;
            }
            Envelope::parse(&std::fs::read(&path).expect("read"))
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            seen += 1;
        }
        assert!(seen >= 15, "only {seen} fixtures parsed");
    }

    #[test]
    fn url_verification_carries_the_challenge() {
        assert_eq!(
            Envelope::parse(&fixture("url_verification.bolt-python.json")).expect("parses"),
            Envelope::UrlVerification {
                challenge: "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P".into()
            }
        );
    }

    #[test]
    fn app_mention_identifiers() {
        let cb = callback("app_mention.bolt-python.json");
        assert_eq!(cb.event_id.as_str(), "Ev111");
        assert_eq!(cb.event.kind, EventKind::AppMention);
        assert_eq!(cb.event.channel.as_ref().map(|c| c.as_str()), Some("C111"));
        assert_eq!(
            cb.event.root().map(|t| t.as_str()),
            Some("1595926230.009600")
        );
        // No `authorizations`: the envelope's team names the installation.
        let key = cb.installation_key();
        assert_eq!(key.team_id.as_ref().map(|t| t.as_str()), Some("T111"));
        assert!(!key.is_enterprise_install);
    }

    #[test]
    fn org_wide_install_has_null_team_and_resolves_by_enterprise() {
        let cb = callback("message_org_install_authorizations.bolt-python.json");
        let key = cb.installation_key();
        assert!(key.is_enterprise_install);
        assert_eq!(key.team_id, None);
        assert_eq!(key.enterprise_id.as_ref().map(|e| e.as_str()), Some("E111"));
    }

    #[test]
    fn authorizations_win_over_envelope_team() {
        let cb = callback("message_changed.bolt-python.json");
        assert_eq!(cb.team_id.as_ref().map(|t| t.as_str()), Some("T111"));
        assert_eq!(
            cb.installation_key().team_id.as_ref().map(|t| t.as_str()),
            Some("T-auth")
        );
    }

    #[test]
    fn message_changed_without_inner_ts_uses_previous_message() {
        let cb = callback("message_changed.bolt-python.json");
        assert_eq!(
            cb.event.kind,
            EventKind::Message(MessageSubtype::MessageChanged)
        );
        assert_eq!(
            cb.event.ts.as_ref().map(|t| t.as_str()),
            Some("1665102338.901939")
        );
        let cb = callback("message_changed.slack-morphism.json");
        assert_eq!(
            cb.event.ts.as_ref().map(|t| t.as_str()),
            Some("1701735043.989889")
        );
    }

    #[test]
    fn message_deleted_points_at_the_deleted_message() {
        let cb = callback("message_deleted.bolt-python.json");
        assert_eq!(
            cb.event.kind,
            EventKind::Message(MessageSubtype::MessageDeleted)
        );
        assert_eq!(
            cb.event.ts.as_ref().map(|t| t.as_str()),
            Some("1665368619.804829")
        );
    }

    #[test]
    fn thread_broadcast_belongs_to_its_thread() {
        let cb = callback("thread_broadcast.bolt-python.json");
        assert_eq!(
            cb.event.kind,
            EventKind::Message(MessageSubtype::ThreadBroadcast)
        );
        assert_eq!(
            cb.event.root().map(|t| t.as_str()),
            Some("1633663824.000500")
        );
    }

    #[test]
    fn lifecycle_events_are_typed() {
        assert_eq!(
            callback("app_uninstalled.bolt-python.json").event.kind,
            EventKind::AppUninstalled
        );
        assert_eq!(
            callback("tokens_revoked.bolt-python.json").event.kind,
            EventKind::TokensRevoked
        );
    }

    #[test]
    fn malformed_envelopes_have_reason_codes() {
        let cases: [(&[u8], &str); 9] = [
            (b"not json", "malformed_json"),
            (b"[1,2]", "malformed_envelope"),
            (br#"{"type":"event_callback","api_app_id":"A1","event_time":1,"event":{"type":"message"}}"#, "missing_field"),
            (br#"{"type":"event_callback","api_app_id":"A1","event_id":"Ev1","event_time":"x","event":{"type":"message"}}"#, "wrong_type"),
            (br#"{"type":"event_callback","api_app_id":"A1","event_id":"Ev1","event_time":-1,"event":{"type":"message"}}"#, "wrong_type"),
            (br#"{"type":"event_callback","api_app_id":"A 1","event_id":"Ev1","event_time":1,"event":{"type":"message"}}"#, "bad_identifier"),
            (br#"{"type":"event_callback","api_app_id":"A1","event_id":"Ev1","event_time":1,"event":{"type":"message","ts":"x"}}"#, "malformed_event"),
            (br#"{"type":"event_callback","api_app_id":"A1","event_id":"Ev1","event_time":1}"#, "missing_field"),
            (br#"{"type":"event_callback","api_app_id":"A1","event_id":"Ev1","event_time":100000000000000000,"event":{"type":"message"}}"#, "wrong_type"),
        ];
        for (body, code) in cases {
            let err = Envelope::parse(body).expect_err(std::str::from_utf8(body).unwrap_or("?"));
            assert_eq!(err.reason_code(), code, "{err}");
        }
    }

    #[test]
    fn slacks_documented_app_mention_parses_with_event_time_in_seconds() {
        // https://api.slack.com/events/app_mention: `event_time` in
        // microseconds, `event_ts` without its dot, `authed_users`.
        let cb = callback("app_mention.slack-docs.json");
        assert_eq!(cb.event_id.as_str(), "Ev0LAN670R");
        assert_eq!(cb.event_time, 1_515_449_522);
        assert_eq!(cb.event.kind, EventKind::AppMention);
        assert_eq!(
            cb.event.root().map(|t| t.as_str()),
            Some("1515449522.000016")
        );
        assert_eq!(
            cb.installation_key().team_id.as_ref().map(|t| t.as_str()),
            Some("T061EG9R6")
        );
    }

    #[test]
    fn event_time_in_seconds_milliseconds_or_microseconds() {
        let s = 1_515_449_522;
        assert_eq!(event_time_seconds(s), Some(s));
        assert_eq!(event_time_seconds(s * 1_000 + 999), Some(s));
        assert_eq!(event_time_seconds(s * 1_000_000 + 16), Some(s));
        assert_eq!(event_time_seconds(0), Some(0));
        // Every second value up to the year 5138 stays seconds.
        assert_eq!(event_time_seconds(99_999_999_999), Some(99_999_999_999));
        // The ranges meet without overlapping: 1973-03-03 in each unit.
        assert_eq!(event_time_seconds(100_000_000_000), Some(100_000_000));
        assert_eq!(event_time_seconds(100_000_000_000_000), Some(100_000_000));
        for bad in [-1, i64::MIN, 100_000_000_000_000_000, i64::MAX] {
            assert_eq!(event_time_seconds(bad), None, "{bad}");
        }
    }

    #[test]
    fn identity_of_deliveries_that_do_not_parse() {
        let body = br#"{"type":"event_callback","api_app_id":"A1","event_id":"Ev1","team_id":"T1",
                        "event_time":1515449522000,"event":{"type":"message","ts":"yesterday"}}"#;
        assert!(Envelope::parse(body).is_err());
        let id = DeliveryIdentity::from_body(body).expect("identity");
        assert_eq!(
            (id.api_app_id.as_str(), id.event_id.as_str()),
            ("A1", "Ev1")
        );
        assert_eq!(id.event_type.as_deref(), Some("message"));
        assert_eq!(id.event_time, Some(1_515_449_522));
        let key = id.installation_key();
        assert_eq!(key.team_id.as_ref().map(|t| t.as_str()), Some("T1"));

        // The team may come from `authorizations` only; an org-wide install
        // resolves by enterprise, as for parsed events.
        let v = serde_json::json!({"type": "event_callback", "api_app_id": "A1", "event_id": "Ev2",
            "event": "a string", "authorizations": [{"enterprise_id": "E1", "team_id": null,
            "is_enterprise_install": true}]});
        let id = DeliveryIdentity::from_value(&v).expect("identity");
        assert_eq!((id.event_type.as_deref(), id.event_time), (None, None));
        let key = id.installation_key();
        assert!(key.is_enterprise_install);
        assert_eq!(key.enterprise_id.as_ref().map(|e| e.as_str()), Some("E1"));
        // A type that is not a Slack name is not kept (it could be anything).
        let v = serde_json::json!({"type": "event_callback", "api_app_id": "A1", "event_id": "Ev3",
            "team_id": "T1", "event": {"type": "Hello there"}});
        assert_eq!(
            DeliveryIdentity::from_value(&v)
                .expect("identity")
                .event_type,
            None
        );
    }

    #[test]
    fn deliveries_without_an_identity() {
        let cases: [&[u8]; 9] = [
            b"not json",
            b"[1]",
            br#"{"type":"event_callback","api_app_id":"A1","team_id":"T1"}"#,
            br#"{"type":"event_callback","api_app_id":"A1","event_id":7,"team_id":"T1"}"#,
            br#"{"type":"event_callback","event_id":"Ev1","team_id":"T1"}"#,
            br#"{"type":"event_callback","api_app_id":"A1","event_id":"Ev1"}"#,
            br#"{"type":"event_callback","api_app_id":"A1","event_id":"Ev 1","team_id":"T1"}"#,
            br#"{"type":"event_callback","api_app_id":"A1","event_id":"Ev1","authorizations":[{"team_id":""}]}"#,
            br#"{"type":"block_actions","api_app_id":"A1","event_id":"Ev1","team_id":"T1"}"#,
        ];
        for body in cases {
            assert_eq!(
                DeliveryIdentity::from_body(body),
                None,
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn unknown_envelope_types_are_kept() {
        assert_eq!(
            Envelope::parse(br#"{"type":"block_actions"}"#).expect("parses"),
            Envelope::Other {
                envelope_type: "block_actions".into()
            }
        );
    }
}
