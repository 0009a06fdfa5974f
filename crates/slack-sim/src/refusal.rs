//! Refusals of the control API: a status and `{"error": …}`.

use axum::Json;
use axum::http::StatusCode;
use serde_json::{Value, json};

/// A refusal of the control API: status and `{"error": …}`.
pub(crate) type Refusal = (StatusCode, Json<Value>);

pub(crate) fn bad(msg: impl Into<String>) -> Refusal {
    (StatusCode::BAD_REQUEST, Json(json!({"error": msg.into()})))
}

pub(crate) fn not_found(what: &str, id: &str) -> Refusal {
    (
        StatusCode::NOT_FOUND,
        Json(json!({"error": format!("no {what} {id:?}")})),
    )
}
