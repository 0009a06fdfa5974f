//! Installing the app into a workspace: `GET /slack/install` starts Slack's
//! OAuth flow with least-privilege bot scopes and a random `state` that is
//! single use, expires, and is bound to the browser by a cookie;
//! `GET /slack/oauth/callback` checks all of that, exchanges the code, and
//! stores the installation with its tokens sealed.
//!
//! Install links are anonymous and each stores a state row, so they are
//! rate limited (overall and per client address, 429 with `Retry-After`)
//! and every new state deletes those past their validity.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use axum::extract::{ConnectInfo, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use secrecy::{ExposeSecret as _, SecretString};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use sqlx::PgPool;
use threadline_slack::WebClient;
use threadline_tenancy::installations::{Registration, register};

use crate::config::OAuthSettings;
use crate::page::page;
use crate::ratelimit::Limiter;

pub use crate::config::DEFAULT_BOT_SCOPES;

/// What the assistant pane adds (with DMs allowed by the policy): the
/// scopes to ask for (`THREADLINE_BOT_SCOPES`) and the events to subscribe.
pub const PANE_BOT_SCOPES: &str = "im:history,assistant:write";
pub const PANE_EVENTS: &[&str] = &[
    "message.im",
    threadline_domain::assistant::STARTED,
    threadline_domain::assistant::CONTEXT_CHANGED,
];
/// What the agent messaging experience (`features.agent_view`, the
/// manifest's default) adds with the same scopes: the events to subscribe.
pub const AGENT_EVENTS: &[&str] = &[
    "message.im",
    threadline_domain::agent_view::HOME_OPENED,
    threadline_domain::agent_view::CONTEXT_CHANGED,
];
const COOKIE: &str = "tl_oauth_browser";

pub struct OAuth {
    pub settings: Arc<OAuthSettings>,
    pub web: WebClient,
}

#[derive(Clone)]
pub struct OAuthState {
    pub pool: PgPool,
    pub oauth: Arc<OAuth>,
    /// Install links handed out (see `THREADLINE_INSTALL_RATE_*`).
    pub limiter: Arc<Limiter>,
    /// Take the client's address from `X-Forwarded-For`.
    pub trust_forwarded_for: bool,
}

fn digest(s: &str) -> String {
    hex::encode(Sha256::digest(s.as_bytes()))
}

fn random() -> String {
    format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

/// The address a request came from: the peer, or with
/// `trust_forwarded_for` the last `X-Forwarded-For` entry (the one the
/// proxy in front wrote; earlier ones are the client's own claims).
fn client_address(req: &Request, trust_forwarded_for: bool) -> IpAddr {
    let forwarded = trust_forwarded_for
        .then(|| {
            req.headers()
                .get_all("x-forwarded-for")
                .iter()
                .next_back()?
                .to_str()
                .ok()?
                .rsplit(',')
                .next()?
                .trim()
                .parse::<IpAddr>()
                .ok()
        })
        .flatten();
    forwarded
        .or_else(|| {
            req.extensions()
                .get::<ConnectInfo<SocketAddr>>()
                .map(|c| c.0.ip())
        })
        .unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED))
}

pub async fn install(State(s): State<OAuthState>, req: Request) -> Response {
    if let Err((why, wait)) = s.limiter.check(client_address(&req, s.trust_forwarded_for)) {
        metrics::counter!("threadline_oauth_installs_limited_total", "limit" => why.label())
            .increment(1);
        if let Some(unlogged) = threadline_runtime::sampled::refusals().admit("install_limited") {
            tracing::warn!(
                limit = why.label(),
                unlogged_since_last = unlogged,
                "install link rate-limited (one line a minute; the metrics count each)"
            );
        }
        let mut resp = page(
            StatusCode::TOO_MANY_REQUESTS,
            "Too many installation attempts",
            "Wait a moment, then start again from /slack/install.",
        );
        let secs = wait.as_secs_f64().ceil().max(1.0) as u64;
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        return resp;
    }
    let (state, browser) = (random(), random());
    // States past their validity go as each new one is written.
    let r = threadline_store::oauth_states::begin(
        &s.pool,
        &digest(&state),
        &digest(&browser),
        s.oauth.settings.state_ttl.as_secs_f64(),
    )
    .await;
    match r {
        Ok(purged) => {
            if purged > 0 {
                metrics::counter!("threadline_oauth_states_purged_total").increment(purged as u64);
            }
        }
        Err(e) => {
            tracing::error!(error = %e, "could not start an installation");
            return page(
                StatusCode::SERVICE_UNAVAILABLE,
                "Try again in a moment",
                "threadline could not start the installation.",
            );
        }
    }
    let query = serde_urlencoded::to_string([
        ("client_id", s.oauth.settings.client_id.as_str()),
        ("scope", s.oauth.settings.scopes.as_str()),
        ("state", state.as_str()),
        ("redirect_uri", s.oauth.settings.redirect_url.as_str()),
    ])
    .unwrap_or_default();
    let secure = if s.oauth.settings.redirect_url.starts_with("https://") {
        "; Secure"
    } else {
        ""
    };
    let cookie = format!(
        "{COOKIE}={browser}; HttpOnly; SameSite=Lax; Path=/slack/oauth; Max-Age={}{secure}",
        s.oauth.settings.state_ttl.as_secs()
    );
    let mut resp = (StatusCode::FOUND, "").into_response();
    let h = resp.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&format!("{}?{query}", s.oauth.settings.authorize_url)) {
        h.insert(header::LOCATION, v);
    }
    if let Ok(v) = HeaderValue::from_str(&cookie) {
        h.insert(header::SET_COOKIE, v);
    }
    resp
}

#[derive(Deserialize)]
pub struct Callback {
    code: Option<String>,
    state: Option<String>,
    error: Option<String>,
}

fn browser_cookie(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == COOKIE)
        .map(|(_, v)| v.to_owned())
}

const INVALID: &str = "This installation link is invalid, has expired or was already used. Start again from /slack/install.";

pub async fn callback(
    State(s): State<OAuthState>,
    headers: HeaderMap,
    Query(q): Query<Callback>,
) -> Response {
    if let Some(e) = q.error.filter(|e| !e.is_empty()) {
        let e: String = e
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
            .take(64)
            .collect();
        metrics::counter!("threadline_oauth_callbacks_total", "result" => "declined").increment(1);
        return page(
            StatusCode::BAD_REQUEST,
            "Installation cancelled",
            &format!("Slack reported: {e}. Nothing was installed."),
        );
    }
    let (Some(state), Some(code)) = (
        q.state.filter(|s| !s.is_empty()),
        q.code.filter(|c| !c.is_empty()),
    ) else {
        metrics::counter!("threadline_oauth_callbacks_total", "result" => "missing_state")
            .increment(1);
        return page(StatusCode::BAD_REQUEST, "Installation failed", INVALID);
    };
    let browser = browser_cookie(&headers).unwrap_or_default();
    // Single use, unexpired, and from the browser that started it: one
    // compare-and-set. A failure says nothing about which check failed.
    let claimed =
        threadline_store::oauth_states::claim(&s.pool, &digest(&state), &digest(&browser)).await;
    match claimed {
        Ok(true) => {}
        Ok(_) => {
            metrics::counter!("threadline_oauth_callbacks_total", "result" => "bad_state")
                .increment(1);
            tracing::warn!("OAuth callback with a missing, reused, expired or foreign state");
            return page(StatusCode::BAD_REQUEST, "Installation failed", INVALID);
        }
        Err(e) => {
            tracing::error!(error = %e, "could not check the OAuth state");
            return page(
                StatusCode::SERVICE_UNAVAILABLE,
                "Try again in a moment",
                "threadline could not finish the installation.",
            );
        }
    }
    match finish(&s, &code).await {
        Ok(team) => {
            metrics::counter!("threadline_oauth_callbacks_total", "result" => "installed")
                .increment(1);
            page(
                StatusCode::OK,
                "threadline is installed",
                &format!(
                    "threadline can now answer in {team}. Mention it in a thread to ask for help."
                ),
            )
        }
        Err(e) => {
            metrics::counter!("threadline_oauth_callbacks_total", "result" => "exchange_failed")
                .increment(1);
            tracing::warn!(error = format!("{e:#}"), "OAuth code exchange failed");
            page(
                StatusCode::BAD_GATEWAY,
                "Installation failed",
                "Slack did not confirm the installation. Start again from /slack/install.",
            )
        }
    }
}

/// Exchanges the code, learns the bot id, stores the installation; returns
/// the workspace's name for the success page.
async fn finish(s: &OAuthState, code: &str) -> anyhow::Result<String> {
    let o = &s.oauth;
    let v = o
        .web
        .oauth_v2_access(&[
            ("client_id", o.settings.client_id.as_str()),
            ("client_secret", o.settings.client_secret.expose_secret()),
            ("code", code),
            ("redirect_uri", o.settings.redirect_url.as_str()),
        ])
        .await?;
    let text = |p: &str| {
        v.pointer(p)
            .and_then(serde_json::Value::as_str)
            .filter(|s| !s.is_empty())
    };
    let token = SecretString::from(
        text("/access_token")
            .ok_or_else(|| anyhow::anyhow!("no access_token"))?
            .to_owned(),
    );
    let org_wide = v
        .get("is_enterprise_install")
        .and_then(serde_json::Value::as_bool)
        .unwrap_or(false);
    let app_id = threadline_domain::AppId::parse(text("/app_id").unwrap_or_default())?;
    let team = text("/team/id")
        .map(threadline_domain::TeamId::parse)
        .transpose()?;
    let enterprise = text("/enterprise/id")
        .map(threadline_domain::EnterpriseId::parse)
        .transpose()?;
    let bot_user = threadline_domain::UserId::parse(text("/bot_user_id").unwrap_or_default())?;
    // The exchange does not name the bot id: ask Slack who the token is.
    let me = o.web.call("auth.test", token.expose_secret(), &[]).await?;
    let bot_id = threadline_domain::BotId::parse(
        me.get("bot_id")
            .and_then(serde_json::Value::as_str)
            .unwrap_or_default(),
    )?;
    let scopes: Vec<String> = text("/scope")
        .unwrap_or("")
        .split(',')
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    let refresh = text("/refresh_token").map(|t| SecretString::from(t.to_owned()));
    let (id, _) = register(
        &s.pool,
        &o.settings.cipher,
        &Registration {
            app_id: app_id.as_str(),
            team_id: team.as_ref().map(|t| t.as_str()),
            enterprise_id: enterprise.as_ref().map(|e| e.as_str()),
            org_wide,
            bot_user_id: bot_user.as_str(),
            bot_id: bot_id.as_str(),
            scopes: &scopes,
        },
        &threadline_tenancy::installations::Tokens {
            bot_token: &token,
            refresh_token: refresh.as_ref(),
            expires_in: v.get("expires_in").and_then(serde_json::Value::as_i64),
        },
    )
    .await?;
    tracing::info!(installation_id = %id, org_wide, "installation stored");
    Ok(text("/team/name")
        .or(text("/enterprise/name"))
        .unwrap_or("your workspace")
        .to_owned())
}
