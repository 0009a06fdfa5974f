//! Registering an installation with its sealed tokens, in one transaction:
//! never an active installation without its token. Used by
//! `threadline install add` and by the OAuth callback.

use anyhow::Context as _;
use secrecy::{ExposeSecret as _, SecretString};
use sqlx::PgPool;
pub use threadline_store::tokens::Registration;
use threadline_store::tokens::{self, SealedPair};
use uuid::Uuid;

use crate::secrets::{Seal, token_aad};

/// The tokens Slack granted an installation, in the clear until sealed here.
pub struct Tokens<'a> {
    pub bot_token: &'a SecretString,
    pub refresh_token: Option<&'a SecretString>,
    /// Seconds until the bot token expires (token rotation).
    pub expires_in: Option<i64>,
}

/// Inserts or updates (re-install) the installation that `r` names
/// (identifiers validated by the caller) with its tokens sealed; returns
/// its id and the id of the key that sealed them. `cipher` may be public
/// keys only (the gateway): sealing needs nothing that opens.
pub async fn register(
    pool: &PgPool,
    cipher: &(dyn Seal + Sync),
    r: &Registration<'_>,
    t: &Tokens<'_>,
) -> anyhow::Result<(Uuid, String)> {
    let mut tx = pool.begin().await?;
    let id = tokens::register(&mut tx, r)
        .await
        .context("registering the installation")?;
    let bot = cipher.seal(
        t.bot_token.expose_secret().as_bytes(),
        &token_aad(&id, "bot"),
    )?;
    let refresh = t
        .refresh_token
        .map(|t| cipher.seal(t.expose_secret().as_bytes(), &token_aad(&id, "refresh")))
        .transpose()?;
    tokens::store_installed(
        &mut tx,
        id,
        SealedPair {
            bytes: &bot.bytes,
            key_id: &bot.key_id,
        },
        refresh.as_ref().map(|s| SealedPair {
            bytes: &s.bytes,
            key_id: &s.key_id,
        }),
        t.expires_in,
    )
    .await
    .context("storing the sealed tokens")?;
    tx.commit().await.context("committing the installation")?;
    Ok((id, bot.key_id))
}
