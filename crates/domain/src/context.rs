//! Building the context for a triggering event: the thread as it is now,
//! ordered, with speakers, deterministically truncated (root plus the most
//! recent replies within count, age and byte limits, with an explicit
//! marker), and a content hash.

use sha2::{Digest, Sha256};

/// One stored message, as the context sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredMessage {
    pub ts: String,
    pub speaker: String,
    pub user_id: String,
    pub text: String,
}

#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_messages: usize,
    pub max_bytes: usize,
    /// Replies older than this (relative to the source message) are dropped.
    pub max_age_secs: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Built {
    pub messages: Vec<StoredMessage>,
    /// How many messages were left out; `> 0` means truncated.
    pub omitted: usize,
    pub content_hash: String,
}

fn secs(ts: &str) -> u64 {
    ts.split('.')
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// What choosing a reply needs: each offered reply's ts and size in bytes,
/// newest first; never its text. The root and the source message are kept
/// before any reply is offered.
#[derive(Debug, Clone)]
pub struct Chooser {
    oldest_allowed: u64,
    bytes: usize,
    max_bytes: usize,
    room: usize,
}

/// What the chooser did with an offered reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offer {
    Keep,
    /// Left out (too big for what room is left); older ones may still fit.
    Skip,
    /// Left out, and so is every older reply (no room, or too old).
    Done,
}

impl Chooser {
    /// `source_len` is the source message's size when it is a reply of the
    /// thread (not the root, not gone).
    pub fn new(
        root_len: usize,
        source_len: Option<usize>,
        source_ts: &str,
        limits: Limits,
    ) -> Self {
        Self {
            oldest_allowed: secs(source_ts).saturating_sub(limits.max_age_secs),
            bytes: root_len + source_len.unwrap_or(0),
            max_bytes: limits.max_bytes,
            room: limits.max_messages.max(2) - 1 - usize::from(source_len.is_some()),
        }
    }

    /// Offers the next older reply (never the root or the source).
    pub fn offer(&mut self, ts: &str, len: usize) -> Offer {
        if self.room == 0 || secs(ts) < self.oldest_allowed {
            return Offer::Done;
        }
        if self.bytes + len > self.max_bytes {
            return Offer::Skip;
        }
        self.bytes += len;
        self.room -= 1;
        Offer::Keep
    }
}

/// `thread` is oldest first with the root first. The root and the source
/// message are always kept; then replies from the newest back, skipping
/// any that would break the byte limit, while the count and the age limit
/// allow. The store reads only what this keeps ([`Chooser`] over sizes);
/// this whole-thread form is the reference it is tested against.
pub fn build(thread: &[StoredMessage], source_ts: &str, limits: Limits) -> Built {
    let Some((root, replies)) = thread.split_first() else {
        return Built {
            messages: Vec::new(),
            omitted: 0,
            content_hash: hash(&[]),
        };
    };
    let source = replies.iter().position(|m| m.ts == source_ts);
    let mut chooser = Chooser::new(
        root.text.len(),
        source.map(|i| replies[i].text.len()),
        source_ts,
        limits,
    );
    let mut keep = vec![false; replies.len()];
    if let Some(i) = source {
        keep[i] = true;
    }
    for (i, m) in replies.iter().enumerate().rev() {
        if Some(i) == source {
            continue;
        }
        match chooser.offer(&m.ts, m.text.len()) {
            Offer::Keep => keep[i] = true,
            Offer::Skip => {}
            Offer::Done => break,
        }
    }
    let mut messages = Vec::with_capacity(limits.max_messages);
    messages.push(root.clone());
    messages.extend(
        replies
            .iter()
            .zip(&keep)
            .filter(|(_, k)| **k)
            .map(|(m, _)| m.clone()),
    );
    finish(messages, thread.len())
}

/// The context of `messages` (oldest first, root first) out of a thread of
/// `thread_len` messages.
pub fn finish(messages: Vec<StoredMessage>, thread_len: usize) -> Built {
    let omitted = thread_len.saturating_sub(messages.len());
    let content_hash = hash(&messages);
    Built {
        messages,
        omitted,
        content_hash,
    }
}

/// SHA-256 over each message's identity and text, length-prefixed.
pub fn hash(messages: &[StoredMessage]) -> String {
    let mut h = Sha256::new();
    for m in messages {
        for part in [&m.ts, &m.speaker, &m.user_id, &m.text] {
            h.update((part.len() as u64).to_be_bytes());
            h.update(part.as_bytes());
        }
    }
    hex::encode(h.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(ts: &str, text: &str) -> StoredMessage {
        StoredMessage {
            ts: ts.into(),
            speaker: "user".into(),
            user_id: "U1".into(),
            text: text.into(),
        }
    }

    fn limits() -> Limits {
        Limits {
            max_messages: 4,
            max_bytes: 1000,
            max_age_secs: 3600,
        }
    }

    #[test]
    fn keeps_root_and_newest_replies_with_a_marker() {
        let t: Vec<_> = (0..10)
            .map(|i| msg(&format!("{}.000000", 1000 + i), &format!("m{i}")))
            .collect();
        let b = build(&t, "1009.000000", limits());
        let texts: Vec<&str> = b.messages.iter().map(|m| m.text.as_str()).collect();
        assert_eq!(texts, ["m0", "m7", "m8", "m9"]);
        assert_eq!(b.omitted, 6);
        assert_eq!(b, build(&t, "1009.000000", limits()), "deterministic");
    }

    #[test]
    fn byte_and_age_limits_cut_from_the_oldest_reply() {
        let t = vec![
            msg("1.000000", "root"),
            msg("2.000000", &"x".repeat(700)),
            msg("3.000000", &"y".repeat(300)),
        ];
        let b = build(&t, "3.000000", limits());
        assert_eq!(b.messages.len(), 2);
        assert_eq!(b.omitted, 1);
        let t = vec![
            msg("1.000000", "root"),
            msg("100.000000", "old"),
            msg("5000.000000", "new"),
        ];
        let b = build(&t, "5000.000000", limits());
        assert_eq!(
            b.messages
                .iter()
                .map(|m| m.text.as_str())
                .collect::<Vec<_>>(),
            ["root", "new"]
        );
    }

    #[test]
    fn the_request_is_kept_even_when_a_huge_reply_follows_it() {
        let t = vec![
            msg("1.000000", "root"),
            msg("2.000000", "question?"),
            msg("3.000000", &"log ".repeat(500)),
            msg("4.000000", "short"),
        ];
        let b = build(&t, "2.000000", limits());
        let texts: Vec<&str> = b.messages.iter().map(|m| m.text.as_str()).collect();
        assert_eq!(
            texts,
            ["root", "question?", "short"],
            "the oversized paste is skipped, not a stop"
        );
        assert_eq!(b.omitted, 1);
    }

    #[test]
    fn the_hash_follows_content() {
        let a = vec![msg("1.0", "a"), msg("2.0", "b")];
        let mut b = a.clone();
        b[1].text = "c".into();
        assert_ne!(hash(&a), hash(&b));
        // Length prefixes: moving bytes between fields changes the hash.
        let x = vec![StoredMessage {
            ts: "1.0".into(),
            speaker: "user".into(),
            user_id: "U1".into(),
            text: "ab".into(),
        }];
        let y = vec![StoredMessage {
            ts: "1.0".into(),
            speaker: "user".into(),
            user_id: "U1a".into(),
            text: "b".into(),
        }];
        assert_ne!(hash(&x), hash(&y));
    }
}
