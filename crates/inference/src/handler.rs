//! Turning one `ContextReady` into a proposal: claim the decision for the
//! (event, version) binding, check kill switches, call the model with the
//! thread as untrusted data, apply the output policy and the AI label, fall
//! back deterministically when no model answers, and publish.

use std::time::Duration;
use threadline_domain::ids::is_dm;
use threadline_domain::state::{DecisionStatus, Machine as _};

use async_nats::jetstream;
use prost::Message as _;
use sha2::{Digest, Sha256};
use sqlx::PgPool;
use threadline_domain::output::{self, Risk};
use threadline_domain::prompt::{self, Quoted};
use threadline_domain::sources::{self, Source};
use threadline_proto::v1::proposal_ready::Work;
use threadline_proto::v1::{ContextReady, PaneStatus, StreamStart};
use threadline_runtime::bus::{Topic, Topology};
use threadline_runtime::killswitch::{self, FEATURE_REPLIES};
use threadline_runtime::worker::Disposition;
use tracing::Instrument as _;
use uuid::Uuid;

use crate::decisions::{self, Claim, ClaimFound, ClaimRequest, Settle, Settled};
use crate::provider::{Breaker, Completion, OpenAiClient, ProviderError, Read, builtin};
use threadline_runtime::batch::Batcher;
use threadline_store::decisions::Decision;

/// A model endpoint with its breaker.
pub struct Guarded {
    pub client: OpenAiClient,
    pub breaker: Breaker,
}

pub struct Handler {
    pub pool: PgPool,
    /// Decision claims of concurrent handlers, one statement per batch
    /// (with each installation's status and kill switch).
    pub claims: Batcher<ClaimRequest, ClaimFound>,
    /// Settles of concurrent handlers, one statement per batch.
    pub settles: Batcher<Settle, Option<Decision>>,
    pub js: jetstream::Context,
    pub topology: Topology,
    /// None: the built-in model is the provider.
    pub primary: Option<Guarded>,
    /// Only a provider marked tested-equivalent is ever configured here.
    pub backup: Option<Guarded>,
    pub system_prompt: String,
    pub label: String,
    pub fallback_text: String,
    pub reply_max_chars: usize,
    pub model_timeout: Duration,
    /// How long the built-in model takes (demos and tests).
    pub builtin_latency: Duration,
    /// Identifies provider, model and instructions in each decision.
    pub model_config_id: String,
    /// Answers are streamed ([`Streaming`]); `None`: one post at the end.
    pub streaming: Option<Streaming>,
}

/// How answers are streamed.
#[derive(Debug, Clone, Copy)]
pub struct Streaming {
    /// How often the text released so far is stored for the publisher.
    pub release_every: Duration,
    /// The built-in model's pace: the time between two of its words.
    pub builtin_pace: Duration,
}

/// Releases a streamed answer's text as the model writes it: only whole
/// words, only while the text so far passes the output policy (once it
/// would need a reviewer nothing more is released: the reviewer sees the
/// rest first), escaped as the final body is and short enough that the
/// final body still starts with it.
pub struct Releaser<'a> {
    pool: &'a PgPool,
    decision: Uuid,
    label: &'a str,
    max_chars: usize,
    every: Duration,
    raw: String,
    released: usize,
    last: Option<std::time::Instant>,
    /// Nothing more is released (a risk, the length, another attempt).
    held: bool,
    /// The decision is no longer being called: stop the model.
    gone: bool,
}

impl<'a> Releaser<'a> {
    fn new(
        pool: &'a PgPool,
        decision: Uuid,
        label: &'a str,
        max_chars: usize,
        every: Duration,
    ) -> Self {
        Self {
            pool,
            decision,
            label,
            max_chars,
            every,
            raw: String::new(),
            released: 0,
            last: None,
            held: false,
            gone: false,
        }
    }

    /// What may be shown of `raw` now: its whole words, escaped, or `None`
    /// once a risk or the length stops the release.
    pub fn releasable(raw: &str, label: &str, max_chars: usize) -> Option<String> {
        let cut = raw.rfind(char::is_whitespace)?;
        let words = raw[..cut].trim();
        let checked = output::prepare(output::Body::Model(words), label, max_chars, false);
        // (a stream is Markdown: a link there hides its target; the rest
        // is posted whole, as mrkdwn, where it shows as written)
        if !checked.risks.is_empty() || output::markup::markdown_link(words) {
            return None;
        }
        let text = threadline_domain::output::markup::escape(words);
        // (room for the truncation marker the final body may end with)
        (text.chars().count() + 20 <= max_chars.min(2900)).then_some(text)
    }

    /// Another model attempt starts: what the first one released stays,
    /// nothing of the new one is released (the final answer is posted).
    fn restart(&mut self) {
        self.raw.clear();
        self.held |= self.released > 0;
    }

    async fn flush(&mut self) -> bool {
        self.last = Some(std::time::Instant::now());
        if self.held {
            // Nothing more is shown, but whether the answer is still
            // wanted is looked at all the same: a held stream whose
            // decision another holder settled stops its model call too.
            if !self.gone
                && let Ok(calling) =
                    threadline_store::streams::calling(self.pool, self.decision).await
            {
                self.gone = !calling;
            }
            return !self.gone;
        }
        let Some(text) = Self::releasable(&self.raw, self.label, self.max_chars) else {
            self.held = !self.raw.trim().is_empty() && self.raw.contains(char::is_whitespace);
            return true;
        };
        if text.len() <= self.released {
            return true;
        }
        match threadline_store::streams::release_text(self.pool, self.decision, &text, self.label)
            .await
        {
            Ok(alive) => {
                self.released = text.len();
                self.gone = !alive;
                alive
            }
            Err(e) => {
                // Not shown yet is not lost: the final body holds it.
                tracing::warn!(error = %e, "storing released text failed; the answer goes on");
                true
            }
        }
    }
}

impl crate::provider::Sink for Releaser<'_> {
    fn hold(&mut self) {
        self.held = true;
    }

    async fn text(&mut self, delta: &str) -> bool {
        self.raw.push_str(delta);
        if self.last.is_some_and(|t| t.elapsed() < self.every) {
            return true;
        }
        self.flush().await
    }
}

/// A short, stable id of the model configuration (no secrets in it).
pub fn model_config_id(parts: &[&str]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_be_bytes());
        h.update(p.as_bytes());
    }
    hex::encode(&h.finalize()[..8])
}

enum Answer {
    Model {
        provider: String,
        completion: Completion,
    },
    Fallback {
        reason: &'static str,
    },
}

/// What an answer comes to before the output policy: its text, whose it
/// is, and what it used.
struct Output {
    text: String,
    provider: String,
    fallback: bool,
    tools: Vec<String>,
    prompt_tokens: Option<i32>,
    completion_tokens: Option<i32>,
}

/// The links the answer took from what it read: from the thread's context
/// (people's and approved bots' messages), the channel the person looks at or the earlier messages of the person's
/// burst (none for the fallback, which is threadline's own text and took
/// nothing from them).
fn sources_of(out: &Output, answer: &str, ctx: &ContextReady) -> Vec<Source> {
    if out.fallback {
        return Vec::new();
    }
    // (never the app's own earlier answers: a link a model made up once
    // is no source when it repeats it)
    let read = ctx
        .messages
        .iter()
        .filter(|m| m.role != "assistant")
        .chain(&ctx.channel_context)
        .chain(&ctx.earlier);
    sources::of(answer, read.map(|m| m.text.as_str()))
}

impl Output {
    fn of(answer: Answer, h: &Handler) -> Self {
        match answer {
            Answer::Model {
                provider,
                completion,
            } => Output {
                text: completion.text,
                provider,
                fallback: false,
                tools: completion.tool_calls,
                prompt_tokens: completion.prompt_tokens,
                completion_tokens: completion.completion_tokens,
            },
            Answer::Fallback { reason } => {
                metrics::counter!("threadline_fallbacks_total", "reason" => reason).increment(1);
                Output {
                    text: h.fallback_text.clone(),
                    provider: "fallback".to_owned(),
                    fallback: true,
                    tools: Vec::new(),
                    prompt_tokens: None,
                    completion_tokens: None,
                }
            }
        }
    }

    /// Model text is untrusted and escaped; the fallback is threadline's own.
    fn body(&self) -> output::Body<'_> {
        if self.fallback {
            output::Body::Own(&self.text)
        } else {
            output::Body::Model(&self.text)
        }
    }
}

impl Handler {
    /// Handles one ContextReady payload that is not tied to a bus delivery.
    pub async fn handle(&self, payload: &[u8]) -> Disposition {
        self.handle_delivery(payload, None).await
    }

    /// Handles one delivery of a ContextReady message; `message_seq` (its
    /// stream sequence) lets a redelivery take over the lease its earlier
    /// delivery left behind.
    pub async fn handle_delivery(&self, payload: &[u8], message_seq: Option<u64>) -> Disposition {
        let Ok(ctx) = ContextReady::decode(payload) else {
            return Disposition::Poison("undecodable ContextReady".into());
        };
        let (Ok(receipt), Ok(inst)) = (
            Uuid::parse_str(&ctx.receipt_id),
            Uuid::parse_str(&ctx.installation_id),
        ) else {
            return Disposition::Poison("ContextReady without ids".into());
        };
        let span = tracing::info_span!("inference.decide", event_id = %ctx.event_id, receipt_id = %receipt, version = ctx.thread_version);
        match self
            .process(&ctx, receipt, inst, message_seq)
            .instrument(span.clone())
            .await
        {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(parent: &span, error = format!("{e:#}"), "inference failed; retrying");
                threadline_tenancy::fault::disposition(&e)
            }
        }
    }

    /// One context, decided: claim → ask → settle, with the assistant
    /// pane's progress and the stream as hooks around the ask.
    async fn process(
        &self,
        ctx: &ContextReady,
        receipt: Uuid,
        inst: Uuid,
        message_seq: Option<u64>,
    ) -> anyhow::Result<Disposition> {
        let id = match self.claim(ctx, receipt, inst, message_seq).await? {
            Ok(id) => id,
            Err(done) => return Ok(done),
        };
        let pane = self.show_progress(id, ctx, inst).await?;
        let label = self.label_for(ctx);
        let mut releaser = self.open_stream(id, ctx, inst, &label).await?;
        let Some(answer) = self.ask_released(ctx, releaser.as_mut()).await else {
            // The decision stopped being called while its answer streamed:
            // another holder settled it (a redelivery took the lease over),
            // which freed the request's place; nothing to record but what
            // this call used until it stopped.
            let spent = self.stopped_call_tokens(ctx, releaser.as_ref().map_or(0, |r| r.raw.len()));
            tracing::info!(
                tokens_estimated = spent,
                "streamed answer no longer wanted; model call stopped"
            );
            threadline_store::budgets::count_tokens(&self.pool, inst, spent).await?;
            return Ok(Disposition::Done);
        };
        self.settle_answer(id, inst, ctx, pane, answer, &label)
            .await
    }

    /// What a model call stopped mid-stream used, estimated at four bytes
    /// a token (about what BPE tokenizers take for English) plus four a
    /// message for its framing: the prompt it was sent and the text it
    /// wrote until it stopped. Providers report usage only at a stream's
    /// end, and an aborted call is billed all the same. The built-in model
    /// uses none, as its whole answers count none.
    fn stopped_call_tokens(&self, ctx: &ContextReady, written: usize) -> i64 {
        if self.primary.is_none() {
            return 0;
        }
        let read = self.system_prompt.len()
            + ctx.messages.iter().map(|m| m.text.len()).sum::<usize>()
            + ctx
                .channel_context
                .iter()
                .chain(&ctx.earlier)
                .map(|m| m.text.len())
                .sum::<usize>();
        let framing = 4 * (1 + ctx.messages.len() + ctx.channel_context.len() + ctx.earlier.len());
        ((read + written).div_ceil(4) + framing) as i64
    }

    /// The AI label this context's answer carries: with the note of its
    /// request's lateness when its installation's policy has it say so
    /// (the context-builder decided; the label goes with every form of the
    /// answer through the decision row).
    fn label_for(&self, ctx: &ContextReady) -> String {
        let late = (ctx.late_by_ms > 0).then(|| Duration::from_millis(ctx.late_by_ms as u64));
        threadline_domain::late::labelled(&self.label, late)
    }

    /// The claim of the decision for the context's (event, version)
    /// binding, under a lease; `Err` is what the message comes to instead
    /// (another delivery holds it, it was settled before, the installation
    /// is gone, a kill switch is engaged: checked by the claim's statement,
    /// before any model call).
    async fn claim(
        &self,
        ctx: &ContextReady,
        receipt: Uuid,
        inst: Uuid,
        message_seq: Option<u64>,
    ) -> anyhow::Result<Result<Uuid, Disposition>> {
        // Long enough for the primary and the backup to time out and the
        // answer to be recorded; a worker that died holding it is replaced
        // once it runs out.
        let lease = self.model_timeout.as_secs_f64() * 2.0 + 10.0;
        let binding = decisions::Binding::of(
            ctx,
            receipt,
            inst,
            threadline_runtime::audit::channel_ref(inst, &ctx.channel_id),
        );
        let found = self
            .claims
            .submit(ClaimRequest::of(
                &binding,
                lease,
                message_seq,
                FEATURE_REPLIES,
            ))
            .await?;
        // (the batch's statement runs outside this span: say here what it
        // found, so that debug logs follow the event through the service)
        tracing::debug!(
            outcome = ?found.claim,
            active = found.active,
            switch = found.switch.as_deref(),
            "decision claim"
        );
        let claim = match found.claim {
            Some(c) => c.into(),
            // Not decidable in the batch's snapshot: on its own.
            None => decisions::claim(&self.pool, &binding, lease, message_seq).await?,
        };
        let id = match claim {
            Claim::Mine(id) => id,
            // Another delivery holds the lease: look again once it may
            // have run out (the message waits in the broker, not here).
            Claim::Busy => return Ok(Err(Disposition::Defer(Duration::from_secs(10)))),
            Claim::Settled(id, status) => {
                // A redelivery: never a second model call for this binding.
                // (in a DM, any outcome: a pane's progress is cleared by it)
                if matches!(status, DecisionStatus::Proposed | DecisionStatus::Review)
                    || (is_dm(&ctx.channel_id) && status != DecisionStatus::Calling)
                {
                    self.publish(id).await?;
                }
                return Ok(Err(Disposition::Done));
            }
        };
        // A removed or revoked installation gets no more model calls.
        if !found.active {
            let mut s = self.suppressed("installation_disabled");
            s.status = DecisionStatus::Cancelled;
            self.settle(id, &s).await?;
            return Ok(Err(Disposition::Done));
        }
        if let Some(switch) = found.switch {
            metrics::counter!("threadline_kill_switch_suppressions_total", "stage" => "inference")
                .increment(1);
            tracing::warn!(switch = %switch, "kill switch engaged; job suppressed before the model call");
            self.settle(id, &self.suppressed(&switch)).await?;
            return Ok(Err(Disposition::Done));
        }
        Ok(Ok(id))
    }

    /// Hook before the ask: in an assistant thread (the pane is a DM with
    /// the app), progress shows while the model runs (the publisher clears
    /// it on every outcome), and the thread's first question names it.
    /// Whether this is a pane thread.
    async fn show_progress(
        &self,
        id: Uuid,
        ctx: &ContextReady,
        inst: Uuid,
    ) -> anyhow::Result<bool> {
        if !is_dm(&ctx.channel_id) {
            return Ok(false);
        }
        let Some(pane) =
            threadline_store::assistant::thread(&self.pool, inst, &ctx.channel_id, &ctx.root_ts)
                .await?
        else {
            return Ok(false);
        };
        let title = (!pane.titled)
            .then(|| {
                ctx.messages
                    .iter()
                    .find(|m| m.ts == ctx.source_ts)
                    .and_then(|m| threadline_domain::assistant::title_of(&m.text))
            })
            .flatten();
        if let Err(e) = self.announce(id, None, title).await {
            tracing::warn!(
                error = format!("{e:#}"),
                "announcing progress failed; none shown"
            );
        }
        Ok(true)
    }

    /// Hook before the ask: where the policy allows it (the publisher
    /// checks again), the stream may start now (the decision is named
    /// before its first word exists), and a releaser hands it the words as
    /// the model writes them. Elsewhere the answer is posted whole.
    async fn open_stream<'a>(
        &'a self,
        id: Uuid,
        ctx: &ContextReady,
        inst: Uuid,
        label: &'a str,
    ) -> anyhow::Result<Option<Releaser<'a>>> {
        let Some(st) = &self.streaming else {
            return Ok(None);
        };
        if !threadline_store::streams::allowed(&self.pool, inst, &ctx.channel_id).await? {
            return Ok(None);
        }
        if let Err(e) = self.announce(id, Some(label), None).await {
            tracing::warn!(
                error = format!("{e:#}"),
                "announcing the stream failed; the answer will be posted whole"
            );
        }
        Ok(Some(Releaser::new(
            &self.pool,
            id,
            label,
            self.reply_max_chars,
            st.release_every,
        )))
    }

    /// The ask, with the releaser's last words after it; `None` when the
    /// publisher ended the stream meanwhile.
    async fn ask_released(
        &self,
        ctx: &ContextReady,
        mut releaser: Option<&mut Releaser<'_>>,
    ) -> Option<Answer> {
        let model_span = tracing::info_span!(
            "model.call",
            model_config_id = %self.model_config_id,
            provider = tracing::field::Empty,
            outcome = tracing::field::Empty
        );
        let answer = self
            .ask(ctx, releaser.as_deref_mut())
            .instrument(model_span.clone())
            .await;
        if let Some(r) = releaser.as_deref_mut()
            && !r.gone
            && matches!(answer, Answer::Model { .. })
        {
            // The last words (the settled body holds them all anyway).
            r.raw.push(' ');
            r.flush().await;
        }
        if releaser.is_some_and(|r| r.gone) {
            return None;
        }
        match &answer {
            Answer::Model { provider, .. } => {
                model_span.record("provider", provider.as_str());
                model_span.record("outcome", "ok");
            }
            Answer::Fallback { reason } => {
                model_span.record("outcome", *reason);
            }
        }
        Some(answer)
    }

    /// Settles the answer: the output policy and the AI label, review for
    /// what needs it, an action's own kill switch, the decision recorded
    /// (hard, so that the lease does not run out into a second model call),
    /// and the proposal published.
    async fn settle_answer(
        &self,
        id: Uuid,
        inst: Uuid,
        ctx: &ContextReady,
        pane: bool,
        answer: Answer,
        label: &str,
    ) -> anyhow::Result<Disposition> {
        let out = Output::of(answer, self);
        let reply = output::prepare(
            out.body(),
            label,
            self.reply_max_chars,
            !out.tools.is_empty(),
        );
        let sources = sources_of(&out, &reply.text, ctx);
        let hash = hex::encode(Sha256::digest(reply.text.as_bytes()));
        let (status, action_kind) = if reply.risks.is_empty() {
            (DecisionStatus::Proposed, "thread_reply".to_owned())
        } else if reply.risks.contains(&Risk::ActionBeyondReply) {
            (
                DecisionStatus::Review,
                format!("tool:{}", out.tools.join(",")),
            )
        } else {
            (DecisionStatus::Review, "thread_reply".to_owned())
        };
        // An action beyond a reply is governed by its own feature switch,
        // checked once the model has said what it wants to do.
        if let Some(done) = self
            .action_switched_off(id, inst, pane, &action_kind)
            .await?
        {
            return Ok(done);
        }
        let settled = Settled {
            status,
            reason: None,
            action_kind: &action_kind,
            review_reasons: reply.risks.iter().map(|r| r.as_str().to_owned()).collect(),
            model_config_id: &self.model_config_id,
            provider: &out.provider,
            fallback: out.fallback,
            prompt_tokens: out.prompt_tokens,
            completion_tokens: out.completion_tokens,
            output_hash: Some(&hash),
            body_text: Some(&reply.text),
            body_blocks: Some(&reply.blocks),
            sources: &sources,
        };
        let Some(settled) = self.settle_hard(id, &settled).await? else {
            // Another worker settled it (our lease ran out): this call ran
            // all the same, and what it used counts, unless the settle
            // found is our own whose answer was lost (its hash is ours).
            let ours = threadline_store::decisions::load(&self.pool, id)
                .await?
                .is_some_and(|d| d.output_hash.as_deref() == Some(hash.as_str()));
            if !ours {
                let used = i64::from(out.prompt_tokens.unwrap_or(0))
                    + i64::from(out.completion_tokens.unwrap_or(0));
                threadline_store::budgets::count_tokens(&self.pool, inst, used).await?;
            }
            return Ok(Disposition::Done);
        };
        metrics::counter!("threadline_decisions_total", "status" => status.as_str()).increment(1);
        if status == DecisionStatus::Review {
            for r in &reply.risks {
                metrics::counter!("threadline_review_reasons_total", "reason" => r.as_str())
                    .increment(1);
            }
            tracing::info!(reasons = ?reply.risks, "proposal routed to human review");
            // (the publisher asks in the review channel, when there is one)
        }
        // The row as settled: what the proposal names, read by the
        // statement that settled it.
        publish_proposal(&self.js, &self.topology, &settled, None).await?;
        Ok(Disposition::Done)
    }

    /// An action beyond a reply whose feature's kill switch is engaged:
    /// suppressed (`Some`), and published in a pane so that its progress
    /// clears.
    async fn action_switched_off(
        &self,
        id: Uuid,
        inst: Uuid,
        pane: bool,
        action_kind: &str,
    ) -> anyhow::Result<Option<Disposition>> {
        let feature = killswitch::feature_of(action_kind);
        if feature == FEATURE_REPLIES {
            return Ok(None);
        }
        let Some(switch) =
            threadline_store::kill_switches::engaged(&self.pool, inst, feature).await?
        else {
            return Ok(None);
        };
        metrics::counter!("threadline_kill_switch_suppressions_total", "stage" => "inference")
            .increment(1);
        tracing::warn!(switch = %switch, feature, "kill switch engaged; proposed action suppressed");
        let mut s = self.suppressed(&switch);
        s.action_kind = action_kind;
        let settled = self.settle(id, &s).await?;
        if pane && let Some(d) = settled {
            // (so that the publisher clears the progress it showed)
            publish_proposal(&self.js, &self.topology, &d, None).await?;
        }
        Ok(Some(Disposition::Done))
    }

    /// The model has answered: records the decision, trying hard, so that
    /// the lease does not run out and another worker call the model again.
    async fn settle_hard(&self, id: Uuid, s: &Settled<'_>) -> anyhow::Result<Option<Decision>> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            match self.settle(id, s).await {
                Ok(stored) => {
                    tracing::debug!(
                        status = s.status.as_str(),
                        recorded = stored.is_some(),
                        "decision settled"
                    );
                    return Ok(stored);
                }
                Err(e) if attempt < 5 => {
                    tracing::warn!(error = %e, attempt, "recording the decision failed; trying again");
                    tokio::time::sleep(Duration::from_millis(500 * attempt)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Settles the decision with whatever other settles are waiting; the
    /// row as settled, none if the lease was lost and another worker
    /// settled it.
    async fn settle(&self, id: Uuid, s: &Settled<'_>) -> anyhow::Result<Option<Decision>> {
        Ok(self.settles.submit(Settle::of(id, s)).await?)
    }

    fn suppressed<'a>(&'a self, switch: &'a str) -> Settled<'a> {
        Settled {
            status: DecisionStatus::Suppressed,
            reason: Some(switch),
            action_kind: "thread_reply",
            review_reasons: Vec::new(),
            model_config_id: &self.model_config_id,
            provider: "none",
            fallback: false,
            prompt_tokens: None,
            completion_tokens: None,
            output_hash: None,
            body_text: None,
            body_blocks: None,
            sources: &[],
        }
    }

    /// Publishes the decision being called, before the model call: as a
    /// stream to start (`stream`: its answer's label, `Nats-Msg-Id:
    /// prop:<decision>:stream`), or as progress to show in its assistant
    /// thread (`prop:<decision>:status`).
    async fn announce(
        &self,
        id: Uuid,
        stream: Option<&str>,
        title: Option<String>,
    ) -> anyhow::Result<()> {
        if let Some(label) = stream {
            // (the label first: a stream ended before any word still shows it)
            threadline_store::streams::release_text(&self.pool, id, "", label).await?;
        }
        let d = threadline_store::decisions::load(&self.pool, id)
            .await?
            .ok_or_else(|| anyhow::anyhow!("decision {id} is gone"))?;
        let mut msg = threadline_store::decisions::proposal(&d);
        let tag = if stream.is_some() {
            msg.stream = true;
            msg.work = Some(Work::StreamStart(StreamStart {}));
            "stream"
        } else {
            let title = title.unwrap_or_default();
            msg.assistant = "status".to_owned();
            msg.assistant_title = title.clone();
            msg.work = Some(Work::PaneStatus(PaneStatus { title }));
            "status"
        };
        threadline_runtime::bus::publish(
            &self.js,
            &self.topology,
            Topic::Proposals,
            &threadline_store::decisions::proposal_msg_id(d.id, Some(tag)),
            msg.encode_to_vec(),
        )
        .await
    }

    /// The model chain: primary (behind its breaker), a tested-equivalent
    /// backup, else the deterministic fallback. The built-in model answers
    /// when no endpoint is configured.
    async fn ask(&self, ctx: &ContextReady, mut releaser: Option<&mut Releaser<'_>>) -> Answer {
        let Some(primary) = &self.primary else {
            let thread: Vec<Read<'_>> = ctx
                .messages
                .iter()
                .map(|m| Read {
                    ts: &m.ts,
                    user: &m.user_id,
                    text: &m.text,
                })
                .collect();
            if !self.builtin_latency.is_zero() {
                tokio::time::sleep(self.builtin_latency).await;
            }
            let mut completion = builtin(&thread, &ctx.source_ts, ctx.thread_version);
            if !ctx.channel_context.is_empty() {
                // (what it read of the channel the person is looking at)
                completion.text.push_str(&format!(
                    "; and {} message(s) of channel {}, the one you are looking at: {}",
                    ctx.channel_context.len(),
                    ctx.context_channel_id,
                    read_list(&ctx.channel_context)
                ));
            }
            if !ctx.earlier.is_empty() {
                // (the earlier messages of the person's burst it answers too)
                completion.text.push_str(&format!(
                    "; and {} earlier message(s) you sent just before: {}",
                    ctx.earlier.len(),
                    read_list(&ctx.earlier)
                ));
            }
            if let (Some(r), Some(st)) = (releaser, &self.streaming) {
                // Word by word at the configured pace, as a model writes,
                // within the model's time limit like any model call (the
                // answer is whole already: a slow pace only shows less).
                let words = async {
                    for word in completion.text.split_inclusive(char::is_whitespace) {
                        if !st.builtin_pace.is_zero() {
                            tokio::time::sleep(st.builtin_pace).await;
                        }
                        if !crate::provider::Sink::text(r, word).await {
                            break;
                        }
                    }
                };
                let _ = tokio::time::timeout(self.model_timeout, words).await;
            }
            metrics::counter!("threadline_model_calls_total", "provider" => "builtin", "result" => "ok").increment(1);
            return Answer::Model {
                provider: "builtin".into(),
                completion,
            };
        };
        let quoted: Vec<Quoted<'_>> = ctx
            .messages
            .iter()
            .map(|m| Quoted {
                role: &m.role,
                speaker_id: &m.user_id,
                ts: &m.ts,
                text: &m.text,
            })
            .collect();
        let viewing: Vec<Quoted<'_>> = ctx
            .channel_context
            .iter()
            .map(|m| Quoted {
                role: &m.role,
                speaker_id: &m.user_id,
                ts: &m.ts,
                text: &m.text,
            })
            .collect();
        let earlier: Vec<Quoted<'_>> = ctx
            .earlier
            .iter()
            .map(|m| Quoted {
                role: &m.role,
                speaker_id: &m.user_id,
                ts: &m.ts,
                text: &m.text,
            })
            .collect();
        let messages = prompt::build_viewing(
            &self.system_prompt,
            &quoted,
            &ctx.source_ts,
            (!viewing.is_empty()).then_some((ctx.context_channel_id.as_str(), viewing.as_slice())),
            &earlier,
        );
        let mut last = "provider_error";
        for g in std::iter::once(primary).chain(self.backup.as_ref()) {
            if !g.breaker.admit() {
                metrics::counter!("threadline_model_calls_total", "provider" => g.client.name.clone(), "result" => "circuit_open").increment(1);
                last = "circuit_open";
                continue;
            }
            let started = std::time::Instant::now();
            let r = match releaser.as_deref_mut() {
                Some(sink) => {
                    sink.restart();
                    tokio::time::timeout(
                        self.model_timeout,
                        g.client.complete_streaming(&messages, sink),
                    )
                    .await
                }
                None => {
                    tokio::time::timeout(self.model_timeout, g.client.complete(&messages)).await
                }
            }
            .unwrap_or(Err(ProviderError::Timeout));
            if r == Err(ProviderError::Stopped) {
                // Not the provider's failure: nobody wants the answer.
                g.breaker.record(true);
                return Answer::Fallback { reason: "stopped" };
            }
            metrics::histogram!("threadline_model_latency_seconds", "provider" => g.client.name.clone())
                .record(started.elapsed().as_secs_f64());
            g.breaker.record(r.is_ok());
            match r {
                Ok(completion) => {
                    metrics::counter!("threadline_model_calls_total", "provider" => g.client.name.clone(), "result" => "ok").increment(1);
                    return Answer::Model {
                        provider: g.client.name.clone(),
                        completion,
                    };
                }
                Err(e) => {
                    metrics::counter!("threadline_model_calls_total", "provider" => g.client.name.clone(), "result" => e.code()).increment(1);
                    tracing::warn!(provider = %g.client.name, error = e.code(), "model call failed");
                    last = e.code();
                }
            }
        }
        Answer::Fallback { reason: last }
    }

    /// Publishes a settled proposal; the binding fields come from the
    /// decision row, never from model output.
    pub async fn publish(&self, id: Uuid) -> anyhow::Result<()> {
        let d = threadline_store::decisions::load(&self.pool, id)
            .await?
            .ok_or_else(|| anyhow::anyhow!("decision {id} is gone"))?;
        publish_proposal(&self.js, &self.topology, &d, None).await
    }
}

/// Publishes a decision as `ProposalReady` (`Nats-Msg-Id: prop:<decision>`,
/// plus `:<resend>` when it is handed over again on purpose, so the
/// stream's duplicate window does not drop it).
pub async fn publish_proposal(
    js: &jetstream::Context,
    topology: &Topology,
    d: &threadline_store::decisions::Decision,
    resend: Option<&str>,
) -> anyhow::Result<()> {
    threadline_runtime::bus::publish(
        js,
        topology,
        Topic::Proposals,
        &threadline_store::decisions::proposal_msg_id(d.id, resend),
        threadline_store::decisions::proposal(d).encode_to_vec(),
    )
    .await
}

/// What the built-in model states it read of `messages`: `ts/digest`
/// items, separated by spaces.
fn read_list(messages: &[threadline_proto::v1::ContextMessage]) -> String {
    messages
        .iter()
        .map(|m| format!("{}/{}", m.ts, crate::provider::text_digest(&m.text)))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::Releaser;

    #[test]
    fn only_whole_words_that_pass_the_policy_are_released_escaped() {
        let r = |raw| Releaser::releasable(raw, "AI", 2900);
        assert_eq!(r("Restart"), None, "no whole word yet");
        assert_eq!(r("Restart the po").as_deref(), Some("Restart the"));
        assert_eq!(
            r("  a & b ").as_deref(),
            Some("a &amp; b"),
            "escaped as posted"
        );
        // What the final body starts with: the release is its prefix.
        let raw = "Use <https://example.com> & retry. Then check";
        let body = threadline_domain::output::markup::escape_within(raw.trim(), 2900);
        assert!(body.starts_with(&r(raw).expect("released")));
        // A mention, a secret: nothing is released from there on.
        assert_eq!(r("ask <@U1> now "), None);
        assert_eq!(r("the key is xoxb-1234-5678-abcdefgh "), None);
        // Near the length limit nothing more is released (the final body
        // may end with a truncation marker there).
        let long = "word ".repeat(600);
        assert_eq!(Releaser::releasable(&long, "AI", 2900), None);
    }
}
