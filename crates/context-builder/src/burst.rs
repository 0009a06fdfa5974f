//! Double texting (`threadline_domain::double_text`): under an
//! installation's `latest` policy a request waits out its asker's quiet
//! period before its context is built; a request with a later one of its
//! burst is absorbed (its receipt ends `ignored` with `double_texted`, its
//! place in the model's queue goes), and the latest top-level request of a
//! burst reads the earlier ones with its thread.

use std::ops::ControlFlow;
use std::time::Duration;

use threadline_domain::double_text::{ABSORBED, BurstPart};
use threadline_domain::state::ReceiptState;
use threadline_proto::v1::ContextMessage;
use threadline_store::double_text::{self, RootBurst};
use uuid::Uuid;

use crate::handler::{Handler, Step};
use crate::store::{self, Installation};

impl Handler {
    /// How much longer the request `received_ms` reached threadline waits
    /// for its asker's quiet period; `None`: it may be built now.
    pub(crate) fn quiet_wait(&self, inst: &Installation, received_ms: i64) -> Option<Duration> {
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        inst.double_texting.wait(received_ms, now_ms)
    }

    /// The request `source_ts` of `root` under its installation's
    /// double-texting policy: built (`Continue`) with the earlier messages
    /// of its burst from other threads (the top-level messages before it,
    /// or before its thread's root), or not now (`Break`, the step it
    /// comes to): absorbed (its receipt finished with [`ABSORBED`], its
    /// place freed, counted; nothing to build), or handed back while an
    /// answer of its thread on its way decides whether it reads the burst
    /// before its thread's root.
    pub(crate) async fn burst(
        &self,
        inst: &Installation,
        channel: &str,
        root: &str,
        source_ts: &str,
        receipt: Uuid,
    ) -> anyhow::Result<ControlFlow<Step, Vec<ContextMessage>>> {
        let Some(quiet) = inst.double_texting.quiet() else {
            return Ok(ControlFlow::Continue(Vec::new()));
        };
        let quiet_ms = quiet.as_millis() as i64;
        let part = double_text::decide(&self.pool, inst.id, channel, source_ts, quiet_ms).await?;
        // (counted once it is built or absorbed, not at each hand-back)
        let counted = || {
            metrics::counter!("threadline_double_texts_total", "outcome" => part.as_str())
                .increment(1);
        };
        if let BurstPart::Absorbed { .. } = part {
            counted();
            let mut conn = self.pool.acquire().await?;
            store::finish(
                &mut conn,
                receipt,
                ReceiptState::Ignored,
                Some(ABSORBED),
                (inst.id, channel),
            )
            .await?;
            drop(conn);
            threadline_store::budgets::free(&self.pool, receipt).await?;
            tracing::info!(
                channel,
                "a request was absorbed by a later one of its burst"
            );
            return Ok(ControlFlow::Break(Step::Ignored(ABSORBED)));
        }
        // A reply reads its thread; the top-level burst before the thread's
        // root too when its answer answers the root (which has no answer
        // yet, and would have read it).
        let from = if root == source_ts {
            source_ts
        } else {
            match double_text::root_burst_read(&self.pool, inst.id, channel, root, quiet_ms).await?
            {
                RootBurst::Read => root,
                RootBurst::NotRead => {
                    counted();
                    return Ok(ControlFlow::Continue(Vec::new()));
                }
                RootBurst::AnswerOnItsWay => {
                    metrics::counter!("threadline_double_text_waits_total").increment(1);
                    tracing::debug!(
                        channel,
                        "an answer of the thread is on its way; built once it settled"
                    );
                    return Ok(ControlFlow::Break(Step::AnswerOnItsWay(
                        ANSWER_ON_ITS_WAY_RETRY,
                    )));
                }
            }
        };
        counted();
        let earlier = double_text::earlier(&self.pool, inst.id, channel, from, quiet_ms)
            .await?
            .into_iter()
            .map(|m| ContextMessage {
                ts: m.ts,
                user_id: m.user_id,
                role: "user".into(),
                text: m.text,
            })
            .collect();
        Ok(ControlFlow::Continue(earlier))
    }
}

/// How long a reply waits for an answer of its thread on its way before
/// it asks again.
const ANSWER_ON_ITS_WAY_RETRY: Duration = Duration::from_secs(1);

impl Handler {
    /// For a rebuild, before it takes a place in the model's queue (and is
    /// charged a model call): `Some(wait)` when the reply `source_ts` of
    /// `root` would be handed back now, an answer of its thread being on
    /// its way ([`Handler::burst`]); asked again after `wait`.
    pub(crate) async fn waits_for_thread_answer(
        &self,
        inst: &Installation,
        channel: &str,
        root: &str,
        source_ts: &str,
    ) -> anyhow::Result<Option<Duration>> {
        let Some(quiet) = inst.double_texting.quiet() else {
            return Ok(None);
        };
        if root == source_ts {
            return Ok(None);
        }
        let quiet_ms = quiet.as_millis() as i64;
        let read =
            double_text::root_burst_read(&self.pool, inst.id, channel, root, quiet_ms).await?;
        if read != RootBurst::AnswerOnItsWay {
            return Ok(None);
        }
        metrics::counter!("threadline_double_text_waits_total").increment(1);
        Ok(Some(ANSWER_ON_ITS_WAY_RETRY))
    }
}
