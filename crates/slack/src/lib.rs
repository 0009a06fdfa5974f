//! Slack request signing (v0) and verification, and a small Web API client.
//!
//! `X-Slack-Signature = "v0=" + hex(HMAC-SHA256(signing_secret, "v0:" + ts + ":" + raw_body))`,
//! valid only while `|now - ts| <= 300 s`.

pub mod signature;
pub mod web;

pub use signature::{SignatureError, SigningSecret, Verifier, sign};
pub use web::{RepliesPage, StreamContent, WebClient, WebError};
