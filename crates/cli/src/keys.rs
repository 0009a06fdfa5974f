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
    let rows: Vec<(Uuid, Vec<u8>, String)> = sqlx::query_as(
        "SELECT id, bot_token_sealed, bot_token_key_id FROM installations
          WHERE bot_token_sealed IS NOT NULL AND bot_token_key_id <> $1",
    )
    .bind(&active)
    .fetch_all(pool)
    .await?;
    let mut done = 0;
    for (id, bytes, key_id) in rows {
        let aad = token_aad(&id, "bot");
        let token = cipher
            .open(
                &Sealed {
                    key_id: key_id.clone(),
                    bytes,
                },
                &aad,
            )
            .with_context(|| format!("installation {id}: opening its token with key {key_id:?}"))?;
        use secrecy::ExposeSecret as _;
        let sealed = cipher.seal(token.expose_secret().as_bytes(), &aad)?;
        // Compare-and-set on the old key: a concurrent re-seal is not undone.
        let r = sqlx::query(
            "UPDATE installations SET bot_token_sealed = $2, bot_token_key_id = $3, updated_at = now()
              WHERE id = $1 AND bot_token_key_id = $4",
        )
        .bind(id)
        .bind(&sealed.bytes)
        .bind(&sealed.key_id)
        .bind(&key_id)
        .execute(pool)
        .await?;
        done += r.rows_affected();
    }
    println!("re-sealed {done} token(s) with key {active}");
    Ok(())
}
