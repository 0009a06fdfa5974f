//! What every Web API method shares: a request's arguments read every way
//! Slack's SDKs send them ([`Params`]), Slack's errors ([`ApiError`]), the
//! budgets of its tiers and of posts, and the checks many methods make.
//! [`crate::webapi`] answers the methods; the assistant and stream methods
//! live in their own modules.

use std::collections::BTreeSet;

use axum::http::HeaderMap;
use axum::http::header::{AUTHORIZATION, CONTENT_TYPE, HOST};
use serde_json::{Map, Value};

use crate::model::{App, Bucket, ChannelKind, Install, World, now_micros};

/// Longest text `chat.postMessage` accepts (Slack truncates display at 4,000
/// and refuses above 40,000 characters).
pub const MAX_TEXT_CHARS: usize = 40_000;

/// A Web API failure: Slack's code plus optional extra fields.
#[derive(Debug)]
pub struct ApiError {
    pub code: &'static str,
    pub extra: Map<String, Value>,
    /// HTTP 429 with this `Retry-After`.
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn new(code: &'static str) -> Self {
        Self {
            code,
            extra: Map::new(),
            retry_after: None,
        }
    }

    pub(crate) fn missing_scope(needed: &str, provided: &BTreeSet<String>) -> Self {
        let mut e = Self::new("missing_scope");
        e.extra.insert("needed".into(), needed.into());
        e.extra.insert(
            "provided".into(),
            provided
                .iter()
                .cloned()
                .collect::<Vec<_>>()
                .join(",")
                .into(),
        );
        e
    }

    pub(crate) fn ratelimited(retry_after: u64) -> Self {
        Self {
            code: "ratelimited",
            extra: Map::new(),
            retry_after: Some(retry_after.max(1)),
        }
    }
}

/// What the `Authorization` header says.
#[derive(Debug, Clone, Default)]
pub(crate) enum Authorization {
    #[default]
    None,
    /// `Bearer <token>`: a token for any method.
    Bearer(String),
    /// `Basic base64(client_id:client_secret)`: client credentials for
    /// `oauth.v2.access` (RFC 6749 §2.3.1), as python-slack-sdk sends them.
    Basic { id: String, secret: String },
    /// A `Basic` header that does not decode to `id:secret`.
    BadBasic,
    /// Another scheme, or a value that is not text.
    Other,
}

impl Authorization {
    pub(crate) fn of(headers: &HeaderMap) -> Self {
        let Some(v) = headers.get(AUTHORIZATION) else {
            return Self::None;
        };
        let Ok(v) = v.to_str() else {
            return Self::Other;
        };
        // The scheme is case-insensitive (RFC 9110 §11.1).
        let (scheme, rest) = v.trim().split_once(' ').unwrap_or((v.trim(), ""));
        let rest = rest.trim();
        if scheme.eq_ignore_ascii_case("bearer") {
            if rest.is_empty() {
                Self::None
            } else {
                Self::Bearer(rest.to_owned())
            }
        } else if scheme.eq_ignore_ascii_case("basic") {
            b64_decode(rest)
                .and_then(|b| String::from_utf8(b).ok())
                .and_then(|s| {
                    let (id, secret) = s.split_once(':')?;
                    Some(Self::Basic {
                        id: id.to_owned(),
                        secret: secret.to_owned(),
                    })
                })
                .unwrap_or(Self::BadBasic)
        } else {
            Self::Other
        }
    }
}

/// The character sets Slack accepts in a `Content-Type` (anything else is
/// `invalid_charset`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Charset {
    Utf8,
    Latin1,
}

impl Charset {
    pub(crate) fn named(name: &str) -> Result<Self, ApiError> {
        match name.to_ascii_lowercase().as_str() {
            "utf-8" | "utf8" => Ok(Self::Utf8),
            "iso-8859-1" | "iso8859-1" | "latin1" => Ok(Self::Latin1),
            _ => Err(ApiError::new("invalid_charset")),
        }
    }

    pub(crate) fn text(self, bytes: Vec<u8>, bad: &'static str) -> Result<String, ApiError> {
        match self {
            Self::Utf8 => String::from_utf8(bytes).map_err(|_| ApiError::new(bad)),
            Self::Latin1 => Ok(bytes.into_iter().map(char::from).collect()),
        }
    }
}

/// A `Content-Type` header: its media type (lowercased) and the parameters
/// Slack reads.
pub(crate) struct ContentType {
    mime: String,
    charset: Option<String>,
    boundary: Option<String>,
}

impl ContentType {
    pub(crate) fn of(headers: &HeaderMap) -> Result<Option<Self>, ApiError> {
        let Some(v) = headers.get(CONTENT_TYPE) else {
            return Ok(None);
        };
        let v = v.to_str().map_err(|_| ApiError::new("invalid_post_type"))?;
        let mut parts = v.split(';');
        let mime = parts.next().unwrap_or("").trim().to_ascii_lowercase();
        if mime.is_empty() {
            return Ok(None);
        }
        let (mut charset, mut boundary) = (None, None);
        for p in parts {
            let Some((k, val)) = p.split_once('=') else {
                continue;
            };
            let val = val.trim().trim_matches('"').to_owned();
            match k.trim().to_ascii_lowercase().as_str() {
                "charset" => charset = Some(val),
                "boundary" => boundary = Some(val),
                _ => {}
            }
        }
        Ok(Some(Self {
            mime,
            charset,
            boundary,
        }))
    }
}

/// A request's arguments and credentials, read the ways Slack reads them
/// and the official SDKs send them:
///
/// * arguments from the query string and from a body that is
///   `application/x-www-form-urlencoded` (node-slack-sdk's `WebClient`,
///   python-slack-sdk for every method without blocks), `application/json`
///   (python-slack-sdk's `chat.postMessage` and `chat.update`) or
///   `multipart/form-data`; the media type and its parameters are
///   case-insensitive, and `charset` may be there or not;
/// * the token from `Authorization: Bearer` (both SDKs), else a `token`
///   argument of the query string or a form body (node-slack-sdk sends it
///   there too when a call names its own token). A JSON body cannot carry
///   it: Slack reads JSON only with the token in the header, so a JSON
///   `token` is ignored (python-slack-sdk moves it to the header);
/// * client credentials for `oauth.v2.access` from `Authorization: Basic`
///   (python-slack-sdk) or as `client_id`/`client_secret` arguments
///   (node-slack-sdk's `InstallProvider`).
#[derive(Debug, Default)]
pub struct Params {
    pub(crate) args: Map<String, Value>,
    /// A `token` argument of the query string or a form body.
    pub(crate) token_arg: Option<String>,
    pub(crate) auth: Authorization,
    /// Slack's warnings about how the request was sent (`missing_charset`,
    /// `superfluous_charset`): answered, not refused.
    pub(crate) warnings: Vec<&'static str>,
    /// The `Host` the request was sent to (the emulator's address, for
    /// the URLs it answers).
    pub(crate) host: Option<String>,
}

impl Params {
    pub(crate) fn parse(
        query: Option<&str>,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Result<Self, ApiError> {
        let mut p = Self {
            auth: Authorization::of(headers),
            host: headers
                .get(HOST)
                .and_then(|h| h.to_str().ok())
                .map(str::to_owned),
            ..Self::default()
        };
        if let Some(q) = query {
            for (k, v) in form_pairs(q.as_bytes(), Charset::Utf8)? {
                p.insert_text(k, v)?;
            }
        }
        if body.iter().all(u8::is_ascii_whitespace) {
            // Nothing to read: python-slack-sdk sends `auth.test` with a
            // JSON content type and no body at all.
            return Ok(p);
        }
        let Some(ct) = ContentType::of(headers)? else {
            return Err(ApiError::new("missing_post_type"));
        };
        let charset = ct.charset.as_deref().map(Charset::named).transpose()?;
        match ct.mime.as_str() {
            "application/json" => {
                if charset.is_none() {
                    p.warnings.push("missing_charset");
                }
                let text = charset
                    .unwrap_or(Charset::Utf8)
                    .text(body.to_vec(), "invalid_json")?;
                match serde_json::from_str::<Value>(&text) {
                    Ok(Value::Object(o)) => {
                        for (k, v) in o {
                            if k != "token" {
                                p.args.insert(k, v);
                            }
                        }
                    }
                    Ok(_) => return Err(ApiError::new("json_not_object")),
                    Err(_) => return Err(ApiError::new("invalid_json")),
                }
            }
            // Slack lists `text/plain` among the POST types it takes; its
            // body is read as form data here.
            "application/x-www-form-urlencoded" | "text/plain" => {
                // UTF-8 is what a form is read as anyway (python-slack-sdk
                // 2.4 sent `;charset=utf-8` and got this warning).
                if charset == Some(Charset::Utf8) {
                    p.warnings.push("superfluous_charset");
                }
                for (k, v) in form_pairs(body, charset.unwrap_or(Charset::Utf8))? {
                    p.insert_text(k, v)?;
                }
            }
            "multipart/form-data" => {
                let boundary = ct
                    .boundary
                    .filter(|b| !b.is_empty())
                    .ok_or(ApiError::new("invalid_form_data"))?;
                for (k, v) in multipart_pairs(body, &boundary, charset.unwrap_or(Charset::Utf8))? {
                    p.insert_text(k, v)?;
                }
            }
            _ => return Err(ApiError::new("invalid_post_type")),
        }
        Ok(p)
    }

    /// A query-string or form argument. PHP-style array names (`foo[]`,
    /// `foo[0]`) are never valid with Slack: lists are comma-separated
    /// strings or JSON.
    pub(crate) fn insert_text(&mut self, k: String, v: String) -> Result<(), ApiError> {
        if k.contains('[') || k.contains(']') {
            return Err(ApiError::new("invalid_array_arg"));
        }
        if k == "token" {
            self.token_arg = Some(v).filter(|t| !t.is_empty());
        } else {
            self.args.insert(k, Value::String(v));
        }
        Ok(())
    }

    /// The token: the `Authorization: Bearer` header wins over a `token`
    /// argument (node-slack-sdk sends both, alike).
    pub(crate) fn token(&self) -> Option<String> {
        match &self.auth {
            Authorization::Bearer(t) => Some(t.clone()),
            _ => self.token_arg.clone(),
        }
    }

    pub fn str(&self, key: &str) -> Option<String> {
        match self.args.get(key)? {
            Value::String(s) if !s.is_empty() => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            Value::Bool(b) => Some(b.to_string()),
            _ => None,
        }
    }

    /// Whether `key` is given as text (even empty), not as another JSON
    /// value.
    pub fn is_text(&self, key: &str) -> bool {
        matches!(self.args.get(key), Some(Value::String(_)))
    }

    pub fn flag(&self, key: &str) -> bool {
        self.boolean(key).unwrap_or(false)
    }

    /// A boolean argument as sent: `None` when absent or not a boolean.
    /// python-slack-sdk sends `1`/`0` (`convert_bool_to_0_or_1`),
    /// node-slack-sdk `true`/`false`, JSON bodies real booleans.
    pub fn boolean(&self, key: &str) -> Option<bool> {
        match self.args.get(key)? {
            Value::Bool(b) => Some(*b),
            Value::Number(n) => match n.as_u64() {
                Some(1) => Some(true),
                Some(0) => Some(false),
                _ => None,
            },
            Value::String(s) => {
                let s = s.trim();
                if s == "1" || s.eq_ignore_ascii_case("true") {
                    Some(true)
                } else if s == "0" || s.eq_ignore_ascii_case("false") {
                    Some(false)
                } else {
                    None
                }
            }
            _ => None,
        }
    }

    /// A JSON-valued argument (`blocks`, `attachments`, `metadata`): a
    /// JSON-encoded string in a query string or form body (and allowed in a
    /// JSON body too), the value itself in a JSON body. `bad` is Slack's
    /// code for one that is not JSON.
    pub fn json(&self, key: &str, bad: &'static str) -> Result<Option<Value>, ApiError> {
        match self.args.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) if s.trim().is_empty() => Ok(None),
            Some(Value::String(s)) => serde_json::from_str(s)
                .map(Some)
                .map_err(|_| ApiError::new(bad)),
            Some(v) => Ok(Some(v.clone())),
        }
    }
}

/// `application/x-www-form-urlencoded` pairs (`+` is a space, `%XX` a
/// byte; a `%` that starts no escape stands for itself).
pub(crate) fn form_pairs(raw: &[u8], charset: Charset) -> Result<Vec<(String, String)>, ApiError> {
    raw.split(|b| *b == b'&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = match p.iter().position(|b| *b == b'=') {
                Some(i) => (&p[..i], &p[i + 1..]),
                None => (p, &p[p.len()..]),
            };
            Ok((
                charset.text(percent_decode(k), "invalid_form_data")?,
                charset.text(percent_decode(v), "invalid_form_data")?,
            ))
        })
        .collect()
}

pub(crate) fn percent_decode(s: &[u8]) -> Vec<u8> {
    let hex = |i: usize| {
        s.get(i)
            .and_then(|b| char::from(*b).to_digit(16))
            .and_then(|d| u8::try_from(d).ok())
    };
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        match (s[i], hex(i + 1), hex(i + 2)) {
            (b'+', _, _) => out.push(b' '),
            (b'%', Some(h), Some(l)) => {
                out.push((h << 4) | l);
                i += 2;
            }
            (b, _, _) => out.push(b),
        }
        i += 1;
    }
    out
}

/// The text fields of a `multipart/form-data` body (a file part is
/// skipped: no method served here takes a file).
pub(crate) fn multipart_pairs(
    body: &[u8],
    boundary: &str,
    charset: Charset,
) -> Result<Vec<(String, String)>, ApiError> {
    let bad = || ApiError::new("invalid_form_data");
    let delimiter = format!("--{boundary}");
    let mut chunks = split_on(body, delimiter.as_bytes()).into_iter();
    chunks.next(); // the preamble
    let mut out = Vec::new();
    for chunk in chunks {
        if chunk.starts_with(b"--") {
            return Ok(out);
        }
        let part = chunk.strip_prefix(b"\r\n").ok_or_else(bad)?;
        let split = find(part, b"\r\n\r\n").ok_or_else(bad)?;
        let head = std::str::from_utf8(&part[..split]).map_err(|_| bad())?;
        let value = part[split + 4..].strip_suffix(b"\r\n").ok_or_else(bad)?;
        let (mut name, mut file) = (None, false);
        for line in head.split("\r\n") {
            let Some((h, v)) = line.split_once(':') else {
                continue;
            };
            if !h.trim().eq_ignore_ascii_case("content-disposition") {
                continue;
            }
            for param in v.split(';').skip(1) {
                match param.split_once('=') {
                    Some((k, v)) if k.trim().eq_ignore_ascii_case("name") => {
                        name = Some(v.trim().trim_matches('"').to_owned());
                    }
                    Some((k, _)) if k.trim().eq_ignore_ascii_case("filename") => file = true,
                    _ => {}
                }
            }
        }
        let name = name.ok_or_else(bad)?;
        if !file {
            out.push((name, charset.text(value.to_vec(), "invalid_form_data")?));
        }
    }
    // No closing delimiter: the body was cut short.
    Err(bad())
}

pub(crate) fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

pub(crate) fn split_on<'a>(hay: &'a [u8], needle: &[u8]) -> Vec<&'a [u8]> {
    let mut out = Vec::new();
    let mut rest = hay;
    while let Some(i) = find(rest, needle) {
        out.push(&rest[..i]);
        rest = &rest[i + needle.len()..];
    }
    out.push(rest);
    out
}

pub(crate) fn need_scope(install: &Install, scope: &str) -> Result<(), ApiError> {
    if install.scopes.contains(scope) {
        Ok(())
    } else {
        Err(ApiError::missing_scope(scope, &install.scopes))
    }
}

/// Looks a channel up within the caller's workspace.
pub(crate) fn channel_of(
    w: &World,
    install: &Install,
    p: &Params,
) -> Result<crate::model::Channel, ApiError> {
    let id = p.str("channel").ok_or(ApiError::new("channel_not_found"))?;
    w.channels
        .get(&id)
        .filter(|c| w.covers(install, &c.team_id))
        .cloned()
        .ok_or(ApiError::new("channel_not_found"))
}

/// Whether `method`'s budget has room for one more call, without taking it.
pub(crate) fn tier_check(
    w: &mut World,
    app: &App,
    install: &Install,
    method: &str,
    per_minute: u32,
) -> Result<(), ApiError> {
    tier_budget(w, app, install, method, per_minute)?;
    if let Some(window) =
        w.read_windows
            .get_mut(&(app.id.clone(), install.team_id.clone(), method.to_owned()))
    {
        window.pop_back();
    }
    Ok(())
}

/// A method's budget of `per_minute` requests per app and workspace, over
/// a sliding minute (Slack's tiers), or `ratelimited` with the wait.
pub(crate) fn tier_budget(
    w: &mut World,
    app: &App,
    install: &Install,
    method: &str,
    per_minute: u32,
) -> Result<(), ApiError> {
    let per_minute = per_minute.max(1) as usize;
    let now = now_micros();
    let window = w
        .read_windows
        .entry((app.id.clone(), install.team_id.clone(), method.to_owned()))
        .or_default();
    // Oldest first: dropping what left the minute costs only what left.
    while window
        .front()
        .is_some_and(|t| now.saturating_sub(*t) >= 60_000_000)
    {
        window.pop_front();
    }
    if window.len() >= per_minute {
        let oldest = window.front().copied().unwrap_or(now);
        let wait = (60_000_000 - now.saturating_sub(oldest)).div_ceil(1_000_000);
        return Err(ApiError::ratelimited(wait));
    }
    window.push_back(now);
    Ok(())
}

/// The posting budget of a channel: about `posts_per_second`, with a burst.
pub(crate) fn post_budget(w: &mut World, team: &str, channel: &str) -> Result<(), ApiError> {
    let (rate, burst) = (
        w.settings.posts_per_second.max(0.001),
        w.settings.post_burst.max(1.0),
    );
    let now = now_micros();
    let b = w
        .post_buckets
        .entry((team.to_owned(), channel.to_owned()))
        .or_insert(Bucket {
            tokens: burst,
            at_micros: now,
        });
    b.tokens = (b.tokens + (now - b.at_micros) as f64 / 1e6 * rate).min(burst);
    b.at_micros = now;
    if b.tokens < 1.0 {
        let wait = ((1.0 - b.tokens) / rate).ceil() as u64;
        return Err(ApiError::ratelimited(wait));
    }
    b.tokens -= 1.0;
    Ok(())
}

/// The channel a call writes to, where the bot may write: a member, or
/// any public channel with `chat:write.public`; not archived.
pub(crate) fn writable_channel(
    w: &World,
    install: &Install,
    p: &Params,
) -> Result<crate::model::Channel, ApiError> {
    need_scope(install, "chat:write")?;
    let channel = channel_of(w, install, p)?;
    if channel.is_archived {
        return Err(ApiError::new("is_archived"));
    }
    let member = channel.members.contains(&install.bot_user_id);
    let public_ok =
        channel.kind == ChannelKind::Public && install.scopes.contains("chat:write.public");
    if !member && !public_ok {
        return Err(if channel.kind == ChannelKind::Public {
            ApiError::new("not_in_channel")
        } else {
            ApiError::new("channel_not_found")
        });
    }
    Ok(channel)
}

/// Most attachments a message may carry.
pub(crate) const MAX_ATTACHMENTS: usize = 100;

/// `blocks`: a JSON array, sent as one (JSON bodies) or JSON-encoded (forms).
/// A `context_actions` block is checked as Slack documents it (see
/// [`context_actions_ok`]); other blocks are kept as sent.
pub(crate) fn blocks_of(p: &Params) -> Result<Option<Value>, ApiError> {
    match p.json("blocks", "invalid_blocks_format")? {
        Some(b) if !b.is_array() => Err(ApiError::new("invalid_blocks_format")),
        Some(b)
            if b.as_array().is_some_and(|a| {
                a.iter()
                    .any(|b| b["type"] == "context_actions" && !context_actions_ok(b))
            }) =>
        {
            Err(ApiError::new("invalid_blocks"))
        }
        b => Ok(b),
    }
}

/// Slack's `context_actions` block (docs.slack.dev, "Context actions
/// block", "Feedback buttons element"; slack_sdk's `ContextActionsBlock`,
/// `FeedbackButtonsElement`): 1 to 5 elements, each `feedback_buttons`
/// (a `positive_button` and a `negative_button`, each with `plain_text`
/// text, a value of at most 2000 characters and an optional
/// `accessibility_label` of at most 75) or `icon_button` (an icon and
/// `plain_text` text); `block_id` and `action_id` at most 255 characters.
pub(crate) fn context_actions_ok(b: &Value) -> bool {
    let within =
        |v: &Value, max: usize| v.is_null() || v.as_str().is_some_and(|s| s.chars().count() <= max);
    let plain =
        |t: &Value| t["type"] == "plain_text" && t["text"].as_str().is_some_and(|s| !s.is_empty());
    let button = |b: &Value| {
        b.is_object()
            && plain(&b["text"])
            && b["value"]
                .as_str()
                .is_some_and(|v| !v.is_empty() && v.chars().count() <= 2000)
            && within(&b["accessibility_label"], 75)
    };
    let element = |e: &Value| {
        within(&e["action_id"], 255)
            && match e["type"].as_str() {
                Some("feedback_buttons") => {
                    button(&e["positive_button"]) && button(&e["negative_button"])
                }
                Some("icon_button") => e["icon"].is_string() && plain(&e["text"]),
                _ => false,
            }
    };
    within(&b["block_id"], 255)
        && b["elements"]
            .as_array()
            .is_some_and(|e| (1..=5).contains(&e.len()) && e.iter().all(element))
}

/// `attachments`: a JSON array of at most 100, as `blocks` is sent.
pub(crate) fn attachments_of(p: &Params) -> Result<Option<Value>, ApiError> {
    match p.json("attachments", "invalid_attachments")? {
        Some(Value::Array(a)) if a.len() > MAX_ATTACHMENTS => {
            Err(ApiError::new("too_many_attachments"))
        }
        Some(a) if !a.is_array() => Err(ApiError::new("invalid_attachments")),
        a => Ok(a),
    }
}

/// `metadata`: an object with an `event_type`, as `blocks` is sent.
pub(crate) fn metadata_of(p: &Params) -> Result<Option<Value>, ApiError> {
    let metadata = p.json("metadata", "invalid_metadata_format")?;
    if let Some(md) = &metadata
        && md
            .get("event_type")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
    {
        return Err(ApiError::new("invalid_metadata_format"));
    }
    Ok(metadata)
}

pub(crate) const B64: &[u8; 64] =
    b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64, padding optional.
pub(crate) fn b64_decode(s: &str) -> Option<Vec<u8>> {
    let mut bits = 0u32;
    let mut nbits = 0;
    let mut bytes = Vec::new();
    for ch in s.trim_end_matches('=').bytes() {
        let v = B64.iter().position(|x| *x == ch)? as u32;
        bits = (bits << 6) | v;
        nbits += 6;
        if nbits >= 8 {
            nbits -= 8;
            bytes.push((bits >> nbits) as u8);
            bits &= (1 << nbits) - 1;
        }
    }
    Some(bytes)
}

#[cfg(test)]
mod tests {
    use super::context_actions_ok;
    use serde_json::json;

    #[test]
    fn a_context_actions_block_is_checked_as_slack_documents_it() {
        let fb = |pos: serde_json::Value| {
            json!({"type": "context_actions", "elements": [{
                "type": "feedback_buttons", "action_id": "feedback_buttons_1",
                "positive_button": pos,
                "negative_button": {"text": {"type": "plain_text", "text": "👎"}, "value": "negative_feedback"}
            }]})
        };
        let good =
            json!({"text": {"type": "plain_text", "text": "👍"}, "value": "positive_feedback"});
        assert!(context_actions_ok(&fb(good)));
        assert!(context_actions_ok(
            &json!({"type": "context_actions", "elements": [
            {"type": "icon_button", "icon": "trash", "text": {"type": "plain_text", "text": "Delete"}}]})
        ));
        for bad in [
            json!({"text": {"type": "mrkdwn", "text": "👍"}, "value": "p"}),
            json!({"text": {"type": "plain_text", "text": "👍"}}),
            json!({"text": {"type": "plain_text", "text": "👍"}, "value": "p",
                   "accessibility_label": "x".repeat(76)}),
            json!(null),
        ] {
            assert!(!context_actions_ok(&fb(bad)));
        }
        assert!(!context_actions_ok(
            &json!({"type": "context_actions", "elements": []})
        ));
        assert!(!context_actions_ok(
            &json!({"type": "context_actions", "elements": [{"type": "button"}]})
        ));
    }
}
