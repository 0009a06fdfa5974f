//! `threadline dlq …`: the dead letters — messages a worker gave up on
//! (poison, or retries exhausted). Listing shows ids, reasons and sizes,
//! never payloads (they can hold message text). A replay puts the message
//! back on the subject it came from, where the handlers' idempotency makes a
//! second processing harmless; the dead letter is removed once the broker
//! has acknowledged the replay.

use anyhow::Context as _;
use async_nats::HeaderMap;
use async_nats::jetstream::{self, stream::Stream};
use clap::Subcommand;
use threadline_runtime::bus::{Topic, Topology};
use threadline_runtime::config::CommonConfig;

const REASON: &str = "Threadline-Dead-Letter-Reason";
const ORIGINAL: &str = "Threadline-Original-Subject";

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
                message_id: header(&m.headers, "Nats-Msg-Id"),
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
    let stream = js
        .get_stream(topology.dead_letter_stream())
        .await
        .with_context(|| {
            format!(
                "opening {} (has a service started?)",
                topology.dead_letter_stream()
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
        DlqCommand::Replay { seq, all } => {
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
            for (letter, m) in wanted {
                let Some(subject) = letter
                    .original_subject
                    .clone()
                    .filter(|s| known.contains(s))
                else {
                    anyhow::bail!(
                        "dead letter {} has no known original subject ({:?}); drop it or republish by hand",
                        letter.seq,
                        letter.original_subject
                    );
                };
                let mut headers = HeaderMap::new();
                for (name, values) in m.headers.iter() {
                    let n: &str = name.as_ref();
                    if n == REASON || n == ORIGINAL || n.starts_with("Nats-") {
                        continue;
                    }
                    for v in values {
                        headers.append(n, v.as_str());
                    }
                }
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
                js.publish_with_headers(subject.clone(), headers, m.payload.clone())
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
