//! The code's shape, read from its source: what keeps one mechanism per
//! concern from drifting back into copies.
//!
//! * No import circle inside any crate: the modules of a crate that name
//!   each other (`crate::x`, `use crate::{x, …}`) form no cycle.
//! * No state as a string in a row type a service reads: a public struct of
//!   the store (outside its test fixtures) has no `state: String` or
//!   `status: String` field; states are the domain's machines end to end.
//! * No state literal in a service crate: outside its tests, no string
//!   literal in the gateway, context-builder, inference, publisher or CLI is
//!   the name of a state of a domain machine, unless its line (or the line
//!   above) says why it is not one (`// not a state: …`, e.g. a label of
//!   another vocabulary).
//! * No `process` or `handle` function over 80 lines in a service crate:
//!   one type and one handler per kind of work, each a few steps.
//! * `runtime` is infrastructure only: neither it nor any workspace crate
//!   it depends on (in any dependency table) depends on `store` or `slack`;
//!   tables and Slack are reached from the crates above it (`tenancy`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use threadline_domain::state::{
    DecisionStatus, InstallationStatus, IntentState, Machine, ReceiptState, ReviewRequestState,
    WorkState,
};
use threadline_testkit::repo_root;

const SERVICES: [&str; 5] = [
    "gateway",
    "context-builder",
    "inference",
    "publisher",
    "cli",
];

/// Every `.rs` file under `dir`.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(sources(&p));
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
    out.sort();
    out
}

/// A file's text without its test module (everything from its first
/// `#[cfg(test)]` line, which the crates keep last).
fn product(path: &Path) -> String {
    let text = std::fs::read_to_string(path).expect("a source file");
    match text.find("\n#[cfg(test)]") {
        Some(i) => text[..i].to_owned(),
        None => text,
    }
}

/// The top-level module a file of `src` is (`handler` for src/handler.rs
/// and src/handler/x.rs); `None` for lib.rs and main.rs.
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).ok()?;
    let first = rel.components().next()?.as_os_str().to_str()?.to_owned();
    let name = first.trim_end_matches(".rs").to_owned();
    (name != "lib" && name != "main").then_some(name)
}

/// The crate's modules each module names.
fn module_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let files = sources(src);
    let modules: BTreeSet<String> = files.iter().filter_map(|f| module_of(src, f)).collect();
    for f in &files {
        let Some(from) = module_of(src, f) else {
            continue;
        };
        // (code only: a doc link names a module without depending on it)
        let text: String = product(f)
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .map(|l| format!("{l}\n"))
            .collect();
        let mut names: BTreeSet<String> = BTreeSet::new();
        // `crate::x` anywhere, and `use crate::{x, y::…}` lists.
        for (i, _) in text.match_indices("crate::") {
            let rest = &text[i + "crate::".len()..];
            if let Some(list) = rest.strip_prefix('{') {
                let end = list.find("};").unwrap_or(list.len());
                for item in list[..end].split(',') {
                    let head: String = item
                        .trim()
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    names.insert(head);
                }
            } else {
                let head: String = rest
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                names.insert(head);
            }
        }
        let entry = graph.entry(from.clone()).or_default();
        for n in names {
            if n != from && modules.contains(&n) {
                entry.insert(n);
            }
        }
    }
    graph
}

/// A cycle of the graph, if it has one.
fn cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        g: &BTreeMap<String, BTreeSet<String>>,
        n: &str,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == n) {
            let mut c = path[i..].to_vec();
            c.push(n.to_owned());
            return Some(c);
        }
        if done.contains(n) {
            return None;
        }
        path.push(n.to_owned());
        for next in g.get(n).into_iter().flatten() {
            if let Some(c) = visit(g, next, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(n.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    for n in graph.keys() {
        if let Some(c) = visit(graph, n, &mut Vec::new(), &mut done) {
            return Some(c);
        }
    }
    None
}

#[test]
fn no_crate_has_an_import_circle() {
    let crates = repo_root().join("crates");
    let mut found = Vec::new();
    let mut names: Vec<PathBuf> = std::fs::read_dir(&crates)
        .expect("crates/")
        .flatten()
        .map(|e| e.path())
        .collect();
    names.sort();
    for krate in names {
        let src = krate.join("src");
        if let Some(c) = cycle(&module_graph(&src)) {
            found.push(format!("{}: {}", krate.display(), c.join(" → ")));
        }
    }
    assert!(found.is_empty(), "import circles: {found:#?}");
}

#[test]
fn the_circle_check_finds_a_circle() {
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    g.entry("a".into()).or_default().insert("b".into());
    g.entry("b".into()).or_default().insert("c".into());
    assert_eq!(cycle(&g), None);
    g.entry("c".into()).or_default().insert("a".into());
    assert_eq!(
        cycle(&g),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
}

#[test]
fn store_rows_carry_states_as_the_domains_machines() {
    let src = repo_root().join("crates/store/src");
    let mut found = Vec::new();
    for f in sources(&src) {
        if f.components().any(|c| c.as_os_str() == "testing") {
            continue;
        }
        let text = product(&f);
        let mut in_pub_struct = false;
        for (i, line) in text.lines().enumerate() {
            let t = line.trim();
            if line.starts_with("pub struct ") {
                in_pub_struct = true;
            } else if line.starts_with('}') || line.starts_with("struct ") {
                in_pub_struct = false;
            }
            if in_pub_struct
                && (t.starts_with("pub state: String") || t.starts_with("pub status: String"))
            {
                found.push(format!("{}:{}: {t}", f.display(), i + 1));
            }
        }
    }
    assert!(
        found.is_empty(),
        "states as strings in store rows: {found:#?}"
    );
}

fn state_names() -> BTreeSet<&'static str> {
    fn of<M: Machine>() -> Vec<&'static str> {
        M::ALL.iter().map(|s| s.as_str()).collect()
    }
    of::<ReceiptState>()
        .into_iter()
        .chain(of::<DecisionStatus>())
        .chain(of::<IntentState>())
        .chain(of::<ReviewRequestState>())
        .chain(of::<InstallationStatus>())
        .chain(of::<WorkState>())
        .collect()
}

/// The string literals of a line of code (not of its comment).
fn literals(line: &str) -> Vec<String> {
    let code = match line.find("//") {
        Some(i) if !line[..i].contains('"') || line[..i].matches('"').count().is_multiple_of(2) => {
            &line[..i]
        }
        _ => line,
    };
    code.split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

#[test]
fn service_crates_hold_no_state_literal() {
    let states = state_names();
    let mut found = Vec::new();
    for krate in SERVICES {
        for f in sources(&repo_root().join("crates").join(krate).join("src")) {
            let text = product(&f);
            let lines: Vec<&str> = text.lines().collect();
            for (i, line) in lines.iter().enumerate() {
                // (said on the line, or on the line above it)
                let said = |l: &str| l.contains("// not a state:");
                if said(line) || (i > 0 && said(lines[i - 1])) {
                    continue;
                }
                for lit in literals(line) {
                    if states.contains(lit.as_str()) {
                        found.push(format!("{}:{}: {}", f.display(), i + 1, line.trim()));
                    }
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "state literals in service crates: {found:#?}"
    );
}

#[test]
fn no_process_or_handle_function_is_over_80_lines() {
    let mut found = Vec::new();
    for krate in SERVICES {
        for f in sources(&repo_root().join("crates").join(krate).join("src")) {
            let text = product(&f);
            let lines: Vec<&str> = text.lines().collect();
            for (i, line) in lines.iter().enumerate() {
                let t = line.trim_start();
                let indent = line.len() - t.len();
                let named = ["fn process(", "fn handle("]
                    .iter()
                    .any(|n| t.contains(n) && !t.starts_with("//"));
                if !named {
                    continue;
                }
                let close = format!("{}}}", " ".repeat(indent));
                let end = lines[i + 1..]
                    .iter()
                    .position(|l| *l == close)
                    .map_or(lines.len(), |k| i + 1 + k);
                let n = end - i + 1;
                if n > 80 {
                    found.push(format!("{}:{}: {n} lines", f.display(), i + 1));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "process/handle functions over 80 lines: {found:#?}"
    );
}

/// The workspace crates (`threadline-…` package names) a manifest names in
/// any of its dependency tables (`[dependencies]`, `[dev-dependencies]`,
/// `[build-dependencies]`, `[target.….dependencies]`, dotted or inline),
/// renamed ones (`package = "threadline-…"`) included.
fn internal_dependencies(manifest: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut in_deps = false;
    for line in manifest.lines() {
        let t = line.trim();
        if t.starts_with('[') {
            let table = t.trim_matches(|c| c == '[' || c == ']');
            in_deps = table.ends_with("dependencies") || table.contains("dependencies.");
            // `[dependencies.threadline-store]`
            if let Some((_, name)) = table.rsplit_once("dependencies.")
                && name.starts_with("threadline-")
            {
                out.insert(name.trim_matches('"').to_owned());
            }
            continue;
        }
        if !in_deps || t.starts_with('#') {
            continue;
        }
        let key = t
            .split(['=', '.'])
            .next()
            .unwrap_or("")
            .trim()
            .trim_matches('"');
        if key.starts_with("threadline-") {
            out.insert(key.to_owned());
        }
        if let Some(i) = t.find("package") {
            let rest = &t[i + "package".len()..];
            if let Some(name) = rest.split('"').nth(1)
                && name.starts_with("threadline-")
            {
                out.insert(name.to_owned());
            }
        }
    }
    out
}

/// Every workspace crate `package` reaches through its manifests'
/// dependency tables, by package name.
fn reaches(package: &str) -> BTreeSet<String> {
    let crates = repo_root().join("crates");
    let mut manifests: BTreeMap<String, String> = BTreeMap::new();
    for e in std::fs::read_dir(&crates).expect("crates/").flatten() {
        let Ok(text) = std::fs::read_to_string(e.path().join("Cargo.toml")) else {
            continue;
        };
        let name = text
            .lines()
            .find_map(|l| l.trim().strip_prefix("name = "))
            .map(|n| n.trim_matches('"').to_owned())
            .expect("a package name");
        manifests.insert(name, text);
    }
    let mut seen = BTreeSet::new();
    let mut todo = vec![package.to_owned()];
    while let Some(p) = todo.pop() {
        let text = manifests
            .get(&p)
            .unwrap_or_else(|| panic!("no crate named {p} under crates/"));
        for d in internal_dependencies(text) {
            if seen.insert(d.clone()) {
                todo.push(d);
            }
        }
    }
    seen
}

#[test]
fn runtime_depends_on_neither_store_nor_slack() {
    let reached = reaches("threadline-runtime");
    let forbidden: Vec<&String> = reached
        .iter()
        .filter(|d| ["threadline-store", "threadline-slack"].contains(&d.as_str()))
        .collect();
    assert!(
        forbidden.is_empty(),
        "threadline-runtime reaches {forbidden:?} (all it reaches: {reached:?}); \
         runtime is infrastructure only: tables and Slack belong to the crates above it"
    );
}

#[test]
fn the_dependency_check_reads_every_form_of_a_dependency() {
    let manifest = r#"
[package]
name = "threadline-runtime"

[dependencies]
threadline-domain.workspace = true
tokio.workspace = true
store = { package = "threadline-store", path = "../store" }

[dev-dependencies]
threadline-testkit = { workspace = true }

[target.'cfg(unix)'.dependencies]
"threadline-proto" = "1"

[dependencies.threadline-slack]
workspace = true

[features]
threadline-nothing = []
"#;
    let found: Vec<String> = internal_dependencies(manifest).into_iter().collect();
    assert_eq!(
        found,
        [
            "threadline-domain",
            "threadline-proto",
            "threadline-slack",
            "threadline-store",
            "threadline-testkit"
        ]
    );
}
