//! slack-sim: a Slack emulator for tests, demos and chaos. It plays both
//! sides of Slack's contract with a bot:
//!
//! * Events API (Slack → app): signed deliveries with Slack's retry rules.
//! * Interactivity (Slack → app): a person's click on a button of an app's
//!   message, sent signed as a `block_actions` payload, once; its
//!   `response_url` (`/actions/…`) takes the app's answer.
//! * Socket Mode: an app's WebSocket connections (`apps.connections.open`)
//!   carry its events and interactions as envelopes it acknowledges.
//! * Web API (app → Slack) under `/api/`: the methods bots use, with Slack's
//!   error codes, rate limits and injectable faults.
//! * Control and inspection under `/_sim/`: build scenarios, act as people,
//!   read the ground truth.
//!
//! State is in memory and every id comes from a seeded generator.

pub mod agent;
pub mod api;
pub mod assistant;
pub mod control;
pub mod delivery;
pub mod events;
pub mod interactivity;
pub mod model;
pub mod refusal;
pub mod response_url;
pub mod socket;
pub mod socket_state;
pub mod streams;
pub mod webapi;

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::Router;
use axum::routing::{get, post};

pub use model::World;

/// A running emulator's shared state.
#[derive(Clone)]
pub struct Sim {
    world: Arc<Mutex<World>>,
    http: reqwest::Client,
    seed: u64,
}

impl Sim {
    pub fn new(seed: u64) -> Self {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(2))
            .pool_idle_timeout(Duration::from_secs(30))
            .build()
            .unwrap_or_default();
        Self {
            world: Arc::new(Mutex::new(World::new(seed))),
            http,
            seed,
        }
    }

    pub fn lock(&self) -> MutexGuard<'_, World> {
        self.world.lock().unwrap_or_else(|p| p.into_inner())
    }
}

pub fn router(sim: Sim) -> Router {
    Router::new()
        .route("/api/{method}", post(webapi::api).get(webapi::api))
        .route("/socket/{ticket}", get(socket::connect))
        .route("/actions/{team}/{n}/{secret}", post(response_url::respond))
        .route("/oauth/v2/authorize", get(control::authorize))
        .route("/_sim/reset", post(control::reset))
        .route("/_sim/settings", post(control::settings))
        .route("/_sim/teams", post(control::create_team))
        .route("/_sim/users", post(control::create_user))
        .route("/_sim/bots", post(control::create_bot))
        .route("/_sim/channels", post(control::create_channel))
        .route("/_sim/channels/{id}/members", post(control::join_channel))
        .route(
            "/_sim/channels/{id}/archive",
            post(control::archive_channel),
        )
        .route(
            "/_sim/channels/{channel}/threads/{ts}",
            get(control::thread),
        )
        .route(
            "/_sim/channels/{channel}/messages",
            get(control::channel_messages),
        )
        .route("/_sim/apps", post(control::create_app))
        .route("/_sim/apps/{app}/installs", post(control::install_app))
        .route("/_sim/apps/{app}/uninstall", post(control::uninstall_app))
        .route(
            "/_sim/apps/{app}/request_urls",
            post(control::set_request_urls),
        )
        .route(
            "/_sim/apps/{app}/interactivity",
            post(control::set_interactivity),
        )
        .route(
            "/_sim/apps/{app}/socket_mode",
            post(socket::set_socket_mode),
        )
        .route("/_sim/apps/{app}/revoke", post(control::revoke_tokens))
        .route("/_sim/act/post", post(control::act_post))
        .route("/_sim/act/double", post(control::act_double))
        .route("/_sim/act/bot_post", post(control::act_bot_post))
        .route("/_sim/act/edit", post(control::act_edit))
        .route("/_sim/act/delete", post(control::act_delete))
        .route("/_sim/act/click", post(control::act_click))
        .route("/_sim/act/stop_stream", post(control::act_stop_stream))
        .route(
            "/_sim/act/assistant_open",
            post(control::act_assistant_open),
        )
        .route(
            "/_sim/act/assistant_context",
            post(control::act_assistant_context),
        )
        .route("/_sim/assistant_threads", get(control::assistant_threads))
        .route("/_sim/act/agent_open", post(control::act_agent_open))
        .route("/_sim/act/agent_context", post(control::act_agent_context))
        .route("/_sim/agent_tabs", get(control::agent_tabs))
        .route("/_sim/apps/{app}/experience", post(control::set_experience))
        .route(
            "/_sim/faults",
            post(control::add_fault).delete(control::clear_faults),
        )
        .route("/_sim/calls", get(control::calls))
        .route("/_sim/deliveries", get(control::deliveries))
        .route("/_sim/interactions", get(control::interactions))
        .route("/_sim/responses", get(response_url::log))
        .route("/_sim/ephemerals", get(response_url::ephemerals))
        .route("/_sim/socket", get(socket::log))
        .route("/_sim/socket/disconnect", post(socket::disconnect))
        .route("/_sim/socket/send", post(socket::send))
        .route("/_sim/app_posts", get(control::app_posts))
        .with_state(sim)
}

/// Serves the emulator on `listener` until `shutdown` resolves.
pub async fn run(
    sim: Sim,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(sim))
        .with_graceful_shutdown(shutdown)
        .await
}
