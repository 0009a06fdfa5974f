//! threadline's tables, one module per table family, each with named row
//! types. Every statement is a `query!`/`query_as!` macro checked against
//! the schema at build time from the offline data in `.sqlx` (so a build
//! needs no database); `scripts/sqlx-prepare.sh` regenerates that data from
//! `migrations/`, and `make lint` fails when it no longer matches them.
//!
//! The crate depends on `domain` and the bus contracts only: services, the
//! CLI and the tests go through it; it knows nothing of the bus, HTTP or
//! configuration. What the caller computes with keys it holds (an audit
//! pseudonym, a sealed token) comes in as a value.

pub mod actions;
pub mod agent_view;
pub mod assistant;
pub mod audit;
pub mod budgets;
pub mod channels;
pub mod decisions;
pub mod double_text;
pub mod feedback;
pub mod installations;
pub mod intents;
pub mod kill_switches;
pub mod late;
pub mod ledger;
pub mod oauth_states;
pub mod operator;
pub mod outbox;
pub mod policies;
pub mod receipts;
pub mod rejections;
pub mod retention;
pub mod review;
pub mod schema;
pub mod streams;
#[cfg(feature = "testing")]
pub mod testing;
pub mod threads;
pub mod tokens;

use threadline_domain::state::Machine;

/// The states among `from` that may become `to`, as the compare-and-set of
/// that move binds them (`state = ANY($n)`, the new state bound beside it):
/// every state change the store makes names its states through the
/// machines in `domain`, so a move they forbid matches no row. Naming a
/// forbidden start is a programming error: debug builds (every test)
/// panic, release builds leave it out.
pub(crate) fn moves<M: Machine>(from: &[M], to: M) -> Vec<String> {
    from.iter()
        .filter(|s| {
            debug_assert!(
                s.can_become(to),
                "{} may not move from {} to {}",
                M::NAME,
                s.as_str(),
                to.as_str()
            );
            s.can_become(to)
        })
        .map(|s| s.as_str().to_owned())
        .collect()
}

/// Every state that may become `to` (a move from wherever the row is).
pub(crate) fn moves_from_any<M: Machine>(to: M) -> Vec<String> {
    M::from_states(to).into_iter().map(str::to_owned).collect()
}

#[cfg(test)]
mod tests {
    /// The tables whose state columns the machines in `domain` govern.
    const GOVERNED: [&str; 4] = [
        "event_receipts",
        "decisions",
        "reply_intents",
        "review_messages",
    ];

    /// Every assignment of a literal to a governed state column in `text`:
    /// `(table, the text from the assignment on)`.
    fn literal_state_writes(text: &str) -> Vec<(String, String)> {
        // One line, lower case, single spaces: SQL as a tokenizer sees it.
        let sql = text
            .to_lowercase()
            .replace('=', " = ")
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        let mut found = Vec::new();
        for column in ["state", "status"] {
            let needle = format!(" {column} = ");
            let mut from = 0;
            while let Some(at) = sql[from..].find(&needle).map(|i| i + from) {
                from = at + 1;
                // An assignment follows SET or a comma; `WHEN state =` and
                // `AND state =` are comparisons.
                let before = sql[..at].trim_end();
                if !(before.ends_with(" set") || before.ends_with(',')) {
                    continue;
                }
                let value = &sql[at + needle.len()..];
                let literal = if value.starts_with('\'') {
                    true
                } else if let Some(case) = value.strip_prefix("case ") {
                    let body = &case[..case.find(" end").unwrap_or(case.len())];
                    body.contains("then '") || body.contains("else '")
                } else {
                    false
                };
                // The table: `UPDATE t SET`, or `INSERT INTO t … ON
                // CONFLICT … DO UPDATE SET`.
                let word_after = |from: usize| -> String {
                    sql[from..]
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect()
                };
                let Some(update) = sql[..at].rfind("update ") else {
                    continue;
                };
                let mut table = word_after(update + 7);
                if table == "set" {
                    let Some(insert) = sql[..update].rfind("insert into ") else {
                        continue;
                    };
                    table = word_after(insert + 12);
                }
                if literal && GOVERNED.contains(&table.as_str()) {
                    let end = sql[at..]
                        .char_indices()
                        .nth(60)
                        .map_or(sql.len(), |(i, _)| at + i);
                    found.push((table, sql[at..end].to_owned()));
                }
            }
        }
        found
    }

    /// A state change names its states through the machines (bound as
    /// parameters from `moves`), never as a literal the machines never saw.
    #[test]
    fn no_statement_writes_a_state_the_machines_did_not_name() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut found = Vec::new();
        let mut files = Vec::new();
        let mut dirs = vec![dir.clone()];
        while let Some(d) = dirs.pop() {
            for entry in std::fs::read_dir(&d).expect("src") {
                let path = entry.expect("entry").path();
                // `testing/` holds the tests' fixtures, which set a row to
                // the state a scenario needs on purpose: no service runs them.
                if path == dir.join("testing") {
                    continue;
                }
                if path.is_dir() {
                    dirs.push(path);
                } else {
                    files.push(path);
                }
            }
        }
        for path in files {
            let text = std::fs::read_to_string(&path).expect("source");
            // Tests (this one's probes included) are not statements.
            let code = text.split("#[cfg(test)]").next().unwrap_or_default();
            for (table, at) in literal_state_writes(code) {
                found.push(format!("{}: {table}: {at}", path.display()));
            }
        }
        assert!(
            found.is_empty(),
            "states written as literals, not through domain's machines: {found:#?}"
        );
    }

    /// The scan finds the writes it looks for and nothing else.
    #[test]
    fn the_scan_tells_a_literal_state_write_from_a_comparison() {
        for write in [
            "UPDATE reply_intents SET state = 'sent' WHERE id = $1",
            "UPDATE reply_intents\n   SET error_code = $2,\n       state = 'held'",
            "UPDATE event_receipts SET failures = failures + 1, state = CASE WHEN x THEN 'failed' ELSE state END",
            "WITH d AS (UPDATE decisions SET status = 'published' WHERE id = $1)",
            "UPDATE reply_intents SET state='sent' WHERE id = $1",
            "INSERT INTO reply_intents (id, state) VALUES ($1, $2) ON CONFLICT (id) DO UPDATE SET state = 'pending'",
        ] {
            assert_eq!(literal_state_writes(write).len(), 1, "{write}");
        }
        for not_one in [
            "UPDATE reply_intents SET state = $2 WHERE id = $1 AND state = 'sent'",
            "UPDATE event_receipts SET failures = CASE WHEN state = 'failed' THEN 0 ELSE failures END",
            "UPDATE event_receipts SET state = CASE WHEN x THEN $3 ELSE state END",
            "UPDATE installations SET status = 'disabled' WHERE id = $1",
            "UPDATE decisions SET status_reason = 'x' WHERE status = 'review'",
            "SELECT id FROM reply_intents WHERE state = 'sent'",
            "UPDATE reply_intents SET attempts = 1 WHERE state <= 'x' OR state >= 'y'",
            "INSERT INTO installations (id) VALUES ($1) ON CONFLICT (id) DO UPDATE SET status = 'active'",
        ] {
            assert!(literal_state_writes(not_one).is_empty(), "{not_one}");
        }
    }
}
