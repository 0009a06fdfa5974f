//! Thinking steps: the stages of a streamed answer, shown in Slack as task
//! updates (`task_update` chunks of `chat.startStream`, `appendStream`
//! and `stopStream`) beside the streamed text. Each task is a real stage of
//! the one reply mechanism, and its status says what that stage came to:
//!
//! * [`Stage::Read`] — the thread's context was built: `complete` when
//!   the stream starts (a stream starts only from a built context);
//! * [`Stage::Write`] — the answer's text: `in_progress` from the start,
//!   `complete` only when the stop shows the whole answer, carrying as
//!   `sources` the links the answer took from what it read
//!   ([`crate::sources`]); a stream that ends before (the thread moved on,
//!   a switch, a review, an interruption) ends it `error` with the
//!   ending's own line as details;
//! * [`Stage::Check`] — the publisher's last staleness check before the
//!   answer is whole: shown `complete` with a clean stop.
//!
//! Titles and details are threadline's own words, never message text.
//! Pure: the publisher sends these chunks, Slack (or slack-sim) shows them.
//!
//! Where an answer is posted whole (streaming off), the assistant pane's
//! status (and an agent's Messages tab's) shows the same stages as they
//! happen, in the same words ([`Stage::title`] as its loading message):
//! the thread being read while its context is built, the answer being
//! written while the model is called, the thread being checked while the
//! publisher runs its staleness check before the post.

use serde_json::{Value, json};

use crate::reply::Ending;
use crate::sources::Source;

/// A stage of a streamed answer, shown as one task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    Read,
    Write,
    Check,
}

/// A task's status, as Slack's `task_update` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Pending,
    InProgress,
    Complete,
    Error,
}

impl Status {
    pub fn name(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::InProgress => "in_progress",
            Self::Complete => "complete",
            Self::Error => "error",
        }
    }
}

impl Stage {
    /// The task's id, stable across the calls of one stream.
    pub fn id(self) -> &'static str {
        match self {
            Self::Read => "threadline_read",
            Self::Write => "threadline_write",
            Self::Check => "threadline_check",
        }
    }

    /// The stage's name as threadline stores it (the pane's status record).
    pub fn name(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Write => "write",
            Self::Check => "check",
        }
    }

    /// The stage a stored name names.
    pub fn parse(name: &str) -> Option<Stage> {
        [Self::Read, Self::Write, Self::Check]
            .into_iter()
            .find(|s| s.name() == name)
    }

    /// The task's title (and the pane status's loading message).
    pub fn title(self) -> &'static str {
        match self {
            Self::Read => "Reading the thread",
            Self::Write => "Writing the answer",
            Self::Check => "Checking the thread before the answer is whole",
        }
    }

    /// A `task_update` chunk of this stage at `status`, with `details`.
    pub fn update(self, status: Status, details: Option<&str>) -> Value {
        let mut c = json!({
            "type": "task_update",
            "id": self.id(),
            "title": self.title(),
            "status": status.name(),
        });
        if let Some(d) = details {
            c["details"] = d.into();
        }
        c
    }
}

/// A `markdown_text` chunk (none for empty text).
fn text(t: &str) -> Option<Value> {
    (!t.is_empty()).then(|| json!({"type": "markdown_text", "text": t}))
}

/// The chunks a stream starts with: the thread was read, the answer is
/// being written.
pub fn start() -> Vec<Value> {
    vec![
        Stage::Read.update(Status::Complete, None),
        Stage::Write.update(Status::InProgress, None),
    ]
}

/// The chunks of an append: its text only.
pub fn append(t: &str) -> Vec<Value> {
    text(t).into_iter().collect()
}

/// The chunks of the stop that shows the whole answer: its last text, the
/// answer written (with the `sources` it took from what it read, if any),
/// the thread checked.
pub fn finished(rest: &str, sources: &[Source]) -> Vec<Value> {
    let mut c: Vec<Value> = text(rest).into_iter().collect();
    let mut written = Stage::Write.update(Status::Complete, None);
    if !sources.is_empty() {
        written["sources"] = sources.iter().map(Source::element).collect();
    }
    c.push(written);
    c.push(Stage::Check.update(Status::Complete, None));
    c
}

/// The chunks of a stop before the whole answer: its closing line, and the
/// writing task ended as an error that says why (never `complete`).
pub fn ended(closing: &str, ending: Ending) -> Vec<Value> {
    let mut c: Vec<Value> = text(closing).into_iter().collect();
    c.push(Stage::Write.update(Status::Error, Some(ending.line())));
    c
}

/// `chunks` as a Web API argument (a JSON array).
pub fn arg(chunks: &[Value]) -> String {
    Value::Array(chunks.to_vec()).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn statuses(c: &[Value]) -> Vec<(String, String)> {
        c.iter()
            .filter(|c| c["type"] == "task_update")
            .map(|c| {
                (
                    c["id"].as_str().unwrap_or_default().to_owned(),
                    c["status"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect()
    }

    #[test]
    fn a_clean_stream_completes_every_stage() {
        let s = statuses(&start());
        assert_eq!(
            s,
            [
                ("threadline_read".into(), "complete".into()),
                ("threadline_write".into(), "in_progress".into())
            ]
        );
        let f = finished(" pod.", &[]);
        assert_eq!(f[0], json!({"type": "markdown_text", "text": " pod."}));
        assert!(statuses(&f).iter().all(|(_, s)| s == "complete"));
        assert!(f.iter().all(|c| c.get("sources").is_none()), "none to show");
        assert_eq!(statuses(&finished("", &[])).len(), 2, "no empty text chunk");
        assert!(append("").is_empty());
    }

    #[test]
    fn the_writing_step_carries_its_sources_when_whole() {
        let s = Source::parse("https://ci.example.com/runs/42").unwrap();
        let f = finished("", std::slice::from_ref(&s));
        let w = f.iter().find(|c| c["id"] == "threadline_write").unwrap();
        assert_eq!(w["sources"], json!([s.element()]));
        assert!(
            f.iter()
                .filter(|c| c["id"] != "threadline_write")
                .all(|c| c.get("sources").is_none())
        );
    }

    #[test]
    fn a_stage_is_stored_by_its_name() {
        for s in [Stage::Read, Stage::Write, Stage::Check] {
            assert_eq!(Stage::parse(s.name()), Some(s));
        }
        assert_eq!(Stage::parse("thinking"), None);
    }

    #[test]
    fn an_early_end_never_completes_the_writing_task() {
        for e in Ending::ALL {
            let c = ended(&e.closing(true), e);
            let w = c.iter().find(|c| c["id"] == "threadline_write").unwrap();
            assert_eq!(w["status"], "error", "{e:?}");
            assert_eq!(w["details"], e.line());
            assert!(!c.iter().any(|c| c["id"] == "threadline_check"));
        }
    }
}
