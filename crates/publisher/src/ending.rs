//! Stopping a stream before the whole answer, until Slack confirms it: a
//! stream whose thread moved on (or that a switch, a review, its model or
//! its dead publisher interrupted) is `ending`, and whoever finds it due —
//! its own publisher at once, a publisher handling its event, the sweeper —
//! stops it with its closing line, the AI label and metadata naming the
//! intent as interrupted. Only Slack's `ok` (or Slack showing the stream
//! ended) makes the intent `interrupted`; a stop Slack refuses keeps it
//! `ending`, due again after Slack's `Retry-After`, and nothing is posted
//! beside the open stream meanwhile (the claim waits for it). A stream no
//! one can be told the owner of is ended the same way, unclaimed.

use std::time::Duration;

use secrecy::ExposeSecret as _;
use threadline_domain::reply::{self, Ending, Found, Shown};
use threadline_domain::thinking;
use threadline_slack::{StreamContent, WebError};
use threadline_store::streams::{self, ToEnd};
use uuid::Uuid;

use crate::handler::{Bot, Handler, jitter, persist};
use crate::intents::{self, Proposal};
use crate::reconcile::{self, Owned, Thread};
use threadline_domain::reply::blocks_arg;

/// How long a stream being stopped is kept from other stoppers.
const LEASE_SECS: f64 = 10.0;

/// What Slack did with one `chat.stopStream`.
pub(crate) enum Stopped {
    Yes,
    /// The stream is not open any more (stopped, by us or the person, or
    /// expired).
    AlreadyEnded,
    RateLimited(Duration),
    /// Refused for good (a token Slack no longer takes, a message it will
    /// not let us stop).
    Refused,
    /// The outcome is not known (a timeout, a reset, a 5xx).
    Unknown,
}

/// What a `chat.stopStream` carries: its last text, the same text with the
/// stream's thinking steps as `chunks`, the blocks below, the metadata.
pub(crate) struct Stop<'a> {
    pub(crate) text: &'a str,
    pub(crate) chunks: &'a str,
    pub(crate) blocks: &'a str,
    pub(crate) metadata: &'a str,
}

/// The AI label when the decision has none yet (an answer ended before
/// inference wrote its first words).
pub(crate) const FALLBACK_LABEL: &str = "AI-generated";

impl Handler {
    /// `chat.stopStream`, tried again at once when its outcome is unknown (a
    /// stop that landed answers the next one `message_not_in_streaming_state`).
    /// A stream that carries its text as `markdown_text` (started before
    /// thinking steps were shown) refuses chunks: it is stopped with the
    /// text alone.
    pub(crate) async fn stop_call(
        &self,
        token: &str,
        channel: &str,
        ts: &str,
        stop: &Stop<'_>,
    ) -> Stopped {
        let mut content = StreamContent::Chunks(stop.chunks);
        let mut attempt = 1u32;
        while attempt <= 2 {
            match self
                .web
                .stop_stream(token, channel, ts, content, stop.blocks, stop.metadata)
                .await
            {
                Ok(()) => return Stopped::Yes,
                Err(WebError::Api { code })
                    if code == "message_not_in_streaming_state" || code == "stopped_by_user" =>
                {
                    return Stopped::AlreadyEnded;
                }
                Err(WebError::Api { code })
                    if code == "streaming_mode_mismatch"
                        && content != StreamContent::Text(stop.text) =>
                {
                    content = StreamContent::Text(stop.text);
                    continue;
                }
                Err(WebError::RateLimited { retry_after }) => {
                    metrics::counter!("threadline_slack_rate_limited_total", "method" => "chat.stopStream")
                        .increment(1);
                    return Stopped::RateLimited(retry_after);
                }
                Err(WebError::Api { code })
                    if !matches!(code.as_str(), "internal_error" | "fatal_error") =>
                {
                    tracing::warn!(code, "Slack refused to stop the stream");
                    return Stopped::Refused;
                }
                Err(e) => {
                    tracing::warn!(error = %e, attempt, "stopping the stream: outcome unknown");
                    if attempt == 1 {
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                }
            }
            attempt += 1;
        }
        Stopped::Unknown
    }

    /// One attempt to stop `e`'s stream with its closing line. True when
    /// Slack confirmed the stream ended (the intent is `interrupted`, or
    /// `sent` when Slack shows it stopped with the whole answer after all);
    /// otherwise it stays `ending`, due again after Slack's wait.
    pub(crate) async fn stop_early(&self, e: &ToEnd, bot: &Bot) -> anyhow::Result<bool> {
        let metadata = reply::ending_metadata(Some(&e.intent.to_string()), e.ending).to_string();
        let blocks = blocks_arg(Shown::Ended {
            label: e.label.as_deref().unwrap_or(FALLBACK_LABEL),
        });
        let text = e.ending.closing(e.shown);
        let chunks = thinking::arg(&thinking::ended(&text, e.ending));
        let stop = Stop {
            text: &text,
            chunks: &chunks,
            blocks: &blocks,
            metadata: &metadata,
        };
        let token = bot.token.expose_secret();
        let due = match self.stop_call(token, &e.channel, &e.stream_ts, &stop).await {
            Stopped::Yes => {
                persist(|| streams::interrupted(&self.pool, e.intent, e.ending)).await?;
                metrics::counter!("threadline_streams_interrupted_total", "reason" => e.ending.reason())
                    .increment(1);
                tracing::info!(
                    reason = e.ending.reason(),
                    "stream ended before the whole answer"
                );
                return Ok(true);
            }
            // Slack says it is not open: what it shows decides.
            Stopped::AlreadyEnded => return self.ended_elsewhere(e, bot).await,
            Stopped::RateLimited(wait) => jitter(wait.as_secs_f64(), &e.intent),
            Stopped::Unknown => 2.0,
            // (Slack ends an open stream at its lifetime: it is looked at
            // again then)
            Stopped::Refused => 60.0,
        };
        tracing::warn!(intent_id = %e.intent, due, "the stream's stop was not confirmed; it is stopped again later");
        persist(|| streams::to_ending(&self.pool, e.intent, e.ending, due)).await?;
        Ok(false)
    }

    /// Slack answered that `e`'s stream is not open any more: read it, and
    /// record what it shows (the whole answer, stopped by its publisher or
    /// by the person, is the answer; a stream Slack expired is finished by
    /// updating it, see [`crate::expired`]; anything else ended without
    /// it).
    async fn ended_elsewhere(&self, e: &ToEnd, bot: &Bot) -> anyhow::Result<bool> {
        let o = Owned::load(
            &self.pool,
            e.intent,
            Thread {
                installation: e.installation,
                channel: &e.channel,
                root_ts: &e.root_ts,
            },
            &bot.bot_id,
            self.sending_stale,
            false,
        )
        .await?;
        let seen = match reconcile::read(&self.web, bot.token.expose_secret(), &o).await {
            Ok(seen) => seen,
            Err(err) => {
                tracing::warn!(error = %err, "reading an ended stream failed; read again soon");
                let due = reconcile::wait_after(&err, 2.0);
                persist(|| streams::to_ending(&self.pool, e.intent, e.ending, due)).await?;
                return Ok(false);
            }
        };
        let answer = seen
            .read
            .named
            .first()
            .or(seen.read.stopped.first())
            .cloned();
        match answer {
            Some(ts) => {
                let decision = intents::decision_of(&self.pool, e.intent).await?;
                let posted = intents::decision_for_post(
                    &self.pool,
                    e.intent,
                    seen.hashes.get(&ts),
                    decision,
                )
                .await?;
                let r = intents::record_post(&self.pool, e.intent, posted, &ts, true).await?;
                self.after_record(&r, e.intent);
            }
            None => {
                if let Some(ts) = seen.read.expired.first() {
                    let shown = seen.expired_text.get(ts).map_or("", String::as_str);
                    return self.expired_at_stop(e, ts, shown, bot).await;
                }
                persist(|| streams::ended_in_slack(&self.pool, e.intent, None, "ended_elsewhere"))
                    .await?;
            }
        }
        Ok(true)
    }

    /// Stops `intent`'s stream now if it is `ending` and due (a publisher
    /// handling its event finds it first). True when Slack confirmed.
    pub(crate) async fn stop_if_due(&self, intent: Uuid, bot: &Bot) -> anyhow::Result<bool> {
        match streams::due_ending(&self.pool, intent, LEASE_SECS).await? {
            Some(e) => self.stop_early(&e, bot).await,
            None => Ok(false),
        }
    }

    /// Ends the streams that reconciliation could not tell the owner of,
    /// unclaimed (no intent named; they answer nobody).
    pub(crate) async fn end_unclaimed(
        &self,
        bot: &Bot,
        channel: &str,
        streams: &[String],
    ) -> anyhow::Result<()> {
        let metadata = reply::ending_metadata(None, Ending::Interrupted).to_string();
        let blocks = blocks_arg(Shown::Ended {
            label: FALLBACK_LABEL,
        });
        let text = Ending::Interrupted.closing(false);
        let chunks = thinking::arg(&thinking::ended(&text, Ending::Interrupted));
        let stop = Stop {
            text: &text,
            chunks: &chunks,
            blocks: &blocks,
            metadata: &metadata,
        };
        for ts in streams {
            let r = self
                .stop_call(bot.token.expose_secret(), channel, ts, &stop)
                .await;
            if matches!(r, Stopped::Yes) {
                metrics::counter!("threadline_streams_interrupted_total", "reason" => "unclaimed")
                    .increment(1);
            }
        }
        Ok(())
    }

    /// What reconciliation found about a stream, acted on: its stream still
    /// open is stopped now; streams no one can be told the owner of are
    /// ended unclaimed.
    pub(crate) async fn after_found(
        &self,
        found: &Found,
        intent: Uuid,
        channel: &str,
        bot: &Bot,
    ) -> anyhow::Result<()> {
        match found {
            Found::Open(_) => {
                self.stop_if_due(intent, bot).await?;
            }
            Found::Unclaimed(streams) => self.end_unclaimed(bot, channel, streams).await?,
            _ => {}
        }
        Ok(())
    }

    /// The event's stream, if its publisher stopped driving it, is taken
    /// over and stopped now (before the whole answer is claimed).
    pub(crate) async fn end_orphaned_stream(
        &self,
        p: &Proposal<'_>,
        bot: &Bot,
    ) -> anyhow::Result<()> {
        let stale = self.stream_stale();
        let Some(o) =
            streams::orphan_of(&self.pool, p.installation, p.event_id, p.action_kind, stale)
                .await?
        else {
            return Ok(());
        };
        if streams::take_orphan(&self.pool, o.intent, stale).await? {
            tracing::warn!(intent_id = %o.intent, "a stream's publisher stopped driving it; ending it");
            self.stop_if_due(o.intent, bot).await?;
        }
        Ok(())
    }

    /// The sweeper's pass over streams: those nobody drives any more are
    /// taken over (their publisher died or froze), and every stream due to
    /// be stopped is stopped.
    pub(crate) async fn sweep_streams(&self) -> anyhow::Result<usize> {
        let stale = self.stream_stale();
        for o in streams::orphans(&self.pool, stale, 50).await? {
            if streams::take_orphan(&self.pool, o.intent, stale).await? {
                tracing::warn!(intent_id = %o.intent, "a stream's publisher stopped driving it; ending it");
            }
        }
        let due = streams::due_endings(&self.pool, LEASE_SECS, 50).await?;
        for e in &due {
            // (one installation's failure does not keep the others' open)
            let stopped = async {
                match self.bot(e.installation).await? {
                    Some(bot) => self.stop_early(e, &bot).await.map(|_| ()),
                    None => {
                        // No token any more: nothing can stop it (Slack ends
                        // it at its lifetime), and nothing will be posted.
                        persist(|| {
                            streams::ended_in_slack(
                                &self.pool,
                                e.intent,
                                None,
                                "installation_unavailable",
                            )
                        })
                        .await?;
                        Ok(())
                    }
                }
            }
            .await;
            if let Err(err) = stopped {
                tracing::warn!(error = format!("{err:#}"), intent_id = %e.intent, "stopping a stream failed; next round");
            }
        }
        Ok(due.len())
    }
}
