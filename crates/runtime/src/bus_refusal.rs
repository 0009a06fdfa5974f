//! What the broker refusing this process means to an operator: a login it
//! does not take, a publish or subscription its role has no right to.

use crate::nats_role::Role;

/// What a broker's complaint about this connection means to an operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The broker refused the login (wrong user or password).
    Login,
    /// The broker refused a publish or subscription the user has no right
    /// to; holds the broker's message (it names the subject only).
    Permission(String),
}

/// Classifies a connection event: `Some` when the broker refused us.
pub fn refusal(event: &async_nats::Event) -> Option<Refusal> {
    use async_nats::{Event, ServerError};
    match event {
        Event::ServerError(ServerError::AuthorizationViolation) => Some(Refusal::Login),
        Event::ServerError(ServerError::Other(m))
            if m.to_ascii_lowercase().contains("permissions violation") =>
        {
            Some(Refusal::Permission(m.clone()))
        }
        _ => None,
    }
}

/// Logs and counts a refusal (`threadline_bus_refusals_total{kind}`): a
/// permission refusal is either a defect (the code does something the
/// rendered permissions do not allow) or a process doing what its role may
/// not.
pub fn report(event: &async_nats::Event, user: Option<Role>) {
    let user = user.map(Role::user).unwrap_or("anonymous");
    match refusal(event) {
        Some(Refusal::Login) => {
            metrics::counter!("threadline_bus_refusals_total", "kind" => "login").increment(1);
            tracing::error!(
                nats_user = user,
                "NATS refused the login: check NATS_USER and NATS_PASSWORD against the broker's users"
            );
        }
        Some(Refusal::Permission(message)) => {
            metrics::counter!("threadline_bus_refusals_total", "kind" => "permission").increment(1);
            tracing::error!(
                nats_user = user,
                broker = %message,
                "NATS refused a publish or subscription this user has no right to"
            );
        }
        None => {}
    }
}
