//! `threadline keys rotate`: re-seal every stored token to the first key of
//! `THREADLINE_TOKEN_KEYS`, an X25519 key (the old keys, legacy symmetric
//! ones included, must still be listed after it); `threadline keys public`:
//! the public halves, for the gateway's `THREADLINE_TOKEN_PUBLIC_KEYS`.

use anyhow::Context as _;
use sqlx::PgPool;
use threadline_runtime::config::Source;
use threadline_store::installations::{self, TokenKind};
use threadline_tenancy::secrets::{Seal as _, Sealed, TOKEN_KEYS_SETTING, TokenKeys, token_aad};

/// How long rotation keeps trying tokens a refresh holds (a refresh takes
/// seconds; its lease at most a minute).
const PATIENCE: std::time::Duration = std::time::Duration::from_secs(90);

pub async fn rotate(src: &Source, pool: &PgPool) -> anyhow::Result<()> {
    let cipher = TokenKeys::from_source(src)?;
    if !cipher.seals_to_public_key() {
        anyhow::bail!(
            "the first key of {TOKEN_KEYS_SETTING} is a symmetric key: put an X25519 key \
             (`threadline keys generate`) first to re-seal every token to it"
        );
    }
    let active = cipher.active_key_id().to_owned();
    let (mut bot, mut refresh) = (0, 0);
    let started = std::time::Instant::now();
    loop {
        let (b, left_b) = reseal(&cipher, pool, TokenKind::Bot).await?;
        let (r, left_r) = reseal(&cipher, pool, TokenKind::Refresh).await?;
        (bot, refresh) = (bot + b, refresh + r);
        let left = left_b + left_r;
        if left == 0 {
            break;
        }
        if started.elapsed() > PATIENCE {
            anyhow::bail!(
                "re-sealed {bot} bot token(s) and {refresh} refresh token(s) with key {active}; \
                 {left} token(s) changed or were being refreshed throughout: run `threadline keys rotate` again"
            );
        }
        // (a refresh holds them, or stored new ones: read them again)
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
    println!("re-sealed {bot} bot token(s) and {refresh} refresh token(s) with key {active}");
    Ok(())
}

/// `threadline keys public`: the public keys of the X25519 entries of
/// `THREADLINE_TOKEN_KEYS`, first first (the gateway seals to the first).
pub fn public(src: &Source) -> anyhow::Result<()> {
    let keys = TokenKeys::from_source(src)?;
    let public = keys.public_entries();
    if public.is_empty() {
        anyhow::bail!(
            "{TOKEN_KEYS_SETTING} lists no X25519 key: add one (`threadline keys generate`)"
        );
    }
    if !keys.seals_to_public_key() {
        eprintln!(
            "note: the first key of {TOKEN_KEYS_SETTING} is symmetric; the gateway seals to {}",
            public.split(':').next().unwrap_or_default()
        );
    }
    println!("{public}");
    Ok(())
}

/// Re-seals every token of `kind` not yet under the active key: how many
/// were re-sealed, and how many changed or were held by a refresh
/// meanwhile (left for the next round).
async fn reseal(cipher: &TokenKeys, pool: &PgPool, kind: TokenKind) -> anyhow::Result<(u64, u64)> {
    let purpose = kind.purpose();
    let rows = installations::sealed_with_other_key(pool, kind, cipher.active_key_id()).await?;
    let (mut done, mut left) = (0, 0);
    for old in rows {
        let aad = token_aad(&old.id, purpose);
        let token = cipher
            .open(
                &Sealed {
                    key_id: old.key_id.clone(),
                    bytes: old.bytes.clone(),
                },
                &aad,
            )
            .with_context(|| {
                format!(
                    "installation {}: opening its {purpose} token with key {:?}",
                    old.id, old.key_id
                )
            })?;
        use secrecy::ExposeSecret as _;
        let sealed = cipher.seal(token.expose_secret().as_bytes(), &aad)?;
        let new = installations::SealedToken {
            id: old.id,
            bytes: sealed.bytes,
            key_id: sealed.key_id,
        };
        if installations::reseal(pool, kind, &old, &new).await? {
            done += 1;
        } else {
            left += 1;
        }
    }
    Ok((done, left))
}
