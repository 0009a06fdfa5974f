//! Installation and channel policies: what an installation allows
//! (`installation_policies`) and what each channel overrides
//! (`channel_policies`). Operators set them with `threadline policy`.

use sqlx::PgPool;
use uuid::Uuid;

/// What an installation allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstallationPolicy {
    pub dms_allowed: bool,
    pub private_channels_allowed: bool,
    pub shared_channels_allowed: bool,
    pub approved_bots: Vec<String>,
    pub read_limits: String,
    pub allowlist_only: bool,
    pub unfurl_allowed: bool,
    /// Answers may be streamed (on by default).
    pub streaming_allowed: bool,
}

impl Default for InstallationPolicy {
    /// An installation without a policy row: DMs, private and shared
    /// channels off, no approved bots, Tier 3 reads, not allow-listed, no
    /// unfurling (the schema's defaults).
    fn default() -> Self {
        Self {
            dms_allowed: false,
            private_channels_allowed: false,
            shared_channels_allowed: false,
            approved_bots: Vec::new(),
            read_limits: "tier3".into(),
            allowlist_only: false,
            unfurl_allowed: false,
            streaming_allowed: true,
        }
    }
}

pub async fn installation_policy(
    pool: &PgPool,
    installation: Uuid,
) -> sqlx::Result<Option<InstallationPolicy>> {
    sqlx::query_as!(
        InstallationPolicy,
        "SELECT dms_allowed, private_channels_allowed, shared_channels_allowed, approved_bots, read_limits,
                allowlist_only, unfurl_allowed, streaming_allowed
           FROM installation_policies WHERE installation_id = $1",
        installation
    )
    .fetch_optional(pool)
    .await
}

/// What a channel overrides; `unfurl_allowed` `None`: as the installation
/// says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChannelPolicy {
    pub channel_id: String,
    pub mode: String,
    pub keywords: Vec<String>,
    pub allowed: bool,
    pub unfurl_allowed: Option<bool>,
    /// `None`: as the installation says.
    pub streaming_allowed: Option<bool>,
}

pub async fn channel_policies(
    pool: &PgPool,
    installation: Uuid,
) -> sqlx::Result<Vec<ChannelPolicy>> {
    sqlx::query_as!(
        ChannelPolicy,
        "SELECT channel_id, mode, keywords, allowed, unfurl_allowed, streaming_allowed FROM channel_policies
          WHERE installation_id = $1 ORDER BY channel_id",
        installation
    )
    .fetch_all(pool)
    .await
}

/// Changes to an installation's policy: `None` leaves a setting as it is.
#[derive(Debug, Clone, Default)]
pub struct InstallationChanges {
    pub dms_allowed: Option<bool>,
    pub private_channels_allowed: Option<bool>,
    pub shared_channels_allowed: Option<bool>,
    pub approved_bots: Option<Vec<String>>,
    pub read_limits: Option<String>,
    pub allowlist_only: Option<bool>,
    pub unfurl_allowed: Option<bool>,
    pub streaming_allowed: Option<bool>,
}

/// Applies `c` to the installation's policy (made from the defaults first
/// when it has none).
pub async fn set_installation_policy(
    pool: &PgPool,
    installation: Uuid,
    c: &InstallationChanges,
) -> sqlx::Result<()> {
    let mut tx = pool.begin().await?;
    sqlx::query!(
        "INSERT INTO installation_policies (installation_id) VALUES ($1) ON CONFLICT DO NOTHING",
        installation
    )
    .execute(&mut *tx)
    .await?;
    sqlx::query!(
        "UPDATE installation_policies
            SET dms_allowed = coalesce($2, dms_allowed),
                private_channels_allowed = coalesce($3, private_channels_allowed),
                shared_channels_allowed = coalesce($4, shared_channels_allowed),
                approved_bots = coalesce($5, approved_bots),
                read_limits = coalesce($6, read_limits),
                allowlist_only = coalesce($7, allowlist_only),
                unfurl_allowed = coalesce($8, unfurl_allowed),
                streaming_allowed = coalesce($9, streaming_allowed),
                updated_at = now()
          WHERE installation_id = $1",
        installation,
        c.dms_allowed,
        c.private_channels_allowed,
        c.shared_channels_allowed,
        c.approved_bots.as_deref(),
        c.read_limits.as_deref(),
        c.allowlist_only,
        c.unfurl_allowed,
        c.streaming_allowed,
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await
}

/// Changes to a channel's policy: `None` leaves a setting as it is; a new
/// row starts as mentions only, not allow-listed, unfurling as the
/// installation says. `keywords` apply with a new `mode`.
#[derive(Debug, Clone, Default)]
pub struct ChannelChanges<'a> {
    pub mode: Option<&'a str>,
    pub keywords: &'a [String],
    pub allowed: Option<bool>,
    /// `Some(None)`: as the installation says again.
    pub unfurl_allowed: Option<Option<bool>>,
    /// `Some(None)`: as the installation says again.
    pub streaming_allowed: Option<Option<bool>>,
}

/// Applies `c` to the channel's policy; returns the channel's policy now.
pub async fn set_channel_policy(
    pool: &PgPool,
    installation: Uuid,
    channel: &str,
    c: &ChannelChanges<'_>,
) -> sqlx::Result<ChannelPolicy> {
    sqlx::query_as!(
        ChannelPolicy,
        "INSERT INTO channel_policies (installation_id, channel_id, mode, keywords, allowed, unfurl_allowed,
                                       streaming_allowed)
         VALUES ($1, $2, coalesce($3, 'mentions'), $4, coalesce($5, false), $7, $9)
         ON CONFLICT (installation_id, channel_id) DO UPDATE
            SET mode = coalesce($3, channel_policies.mode),
                keywords = CASE WHEN $3 IS NULL THEN channel_policies.keywords ELSE EXCLUDED.keywords END,
                allowed = coalesce($5, channel_policies.allowed),
                unfurl_allowed = CASE WHEN $6 THEN $7 ELSE channel_policies.unfurl_allowed END,
                streaming_allowed = CASE WHEN $8 THEN $9 ELSE channel_policies.streaming_allowed END,
                updated_at = now()
         RETURNING channel_id, mode, keywords, allowed, unfurl_allowed, streaming_allowed",
        installation,
        channel,
        c.mode,
        c.keywords,
        c.allowed,
        c.unfurl_allowed.is_some(),
        c.unfurl_allowed.flatten(),
        c.streaming_allowed.is_some(),
        c.streaming_allowed.flatten(),
    )
    .fetch_one(pool)
    .await
}

/// The installation's own budgets (`None`: the services' default; 0: no
/// limit), as `threadline policy set` leaves them.
pub async fn budget_overrides(
    pool: &PgPool,
    installation: Uuid,
) -> sqlx::Result<threadline_domain::budget::Overrides> {
    let r = sqlx::query!(
        "SELECT answers_per_minute, model_calls_per_minute, model_tokens_per_day
           FROM installation_policies WHERE installation_id = $1",
        installation
    )
    .fetch_optional(pool)
    .await?;
    Ok(r.map(|r| threadline_domain::budget::Overrides {
        answers_per_minute: r.answers_per_minute,
        model_calls_per_minute: r.model_calls_per_minute,
        model_tokens_per_day: r.model_tokens_per_day,
    })
    .unwrap_or_default())
}

/// Changes to an installation's budgets: `None` leaves one as it is,
/// `Some(None)` returns it to the services' default, `Some(Some(n))` sets
/// it (0: no limit).
#[derive(Debug, Clone, Copy, Default)]
pub struct BudgetChanges {
    pub answers_per_minute: Option<Option<i32>>,
    pub model_calls_per_minute: Option<Option<i32>>,
    pub model_tokens_per_day: Option<Option<i64>>,
}

impl BudgetChanges {
    pub fn is_empty(&self) -> bool {
        self.answers_per_minute.is_none()
            && self.model_calls_per_minute.is_none()
            && self.model_tokens_per_day.is_none()
    }
}

/// Applies `c` to the installation's budgets (its policy made from the
/// defaults first when it has none).
pub async fn set_budget_overrides(
    pool: &PgPool,
    installation: Uuid,
    c: &BudgetChanges,
) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO installation_policies (installation_id, answers_per_minute, model_calls_per_minute,
                                            model_tokens_per_day)
         VALUES ($1, $3, $5, $7)
         ON CONFLICT (installation_id) DO UPDATE
            SET answers_per_minute = CASE WHEN $2 THEN $3 ELSE installation_policies.answers_per_minute END,
                model_calls_per_minute = CASE WHEN $4 THEN $5 ELSE installation_policies.model_calls_per_minute END,
                model_tokens_per_day = CASE WHEN $6 THEN $7 ELSE installation_policies.model_tokens_per_day END,
                updated_at = now()",
        installation,
        c.answers_per_minute.is_some(),
        c.answers_per_minute.flatten(),
        c.model_calls_per_minute.is_some(),
        c.model_calls_per_minute.flatten(),
        c.model_tokens_per_day.is_some(),
        c.model_tokens_per_day.flatten(),
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// What the installation has used of its budgets: its buckets as last
/// stored (units left then, and how long ago) and its tokens today.
#[derive(Debug, Clone, Default)]
pub struct BudgetUse {
    pub answers_left: Option<f64>,
    pub model_calls_left: Option<f64>,
    pub seconds_since: Option<f64>,
    pub tokens_today: i64,
    pub parked: i64,
    pub in_queue: i64,
}

pub async fn budget_use(pool: &PgPool, installation: Uuid) -> sqlx::Result<BudgetUse> {
    let r = sqlx::query!(
        r#"SELECT b.answers, b.model_calls, extract(epoch FROM now() - b.refilled_at)::float8 AS since,
                  coalesce((SELECT t.tokens FROM tenant_tokens t
                             WHERE t.installation_id = $1 AND t.day = (now() AT TIME ZONE 'UTC')::date), 0)
                      AS "tokens!",
                  (SELECT count(*) FROM tenant_work w WHERE w.installation_id = $1 AND w.state = $2) AS "parked!",
                  (SELECT count(*) FROM tenant_work w WHERE w.installation_id = $1 AND w.state = $3) AS "in_queue!"
             FROM (SELECT 1) one LEFT JOIN tenant_budgets b ON b.installation_id = $1"#,
        installation,
        threadline_domain::state::WorkState::Parked.name(),
        threadline_domain::state::WorkState::Admitted.name(),
    )
    .fetch_one(pool)
    .await?;
    Ok(BudgetUse {
        answers_left: r.answers,
        model_calls_left: r.model_calls,
        seconds_since: r.since,
        tokens_today: r.tokens,
        parked: r.parked,
        in_queue: r.in_queue,
    })
}

/// The installation's double-texting policy (the default when it never
/// chose).
pub async fn double_texting(
    pool: &PgPool,
    installation: Uuid,
) -> sqlx::Result<threadline_domain::double_text::DoubleTexting> {
    use threadline_domain::double_text::DoubleTexting;
    let r = sqlx::query!(
        "SELECT double_texting, double_texting_quiet_ms FROM installation_policies
          WHERE installation_id = $1",
        installation
    )
    .fetch_optional(pool)
    .await?;
    match r {
        None => Ok(DoubleTexting::DEFAULT),
        Some(r) => DoubleTexting::parse(&r.double_texting, r.double_texting_quiet_ms.max(0) as u32)
            .ok_or_else(|| {
                sqlx::Error::Decode(
                    format!(
                        "installation_policies.double_texting: {:?}",
                        r.double_texting
                    )
                    .into(),
                )
            }),
    }
}

/// Sets the installation's double-texting policy (its other settings made
/// from the defaults first when it has none); `each` keeps the quiet period
/// last chosen.
pub async fn set_double_texting(
    pool: &PgPool,
    installation: Uuid,
    policy: threadline_domain::double_text::DoubleTexting,
) -> sqlx::Result<()> {
    let quiet = policy.quiet().map(|q| q.as_millis() as i32);
    sqlx::query!(
        "INSERT INTO installation_policies (installation_id, double_texting, double_texting_quiet_ms)
         VALUES ($1, $2, coalesce($3::int, $4::int))
         ON CONFLICT (installation_id) DO UPDATE
            SET double_texting = EXCLUDED.double_texting,
                double_texting_quiet_ms = coalesce($3::int, installation_policies.double_texting_quiet_ms),
                updated_at = now()",
        installation,
        policy.as_str(),
        quiet,
        threadline_domain::double_text::QUIET_DEFAULT_MS as i32
    )
    .execute(pool)
    .await?;
    Ok(())
}
