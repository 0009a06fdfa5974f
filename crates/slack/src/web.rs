//! A small Slack Web API client. It never retries by itself: callers decide
//! (a post whose outcome is unknown must be reconciled, not re-sent).

use std::time::Duration;

use serde_json::Value;

#[derive(Debug, thiserror::Error)]
pub enum WebError {
    /// `ok: false` with Slack's error code.
    #[error("Slack error {code}")]
    Api { code: String },
    /// HTTP 429: wait `retry_after`.
    #[error("rate limited for {retry_after:?}")]
    RateLimited { retry_after: Duration },
    /// A non-2xx status other than 429.
    #[error("HTTP {0}")]
    Http(u16),
    /// The request may or may not have reached Slack (timeout, reset).
    #[error("transport: {0}")]
    Transport(String),
    /// An answer that is not Slack's JSON.
    #[error("undecodable answer")]
    Decode,
}

impl WebError {
    /// Whether Slack could not be reached or failed on its side (try again
    /// later), as opposed to an answer that will not change. The worker's
    /// retry rules read it through `threadline_tenancy::fault`.
    pub fn is_transient(&self) -> bool {
        match self {
            WebError::Transport(_) | WebError::Decode | WebError::RateLimited { .. } => true,
            WebError::Http(status) => *status >= 500 || *status == 408 || *status == 429,
            WebError::Api { code } => matches!(
                code.as_str(),
                "internal_error"
                    | "fatal_error"
                    | "service_unavailable"
                    | "request_timeout"
                    | "ratelimited"
            ),
        }
    }

    /// What failed, as a short code naming the kind, never the data:
    /// `slack_<error code>` (Slack's code as it came: cut to a label by the
    /// caller), `slack_ratelimited`, `slack_http_<status>`,
    /// `slack_transport`, `slack_undecodable`.
    pub fn code(&self) -> String {
        match self {
            WebError::Api { code } => format!("slack_{code}"),
            WebError::RateLimited { .. } => "slack_ratelimited".into(),
            WebError::Http(status) => format!("slack_http_{status}"),
            WebError::Transport(_) => "slack_transport".into(),
            WebError::Decode => "slack_undecodable".into(),
        }
    }
}

/// Slack's answers that mean the credentials were refused.
const AUTH_ERRORS: &[&str] = &[
    "not_authed",
    "invalid_auth",
    "token_revoked",
    "token_expired",
    "account_inactive",
    "missing_scope",
    "not_allowed_token_type",
];

#[derive(Clone, Debug)]
pub struct WebClient {
    base: String,
    http: reqwest::Client,
}

/// One page of `conversations.replies`.
#[derive(Debug, Clone)]
pub struct RepliesPage {
    pub messages: Vec<Value>,
    pub next_cursor: Option<String>,
}

impl WebClient {
    /// `base` is `SLACK_API_URL` (e.g. `https://slack.com/api/`).
    pub fn new(base: &str, timeout: Duration) -> Result<Self, WebError> {
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| WebError::Transport(e.to_string()))?;
        Ok(Self {
            base: format!("{}/", base.trim_end_matches('/')),
            http,
        })
    }

    /// Calls `method` with a bearer token and form arguments.
    ///
    /// Each call is a `slack.api` span (method and outcome, never arguments)
    /// and counts in `threadline_slack_api_calls_total`; refused credentials
    /// also in `threadline_auth_failures_total{source="slack_api"}`.
    pub async fn call(
        &self,
        method: &str,
        token: &str,
        form: &[(&str, &str)],
    ) -> Result<Value, WebError> {
        use tracing::Instrument as _;
        let span = tracing::info_span!("slack.api", method, outcome = tracing::field::Empty);
        let r = self
            .call_once(method, token, form)
            .instrument(span.clone())
            .await;
        let outcome = match &r {
            Ok(_) => "ok",
            Err(WebError::Api { code }) => code.as_str(),
            Err(WebError::RateLimited { .. }) => "ratelimited",
            Err(WebError::Http(_)) => "http_error",
            Err(WebError::Transport(_)) => "transport",
            Err(WebError::Decode) => "undecodable",
        };
        // Slack's codes are short identifiers; anything else is bucketed so
        // a label can never carry free text.
        let outcome = if outcome.len() <= 40
            && outcome.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
        {
            outcome.to_owned()
        } else {
            "other".to_owned()
        };
        span.record("outcome", outcome.as_str());
        if AUTH_ERRORS.contains(&outcome.as_str()) {
            metrics::counter!("threadline_auth_failures_total", "source" => "slack_api", "reason" => outcome.clone())
                .increment(1);
        }
        metrics::counter!("threadline_slack_api_calls_total", "method" => method.to_owned(), "outcome" => outcome)
            .increment(1);
        r
    }

    async fn call_once(
        &self,
        method: &str,
        token: &str,
        form: &[(&str, &str)],
    ) -> Result<Value, WebError> {
        let r = self
            .http
            .post(format!("{}{method}", self.base))
            .bearer_auth(token)
            .form(form)
            .send()
            .await
            .map_err(|e| {
                // `connect`: the request never left; anything else may have reached Slack.
                WebError::Transport(if e.is_connect() {
                    "connect".into()
                } else if e.is_timeout() {
                    "timed out".into()
                } else {
                    "connection".into()
                })
            })?;
        let status = r.status().as_u16();
        if status == 429 {
            let secs = r
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok())
                .unwrap_or(1)
                .clamp(1, 3600);
            return Err(WebError::RateLimited {
                retry_after: Duration::from_secs(secs),
            });
        }
        if !(200..300).contains(&status) {
            return Err(WebError::Http(status));
        }
        let v: Value = r.json().await.map_err(|_| WebError::Decode)?;
        match v.get("ok").and_then(Value::as_bool) {
            Some(true) => Ok(v),
            Some(false) => Err(WebError::Api {
                code: v
                    .get("error")
                    .and_then(Value::as_str)
                    .unwrap_or("unknown_error")
                    .to_owned(),
            }),
            None => Err(WebError::Decode),
        }
    }

    /// `oauth.v2.access`: exchanges a code (or, with `grant_type=refresh_token`,
    /// a refresh token) using the app's client credentials.
    pub async fn oauth_v2_access(&self, form: &[(&str, &str)]) -> Result<Value, WebError> {
        let r = self
            .http
            .post(format!("{}oauth.v2.access", self.base))
            .form(form)
            .send()
            .await
            .map_err(|e| {
                // `connect`: the request never left; anything else may have reached Slack.
                WebError::Transport(
                    if e.is_connect() {
                        "connect"
                    } else {
                        "connection"
                    }
                    .into(),
                )
            })?;
        let status = r.status().as_u16();
        if !(200..300).contains(&status) {
            return Err(WebError::Http(status));
        }
        let v: Value = r.json().await.map_err(|_| WebError::Decode)?;
        match v.get("ok").and_then(Value::as_bool) {
            Some(true) => Ok(v),
            _ => Err(WebError::Api {
                code: v
                    .get("error")
                    .and_then(Value::as_str)
                    .unwrap_or("unknown_error")
                    .to_owned(),
            }),
        }
    }

    /// `chat.postMessage` into a thread, with message metadata. Never
    /// retried here: an unknown outcome must be reconciled first.
    ///
    /// Links and media are unfurled only when `unfurl` is true: Slack
    /// unfurls media by default, and an unfurl fetches a link nobody
    /// clicked, so both are turned off explicitly otherwise.
    #[allow(clippy::too_many_arguments)]
    pub async fn post_reply(
        &self,
        token: &str,
        channel: &str,
        thread_ts: &str,
        text: &str,
        blocks_json: &str,
        metadata_json: &str,
        unfurl: bool,
    ) -> Result<String, WebError> {
        let mut form = vec![
            ("channel", channel),
            ("thread_ts", thread_ts),
            ("text", text),
            ("metadata", metadata_json),
        ];
        if !blocks_json.is_empty() {
            form.push(("blocks", blocks_json));
        }
        let unfurl = if unfurl { "true" } else { "false" };
        form.push(("unfurl_links", unfurl));
        form.push(("unfurl_media", unfurl));
        let v = self.call("chat.postMessage", token, &form).await?;
        v.get("ts")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or(WebError::Decode)
    }

    /// `chat.startStream` in thread `thread_ts`, for `recipient` (user,
    /// team; Slack asks for them in channels), with its first `chunks` (a
    /// JSON array; none when empty); the stream's ts. Never retried here:
    /// the start is a post, and an unknown outcome is reconciled.
    pub async fn start_stream(
        &self,
        token: &str,
        channel: &str,
        thread_ts: &str,
        recipient: (Option<&str>, Option<&str>),
        chunks_json: &str,
    ) -> Result<String, WebError> {
        let mut form = vec![("channel", channel), ("thread_ts", thread_ts)];
        if let Some(u) = recipient.0 {
            form.push(("recipient_user_id", u));
        }
        if let Some(t) = recipient.1 {
            form.push(("recipient_team_id", t));
        }
        if !chunks_json.is_empty() {
            form.push(("chunks", chunks_json));
        }
        let v = self.call("chat.startStream", token, &form).await?;
        v.get("ts")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or(WebError::Decode)
    }

    /// `chat.appendStream`: adds `content` to the open stream `ts`.
    pub async fn append_stream(
        &self,
        token: &str,
        channel: &str,
        ts: &str,
        content: StreamContent<'_>,
    ) -> Result<(), WebError> {
        let mut form = vec![("channel", channel), ("ts", ts)];
        content.push_to(&mut form);
        self.call("chat.appendStream", token, &form)
            .await
            .map(|_| ())
    }

    /// `chat.stopStream`: the last content (may be empty), blocks shown
    /// below the streamed text, and the message's metadata.
    pub async fn stop_stream(
        &self,
        token: &str,
        channel: &str,
        ts: &str,
        content: StreamContent<'_>,
        blocks_json: &str,
        metadata_json: &str,
    ) -> Result<(), WebError> {
        let mut form = vec![("channel", channel), ("ts", ts)];
        content.push_to(&mut form);
        if !blocks_json.is_empty() {
            form.push(("blocks", blocks_json));
        }
        if !metadata_json.is_empty() {
            form.push(("metadata", metadata_json));
        }
        self.call("chat.stopStream", token, &form).await.map(|_| ())
    }

    /// `chat.update` of our own message `ts`: its whole text, blocks and
    /// metadata (all replaced). Never retried here: an update of the same
    /// content is idempotent, and its caller decides when to try again.
    pub async fn update_message(
        &self,
        token: &str,
        channel: &str,
        ts: &str,
        text: &str,
        blocks_json: &str,
        metadata_json: &str,
    ) -> Result<(), WebError> {
        let mut form = vec![("channel", channel), ("ts", ts), ("text", text)];
        if !blocks_json.is_empty() {
            form.push(("blocks", blocks_json));
        }
        if !metadata_json.is_empty() {
            form.push(("metadata", metadata_json));
        }
        self.call("chat.update", token, &form).await.map(|_| ())
    }

    pub async fn conversations_replies(
        &self,
        token: &str,
        channel: &str,
        ts: &str,
        cursor: Option<&str>,
        limit: u32,
    ) -> Result<RepliesPage, WebError> {
        let limit = limit.to_string();
        let mut form = vec![
            ("channel", channel),
            ("ts", ts),
            ("limit", limit.as_str()),
            ("include_all_metadata", "true"),
        ];
        if let Some(c) = cursor {
            form.push(("cursor", c));
        }
        let v = self.call("conversations.replies", token, &form).await?;
        let messages = v
            .get("messages")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let next_cursor = v
            .pointer("/response_metadata/next_cursor")
            .and_then(Value::as_str)
            .filter(|c| !c.is_empty() && v.get("has_more").and_then(Value::as_bool) == Some(true))
            .map(str::to_owned);
        Ok(RepliesPage {
            messages,
            next_cursor,
        })
    }

    /// `conversations.info`: whether `channel` is private (a private channel,
    /// multi-person DM or DM), as Slack sees it now.
    pub async fn channel_is_private(&self, token: &str, channel: &str) -> Result<bool, WebError> {
        let v = self
            .call("conversations.info", token, &[("channel", channel)])
            .await?;
        let c = v.get("channel").ok_or(WebError::Decode)?;
        let flag = |k: &str| c.get(k).and_then(Value::as_bool);
        match (flag("is_private"), flag("is_im"), flag("is_mpim")) {
            (None, None, None) => Err(WebError::Decode),
            (p, im, mpim) => Ok(p.unwrap_or(false) || im.unwrap_or(false) || mpim.unwrap_or(false)),
        }
    }
}

/// What one call adds to a stream: `markdown_text`, or `chunks` (a JSON
/// array of Slack's streaming chunks). A stream keeps to the form its
/// first content came in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamContent<'a> {
    Text(&'a str),
    Chunks(&'a str),
}

impl<'a> StreamContent<'a> {
    fn push_to<'f>(self, form: &mut Vec<(&'static str, &'f str)>)
    where
        'a: 'f,
    {
        match self {
            Self::Text(t) if !t.is_empty() => form.push(("markdown_text", t)),
            Self::Chunks(c) if !c.is_empty() && c != "[]" => form.push(("chunks", c)),
            _ => {}
        }
    }
}
