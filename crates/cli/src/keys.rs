//! `threadline keys rotate`: re-seal every stored token with the first key
//! of `THREADLINE_TOKEN_KEYS` (the old keys must still be listed after it).

use anyhow::Context as _;
use sqlx::PgPool;
use threadline_runtime::config::Source;
use threadline_runtime::secrets::{Sealed, TokenCipher, token_aad};
use threadline_store::installations::{self, TokenKind};

pub async fn rotate(src: &Source, pool: &PgPool) -> anyhow::Result<()> {
    let cipher = TokenCipher::from_source(src)?;
    let active = cipher.active_key_id().to_owned();
    let bot = reseal(&cipher, pool, TokenKind::Bot).await?;
    let refresh = reseal(&cipher, pool, TokenKind::Refresh).await?;
    println!("re-sealed {bot} bot token(s) and {refresh} refresh token(s) with key {active}");
    Ok(())
}

/// Re-seals every token of `kind` not yet under the active key.
async fn reseal(cipher: &TokenCipher, pool: &PgPool, kind: TokenKind) -> anyhow::Result<u64> {
    let purpose = kind.purpose();
    let rows = installations::sealed_with_other_key(pool, kind, cipher.active_key_id()).await?;
    let mut done = 0;
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
        }
    }
    Ok(done)
}
