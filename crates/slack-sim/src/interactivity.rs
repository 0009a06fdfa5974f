//! Interactivity: a person clicks a button on an app's message and Slack
//! sends the app a `block_actions` payload at its interactivity request
//! URL. Shaped after Slack's `block_actions` reference and the payloads in
//! bolt-python's tests:
//!
//! * the body is `application/x-www-form-urlencoded` with one field,
//!   `payload`, the JSON; signed with the app's signing secret as event
//!   deliveries are (`v0`, `X-Slack-Request-Timestamp`,
//!   `X-Slack-Signature`);
//! * an app in Socket Mode gets the payload as an `interactive` envelope
//!   over one of its connections instead (see [`crate::socket`]);
//! * one attempt within the deadline (Slack: 3 s): Slack does not retry an
//!   interaction, the person sees an error instead;
//! * `enterprise` names the workspace's enterprise when it has one (null
//!   otherwise), and `team` is null for an org-wide install, as events name
//!   them; `message` is the message as the Web API returns it, blocks
//!   included and metadata left out.
//!
//! Chosen where Slack documents nothing: a block posted without a
//! `block_id` (Slack generates one when the message is posted; the emulator
//! keeps blocks as posted) gets one derived from the message's `ts` and the
//! block's place, the same at every click.
//!
//! A `feedback_buttons` element (in a `context_actions` block, as AI apps
//! attach to answers) is clicked on one side (`button`: `positive` or
//! `negative`); its action is the element's `type` and `action_id` with
//! the pressed button's `text` and `value` (bolt's `FeedbackButtonsAction`).
//! Slack toggles the buttons in the client and reports no deselect: every
//! click is sent.
//!
//! Every payload carries a `response_url` on the emulator, issued for the
//! click (its app, channel, message and person) and served by
//! [`crate::response_url`]: the app answers the person through it, up to 5
//! times within 30 minutes.

use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::{Value, json};
use threadline_slack::SigningSecret;

use crate::Sim;
use crate::delivery::signature_headers;
use crate::model::{ChannelKind, InteractionRecord, InteractionStatus, World, now_unix};
use crate::refusal::{Refusal, bad, not_found};

/// A person's click, as `POST /_sim/act/click` takes it.
#[derive(Deserialize)]
pub struct ClickReq {
    user: String,
    channel: String,
    /// The message's `ts`.
    ts: String,
    /// The button's `action_id` (of a `feedback_buttons` element: the
    /// element's, shared by its two buttons).
    action_id: String,
    /// Which of a `feedback_buttons` element's buttons: `positive` or
    /// `negative` (required for one; refused for any other element).
    #[serde(default)]
    button: Option<FeedbackSide>,
}

/// One of the two buttons of a `feedback_buttons` element.
#[derive(Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum FeedbackSide {
    Positive,
    Negative,
}

impl FeedbackSide {
    fn field(self) -> &'static str {
        match self {
            FeedbackSide::Positive => "positive_button",
            FeedbackSide::Negative => "negative_button",
        }
    }
}

/// An interaction built under the world's lock, to be sent without it.
pub struct Outgoing {
    /// None: the app is in Socket Mode, the payload goes over a connection.
    url: Option<String>,
    app_id: String,
    payload: Value,
    secret: SigningSecret,
    /// `payload=<the JSON, url-encoded>`.
    form: String,
    /// Its log entry, `id`, `status` and `elapsed_ms` to be filled in.
    record: InteractionRecord,
}

/// The button with `action_id` in `blocks`: an element of an `actions` or
/// `context_actions` block or a section's `accessory`, with its block's
/// index and `block_id`.
fn find_button<'a>(
    blocks: &'a [Value],
    action_id: &str,
) -> Option<(usize, Option<&'a str>, &'a Value)> {
    blocks.iter().enumerate().find_map(|(i, b)| {
        let candidates: Vec<&Value> = match b["type"].as_str() {
            Some("actions" | "context_actions") => b["elements"].as_array()?.iter().collect(),
            Some("section") => b.get("accessory").into_iter().collect(),
            _ => Vec::new(),
        };
        candidates
            .into_iter()
            .find(|e| e["action_id"].as_str() == Some(action_id))
            .map(|e| (i, b["block_id"].as_str(), e))
    })
}

/// A `block_id` for the block at `index` of the message `ts` that was
/// posted without one: three characters like Slack's generated ids,
/// derived from both so that every click sees the same.
fn derived_block_id(ts: &str, index: usize) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    // FNV-1a over the ts and the index.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in ts.bytes().chain(index.to_le_bytes()) {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    (0..3)
        .map(|i| ALPHABET[((h >> (6 * i)) & 63) as usize] as char)
        .collect()
}

/// Checks a click and builds the interaction it sends: the message (not
/// deleted) must carry a button with the `action_id`, have been posted by
/// an app installed in the channel's workspace with an interactivity
/// request URL, and be where the person can see it. `host` is the
/// emulator's address, for the `response_url`.
pub fn prepare(w: &mut World, r: &ClickReq, host: &str) -> Result<Outgoing, Refusal> {
    let channel = w
        .channels
        .get(&r.channel)
        .cloned()
        .ok_or_else(|| not_found("channel", &r.channel))?;
    let msg = w
        .message(&r.channel, &r.ts)
        .filter(|m| !m.deleted)
        .cloned()
        .ok_or_else(|| not_found("message", &r.ts))?;
    let user = w
        .users
        .get(&r.user)
        .cloned()
        .ok_or_else(|| not_found("user", &r.user))?;
    if user.is_bot {
        return Err(bad("only a person clicks a button"));
    }
    let sees = channel.members.contains(&user.id)
        || (channel.kind == ChannelKind::Public && user.team_id == channel.team_id);
    if !sees {
        return Err(bad("the user cannot see the channel"));
    }
    let mut blocks = msg
        .blocks
        .clone()
        .and_then(|b| b.as_array().cloned())
        .unwrap_or_default();
    let (index, block_id, element) = find_button(&blocks, &r.action_id).ok_or_else(|| {
        bad(format!(
            "the message has no button with action_id {:?}",
            r.action_id
        ))
    })?;
    // What the person pressed: a button, or one side of feedback buttons
    // (Slack reports the element's type and action_id with the pressed
    // side's text and value; a deselect is never reported, so every click
    // is one).
    let element = match (element["type"].as_str(), r.button) {
        (Some("button"), None) => element.clone(),
        (Some("feedback_buttons"), Some(side)) => {
            let mut pressed = element[side.field()].clone();
            pressed["type"] = "feedback_buttons".into();
            pressed
        }
        (Some("feedback_buttons"), None) => {
            return Err(bad(format!(
                "the element with action_id {:?} is feedback_buttons: say which button (positive or negative)",
                r.action_id
            )));
        }
        (kind, _) => {
            return Err(bad(format!(
                "the element with action_id {:?} is a {}, not a button",
                r.action_id,
                kind.unwrap_or("element of no type")
            )));
        }
    };
    let block_id = block_id.map_or_else(|| derived_block_id(&msg.ts, index), str::to_owned);
    let app_id = msg
        .app_id
        .clone()
        .ok_or_else(|| bad("the message was not posted by an app: its buttons go nowhere"))?;
    let app = w
        .apps
        .get(&app_id)
        .cloned()
        .ok_or_else(|| not_found("app", &app_id))?;
    let url = if app.socket_mode {
        None
    } else {
        Some(app.interactivity_url.clone().ok_or_else(|| {
            bad(format!(
                "app {app_id} has no interactivity request URL (POST /_sim/apps/{app_id}/interactivity)"
            ))
        })?)
    };
    let install = w
        .install_of(&app, &channel.team_id)
        .cloned()
        .ok_or_else(|| bad("the app that posted the message is not installed there any more"))?;
    let secret = SigningSecret::new(&app.signing_secret)
        .map_err(|_| bad("the app's signing secret cannot sign"))?;

    // The message as the Web API returns it, every block with its block_id.
    for (i, b) in blocks.iter_mut().enumerate() {
        if b.get("block_id").and_then(Value::as_str).is_none()
            && let Some(o) = b.as_object_mut()
        {
            o.insert("block_id".into(), derived_block_id(&msg.ts, i).into());
        }
    }
    let parent_user = msg
        .thread_ts
        .as_deref()
        .filter(|t| *t != msg.ts)
        .and_then(|t| w.message(&channel.id, t))
        .and_then(|p| p.user.clone());
    let mut message = msg.to_api(
        parent_user.as_deref(),
        w.reply_count(&channel.id, &msg.ts),
        false,
    );
    if msg.blocks.as_ref().is_some_and(Value::is_array) {
        message["blocks"] = blocks.into();
    }
    message["team"] = channel.team_id.clone().into();

    let team = w.teams.get(&channel.team_id).cloned();
    let enterprise_id = team.as_ref().and_then(|t| t.enterprise_id.clone());
    let org_wide = install.is_enterprise_install;
    // An org-wide install is for the enterprise, not a workspace: `team`
    // is null (bolt-python's org-install block_actions fixture).
    let team_v = match &team {
        Some(t) if !org_wide => {
            let mut v = json!({"id": t.id, "domain": t.domain});
            if let Some(e) = &enterprise_id {
                v["enterprise_id"] = e.clone().into();
                v["enterprise_name"] = e.clone().into();
            }
            v
        }
        _ => Value::Null,
    };
    let mut container = json!({"type": "message", "message_ts": msg.ts, "channel_id": channel.id,
                               "is_ephemeral": false});
    if let Some(t) = msg.thread_ts.as_deref().filter(|t| *t != msg.ts) {
        container["thread_ts"] = t.into();
    }
    let kind = element["type"].as_str().unwrap_or("button").to_owned();
    let mut action = json!({"action_id": r.action_id, "block_id": block_id, "text": element["text"],
                            "type": kind, "action_ts": w.clock.next_ts()});
    for k in ["value", "style"] {
        if let Some(v) = element.get(k) {
            action[k] = v.clone();
        }
    }
    let trigger_id = format!(
        "{}.{}.{}",
        w.rng.next_u64() % 10_000_000_000_000,
        w.rng.next_u64() % 10_000_000_000_000,
        w.rng.hex(32)
    );
    let response_url = crate::response_url::issue(
        w,
        host,
        if org_wide {
            &install.team_id
        } else {
            &channel.team_id
        },
        &app.id,
        &channel.id,
        &msg.ts,
        &user.id,
    );
    let payload = json!({
        "type": "block_actions",
        "user": {"id": user.id, "username": user.name, "name": user.name, "team_id": user.team_id},
        "api_app_id": app.id,
        "token": app.verification_token,
        "container": container,
        "trigger_id": trigger_id,
        "team": team_v,
        "enterprise": enterprise_id.as_ref().map(|e| json!({"id": e, "name": e})),
        "is_enterprise_install": org_wide,
        "channel": {
            "id": channel.id,
            // (Slack names every DM so in interaction payloads)
            "name": if channel.kind == ChannelKind::Im { "directmessage" } else { channel.name.as_str() },
        },
        "message": message,
        "state": {"values": {}},
        "response_url": response_url,
        "actions": [action],
    });
    let form = serde_urlencoded::to_string([("payload", payload.to_string())])
        .map_err(|e| bad(format!("encoding the payload: {e}")))?;
    Ok(Outgoing {
        url,
        app_id: app.id.clone(),
        payload,
        secret,
        form,
        record: InteractionRecord {
            id: 0,
            app_id: app.id,
            team_id: channel.team_id,
            user: user.id,
            channel: channel.id,
            message_ts: msg.ts,
            action_id: r.action_id.clone(),
            value: element["value"].as_str().map(str::to_owned),
            status: InteractionStatus::Failed("timeout"),
            elapsed_ms: 0,
        },
    })
}

/// Sends an interaction once (no retries) within the delivery deadline,
/// without the world's lock, and logs how the app answered.
pub async fn send(sim: &Sim, out: Outgoing) -> InteractionRecord {
    let started = Instant::now();
    let Some(url) = out.url else {
        // Socket Mode: an `interactive` envelope, acknowledged or not.
        let status = crate::socket::interactive(sim, &out.app_id, out.payload).await;
        return finish(sim, out.record, InteractionStatus::Socket(status), started);
    };
    let deadline = Duration::from_millis(sim.lock().settings.delivery_deadline_ms);
    let (ts, sig) = signature_headers(&out.secret, now_unix(), out.form.as_bytes());
    let sent = sim
        .http
        .post(&url)
        .timeout(deadline)
        .header("content-type", "application/x-www-form-urlencoded")
        .header("x-slack-request-timestamp", ts)
        .header("x-slack-signature", sig)
        .body(out.form)
        .send()
        .await;
    let status = match sent {
        Ok(r) => InteractionStatus::Http(r.status().as_u16()),
        Err(e) if e.is_timeout() => InteractionStatus::Failed("timeout"),
        Err(_) => InteractionStatus::Failed("connect_error"),
    };
    finish(sim, out.record, status, started)
}

/// Logs how the app answered an interaction.
fn finish(
    sim: &Sim,
    mut record: InteractionRecord,
    status: InteractionStatus,
    started: Instant,
) -> InteractionRecord {
    record.status = status;
    record.elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    let mut w = sim.lock();
    record.id = w.interactions.len() as u64 + 1;
    w.interactions.push(record.clone());
    record
}
