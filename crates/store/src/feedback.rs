//! Feedback on answers: each person's latest verdict per decision, from the
//! feedback buttons every answer carries (`answer_feedback`). Content-free:
//! the decision, the person's Slack id, the verdict and when. A click counts
//! only on the decision's own answer, in the installation the click was
//! signed for; a person's later click (Slack's `action_ts`) replaces their
//! earlier one, an older one changes nothing. Each verdict recorded is
//! audited (stage `feedback`) in its transaction.

use sqlx::PgPool;
use threadline_domain::budget::NOTE_ACTION_KIND;
use threadline_domain::feedback::Verdict;
use time::OffsetDateTime;
use uuid::Uuid;

use crate::audit;

/// A click on an answer's feedback buttons, as the gateway verified it.
#[derive(Debug, Clone)]
pub struct Click<'a> {
    /// The installation the signed click resolved to.
    pub installation: Uuid,
    /// Where the clicked message is, and who clicked.
    pub channel: &'a str,
    pub message_ts: &'a str,
    pub user: &'a str,
    pub verdict: Verdict,
    /// Slack's `action_ts` (`None`: the time it is recorded).
    pub action_ts: Option<&'a str>,
    /// The channel's audit pseudonym (computed by the caller with the key).
    pub channel_ref: Option<String>,
}

/// Why a click was not counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The decision belongs to another installation.
    OtherInstallation,
    /// The clicked message is not the decision's answer.
    NotTheAnswer,
    /// The decision is threadline's own note, not an answer.
    NotAnAnswer,
}

impl Refusal {
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::OtherInstallation => "other_installation",
            Refusal::NotTheAnswer => "not_the_answer",
            Refusal::NotAnAnswer => "not_an_answer",
        }
    }
}

/// What a click came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorded {
    /// The person's verdict on the decision is now this click's.
    Counted,
    /// The person clicked later already (their later verdict stands), or
    /// this very click was recorded before (Slack's redelivery of it, the
    /// same `action_ts`): it changes nothing and is not counted again.
    Outdated,
    Refused(Refusal),
    NotFound,
}

/// Records `click`'s verdict on decision `id` (see the module docs).
pub async fn record(pool: &PgPool, id: Uuid, click: &Click<'_>) -> sqlx::Result<Recorded> {
    let mut tx = pool.begin().await?;
    let Some(d) = sqlx::query!(
        r#"SELECT d.installation_id, d.channel_id, d.action_kind, d.event_id, d.receipt_id,
                  d.thread_version, d.model_config_id,
                  i.slack_ts AS "slack_ts?", i.stream_ts AS "stream_ts?",
                  coalesce(i.extra_ts, '{}') AS "extra_ts!"
             FROM decisions d
             LEFT JOIN reply_intents i
               ON i.installation_id = d.installation_id AND i.event_id = d.event_id
              AND i.action_kind = d.action_kind
            WHERE d.id = $1"#,
        id
    )
    .fetch_optional(&mut *tx)
    .await?
    else {
        return Ok(Recorded::NotFound);
    };
    if d.installation_id != click.installation {
        return Ok(Recorded::Refused(Refusal::OtherInstallation));
    }
    if d.action_kind == NOTE_ACTION_KIND {
        return Ok(Recorded::Refused(Refusal::NotAnAnswer));
    }
    // The answer Slack holds for the decision's intent: its post, its
    // stream, or a second post recorded beside them. An intent whose
    // outcome is not recorded yet has none: a signed click on a message in
    // the decision's channel that names it proves Slack holds it there.
    let known = [d.slack_ts.as_deref(), d.stream_ts.as_deref()];
    let recorded = known.iter().any(Option::is_some) || !d.extra_ts.is_empty();
    let is_it =
        known.contains(&Some(click.message_ts)) || d.extra_ts.iter().any(|t| t == click.message_ts);
    if d.channel_id != click.channel || (recorded && !is_it) {
        return Ok(Recorded::Refused(Refusal::NotTheAnswer));
    }
    let counted = sqlx::query!(
        "INSERT INTO answer_feedback AS f (decision_id, user_id, installation_id, verdict, action_ts)
         VALUES ($1, $2, $3, $4, coalesce($5::text::numeric, extract(epoch FROM clock_timestamp())))
         ON CONFLICT (decision_id, user_id) DO UPDATE
            SET verdict = EXCLUDED.verdict, action_ts = EXCLUDED.action_ts,
                clicks = f.clicks + 1, updated_at = now()
          WHERE f.action_ts < EXCLUDED.action_ts",
        id,
        click.user,
        click.installation,
        click.verdict.as_str(),
        click.action_ts,
    )
    .execute(&mut *tx)
    .await?
    .rows_affected()
        == 1;
    if !counted {
        return Ok(Recorded::Outdated);
    }
    audit::append(
        &mut tx,
        &audit::Record {
            stage: "feedback",
            outcome: click.verdict.as_str(),
            installation_id: Some(d.installation_id),
            event_id: Some(&d.event_id),
            receipt_id: Some(d.receipt_id),
            decision_id: Some(id),
            channel_ref: click.channel_ref.clone(),
            thread_version: Some(d.thread_version),
            model_config_id: d.model_config_id.as_deref(),
            ..Default::default()
        },
    )
    .await?;
    tx.commit().await?;
    Ok(Recorded::Counted)
}

/// One person's latest verdict on one answer, as `threadline feedback
/// export` prints it: identifiers and codes, no text, no person.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Exported {
    pub decision: Uuid,
    /// The model configuration that wrote the answer.
    pub model: Option<String>,
    pub thread_version: i64,
    /// What kind of answer it was: `posted` or `streamed`; `fallback` (no
    /// model answered), `reviewed` (a reviewer approved it),
    /// `assistant_pane`, and `review:<reason>` for each reason the output
    /// policy held it for.
    pub labels: Vec<String>,
    pub verdict: &'static str,
    /// When the verdict was given (its latest click), RFC 3339, UTC.
    pub time: String,
}

/// Every latest verdict recorded since `since` (all when `None`), of one
/// installation or all, oldest first.
pub async fn export(
    pool: &PgPool,
    since: Option<OffsetDateTime>,
    installation: Option<Uuid>,
) -> sqlx::Result<Vec<Exported>> {
    let rows = sqlx::query!(
        r#"SELECT f.decision_id, d.model_config_id, d.thread_version, f.verdict,
                  to_char(f.updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') AS "time!",
                  coalesce(i.streamed, false) AS "streamed!", d.fallback,
                  d.reviewed_by IS NOT NULL AS "reviewed!", d.review_reasons,
                  EXISTS (SELECT 1 FROM assistant_threads a
                           WHERE a.installation_id = d.installation_id
                             AND a.channel_id = d.channel_id AND a.thread_ts = d.root_ts) AS "pane!"
             FROM answer_feedback f
             JOIN decisions d ON d.id = f.decision_id
             LEFT JOIN reply_intents i
               ON i.installation_id = d.installation_id AND i.event_id = d.event_id
              AND i.action_kind = d.action_kind
            WHERE ($1::timestamptz IS NULL OR f.updated_at >= $1)
              AND ($2::uuid IS NULL OR f.installation_id = $2)
            ORDER BY f.updated_at, f.decision_id, f.user_id"#,
        since,
        installation,
    )
    .fetch_all(pool)
    .await?;
    rows.into_iter()
        .map(|r| {
            let verdict = Verdict::parse(&r.verdict).ok_or_else(|| {
                sqlx::Error::Decode(format!("answer_feedback.verdict: {:?}", r.verdict).into())
            })?;
            let mut labels = vec![if r.streamed { "streamed" } else { "posted" }.to_owned()];
            for (on, label) in [
                (r.fallback, "fallback"),
                (r.reviewed, "reviewed"),
                (r.pane, "assistant_pane"),
            ] {
                if on {
                    labels.push(label.to_owned());
                }
            }
            labels.extend(
                r.review_reasons
                    .iter()
                    .map(|why| format!("review:{}", audit::sanitise_code(why))),
            );
            Ok(Exported {
                decision: r.decision_id,
                model: r.model_config_id,
                thread_version: r.thread_version,
                labels,
                verdict: verdict.as_str(),
                time: r.time,
            })
        })
        .collect()
}
