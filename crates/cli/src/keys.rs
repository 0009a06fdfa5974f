//! `threadline keys rotate`: re-seal every stored token with the first key
//! of `THREADLINE_TOKEN_KEYS` (the old keys must still be listed after it).

use anyhow::Context as _;
use sqlx::PgPool;
use threadline_runtime::config::Source;
use threadline_runtime::secrets::{Sealed, TokenCipher, token_aad};
use uuid::Uuid;

pub async fn rotate(src: &Source, pool: &PgPool) -> anyhow::Result<()> {
    let cipher = TokenCipher::from_source(src)?;
    let active = cipher.active_key_id().to_owned();
    let bot = reseal(&cipher, pool, Kind::Bot).await?;
    let refresh = reseal(&cipher, pool, Kind::Refresh).await?;
    println!("re-sealed {bot} bot token(s) and {refresh} refresh token(s) with key {active}");
    Ok(())
}

#[derive(Clone, Copy)]
enum Kind {
    Bot,
    Refresh,
}

impl Kind {
    /// The token's column, its key-id column, and its AAD purpose.
    fn columns(self) -> (&'static str, &'static str, &'static str) {
        match self {
            Kind::Bot => ("bot_token_sealed", "bot_token_key_id", "bot"),
            Kind::Refresh => ("refresh_token_sealed", "refresh_token_key_id", "refresh"),
        }
    }
}

/// Re-seals every token of `kind` not yet under the active key.
async fn reseal(cipher: &TokenCipher, pool: &PgPool, kind: Kind) -> anyhow::Result<u64> {
    let (sealed_col, key_col, purpose) = kind.columns();
    let rows: Vec<(Uuid, Vec<u8>, String)> = sqlx::query_as(&format!(
        "SELECT id, {sealed_col}, {key_col} FROM installations
          WHERE {sealed_col} IS NOT NULL AND {key_col} <> $1"
    ))
    .bind(cipher.active_key_id())
    .fetch_all(pool)
    .await?;
    let mut done = 0;
    for (id, bytes, key_id) in rows {
        let aad = token_aad(&id, purpose);
        let token = cipher
            .open(
                &Sealed {
                    key_id: key_id.clone(),
                    bytes,
                },
                &aad,
            )
            .with_context(|| {
                format!("installation {id}: opening its {purpose} token with key {key_id:?}")
            })?;
        use secrecy::ExposeSecret as _;
        let sealed = cipher.seal(token.expose_secret().as_bytes(), &aad)?;
        // Compare-and-set on the old key: a concurrent re-seal is not undone.
        let r = sqlx::query(&format!(
            "UPDATE installations SET {sealed_col} = $2, {key_col} = $3, updated_at = now()
              WHERE id = $1 AND {key_col} = $4"
        ))
        .bind(id)
        .bind(&sealed.bytes)
        .bind(&sealed.key_id)
        .bind(&key_id)
        .execute(pool)
        .await?;
        done += r.rows_affected();
    }
    Ok(done)
}
