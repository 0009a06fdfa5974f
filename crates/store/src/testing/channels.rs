//! Test fixtures and reads for the `channels` family (see `crate::channels`).

/// What was learned of one channel's kind, and from where.
#[derive(Debug, Clone)]
pub struct LearnedKind {
    pub channel_id: String,
    pub is_private: bool,
    pub learned_from: String,
}

/// The channel kinds learned for every channel but `except`, by channel.
pub async fn learned_kinds_except(
    pool: &sqlx::PgPool,
    except: &str,
) -> sqlx::Result<Vec<LearnedKind>> {
    sqlx::query_as!(
        LearnedKind,
        "SELECT channel_id, is_private, learned_from FROM channel_kinds WHERE channel_id <> $1 ORDER BY channel_id",
        except
    )
    .fetch_all(pool)
    .await
}
