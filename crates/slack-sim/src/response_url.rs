//! The `response_url` of an interaction, served: the app answers the
//! person who clicked by POSTing a message to it. After Slack's "Handling
//! user interaction" guide (message responses) and its interactive
//! message field guide:
//!
//! * `POST /actions/{team}/{n}/{secret}` with a JSON body: `text`,
//!   `blocks`, `response_type`, `replace_original`, `delete_original`,
//!   `thread_ts`; the URL needs no token;
//! * `response_type: "ephemeral"` (the default) shows the message to the
//!   person who clicked only, in the channel (or thread with `thread_ts`):
//!   not in the history, no events; `in_channel` posts it as the app's bot
//!   for everyone (Slack posts it even where the bot is not a member),
//!   with the events a post causes;
//! * `replace_original: true` replaces the message the button was on in
//!   its entirety (text and blocks; attachments gone): same `ts`, edited,
//!   `message_changed`; `delete_original: true` deletes it
//!   (`message_deleted`) and posts the body's text, if any, as a new
//!   message; the flags may come as booleans or as `"true"`/`"false"`,
//!   as Slack's own examples send them;
//! * a URL answers at most 5 times and for 30 minutes
//!   (`settings.response_url_ttl_ms`).
//!
//! Answers: HTTP 200 `{"ok":true}`; errors are `{"ok":false,"error":…}`.
//! Chosen where Slack documents nothing: the error codes and statuses are
//! those Slack's incoming webhooks (served by the same host) document, plus
//! two of their own: 404 `no_service` for a URL never issued (or whose app
//! was uninstalled), 404 `expired_url` past its lifetime, 404 `used_url`
//! after 5 uses, 400 `invalid_payload` for a body that is not a JSON
//! object, 400 `no_text` for one with neither `text` nor `blocks` (unless
//! it only deletes), 400 `invalid_blocks` for `blocks` that are not an
//! array, 404 `message_not_found` when the message to replace or delete
//! is gone. A refused request does not count as a use. Any
//! `response_type` other than `in_channel` is ephemeral; `delete_original`
//! wins over `replace_original`; the message's metadata survives a
//! replacement; posts through the URL take no share of the channel's
//! posting budget.

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::Sim;
use crate::delivery::{Envelope, dispatch};
use crate::events;
use crate::model::{Edit, Ephemeral, Message, World, now_micros};

/// How many times a `response_url` answers (Slack: 5).
pub const MAX_USES: u32 = 5;

pub use crate::model::{ResponseRecord, ResponseState, ResponseUrl};

/// Issues the `response_url` of an interaction in `channel` on
/// `message_ts`, clicked by `user`; `url_team` is the workspace, or the
/// enterprise of an org-wide install. `host` is the emulator's address.
pub fn issue(
    w: &mut World,
    host: &str,
    url_team: &str,
    app_id: &str,
    channel: &str,
    message_ts: &str,
    user: &str,
) -> String {
    let mut id = (w.rng.next_u64() % 10_000_000_000_000).to_string();
    while w.responses.issued.contains_key(&id) {
        id = (w.rng.next_u64() % 10_000_000_000_000).to_string();
    }
    let secret = w.rng.id("", 24);
    let url = format!("http://{host}/actions/{url_team}/{id}/{secret}");
    w.responses.issued.insert(
        id.clone(),
        ResponseUrl {
            id,
            url: url.clone(),
            team_id: url_team.to_owned(),
            secret,
            app_id: app_id.to_owned(),
            channel: channel.to_owned(),
            message_ts: message_ts.to_owned(),
            user: user.to_owned(),
            issued_at_micros: now_micros(),
            uses: 0,
        },
    );
    url
}

/// What the app's request asks for.
struct Answer {
    text: Option<String>,
    blocks: Option<Value>,
    in_channel: bool,
    replace: bool,
    delete: bool,
    thread_ts: Option<String>,
}

impl Answer {
    fn has_content(&self) -> bool {
        self.text.as_deref().is_some_and(|t| !t.trim().is_empty())
            || self
                .blocks
                .as_ref()
                .and_then(Value::as_array)
                .is_some_and(|b| !b.is_empty())
    }
}

type Refused = (StatusCode, &'static str);

/// `true`/`false`, or the strings Slack's examples send.
fn flag(o: &Map<String, Value>, key: &str) -> bool {
    match o.get(key) {
        Some(Value::Bool(b)) => *b,
        Some(Value::String(s)) => s.eq_ignore_ascii_case("true"),
        _ => false,
    }
}

fn parse(body: &[u8]) -> Result<Answer, Refused> {
    let Ok(Value::Object(o)) = serde_json::from_slice::<Value>(body) else {
        return Err((StatusCode::BAD_REQUEST, "invalid_payload"));
    };
    let string = |k: &str| o.get(k).and_then(Value::as_str).map(str::to_owned);
    Ok(Answer {
        text: string("text"),
        blocks: o.get("blocks").filter(|b| !b.is_null()).cloned(),
        in_channel: o.get("response_type").and_then(Value::as_str) == Some("in_channel"),
        replace: flag(&o, "replace_original"),
        delete: flag(&o, "delete_original"),
        thread_ts: string("thread_ts").filter(|t| !t.is_empty()),
    })
}

/// `POST /actions/{team}/{n}/{secret}`: the app answers the person.
pub async fn respond(
    State(sim): State<Sim>,
    Path((team, id, secret)): Path<(String, String, String)>,
    body: Bytes,
) -> Response {
    let (status, result, envs) = {
        let mut w = sim.lock();
        let answer = parse(&body);
        let mut record = ResponseRecord {
            seq: w.responses.log.len() as u64 + 1,
            url_id: id.clone(),
            app_id: None,
            user: None,
            channel: None,
            message_ts: None,
            response_type: None,
            replace_original: false,
            delete_original: false,
            thread_ts: None,
            text: None,
            result: String::new(),
            http_status: 0,
            use_number: None,
            ts: None,
            at_micros: now_micros(),
        };
        if let Ok(a) = &answer {
            record.response_type = Some(
                if a.in_channel {
                    "in_channel"
                } else {
                    "ephemeral"
                }
                .into(),
            );
            record.replace_original = a.replace;
            record.delete_original = a.delete;
            record.thread_ts = a.thread_ts.clone();
            record.text = a.text.clone();
        }
        let outcome = apply(&mut w, &team, &id, &secret, answer, &mut record);
        let (status, result, envs) = match outcome {
            Ok(envs) => (StatusCode::OK, "ok", envs),
            Err((status, code)) => (status, code, Vec::new()),
        };
        record.result = result.to_owned();
        record.http_status = status.as_u16();
        w.responses.log.push(record);
        (status, result, envs)
    };
    dispatch(&sim, envs);
    let body = if result == "ok" {
        json!({"ok": true})
    } else {
        json!({"ok": false, "error": result})
    };
    let mut r = (status, Json(body)).into_response();
    r.headers_mut().insert(
        "content-type",
        HeaderValue::from_static("application/json; charset=utf-8"),
    );
    r
}

/// Checks the URL and the answer, then applies it: every check comes
/// before any change.
fn apply(
    w: &mut World,
    team: &str,
    id: &str,
    secret: &str,
    answer: Result<Answer, Refused>,
    record: &mut ResponseRecord,
) -> Result<Vec<Envelope>, Refused> {
    const NO_SERVICE: Refused = (StatusCode::NOT_FOUND, "no_service");
    let url = w
        .responses
        .issued
        .get(id)
        .filter(|u| u.team_id == team && u.secret == secret)
        .cloned()
        .ok_or(NO_SERVICE)?;
    record.app_id = Some(url.app_id.clone());
    record.user = Some(url.user.clone());
    record.channel = Some(url.channel.clone());
    record.message_ts = Some(url.message_ts.clone());
    let age_ms = now_micros().saturating_sub(url.issued_at_micros) / 1000;
    if age_ms > w.settings.response_url_ttl_ms {
        return Err((StatusCode::NOT_FOUND, "expired_url"));
    }
    if url.uses >= MAX_USES {
        return Err((StatusCode::NOT_FOUND, "used_url"));
    }
    let a = answer?;
    if a.blocks.as_ref().is_some_and(|b| !b.is_array()) {
        return Err((StatusCode::BAD_REQUEST, "invalid_blocks"));
    }
    if !a.delete && !a.has_content() {
        return Err((StatusCode::BAD_REQUEST, "no_text"));
    }
    let channel = w.channels.get(&url.channel).cloned().ok_or(NO_SERVICE)?;
    let app = w.apps.get(&url.app_id).cloned().ok_or(NO_SERVICE)?;
    let install = w
        .install_of(&app, &channel.team_id)
        .cloned()
        .ok_or(NO_SERVICE)?;
    let original = if a.delete || a.replace {
        Some(
            w.message(&channel.id, &url.message_ts)
                .filter(|m| !m.deleted)
                .cloned()
                .ok_or((StatusCode::NOT_FOUND, "message_not_found"))?,
        )
    } else {
        None
    };

    let mut envs = Vec::new();
    if let Some(before) = original {
        let event_ts = w.clock.next_ts();
        if a.delete {
            w.mark_deleted(&channel.id, &before.ts);
            envs.extend(events::deleted(w, &channel, &before, &event_ts));
        } else {
            let mut after = before.clone();
            after.text = a.text.clone().unwrap_or_default();
            after.blocks = a.blocks.clone();
            after.attachments = None;
            after.edited = Some((install.bot_user_id.clone(), event_ts.clone()));
            after.edits.push(Edit {
                text: after.text.clone(),
                edit_ts: event_ts.clone(),
                at_micros: now_micros(),
            });
            w.insert_message(after.clone());
            envs.extend(events::edited(w, &channel, &before, &after, &event_ts));
        }
    }
    if (a.delete || !a.replace) && a.has_content() {
        // A reply's ts resolves to its thread's root, as Slack does.
        let thread_ts = a.thread_ts.clone().map(|t| {
            w.message(&channel.id, &t)
                .and_then(|m| m.thread_ts.clone())
                .unwrap_or(t)
        });
        let ts = w.clock.next_ts();
        let text = a.text.clone().unwrap_or_default();
        if a.in_channel {
            let msg = Message {
                channel: channel.id.clone(),
                ts: ts.clone(),
                user: Some(install.bot_user_id.clone()),
                bot_id: Some(install.bot_id.clone()),
                app_id: Some(app.id.clone()),
                username: None,
                subtype: None,
                original_text: text.clone(),
                text,
                thread_ts: thread_ts.clone(),
                blocks: a.blocks.clone(),
                attachments: None,
                metadata: None,
                edited: None,
                deleted: false,
                client_msg_id: None,
                created_at_micros: now_micros(),
                deleted_at_micros: None,
                edits: Vec::new(),
                streaming_state: None,
                stream: None,
            };
            envs.extend(events::post(w, &channel, msg));
            crate::assistant::replied(w, &app.id, &channel.id, thread_ts.as_deref());
        } else {
            w.ephemerals.push(Ephemeral {
                channel: channel.id.clone(),
                user: url.user.clone(),
                ts: ts.clone(),
                thread_ts,
                text,
                blocks: a.blocks.clone(),
                app_id: app.id.clone(),
                bot_id: install.bot_id.clone(),
                via: "response_url".into(),
                created_at_micros: now_micros(),
            });
        }
        record.ts = Some(ts);
    }
    let issued = w.responses.issued.get_mut(id).ok_or(NO_SERVICE)?;
    issued.uses += 1;
    record.use_number = Some(issued.uses);
    Ok(envs)
}

#[derive(Deserialize)]
pub struct LogQuery {
    url_id: Option<String>,
    channel: Option<String>,
    user: Option<String>,
}

/// `GET /_sim/responses`: the `response_url`s issued (oldest first) and
/// every request to one, in order.
pub async fn log(State(sim): State<Sim>, Query(q): Query<LogQuery>) -> Json<Value> {
    let w = sim.lock();
    let fits = |id: &str, channel: Option<&str>, user: Option<&str>| {
        q.url_id.as_deref().is_none_or(|x| x == id)
            && q.channel.as_deref().is_none_or(|x| Some(x) == channel)
            && q.user.as_deref().is_none_or(|x| Some(x) == user)
    };
    let mut issued: Vec<&ResponseUrl> = w
        .responses
        .issued
        .values()
        .filter(|u| fits(&u.id, Some(&u.channel), Some(&u.user)))
        .collect();
    issued.sort_by_key(|u| u.issued_at_micros);
    let uses: Vec<&ResponseRecord> = w
        .responses
        .log
        .iter()
        .filter(|r| fits(&r.url_id, r.channel.as_deref(), r.user.as_deref()))
        .collect();
    Json(json!({"ok": true, "response_urls": issued, "responses": uses}))
}

#[derive(Deserialize)]
pub struct EphemeralQuery {
    channel: Option<String>,
    user: Option<String>,
}

/// `GET /_sim/ephemerals`: every ephemeral message, oldest first.
pub async fn ephemerals(State(sim): State<Sim>, Query(q): Query<EphemeralQuery>) -> Json<Value> {
    let w = sim.lock();
    let list: Vec<&Ephemeral> = w
        .ephemerals
        .iter()
        .filter(|e| {
            q.channel.as_deref().is_none_or(|c| c == e.channel)
                && q.user.as_deref().is_none_or(|u| u == e.user)
        })
        .collect();
    Json(json!({"ok": true, "ephemerals": list}))
}
