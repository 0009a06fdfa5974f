//! `threadline dlq …`: the dead letters — messages a worker gave up on
//! (poison, or repeated failures). A letter is an envelope (subject, reason,
//! the identities the message names) and the message sealed with
//! `THREADLINE_DEAD_LETTER_KEYS`, or without its text when the worker had no
//! keys (see `threadline_tenancy::dead_letter`); listing shows the envelope,
//! never a payload. A replay opens the message and puts it back on the
//! subject it came from, where the handlers' idempotency makes a second
//! processing harmless; the dead letter is removed once the broker has
//! acknowledged the replay. A letter whose message was not kept whole says
//! so and stays.

use anyhow::Context as _;
use async_nats::HeaderMap;
use async_nats::jetstream::{self, stream::Stream};
use clap::Subcommand;
use threadline_runtime::bus::{Topic, Topology};
use threadline_runtime::config::CommonConfig;
use threadline_tenancy::dead_letter::{
    self, DECISION, EVENT, INSTALLATION, ORIGINAL, PAYLOAD, REASON, RECEIPT,
};

#[derive(Subcommand)]
pub enum DlqCommand {
    /// Dead letters, oldest first, as JSON (no payloads).
    List {
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// Put dead letters back on their original subject and remove them.
    Replay {
        /// Stream sequence numbers (from `dlq list`).
        #[arg(required_unless_present = "all")]
        seq: Vec<u64>,
        /// Every dead letter.
        #[arg(long, conflicts_with = "seq")]
        all: bool,
        /// Also letters without a payload mark (written before dead letters
        /// were sealed), put back as they are: check them first.
        #[arg(long)]
        legacy: bool,
    },
    /// Remove dead letters without replaying them (after inspection).
    Drop {
        #[arg(required = true)]
        seq: Vec<u64>,
    },
}

#[derive(serde::Serialize)]
struct Letter {
    seq: u64,
    dead_lettered_at: String,
    original_subject: Option<String>,
    reason: Option<String>,
    message_id: Option<String>,
    installation_id: Option<String>,
    receipt_id: Option<String>,
    event_id: Option<String>,
    decision_id: Option<String>,
    /// `sealed` (replayable with the keys), `whole`, `redacted` or
    /// `dropped` (see `threadline_tenancy::dead_letter`).
    payload: String,
    payload_bytes: usize,
}

fn header(h: &HeaderMap, name: &str) -> Option<String> {
    h.get(name).map(|v| v.as_str().to_owned())
}

async fn letters(
    stream: &Stream,
    limit: usize,
) -> anyhow::Result<Vec<(Letter, jetstream::message::StreamMessage)>> {
    let info = stream
        .get_info()
        .await
        .context("reading the dead-letter stream")?;
    let mut out = Vec::new();
    if info.state.messages == 0 {
        return Ok(out);
    }
    for seq in info.state.first_sequence..=info.state.last_sequence {
        if out.len() >= limit {
            break;
        }
        // Gaps are letters already replayed or dropped.
        let Ok(m) = stream.get_raw_message(seq).await else {
            continue;
        };
        out.push((
            Letter {
                seq,
                dead_lettered_at: m
                    .time
                    .format(&time::format_description::well_known::Rfc3339)
                    .unwrap_or_default(),
                original_subject: header(&m.headers, ORIGINAL),
                reason: header(&m.headers, REASON),
                message_id: header(&m.headers, "Threadline-Message-Id")
                    .or_else(|| header(&m.headers, "Nats-Msg-Id")),
                installation_id: header(&m.headers, INSTALLATION),
                receipt_id: header(&m.headers, RECEIPT),
                event_id: header(&m.headers, EVENT),
                decision_id: header(&m.headers, DECISION),
                payload: header(&m.headers, PAYLOAD).unwrap_or_else(|| "whole".into()),
                payload_bytes: m.payload.len(),
            },
            m,
        ));
    }
    Ok(out)
}

pub async fn run(cmd: DlqCommand, common: &CommonConfig) -> anyhow::Result<()> {
    let nats = threadline_runtime::bus::connect(&common.nats_url, "threadline-cli").await?;
    let js = jetstream::new(nats.clone());
    let topology = Topology::from_config(common);
    let letter_keys = dead_letter::Letters::from_config(common)?;
    let stream = js
        .get_stream(topology.dead_letter_stream())
        .await
        .with_context(|| {
            format!(
                "opening stream {} (bus prefix {:?} from THREADLINE_BUS_PREFIX, broker {}): \
                 has a service started with this prefix? A demo or test stack runs under a \
                 prefix of its own; set THREADLINE_BUS_PREFIX to the one it printed",
                topology.dead_letter_stream(),
                common.bus_prefix,
                threadline_runtime::bus::redact_url(common.nats_url.url()),
            )
        })?;
    match cmd {
        DlqCommand::List { limit } => {
            let list: Vec<Letter> = letters(&stream, limit)
                .await?
                .into_iter()
                .map(|l| l.0)
                .collect();
            println!("{}", serde_json::to_string_pretty(&list)?);
        }
        DlqCommand::Drop { seq } => {
            for s in seq {
                stream
                    .delete_message(s)
                    .await
                    .with_context(|| format!("dead letter {s} not found"))?;
                println!("dropped {s}");
            }
        }
        DlqCommand::Replay { seq, all, legacy } => {
            let wanted: Vec<(Letter, jetstream::message::StreamMessage)> =
                letters(&stream, usize::MAX)
                    .await?
                    .into_iter()
                    .filter(|(l, _)| all || seq.contains(&l.seq))
                    .collect();
            if !all {
                for s in &seq {
                    anyhow::ensure!(
                        wanted.iter().any(|(l, _)| l.seq == *s),
                        "dead letter {s} not found"
                    );
                }
            }
            // Only subjects of this deployment's topics are replayed to.
            let known: Vec<String> = Topic::ALL.iter().map(|t| topology.subject(*t)).collect();
            // Check every letter before replaying any, so a refusal leaves
            // the set as it was.
            let mut ready = Vec::new();
            for (letter, m) in wanted {
                let (subject, payload) = dead_letter::open(
                    &m.subject,
                    &m.headers,
                    &m.payload,
                    letter_keys.keys(),
                    legacy,
                )
                .with_context(|| format!("dead letter {} cannot be replayed", letter.seq))?;
                anyhow::ensure!(
                    known.contains(&subject),
                    "dead letter {} names {subject:?}, not a subject of this deployment ({}); drop it or republish by hand",
                    letter.seq,
                    topology.prefix()
                );
                ready.push((letter, m, subject, payload));
            }
            for (letter, m, subject, payload) in ready {
                let mut headers = dead_letter::without(Some(&m.headers), &dead_letter::HEADERS);
                // A fresh message id: the original may still be inside the
                // stream's duplicate window, which would drop the replay.
                headers.insert(
                    "Nats-Msg-Id",
                    format!(
                        "replay:{}:{}",
                        letter.seq,
                        letter.message_id.as_deref().unwrap_or("")
                    )
                    .as_str(),
                );
                js.publish_with_headers(subject.clone(), headers, payload)
                    .await?
                    .await
                    .with_context(|| format!("replaying dead letter {}", letter.seq))?;
                stream.delete_message(letter.seq).await?;
                println!("replayed {} to {subject}", letter.seq);
            }
        }
    }
    nats.flush().await?;
    Ok(())
}
