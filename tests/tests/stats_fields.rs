//! The operations page's list of `threadline stats --json` fields is the
//! output's: every field the CLI prints is named there, and every field
//! named there is printed.

use threadline_testkit::{TestDb, repo_root};
use threadline_tests::cli;

/// The operations page's paragraph on `stats --json`, up to the next
/// heading-like line.
fn readme_list() -> String {
    let readme = std::fs::read_to_string(repo_root().join("docs/operations.md"))
        .expect("docs/operations.md");
    let start = readme
        .find("`stats --json` reports")
        .expect("docs/operations.md describes `stats --json`");
    let rest = &readme[start..];
    let end = rest.find("Gateway answers:").expect("the section after it");
    rest[..end].to_owned()
}

/// The backticked snake_case names of a text.
fn named(text: &str) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|w| !w.is_empty() && w.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operations_page_names_every_stats_field_and_no_other() {
    let db = TestDb::new().await;
    let out = cli(&["stats", "--json"], &[("DATABASE_URL", db.url.clone())]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stats: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let mut fields: Vec<String> = Vec::new();
    for (k, v) in stats.as_object().expect("an object") {
        fields.push(k.clone());
        // Fixed sub-fields (not open-ended maps of states or reasons).
        if k == "reconciliations_by_result" || k == "spool" {
            fields.extend(v.as_object().expect("an object").keys().cloned());
        }
    }
    let list = readme_list();
    let in_readme = named(&list);
    let missing: Vec<&String> = fields.iter().filter(|f| !in_readme.contains(f)).collect();
    assert!(
        missing.is_empty(),
        "stats fields docs/operations.md does not name: {missing:?}"
    );
    // Names in the list that are neither fields nor the values/reasons the
    // list mentions as examples.
    const EXAMPLES: &[&str] = &[
        "unparsed",
        "rate_limited_too_often",
        "source_deleted",
        "intent_held",
    ];
    let unknown: Vec<&String> = in_readme
        .iter()
        .filter(|n| !fields.contains(n) && !EXAMPLES.contains(&n.as_str()))
        .filter(|n| !n.starts_with("threadline_"))
        .collect();
    assert!(
        unknown.is_empty(),
        "docs/operations.md names fields stats does not print: {unknown:?}"
    );
}
