//! Review in Slack: the action ids of a review request's buttons, and the
//! parts of an interactivity request (`POST /slack/interactions`, a signed
//! form whose `payload` field is JSON) that a click on them carries; a
//! click on an answer's feedback buttons is read here too (one parse of a
//! payload, one type per kind: [`Interaction`]).

use serde_json::Value;

use crate::envelope::InstallationKey;
use crate::feedback;
use crate::ids::{AppId, ChannelId, EnterpriseId, TeamId, Ts, UserId};

pub const APPROVE_ACTION: &str = "threadline_review_approve";
pub const REJECT_ACTION: &str = "threadline_review_reject";

/// A click on Approve or Reject of a review request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Click {
    pub key: InstallationKey,
    pub user: UserId,
    pub channel: ChannelId,
    pub message_ts: Ts,
    pub approve: bool,
    /// The decision the request is for (the button's value, unparsed).
    pub decision: String,
    /// Where Slack takes a reply to the person who clicked, if it gave one
    /// (see [`response_url_allowed`] before following it).
    pub response_url: Option<String>,
}

/// Slack's host for `response_url`s.
pub const SLACK_HOOKS_ORIGIN: &str = "https://hooks.slack.com";

/// `scheme://authority` of an absolute http(s) URL.
fn origin(url: &str) -> Option<&str> {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))?;
    let authority = rest.split(['/', '?', '#']).next()?;
    if authority.is_empty() || authority.contains('@') {
        return None;
    }
    Some(&url[..url.len() - rest.len() + authority.len()])
}

/// Whether a click's `response_url` may be followed: only to Slack's own
/// hooks host over TLS, or to the configured Web API's own origin (an
/// emulator). The payload is Slack's, but a reply carrying text is never
/// sent anywhere else on its say-so.
pub fn response_url_allowed(url: &str, web_api_url: &str) -> bool {
    let Some(o) = origin(url) else {
        return false;
    };
    o.eq_ignore_ascii_case(SLACK_HOOKS_ORIGIN)
        || origin(web_api_url).is_some_and(|api| {
            o.eq_ignore_ascii_case(api) && !api.eq_ignore_ascii_case("https://slack.com")
        })
}

/// What an interactivity request is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Interaction {
    Review(Click),
    /// A click on an answer's feedback buttons.
    Feedback(feedback::Click),
    /// Another kind of interaction, or another action, that threadline
    /// does not act on (its `type`, and the action id if any).
    Other {
        kind: String,
        action: Option<String>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InteractionError {
    #[error("the form has no `payload` field")]
    NoPayload,
    #[error("`payload` is not a JSON object")]
    NotJson,
    #[error("`{0}` is missing or malformed")]
    Field(&'static str),
}

impl InteractionError {
    pub fn code(&self) -> &'static str {
        match self {
            InteractionError::NoPayload => "no_payload",
            InteractionError::NotJson => "payload_not_json",
            InteractionError::Field(_) => "payload_field",
        }
    }
}

/// Parses the form body of an interactivity request.
pub fn parse_form(body: &[u8]) -> Result<Interaction, InteractionError> {
    let fields: Vec<(String, String)> =
        serde_urlencoded::from_bytes(body).map_err(|_| InteractionError::NoPayload)?;
    let payload = fields
        .into_iter()
        .find(|(k, _)| k == "payload")
        .map(|(_, v)| v)
        .ok_or(InteractionError::NoPayload)?;
    let v: Value = serde_json::from_str(&payload).map_err(|_| InteractionError::NotJson)?;
    if !v.is_object() {
        return Err(InteractionError::NotJson);
    }
    parse(&v)
}

/// Reads a `block_actions` payload (other kinds are `Other`).
pub fn parse(v: &Value) -> Result<Interaction, InteractionError> {
    let kind = v
        .get("type")
        .and_then(Value::as_str)
        .ok_or(InteractionError::Field("type"))?;
    let action = v.pointer("/actions/0");
    let action_id = action
        .and_then(|a| a.get("action_id"))
        .and_then(Value::as_str);
    let value = || {
        action
            .and_then(|a| a.get("value"))
            .and_then(Value::as_str)
            .ok_or(InteractionError::Field("actions[0].value"))
    };
    match (kind, action_id) {
        ("block_actions", Some(a @ (APPROVE_ACTION | REJECT_ACTION))) => {
            let o = clicked_from(v)?;
            Ok(Interaction::Review(Click {
                key: o.key,
                user: o.user,
                channel: o.channel,
                message_ts: o.message_ts,
                approve: a == APPROVE_ACTION,
                decision: value()?.to_owned(),
                response_url: o.response_url,
            }))
        }
        ("block_actions", Some(feedback::FEEDBACK_ACTION)) => {
            let o = clicked_from(v)?;
            let (verdict, decision) = feedback::Verdict::of_value(value()?)
                .ok_or(InteractionError::Field("actions[0].value"))?;
            let action_ts = action
                .and_then(|a| a.get("action_ts"))
                .and_then(Value::as_str)
                .map(Ts::parse)
                .transpose()
                .map_err(|_| InteractionError::Field("actions[0].action_ts"))?;
            Ok(Interaction::Feedback(feedback::Click {
                key: o.key,
                user: o.user,
                channel: o.channel,
                message_ts: o.message_ts,
                verdict,
                decision: decision.to_owned(),
                action_ts,
            }))
        }
        _ => Ok(Interaction::Other {
            kind: kind.to_owned(),
            action: action_id.map(str::to_owned),
        }),
    }
}

/// Where a click comes from: the installation, the person, the message.
struct Origin {
    key: InstallationKey,
    user: UserId,
    channel: ChannelId,
    message_ts: Ts,
    response_url: Option<String>,
}

fn clicked_from(v: &Value) -> Result<Origin, InteractionError> {
    let s = |ptr: &str| {
        v.pointer(ptr)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
    };
    let app = AppId::parse(s("/api_app_id").ok_or(InteractionError::Field("api_app_id"))?)
        .map_err(|_| InteractionError::Field("api_app_id"))?;
    let team = s("/team/id")
        .map(TeamId::parse)
        .transpose()
        .map_err(|_| InteractionError::Field("team.id"))?;
    let enterprise = s("/enterprise/id")
        .map(EnterpriseId::parse)
        .transpose()
        .map_err(|_| InteractionError::Field("enterprise.id"))?;
    let is_enterprise_install = v
        .get("is_enterprise_install")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    if team.is_none() && enterprise.is_none() {
        return Err(InteractionError::Field("team.id"));
    }
    let key = InstallationKey {
        app_id: app,
        team_id: if is_enterprise_install { None } else { team },
        enterprise_id: enterprise,
        is_enterprise_install,
    };
    let user = UserId::parse(s("/user/id").ok_or(InteractionError::Field("user.id"))?)
        .map_err(|_| InteractionError::Field("user.id"))?;
    let channel = s("/container/channel_id")
        .or_else(|| s("/channel/id"))
        .ok_or(InteractionError::Field("container.channel_id"))?;
    let channel =
        ChannelId::parse(channel).map_err(|_| InteractionError::Field("container.channel_id"))?;
    let ts = s("/container/message_ts")
        .or_else(|| s("/message/ts"))
        .ok_or(InteractionError::Field("container.message_ts"))?;
    let message_ts = Ts::parse(ts).map_err(|_| InteractionError::Field("container.message_ts"))?;
    Ok(Origin {
        key,
        user,
        channel,
        message_ts,
        response_url: s("/response_url").map(str::to_owned),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn click(action: &str) -> Value {
        json!({
            "type": "block_actions",
            "user": {"id": "U0REVIEW", "username": "rita", "name": "rita", "team_id": "T0001"},
            "api_app_id": "A0APP",
            "token": "verification",
            "container": {"type": "message", "message_ts": "1700000000.000100", "channel_id": "C0REVIEW", "is_ephemeral": false},
            "trigger_id": "1.2.abc",
            "team": {"id": "T0001", "domain": "acme"},
            "enterprise": null,
            "is_enterprise_install": false,
            "channel": {"id": "C0REVIEW", "name": "answers-review"},
            "state": {"values": {}},
            "response_url": "https://hooks.slack.com/actions/T0001/1/x",
            "actions": [{"action_id": action, "block_id": "threadline_review", "value": "0191-dec",
                         "type": "button", "action_ts": "1700000001.000200",
                         "text": {"type": "plain_text", "text": "Approve"}}]
        })
    }

    #[test]
    fn a_response_url_is_followed_only_to_slack_or_the_configured_api() {
        let slack = "https://slack.com/api";
        assert!(response_url_allowed(
            "https://hooks.slack.com/actions/T0001/1/x",
            slack
        ));
        for refused in [
            "http://hooks.slack.com/actions/T0001/1/x",
            "https://hooks.slack.com.evil.example/actions/x",
            "https://hooks.slack.com@evil.example/actions/x",
            "https://slack.com/actions/x",
            "https://evil.example/actions/x",
            "ftp://hooks.slack.com/x",
            "hooks.slack.com/actions",
            "",
        ] {
            assert!(!response_url_allowed(refused, slack), "{refused}");
        }
        // An emulator as the Web API: its own origin, nothing else.
        let sim = "http://127.0.0.1:4000/api";
        assert!(response_url_allowed(
            "http://127.0.0.1:4000/actions/T1/2/x",
            sim
        ));
        assert!(!response_url_allowed(
            "http://127.0.0.1:4001/actions/T1/2/x",
            sim
        ));
        assert!(!response_url_allowed(
            "http://127.0.0.1:4000@evil/actions",
            sim
        ));
    }

    #[test]
    fn a_click_on_a_review_button_is_read_from_the_form() {
        let body =
            serde_urlencoded::to_string([("payload", click(APPROVE_ACTION).to_string())]).unwrap();
        let Interaction::Review(c) = parse_form(body.as_bytes()).unwrap() else {
            panic!("a review click");
        };
        assert!(c.approve);
        assert_eq!(c.user.as_str(), "U0REVIEW");
        assert_eq!(c.channel.as_str(), "C0REVIEW");
        assert_eq!(c.message_ts.as_str(), "1700000000.000100");
        assert_eq!(c.decision, "0191-dec");
        assert_eq!(
            c.response_url.as_deref(),
            Some("https://hooks.slack.com/actions/T0001/1/x")
        );
        assert_eq!(c.key.team_id.as_ref().map(|t| t.as_str()), Some("T0001"));
        assert!(!c.key.is_enterprise_install);
        let Interaction::Review(c) = parse(&click(REJECT_ACTION)).unwrap() else {
            panic!("a review click");
        };
        assert!(!c.approve);
    }

    #[test]
    fn other_interactions_are_named_and_bad_ones_refused() {
        assert_eq!(
            parse(&click("someone_elses_button")).unwrap(),
            Interaction::Other {
                kind: "block_actions".into(),
                action: Some("someone_elses_button".into())
            }
        );
        assert!(matches!(
            parse(&json!({"type": "view_submission"})).unwrap(),
            Interaction::Other { .. }
        ));
        assert_eq!(parse_form(b"text=hi"), Err(InteractionError::NoPayload));
        assert_eq!(
            parse_form(b"payload=%5B1%5D"),
            Err(InteractionError::NotJson)
        );
        let mut no_user = click(APPROVE_ACTION);
        no_user["user"] = json!(null);
        assert_eq!(parse(&no_user), Err(InteractionError::Field("user.id")));
        let mut bad_ts = click(APPROVE_ACTION);
        bad_ts["container"]["message_ts"] = json!("yesterday");
        bad_ts["message"] = json!(null);
        assert_eq!(
            parse(&bad_ts),
            Err(InteractionError::Field("container.message_ts"))
        );
    }

    #[test]
    fn a_click_on_feedback_buttons_is_its_own_kind() {
        let mut v = click(feedback::FEEDBACK_ACTION);
        v["actions"][0]["type"] = json!("feedback_buttons");
        v["actions"][0]["value"] = json!("negative:0191-dec");
        let Interaction::Feedback(c) = parse(&v).unwrap() else {
            panic!("a feedback click");
        };
        assert_eq!(c.verdict, feedback::Verdict::Negative);
        assert_eq!(c.decision, "0191-dec");
        assert_eq!(c.user.as_str(), "U0REVIEW");
        assert_eq!(c.message_ts.as_str(), "1700000000.000100");
        assert_eq!(
            c.action_ts.as_ref().map(|t| t.as_str()),
            Some("1700000001.000200")
        );
        v["actions"][0]["value"] = json!("good-feedback");
        assert_eq!(parse(&v), Err(InteractionError::Field("actions[0].value")));
    }

    #[test]
    fn an_org_wide_install_is_keyed_by_its_enterprise() {
        let mut v = click(APPROVE_ACTION);
        v["enterprise"] = json!({"id": "E0ORG", "name": "Org"});
        v["is_enterprise_install"] = json!(true);
        let Interaction::Review(c) = parse(&v).unwrap() else {
            panic!("a review click");
        };
        assert!(c.key.is_enterprise_install);
        assert_eq!(c.key.team_id, None);
        assert_eq!(
            c.key.enterprise_id.as_ref().map(|e| e.as_str()),
            Some("E0ORG")
        );
    }
}
