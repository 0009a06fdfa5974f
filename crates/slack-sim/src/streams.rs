//! Streamed messages: `chat.startStream` creates a bot reply that grows
//! with `chat.appendStream` and is finalised by `chat.stopStream`, the
//! person's Stop button, or the stream's lifetime. Shaped after Slack's
//! method reference, the official SDKs' types and helpers
//! (python-slack-sdk's `chat_stream`: an empty start for a short reply,
//! `chunks` rather than `markdown_text` from 3.40) and captured events:
//!
//! * the start creates the message at once and sends a `message` event
//!   with `text: ""` and `streaming_state: "in_progress"`; appends send no
//!   event; the end sends a hidden `message_changed` with the whole text
//!   and `streaming_state: "completed"`, without `edited`;
//! * text comes as `markdown_text` or as `markdown_text` chunks, and a
//!   stream keeps to the form its first content came in
//!   (`streaming_mode_mismatch`); at most 12,000 characters per call;
//! * only the app that started a stream appends to it or stops it
//!   (`message_not_owned_by_app`); a stream that ended answers
//!   `message_not_in_streaming_state`, or `stopped_by_user` to an append
//!   after the person pressed Stop;
//! * thinking steps: `task_update` (`id`, `title`, `status` of
//!   `pending`/`in_progress`/`complete`/`error`, optional `details`,
//!   `output` and URL `sources`) and `plan_update` (`title`) chunks, the
//!   start's `task_display_mode` (`timeline`, `plan`); `sources` only on a
//!   task update; anything else `invalid_chunks`. A message keeps its
//!   tasks by id (the latest fields win) and shows them as `task_card`
//!   blocks, or one `plan` block, as the Block Kit reference gives them;
//! * Tier 2 budgets for start and stop, Tier 4 for append, and the start
//!   takes a post from the channel's budget like `chat.postMessage`.
//!
//! Not documented by Slack and chosen here: while a stream is open, the
//! Web API shows the text streamed so far (with `streaming_state`); a
//! stream still open at `stream_lifetime_ms` ends as `errored` with the
//! text it had, without an event (seen by the next call or inspection); a
//! stream without `thread_ts` is allowed only in channels (top-level
//! streams), not in DMs; recipients are required in channels only, as the
//! reference says (some report Slack asking for them in DMs too);
//! `chat.update` of a stream still open is refused (`cant_update_message`);
//! the final message's blocks are its tasks (above the text, where Slack
//! interleaves task cards and text in timeline mode), one `rich_text` block
//! of the streamed text, then the stop's `blocks`; a plan without a
//! `plan_update` has an empty title.

use serde_json::{Value, json};

use crate::api::{ApiError, MAX_TEXT_CHARS, Params};
use crate::delivery::Envelope;
use crate::events;
use crate::model::{App, ChannelKind, Install, Message, Stream, World, now_micros, now_unix};

/// Most characters of `markdown_text` one call may carry.
pub const MAX_STREAM_CALL_CHARS: usize = 12_000;

/// Most blocks `chat.stopStream` renders below the streamed text.
const MAX_STOP_BLOCKS: usize = 50;

/// What one call adds to a stream.
#[derive(Default)]
struct Content {
    text: String,
    other: Vec<Value>,
    /// The form it came in; `None` when the call carried nothing.
    mode: Option<&'static str>,
}

/// The content of a call: `markdown_text`, or `chunks` (a JSON array, or a
/// JSON-encoded one in a form body).
fn content(p: &Params) -> Result<Content, ApiError> {
    let text = p.str("markdown_text");
    let chunks = match p.json("chunks", "invalid_chunks")? {
        None => None,
        Some(Value::Array(a)) => Some(a),
        Some(_) => return Err(ApiError::new("invalid_chunks")),
    };
    match (text, chunks) {
        (Some(_), Some(c)) if !c.is_empty() => Err(ApiError::new(
            "cannot_provide_both_markdown_text_and_chunks",
        )),
        (Some(text), _) => {
            if text.chars().count() > MAX_STREAM_CALL_CHARS {
                return Err(ApiError::new("msg_too_long"));
            }
            Ok(Content {
                text,
                other: Vec::new(),
                mode: Some("markdown_text"),
            })
        }
        (None, Some(chunks)) => {
            let mut c = Content {
                mode: (!chunks.is_empty()).then_some("chunks"),
                ..Content::default()
            };
            for chunk in chunks {
                // Sources (citations) are carried by task updates only.
                if chunk["type"] != "task_update" && chunk.get("sources").is_some() {
                    return Err(ApiError::new("invalid_chunks"));
                }
                match chunk["type"].as_str() {
                    Some("markdown_text") => {
                        let t = chunk["text"]
                            .as_str()
                            .ok_or(ApiError::new("invalid_chunks"))?;
                        c.text.push_str(t);
                    }
                    Some("task_update") if valid_task(&chunk) => c.other.push(chunk),
                    Some("plan_update") if non_empty(&chunk["title"]) => c.other.push(chunk),
                    Some("blocks") if chunk["blocks"].is_array() => c.other.push(chunk),
                    _ => return Err(ApiError::new("invalid_chunks")),
                }
            }
            if c.text.chars().count() > MAX_STREAM_CALL_CHARS {
                return Err(ApiError::new("msg_too_long"));
            }
            Ok(c)
        }
        (None, None) => Ok(Content::default()),
    }
}

fn non_empty(v: &Value) -> bool {
    v.as_str().is_some_and(|s| !s.is_empty())
}

/// A `task_update` as Slack's reference gives it: an `id` and a `title`,
/// a `status` of `pending`, `in_progress`, `complete` or `error`,
/// optional text `details` and `output`, and optional `sources`, each a
/// URL source element (`type: url`, `url`, `text`).
fn valid_task(c: &Value) -> bool {
    let text_or_absent = |k: &str| c.get(k).is_none_or(Value::is_string);
    let sources = match c.get("sources") {
        None => true,
        Some(Value::Array(a)) => a.iter().all(|s| {
            s["type"] == "url"
                && non_empty(&s["text"])
                && s["url"]
                    .as_str()
                    .is_some_and(|u| u.starts_with("https://") || u.starts_with("http://"))
        }),
        Some(_) => false,
    };
    non_empty(&c["id"])
        && non_empty(&c["title"])
        && matches!(
            c["status"].as_str(),
            Some("pending" | "in_progress" | "complete" | "error")
        )
        && text_or_absent("details")
        && text_or_absent("output")
        && sources
}

/// Keeps a stream's tasks and plan title from the chunks of one call: an
/// id seen before is updated in place with the fields this update carries.
fn keep_tasks(s: &mut Stream, chunks: &[Value]) {
    for c in chunks {
        match c["type"].as_str() {
            Some("task_update") => {
                let mut task = c.clone();
                if let Some(o) = task.as_object_mut() {
                    o.remove("type");
                }
                match s.tasks.iter_mut().find(|t| t["id"] == c["id"]) {
                    Some(t) => {
                        if let (Some(t), Some(new)) = (t.as_object_mut(), task.as_object()) {
                            for (k, v) in new {
                                t.insert(k.clone(), v.clone());
                            }
                        }
                    }
                    None => s.tasks.push(task),
                }
            }
            Some("plan_update") => s.plan_title = c["title"].as_str().map(str::to_owned),
            _ => {}
        }
    }
}

/// Text as a `rich_text` object of one section (a task card's `details`
/// and `output`).
fn rich(text: &str) -> Value {
    json!({"type": "rich_text", "elements": [{"type": "rich_text_section",
                                              "elements": [{"type": "text", "text": text}]}]})
}

/// A stream's tasks as Slack's blocks show them: a `task_card` block each
/// (timeline), or one `plan` block holding them (plan).
fn task_blocks(s: &Stream, ts: &str) -> Vec<Value> {
    let cards: Vec<Value> = s
        .tasks
        .iter()
        .map(|t| {
            let mut card = json!({"type": "task_card", "task_id": t["id"], "title": t["title"],
                                  "status": t["status"]});
            for k in ["details", "output"] {
                if let Some(text) = t[k].as_str() {
                    card[k] = rich(text);
                }
            }
            if let Some(sources) = t.get("sources") {
                card["sources"] = sources.clone();
            }
            card
        })
        .collect();
    if s.task_display_mode == "plan" && (!cards.is_empty() || s.plan_title.is_some()) {
        return vec![
            json!({"type": "plan", "block_id": format!("p{}", ts.replace('.', "")),
                           "title": s.plan_title.clone().unwrap_or_default(), "tasks": cards}),
        ];
    }
    cards
}

/// Ends, as `errored`, every stream still open past the lifetime.
pub fn expire(w: &mut World) {
    if w.open_streams.is_empty() {
        return;
    }
    let now = now_micros();
    let lifetime = w.settings.stream_lifetime_ms.saturating_mul(1000);
    let open: Vec<_> = w.open_streams.iter().cloned().collect();
    for (channel, key) in open {
        let Some(m) = w.messages.get_mut(&channel).and_then(|m| m.get_mut(&key)) else {
            w.open_streams.remove(&(channel, key));
            continue;
        };
        let Some(s) = m.stream.as_mut() else {
            continue;
        };
        if now.saturating_sub(s.started_at_micros) >= lifetime {
            s.ended = Some("expired".into());
            s.ended_at_micros = Some(s.started_at_micros + lifetime);
            m.streaming_state = Some("errored".into());
            render(m, Vec::new());
            w.open_streams.remove(&(channel, key));
        }
    }
}

/// `chat.startStream`: a new bot message in `thread_ts` (or top level in
/// a channel), open for appends.
pub fn start(
    w: &mut World,
    app: &App,
    install: &Install,
    p: &Params,
    envs: &mut Vec<Envelope>,
) -> Result<Value, ApiError> {
    let channel = crate::api::writable_channel(w, install, p)?;
    let direct = matches!(channel.kind, ChannelKind::Im | ChannelKind::Mpim);
    let thread_ts = p.str("thread_ts");
    if thread_ts.is_none() && direct {
        return Err(ApiError::new("invalid_arguments"));
    }
    // Required when streaming to channels: the person who sees it stream.
    let (recipient_user, recipient_team) = (p.str("recipient_user_id"), p.str("recipient_team_id"));
    if !direct {
        let user = recipient_user
            .as_deref()
            .ok_or(ApiError::new("missing_recipient_user_id"))?;
        let team = recipient_team
            .as_deref()
            .ok_or(ApiError::new("missing_recipient_team_id"))?;
        if !w.users.contains_key(user) {
            return Err(ApiError::new("user_not_found"));
        }
        if !w.teams.contains_key(team) {
            return Err(ApiError::new("team_not_found"));
        }
    }
    let task_display_mode = match p.str("task_display_mode").as_deref() {
        None | Some("timeline") => "timeline",
        Some("plan") => "plan",
        Some(_) => return Err(ApiError::new("invalid_arguments")),
    };
    let c = content(p)?;
    // Both budgets are checked before either is taken: a start refused by
    // one takes nothing from the other.
    let tier2 = w.settings.tier2_per_minute;
    crate::api::tier_check(w, app, install, "chat.startStream", tier2)?;
    crate::api::post_budget(w, &install.team_id, &channel.id)?;
    crate::api::tier_budget(w, app, install, "chat.startStream", tier2)?;
    let thread_ts = thread_ts.map(|t| {
        // A reply's ts resolves to its thread's root, as a post's does.
        w.message(&channel.id, &t)
            .and_then(|m| m.thread_ts.clone())
            .unwrap_or(t)
    });
    let ts = w.clock.next_ts();
    let now = now_micros();
    let mut msg = Message {
        channel: channel.id.clone(),
        ts: ts.clone(),
        user: Some(install.bot_user_id.clone()),
        bot_id: Some(install.bot_id.clone()),
        app_id: Some(app.id.clone()),
        username: None,
        subtype: None,
        original_text: c.text.clone(),
        text: c.text,
        thread_ts,
        blocks: None,
        attachments: None,
        metadata: None,
        edited: None,
        deleted: false,
        client_msg_id: None,
        created_at_micros: now,
        deleted_at_micros: None,
        edits: Vec::new(),
        streaming_state: Some("in_progress".into()),
        stream: Some(Stream {
            mode: c.mode.map(str::to_owned),
            recipient_user_id: recipient_user,
            recipient_team_id: recipient_team,
            started_at_micros: now,
            appends: 0,
            other_chunks: Vec::new(),
            task_display_mode: task_display_mode.to_owned(),
            tasks: Vec::new(),
            plan_title: None,
            ended_at_micros: None,
            ended: None,
        }),
    };
    if let Some(s) = msg.stream.as_mut() {
        keep_tasks(s, &c.other);
        s.other_chunks = c.other;
    }
    render_open(&mut msg);
    w.insert_message(msg.clone());
    w.open_streams
        .insert((channel.id.clone(), crate::model::ts_key(&ts)));
    // The opening event carries no text yet, whatever the start carried.
    let opening = Message {
        text: String::new(),
        ..msg
    };
    envs.extend(events::new_message(w, &channel, &opening));
    crate::assistant::replied(w, &app.id, &channel.id, opening.thread_ts.as_deref());
    Ok(json!({"channel": channel.id, "ts": ts}))
}

/// The open stream `ts` of this app in `channel`, or Slack's refusal.
/// `append`: whether the call is an append (an append after the person's
/// Stop is `stopped_by_user`; a stop then finds the stream ended).
fn open_stream(
    w: &mut World,
    app: &App,
    install: &Install,
    p: &Params,
    append: bool,
) -> Result<(crate::model::Channel, Message), ApiError> {
    let channel = crate::api::writable_channel(w, install, p)?;
    let ts = p.str("ts").ok_or(ApiError::new("message_not_found"))?;
    let m = w
        .message(&channel.id, &ts)
        .filter(|m| !m.deleted)
        .cloned()
        .ok_or(ApiError::new("message_not_found"))?;
    if m.app_id.as_deref() != Some(app.id.as_str()) {
        return Err(ApiError::new("message_not_owned_by_app"));
    }
    match m.stream.as_ref().map(|s| s.ended.as_deref()) {
        Some(None) => Ok((channel, m)),
        Some(Some("stopped_by_user")) if append => Err(ApiError::new("stopped_by_user")),
        _ => Err(ApiError::new("message_not_in_streaming_state")),
    }
}

/// Adds a call's content to a stream, keeping to the stream's form.
fn add(m: &mut Message, c: Content) -> Result<(), ApiError> {
    let s = m.stream.as_mut().expect("an open stream");
    if let (Some(was), Some(now)) = (s.mode.as_deref(), c.mode)
        && was != now
    {
        return Err(ApiError::new("streaming_mode_mismatch"));
    }
    if m.text.chars().count() + c.text.chars().count() > MAX_TEXT_CHARS {
        return Err(ApiError::new("msg_too_long"));
    }
    if s.mode.is_none() {
        s.mode = c.mode.map(str::to_owned);
    }
    keep_tasks(s, &c.other);
    s.other_chunks.extend(c.other);
    m.text.push_str(&c.text);
    render_open(m);
    Ok(())
}

/// `chat.appendStream`: more text (or chunks) for an open stream.
pub fn append(w: &mut World, app: &App, install: &Install, p: &Params) -> Result<Value, ApiError> {
    let (channel, mut m) = open_stream(w, app, install, p, true)?;
    let c = content(p)?;
    if c.mode.is_none() {
        return Err(ApiError::new("markdown_text_or_chunks_required"));
    }
    add(&mut m, c)?;
    crate::api::tier_budget(
        w,
        app,
        install,
        "chat.appendStream",
        w.settings.tier4_per_minute,
    )?;
    if let Some(s) = m.stream.as_mut() {
        s.appends += 1;
    }
    let ts = m.ts.clone();
    w.insert_message(m);
    Ok(json!({"channel": channel.id, "ts": ts}))
}

/// `chat.stopStream`: the last content, blocks below it and metadata; the
/// message is final and a hidden `message_changed` carries its text.
pub fn stop(
    w: &mut World,
    app: &App,
    install: &Install,
    p: &Params,
    envs: &mut Vec<Envelope>,
) -> Result<Value, ApiError> {
    let (channel, before) = open_stream(w, app, install, p, false)?;
    let mut after = before.clone();
    add(&mut after, content(p)?)?;
    let blocks = crate::api::blocks_of(p)?;
    if blocks
        .as_ref()
        .and_then(Value::as_array)
        .is_some_and(|b| b.len() > MAX_STOP_BLOCKS)
    {
        return Err(ApiError::new("msg_blocks_too_many"));
    }
    let metadata = crate::api::metadata_of(p)?;
    crate::api::tier_budget(
        w,
        app,
        install,
        "chat.stopStream",
        w.settings.tier2_per_minute,
    )?;
    render(
        &mut after,
        blocks
            .and_then(|b| b.as_array().cloned())
            .unwrap_or_default(),
    );
    if metadata.is_some() {
        after.metadata = metadata;
    }
    envs.extend(finish(w, &channel, &before, after.clone(), "stopped"));
    let parent = after
        .thread_ts
        .as_deref()
        .and_then(|t| w.message(&channel.id, t))
        .and_then(|m| m.user.clone());
    let mut message = w
        .message(&channel.id, &after.ts)
        .map(|m| m.to_api(parent.as_deref(), 0, true))
        .unwrap_or_default();
    message["team"] = install.team_id.clone().into();
    message["bot_profile"] = json!({"id": install.bot_id, "deleted": false, "name": app.name, "app_id": app.id,
                                    "user_id": install.bot_user_id, "updated": now_unix(), "icons": {},
                                    "team_id": install.team_id});
    Ok(json!({"channel": channel.id, "ts": after.ts, "message": message}))
}

/// An open stream with tasks shows them (and its text so far) as blocks;
/// one without shows no blocks until it ends.
fn render_open(m: &mut Message) {
    if m.stream.as_ref().is_some_and(|s| !s.tasks.is_empty()) {
        render(m, Vec::new());
    }
}

/// A stream's blocks: its tasks (see [`task_blocks`]), the streamed text
/// as Slack renders it (a `rich_text` block), then `below` (the stop's
/// blocks), however it ended.
fn render(m: &mut Message, below: Vec<Value>) {
    let mut blocks = m
        .stream
        .as_ref()
        .map(|s| task_blocks(s, &m.ts))
        .unwrap_or_default();
    if !m.text.is_empty() {
        blocks.push(
            json!({"type": "rich_text", "block_id": format!("s{}", m.ts.replace('.', "")),
                           "elements": [{"type": "rich_text_section",
                                         "elements": [{"type": "text", "text": m.text}]}]}),
        );
    }
    blocks.extend(below);
    if !blocks.is_empty() {
        m.blocks = Some(Value::Array(blocks));
    }
}

/// Ends a stream (`how`: `stopped`, `stopped_by_user`) with `after` as its
/// final form, and returns the `message_changed` it causes.
fn finish(
    w: &mut World,
    channel: &crate::model::Channel,
    before: &Message,
    mut after: Message,
    how: &str,
) -> Vec<Envelope> {
    let now = now_micros();
    if let Some(s) = after.stream.as_mut() {
        s.ended = Some(how.to_owned());
        s.ended_at_micros = Some(now);
    }
    after.streaming_state = Some("completed".into());
    w.open_streams
        .remove(&(channel.id.clone(), crate::model::ts_key(&after.ts)));
    w.insert_message(after.clone());
    let event_ts = w.clock.next_ts();
    // What the apps saw before: the opening event's empty text.
    let seen = Message {
        text: String::new(),
        ..before.clone()
    };
    events::edited(w, channel, &seen, &after, &event_ts)
}

/// The person who receives a stream presses Stop: the stream ends with
/// what it has, later appends get `stopped_by_user`.
pub fn stop_by_user(w: &mut World, channel: &str, ts: &str) -> Result<Vec<Envelope>, &'static str> {
    expire(w);
    let ch = w.channels.get(channel).cloned().ok_or("no such channel")?;
    let m = w
        .message(channel, ts)
        .filter(|m| !m.deleted)
        .cloned()
        .ok_or("no such message")?;
    match m.stream.as_ref().map(|s| s.ended.is_none()) {
        Some(true) => {}
        Some(false) => return Err("the stream has already ended"),
        None => return Err("the message was not streamed"),
    }
    let mut after = m.clone();
    render(&mut after, Vec::new());
    Ok(finish(w, &ch, &m, after, "stopped_by_user"))
}
