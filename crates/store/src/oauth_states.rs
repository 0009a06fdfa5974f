//! The OAuth install flow's states: single use, short-lived, bound to the
//! browser that started the flow; only their SHA-256 digests are stored.

use sqlx::PgPool;

/// Stores a new state (its digest and its browser's) valid for `ttl_secs`,
/// deleting the expired ones on the way; returns how many were deleted.
pub async fn begin(
    pool: &PgPool,
    state_hash: &str,
    browser_hash: &str,
    ttl_secs: f64,
) -> sqlx::Result<i64> {
    sqlx::query_scalar!(
        r#"WITH purged AS (DELETE FROM oauth_states WHERE expires_at <= now() RETURNING 1)
           INSERT INTO oauth_states (state_hash, browser_hash, expires_at)
                VALUES ($1, $2, now() + make_interval(secs => $3))
             RETURNING (SELECT count(*) FROM purged) AS "purged!""#,
        state_hash,
        browser_hash,
        ttl_secs
    )
    .fetch_one(pool)
    .await
}

/// Uses a state up: single use, unexpired, and from the browser that
/// started it, in one compare-and-set (a failure says nothing about which
/// check failed). True when it was valid.
pub async fn claim(pool: &PgPool, state_hash: &str, browser_hash: &str) -> sqlx::Result<bool> {
    let r = sqlx::query!(
        "UPDATE oauth_states SET used_at = now()
          WHERE state_hash = $1 AND browser_hash = $2 AND used_at IS NULL AND expires_at > now()",
        state_hash,
        browser_hash
    )
    .execute(pool)
    .await?;
    Ok(r.rows_affected() == 1)
}
