#!/usr/bin/env python3
"""Checks that the documentation and the code agree. Run by `make lint`:

    python3 scripts/check-docs.py [--root DIR] [--base COMMIT]
    python3 scripts/check-docs.py --self-test

Python 3.11, standard library only (plus deploy/check/rust_settings.py, the
extractor the deployment check already uses, also standard library only).
Every problem is listed with its file and line; the exit status is 1 if there
is any, 0 otherwise. Each check prints what it looked at when it passes.

a. Settings (docs/configuration.md against the code, both ways).
   "Product code" is crates/*/src/**/*.rs without crates/testkit, and in each
   file without everything from the first line matching `^#\\[cfg\\(test\\)\\]`
   to the end of the file: test modules are kept last by convention, and a
   top-level item after that line that is not `#[cfg(test)]` itself fails
   the check (so nothing read there can go unseen).
   crates/*/tests/ and tests/ are not product code.
   1. Every THREADLINE_* name in product code (code, strings and comments
      alike) appears, in backticks, in the first column of a table of
      docs/configuration.md (a table whose header's first cell is
      "setting"); every THREADLINE_* name in those first columns
      appears in product code. A name written as a pattern
      (`THREADLINE_MODEL_BACKUP_*`: it ends with `_`) must match a documented
      name. Names built at run time are listed in PREFIXES below: a file
      that builds names with `format!("{prefix}_SUFFIX")` must be listed
      there with the literal prefixes it is called with, and every
      prefix + SUFFIX found in that file counts as read (the prefix literal
      itself is no setting); `format!("THREADLINE_{x}")` is refused until
      its expansions are listed in EXPANSIONS.
   2. Per binary (gateway, context-builder, inference, publisher, the
      `threadline` CLI, slack-sim): what it reads, as
      deploy/check/rust_settings.py extracts it (reads through `src.…("KEY")`
      and clap `env = "KEY"`, following the runtime crate's
      `Type::from_source` entry points), plus the reads that extractor does
      not see (IMPLICIT below), equals what the page lists for it: the rows
      of the table under a heading that names the binary in backticks, and
      the rows of a table with a "read by" column that names its short name.
      Each setting is one row of the page.
   3. Defaults and ranges: a default given as a literal or a constant in
      `src.string/parse/bounded/millis/flag/url/socket_addr("KEY", DEFAULT…)`
      (also through a helper's parameters) or in a clap `env = "KEY"`
      argument's `default_value(_t)` appears in backticks in the row's
      "default" cell (empty defaults and texts longer than 80 characters are
      not compared); the range of `src.bounded/millis` appears there as
      `LOW–HIGH` (plain digits, an en dash).
b. Links. In README.md, CONTRIBUTING.md, docs/**/*.md, crates/*/README.md,
   proto/README.md, deploy/README.md and migrations/README.md, every relative link or image
   (inline or reference definition, outside code) resolves to a file or
   directory in the repository, and its `#anchor`, when it points into a
   Markdown file, matches a heading there by GitHub's rules (lowercased,
   punctuation other than `-` and `_` dropped, each space a `-`, `-1`, `-2`
   … for repeated headings) or an HTML id/name. http(s), mailto and other
   URLs with a scheme are skipped.
c. Invariants. A comment (`//`, `///`, `//!`; consecutive comment lines read
   as one text, so a citation may wrap) in crates/ or tests/ that cites an
   invariant by number ("invariant 4", "Invariant #4", "DESIGN invariant
   2", "invariants 3–5", "invariants 3, 4 and 5") cites one defined in
   docs/architecture.md: a line `N. ` inside the section whose heading
   contains "Invariants". "DESIGN §N" (and a bare §M after it in the same
   comment, with no "RFC" between) must be a heading `N. …` there.
d. Commit subjects. Every commit in BASE..HEAD (BASE: BASE_COMMIT, the
   last commit before the rule) has a subject (`git log`'s %s: the first
   paragraph of the message) of at most 72 characters. Merge commits, whose
   subjects git or the forge writes, are not checked. If BASE is not in the
   repository (a shallow clone) the check prints a notice and is skipped;
   outside a git work tree too.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unicodedata
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

SCRIPT_ROOT = Path(__file__).resolve().parent.parent
BASE_COMMIT = "3e645fe97fafe84d84855708fe31db36aaae04ca"
MAX_SUBJECT = 72
CONFIG_DOC = "docs/configuration.md"
ARCH_DOC = "docs/architecture.md"

# Files that build setting names as format!("{prefix}_SUFFIX"), and the
# literal prefixes passed to them. crates/inference/src/config.rs:
# `fn model(src, prefix)` reads `{prefix}_BASE_URL`, `{prefix}_NAME` and
# `{prefix}_API_KEY`, called as model(src, "THREADLINE_MODEL") and
# model(src, "THREADLINE_MODEL_BACKUP").
PREFIXES: dict[str, list[str]] = {
    "crates/inference/src/config.rs": ["THREADLINE_MODEL", "THREADLINE_MODEL_BACKUP"],
}
# Names built as format!("THREADLINE_{x}…") in a file: the names it can make.
# None today; such a format! in product code fails until it is listed here.
EXPANSIONS: dict[str, list[str]] = {}

# Reads rust_settings.py does not see, and how to tell a binary makes them:
# a regex searched in the non-test code of the binary's crate.
IMPLICIT: dict[str, str] = {
    # Source::from_env reads the environment over this file.
    "THREADLINE_CONFIG_FILE": r"\bSource::from_env\s*\(",
    # telemetry::init (services) and slack-sim's EnvFilter take the log level.
    "RUST_LOG": r"\btelemetry::init\s*\(|\bEnvFilter::(?:try_)?from_default_env\s*\(",
}
# Binaries the page documents: short name (the "read by" column) -> binary.
SERVICES: dict[str, str] = {
    "gateway": "threadline-gateway",
    "context-builder": "threadline-context-builder",
    "inference": "threadline-inference",
    "publisher": "threadline-publisher",
    "cli": "threadline",
    "slack-sim": "threadline-slack-sim",
}

LINKED_DOCS = ["README.md", "CONTRIBUTING.md", "docs/**/*.md", "crates/*/README.md",
               "proto/README.md", "deploy/README.md", "migrations/README.md"]

NAME_RE = re.compile(r"THREADLINE_[A-Z0-9_]*")
TEST_START = re.compile(r"^#\[cfg\(test\)\]")
ITEM_RE = re.compile(r"^(?:pub(?:\([\w:]+\))?\s+)?(?:async\s+|unsafe\s+|const\s+)*"
                     r"(?:fn|struct|enum|impl|mod|const|static|use|trait|type|macro_rules!)\b")


@dataclass
class Result:
    name: str
    problems: list[str] = field(default_factory=list)
    summary: str = ""
    notice: str = ""


# ---------------------------------------------------------------- helpers


def rel(root: Path, path: Path) -> str:
    return str(path.relative_to(root))


def product_files(root: Path) -> list[Path]:
    return sorted(p for p in root.glob("crates/*/src/**/*.rs")
                  if p.relative_to(root).parts[1] != "testkit")


def product_lines(path: Path) -> list[str]:
    """The file's lines up to (not including) the first `#[cfg(test)]` line."""
    out = []
    for line in path.read_text(encoding="utf-8").split("\n"):
        if TEST_START.match(line):
            break
        out.append(line)
    return out


def load_rust_settings():
    sys.dont_write_bytecode = True  # no __pycache__ in deploy/check
    sys.path.insert(0, str(SCRIPT_ROOT / "deploy" / "check"))
    try:
        import rust_settings  # noqa: PLC0415
    finally:
        sys.path.pop(0)
    return rust_settings


def split_row(line: str) -> list[str]:
    """A Markdown table row's cells (`|` inside a code span does not split)."""
    s = line.strip()
    if s.startswith("|"):
        s = s[1:]
    if s.endswith("|") and not s.endswith("\\|"):
        s = s[:-1]
    cells, cur, in_code = [], "", False
    i = 0
    while i < len(s):
        ch = s[i]
        if ch == "\\" and i + 1 < len(s) and s[i + 1] == "|":
            cur += "|"
            i += 2
            continue
        if ch == "`":
            in_code = not in_code
        if ch == "|" and not in_code:
            cells.append(cur.strip())
            cur = ""
        else:
            cur += ch
        i += 1
    cells.append(cur.strip())
    return cells


@dataclass
class Row:
    names: list[str]
    cells: dict[str, str]
    line: int
    heading: str
    read_by: list[str] | None  # from a "read by" column


def config_rows(doc: Path) -> tuple[list[Row], list[str]]:
    """Rows of every table in the page (header names lowercased)."""
    rows: list[Row] = []
    problems: list[str] = []
    lines = doc.read_text(encoding="utf-8").split("\n")
    heading = ""
    header: list[str] | None = None
    in_fence = False
    for n, line in enumerate(lines, 1):
        if re.match(r"^\s*(```|~~~)", line):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        m = re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if m:
            heading = m.group(2)
            header = None
            continue
        if not line.lstrip().startswith("|"):
            header = None
            continue
        cells = split_row(line)
        if header is None:
            header = [c.lower() for c in cells]
            continue
        if header[0] != "setting":
            continue  # not a settings table
        if all(re.fullmatch(r":?-{3,}:?", c) for c in cells):
            continue
        named = dict(zip(header, cells))
        first = cells[0]
        names = re.findall(r"`([A-Z][A-Z0-9_]*)`", first)
        read_by = None
        if "read by" in named:
            read_by = [s.strip() for s in re.split(r"[,;]", named["read by"].replace("`", "")) if s.strip()]
        if not names:
            problems.append(f"{CONFIG_DOC}:{n}: the first cell names no setting in backticks: {first!r}")
            continue
        rows.append(Row(names, named, n, heading, read_by))
    return rows, problems


# ---------------------------------------------------------------- check a


@dataclass
class CodeNames:
    names: dict[str, str] = field(default_factory=dict)  # name -> first file:line
    patterns: dict[str, str] = field(default_factory=dict)  # `PREFIX_` -> where


def code_after_tests(path: Path) -> list[int]:
    """Top-level items after the first `#[cfg(test)]` line that are not
    themselves `#[cfg(test)]`: code check a would not see."""
    lines = path.read_text(encoding="utf-8").split("\n")
    start = next((i for i, l in enumerate(lines) if TEST_START.match(l)), None)
    if start is None:
        return []
    out = []
    for i in range(start + 1, len(lines)):
        if not ITEM_RE.match(lines[i]):
            continue
        j = i - 1
        while j > start and (lines[j].startswith(("#[", "//")) and not TEST_START.match(lines[j])):
            j -= 1
        if not TEST_START.match(lines[j]):
            out.append(i + 1)
    return out


def code_names(root: Path, problems: list[str]) -> CodeNames:
    out = CodeNames()
    for path in product_files(root):
        r = rel(root, path)
        for n in code_after_tests(path):
            problems.append(f"{r}:{n}: an item after the file's first #[cfg(test)] line that is not "
                            f"#[cfg(test)] itself; check a reads nothing after that line, so keep test "
                            f"modules last")
        lines = product_lines(path)
        text = "\n".join(lines)
        prefixes = PREFIXES.get(r, [])
        suffixes = re.findall(r'format!\(\s*"\{\w+\}(_[A-Z0-9_]+)"', text)
        if suffixes and not prefixes:
            problems.append(
                f"{r}: builds setting names with format!(\"{{…}}{suffixes[0]}\"); list the literal "
                f"prefixes it is called with in PREFIXES in scripts/check-docs.py")
        for p in prefixes:
            if not suffixes or f'"{p}"' not in text:
                problems.append(f"{r}: PREFIXES in scripts/check-docs.py lists {p!r}, but the file no "
                                f"longer passes it to a format!(\"{{prefix}}_…\") (update PREFIXES)")
            for s in suffixes:
                out.names.setdefault(p + s, f"{r} (format! of {p!r})")
        for n, line in enumerate(lines, 1):
            for m in NAME_RE.finditer(line):
                name, after = m.group(0), line[m.end():m.end() + 1]
                where = f"{r}:{n}"
                if after == "{":
                    if name not in [e[:len(name)] for e in EXPANSIONS.get(r, [])]:
                        problems.append(f"{where}: a setting name built at run time "
                                        f"(format!(\"{name}{{…}}\")); list its expansions in "
                                        f"EXPANSIONS in scripts/check-docs.py")
                    continue
                if name in prefixes and line[m.start() - 1:m.start()] == '"' and after == '"':
                    continue  # the prefix literal handed to the format! above
                if name.endswith("_"):
                    out.patterns.setdefault(name, where)
                else:
                    out.names.setdefault(name, where)
        for e in EXPANSIONS.get(r, []):
            out.names.setdefault(e, f"{r} (EXPANSIONS)")
    return out


def param_args(rs, code: str, param: str) -> list[str]:
    """The arguments passed for parameter `param` of the functions of this
    file that have one (`fn days(.., key: &str, default: u64)` called as
    `days(.., "KEY", 30)`), one per call."""
    out: list[str] = []
    if not re.fullmatch(r"[a-z_]\w*", param):
        return out
    for m in re.finditer(r"\bfn (\w+)\s*(?:<[^>]*>)?\s*\(", code):
        names = [p.split(":")[0].strip() for p in rs.call_args(code, m.end() - 1)]
        if param not in names:
            continue
        index = names.index(param)
        for call in re.finditer(rf"(?<!fn )\b{m.group(1)}\s*\(", code):
            args = rs.call_args(code, call.end() - 1)
            if index < len(args):
                out.append(args[index])
    return out


def extract_defaults(root: Path, rs) -> tuple[dict[str, set[str]], dict[str, set[tuple[int, int]]]]:
    """Per key, the literal defaults and the ranges of its reads."""
    defaults: dict[str, set[str]] = {}
    ranges: dict[str, set[tuple[int, int]]] = {}
    consts = rs.all_consts(root)
    with_default = {"string", "parse", "bounded", "millis", "flag", "url", "socket_addr"}  # (KEY, DEFAULT, …)

    def value(arg: str) -> str | None:
        arg = arg.strip().lstrip("&")
        m = re.fullmatch(r'"((?:[^"\\]|\\.)*)"', arg)
        if m:
            return m.group(1)
        if arg in ("true", "false"):
            return arg
        if re.fullmatch(r"[\d_ ()<*+]+", arg) and re.search(r"\d", arg):
            return str(int(eval(arg.replace("_", ""), {"__builtins__": {}})))  # digits, <<, *, +
        ident = arg.rsplit("::", 1)[-1]
        return consts.get(ident)

    for path in product_files(root):
        code = rs.collapse(rs.non_test_code(path.read_text(encoding="utf-8")))
        for m in re.finditer(r"#\[arg\(", code):  # clap: env = "KEY", default_value(_t) = …
            attr = ", ".join(rs.call_args(code, m.end() - 1))
            env = re.search(r'\benv\s*=\s*"([A-Z][A-Z0-9_]*)"', attr)
            dflt = re.search(r'\bdefault_value(?:_t)?\s*=\s*("(?:[^"\\]|\\.)*"|[\w.:-]+)', attr)
            if env and dflt:
                v = dflt.group(1)
                defaults.setdefault(env.group(1), set()).add(v[1:-1] if v.startswith('"') else v)
        for m in re.finditer(r"\bsrc\s*\.\s*(\w+)\s*\(", code):
            method = m.group(1)
            if method not in with_default:
                continue
            args = rs.call_args(code, m.end() - 1)
            if len(args) < 2:
                continue
            key = value(args[0])
            pairs: list[tuple[str | None, str | None]]
            if key is not None and re.fullmatch(r"[A-Z][A-Z0-9_]*", key):
                pairs = [(key, value(args[1]))]
            else:
                # A key and a default handed through parameters of a helper
                # (`fn days(.., key: &str, default: u64)`): pair the calls' arguments.
                keys = param_args(rs, code, args[0].strip().lstrip("&"))
                dflts = param_args(rs, code, args[1].strip())
                if len(dflts) != len(keys):
                    dflts = [""] * len(keys)
                pairs = [(value(k), value(d) if d else None) for k, d in zip(keys, dflts)]
            for k, d in pairs:
                if k is None:
                    continue
                if d is not None:
                    defaults.setdefault(k, set()).add(d)
                if method in ("bounded", "millis") and len(args) >= 3:
                    rng = rs.range_bounds(args[2])
                    if rng is not None:
                        ranges.setdefault(k, set()).add(rng)
    return defaults, ranges


def check_settings(root: Path) -> Result:
    res = Result("a. settings")
    doc = root / CONFIG_DOC
    if not doc.exists():
        res.problems.append(f"{CONFIG_DOC} does not exist")
        return res
    rows, problems = config_rows(doc)
    res.problems += problems
    documented: dict[str, int] = {}
    for row in rows:
        for name in row.names:
            if name in documented:
                res.problems.append(f"{CONFIG_DOC}:{row.line}: `{name}` has a row already (line {documented[name]})")
            else:
                documented[name] = row.line

    # 1. THREADLINE_* names, both ways.
    code = code_names(root, res.problems)
    doc_tl = {n for n in documented if n.startswith("THREADLINE_")}
    for name, where in sorted(code.names.items()):
        if name not in documented:
            res.problems.append(f"{where}: {name} is in product code but not in a table of {CONFIG_DOC}")
    for pattern, where in sorted(code.patterns.items()):
        if not any(n.startswith(pattern) for n in documented):
            res.problems.append(f"{where}: {pattern}* matches no setting documented in {CONFIG_DOC}")
    for name in sorted(doc_tl - set(code.names)):
        res.problems.append(f"{CONFIG_DOC}:{documented[name]}: {name} is documented, but no product code "
                            f"(crates/*/src, test modules and crates/testkit excluded) reads or names it")

    # 2. Per binary.
    rs = load_rust_settings()
    try:
        bins = rs.binaries(root)
    except rs.ExtractError as e:
        res.problems.append(f"deploy/check/rust_settings.py cannot extract the settings: {e}")
        return res
    listed: dict[str, set[str]] = {b: set() for b in SERVICES.values()}
    for row in rows:
        targets: list[str] = []
        if row.read_by is not None:
            for short in row.read_by:
                if short not in SERVICES:
                    res.problems.append(f"{CONFIG_DOC}:{row.line}: \"read by\" names {short!r}; expected "
                                        f"comma-separated names among {', '.join(SERVICES)}")
                else:
                    targets.append(SERVICES[short])
        else:
            named = [b for b in SERVICES.values() if f"`{b}`" in row.heading]
            if len(named) != 1:
                res.problems.append(f"{CONFIG_DOC}:{row.line}: the table's heading ({row.heading!r}) names no "
                                    f"binary in backticks (e.g. `threadline-gateway`) and the table has "
                                    f"no \"read by\" column")
            targets = named[:1]
        for b in targets:
            listed[b].update(row.names)
    checked_bins = 0
    for short, b in SERVICES.items():
        if b not in bins:
            if listed[b]:
                res.problems.append(f"{CONFIG_DOC}: settings are listed for {b}, but no crate builds it")
            continue
        checked_bins += 1
        reads = set(bins[b].reads.keys)
        crate_code = "".join(rs.non_test_code(p.read_text(encoding="utf-8"))
                             for p in sorted((root / "crates" / bins[b].crate / "src").rglob("*.rs")))
        for name, pattern in IMPLICIT.items():
            if re.search(pattern, crate_code):
                reads.add(name)
        reads |= set(re.findall(r'\benv::var(?:_os)?\(\s*"([A-Z][A-Z0-9_]*)"', crate_code))
        for name in sorted(reads - listed[b]):
            where = bins[b].reads.where.get(name, f"crates/{bins[b].crate}")
            res.problems.append(f"{where}: {b} reads {name}, but {CONFIG_DOC} does not list it for "
                                f"{short} (its table, or \"{short}\" in the shared table's \"read by\")")
        for name in sorted(listed[b] - reads):
            res.problems.append(f"{CONFIG_DOC}:{documented.get(name, 0)}: {name} is listed for {short}, "
                                f"but {b} does not read it")

    # 3. Defaults and ranges.
    defaults, ranges = extract_defaults(root, rs)
    by_name = {n: row for row in rows for n in row.names}
    compared = 0
    for name, values in sorted(defaults.items()):
        row = by_name.get(name)
        if row is None:
            continue
        cell = row.cells.get("default", "")
        shown = {t.replace("_", "") if re.fullmatch(r"[\d_]+", t) else t
                 for t in re.findall(r"`([^`]*)`", cell)}
        for v in sorted(values):
            if v == "" or len(v) > 80:
                continue
            compared += 1
            if v not in shown:
                res.problems.append(f"{CONFIG_DOC}:{row.line}: the default of {name} in the code is "
                                    f"`{v}`; the \"default\" cell says {cell!r}")
    for name, rngs in sorted(ranges.items()):
        row = by_name.get(name)
        if row is None:
            continue
        cell = row.cells.get("default", "")
        for lo, hi in sorted(rngs):
            compared += 1
            if not re.search(rf"(?<![\d]){lo}–{hi}(?![\d])", cell):
                res.problems.append(f"{CONFIG_DOC}:{row.line}: {name} accepts {lo}–{hi} in the code; the "
                                    f"\"default\" cell should say so as `{lo}–{hi}` (it says {cell!r})")
    res.summary = (f"{len(code.names)} THREADLINE_* names in product code and {len(doc_tl)} documented agree; "
                   f"{checked_bins} binaries' reads match their tables ({len(documented)} rows); "
                   f"{compared} defaults and ranges match")
    return res


# ---------------------------------------------------------------- check b


def slug(text: str) -> str:
    """GitHub's heading anchor (without the -N suffix of repeats)."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # links and images: their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    parts = re.split(r"(`+[^`]*`+)", text)
    plain = []
    for i, part in enumerate(parts):
        if i % 2:
            plain.append(part.strip("`"))
        else:
            part = part.replace("*", "")
            part = re.sub(r"(?<![\w])_+|_+(?![\w])", "", part)  # _emphasis_, not snake_case
            plain.append(part)
    text = "".join(plain).strip().lower()
    out = []
    for ch in text:
        if ch in "-_ " or ch.isalnum() or unicodedata.category(ch).startswith("M"):
            out.append("-" if ch == " " else ch)
    return "".join(out)


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    lines = path.read_text(encoding="utf-8").split("\n")
    in_fence = False
    prev = ""
    for line in lines:
        if re.match(r"^\s*(```|~~~)", line):
            in_fence = not in_fence
            prev = ""
            continue
        if in_fence:
            continue
        text = None
        m = re.match(r"^ {0,3}(#{1,6})\s+(.*?)(?:\s+#+)?\s*$", line)
        if m:
            text = m.group(2)
        elif prev.strip() and not prev.lstrip().startswith(("|", "-", "*", ">")) and \
                re.fullmatch(r" {0,3}(=+|-+)\s*", line):
            text = prev.strip()
        if text is not None:
            base = slug(text)
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
        for a in re.findall(r"""<a\s[^>]*(?:name|id)\s*=\s*["']([^"']+)["']""", line):
            found.add(a)
        prev = line
    return found


def strip_code(lines: list[str]) -> list[str]:
    """Lines with fenced blocks blanked and inline code spans removed."""
    out, in_fence = [], False
    for line in lines:
        if re.match(r"^\s*(```|~~~)", line):
            in_fence = not in_fence
            out.append("")
            continue
        out.append("" if in_fence else re.sub(r"(`+)(?:(?!\1).)+?\1", "", line))
    return out


LINK_RE = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*(<[^>]*>|[^\s)]+)(?:\s+(?:\"[^\"]*\"|'[^']*'|\([^)]*\)))?\s*\)")
REF_RE = re.compile(r"^ {0,3}\[(?!\^)[^\]]+\]:\s*(<[^>]*>|\S+)")


def doc_files(root: Path) -> list[Path]:
    out: set[Path] = set()
    for pattern in LINKED_DOCS:
        out.update(p for p in root.glob(pattern) if p.is_file())
    return sorted(out)


def check_links(root: Path) -> Result:
    res = Result("b. links")
    files = doc_files(root)
    cache: dict[Path, set[str]] = {}
    count = anchored = 0
    for path in files:
        lines = strip_code(path.read_text(encoding="utf-8").split("\n"))
        for n, line in enumerate(lines, 1):
            targets = [m.group(1) for m in LINK_RE.finditer(line)]
            m = REF_RE.match(line)
            if m:
                targets.append(m.group(1))
            for target in targets:
                target = target.strip("<>")
                if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("//"):
                    continue  # http(s), mailto, …
                count += 1
                where = f"{rel(root, path)}:{n}"
                part, _, anchor = target.partition("#")
                part = urllib.parse.unquote(part)
                if not part:
                    dest = path
                elif part.startswith("/"):
                    dest = root / part.lstrip("/")
                else:
                    dest = path.parent / part
                dest = Path(os.path.normpath(dest))
                if not dest.is_relative_to(root):
                    res.problems.append(f"{where}: link {target!r} leaves the repository")
                    continue
                if not dest.exists():
                    res.problems.append(f"{where}: link {target!r}: {rel(root, dest)} does not exist")
                    continue
                if anchor and dest.is_file() and dest.suffix.lower() in (".md", ".markdown"):
                    anchored += 1
                    if dest not in cache:
                        cache[dest] = anchors(dest)
                    want = urllib.parse.unquote(anchor).lower()
                    if want not in {a.lower() for a in cache[dest]}:
                        res.problems.append(f"{where}: link {target!r}: no heading in {rel(root, dest)} "
                                            f"has the anchor #{want}")
    res.summary = (f"{count} relative links in {len(files)} Markdown files resolve "
                   f"({anchored} of them to a heading)")
    return res


# ---------------------------------------------------------------- check c


def comment_blocks(path: Path) -> list[tuple[str, list[int]]]:
    """Runs of consecutive comment lines, as one text each, with the line
    number of every character of it. A comment after code stands alone."""
    blocks: list[tuple[str, list[int]]] = []
    text, where = "", []
    for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").split("\n"), 1):
        # The first `//` outside a string literal (an even number of quotes before it).
        pos = next((p.start() for p in re.finditer("//", line)
                    if line[:p.start()].replace('\\"', "").replace("'\"'", "").count('"') % 2 == 0), None)
        trailing = pos is not None and bool(line[:pos].strip())
        if text and (pos is None or trailing):
            blocks.append((text, where))
            text, where = "", []
        if pos is None:
            continue
        piece = re.sub(r"^//[/!]?", "", line[pos:]).strip() + " "
        if trailing:
            blocks.append((piece, [n] * len(piece)))
        else:
            text += piece
            where += [n] * len(piece)
    if text:
        blocks.append((text, where))
    return blocks


CITE_RE = re.compile(
    r"(?i)\binvariants?\s*(?:#|no\.?\s*)?(\d+)((?:\s*(?:[-–—]|,|\band\b|\bor\b|&|\bto\b)\s*#?\d+)*)")
SECTION_RE = re.compile(r"§\s*(\d+)")


def cited_numbers(m: re.Match) -> list[int]:
    first = int(m.group(1))
    nums = [first]
    rest = m.group(2) or ""
    prev = first
    for sep, num in re.findall(r"\s*([-–—]|,|and|or|&|to)\s*#?(\d+)", rest, re.I):
        num = int(num)
        if sep in "-–—" or sep.lower() == "to":
            nums += list(range(prev + 1, num + 1))
        else:
            nums.append(num)
        prev = num
    return nums


def architecture(root: Path) -> tuple[set[int], set[int], list[str]]:
    doc = root / ARCH_DOC
    if not doc.exists():
        return set(), set(), [f"{ARCH_DOC} does not exist"]
    invariants, sections = set(), set()
    level = None
    in_fence = False
    found = False
    for line in doc.read_text(encoding="utf-8").split("\n"):
        if re.match(r"^\s*(```|~~~)", line):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        m = re.match(r"^(#{1,6})\s+(.*)$", line)
        if m:
            num = re.match(r"(\d+)\.", m.group(2).strip())
            if num:
                sections.add(int(num.group(1)))
            if level is not None and len(m.group(1)) <= level:
                level = None
            if "invariants" in m.group(2).lower():
                level, found = len(m.group(1)), True
            continue
        if level is not None:
            d = re.match(r"^(\d+)\.\s", line)
            if d:
                invariants.add(int(d.group(1)))
    problems = [] if found else [f"{ARCH_DOC}: no heading contains \"Invariants\""]
    return invariants, sections, problems


def check_invariants(root: Path) -> Result:
    res = Result("c. invariants")
    invariants, sections, problems = architecture(root)
    files = sorted(p for d in ("crates", "tests") for p in (root / d).rglob("*.rs"))
    cites = section_cites = 0
    for path in files:
        for text, where in comment_blocks(path):
            for m in CITE_RE.finditer(text):
                for num in cited_numbers(m):
                    cites += 1
                    if num not in invariants:
                        res.problems.append(
                            f"{rel(root, path)}:{where[m.start()]}: cites invariant {num} "
                            f"({m.group(0).strip()!r}); {ARCH_DOC}'s invariants are "
                            f"{', '.join(map(str, sorted(invariants))) or 'none'}")
            design = False
            last = 0
            for m in SECTION_RE.finditer(text):
                between = text[last:m.start()]
                if re.search(r"DESIGN\s*$", between):
                    design = True
                elif "RFC" in between:
                    design = False
                last = m.end()
                if not design:
                    continue
                section_cites += 1
                if int(m.group(1)) not in sections:
                    res.problems.append(f"{rel(root, path)}:{where[m.start()]}: cites DESIGN §{m.group(1)}; "
                                        f"{ARCH_DOC} has no heading \"{m.group(1)}. …\"")
    if (cites or section_cites) and problems:
        res.problems = problems + res.problems
    res.summary = (f"{cites} invariant citations and {section_cites} DESIGN § citations in "
                   f"{len(files)} files match {len(invariants)} invariants and {len(sections)} sections "
                   f"of {ARCH_DOC}")
    return res


# ---------------------------------------------------------------- check d


def check_subjects(root: Path, base: str) -> Result:
    res = Result("d. commit subjects")

    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)

    if git("rev-parse", "--is-inside-work-tree").returncode != 0:
        res.notice = "not a git work tree: commit subjects not checked"
        return res
    if git("cat-file", "-e", f"{base}^{{commit}}").returncode != 0:
        res.notice = (f"the base commit {base[:12]} is not in this clone (shallow?): commit subjects not "
                      f"checked (git fetch --unshallow to check them)")
        return res
    log = git("log", "--no-merges", "--format=%h%x00%s%x00", f"{base}..HEAD")
    if log.returncode != 0:
        res.problems.append(f"git log {base[:12]}..HEAD failed: {log.stderr.strip()}")
        return res
    fields = log.stdout.split("\0")
    count = 0
    for h, s in zip(fields[0::2], fields[1::2]):
        h = h.strip()
        if not h:
            continue
        count += 1
        if len(s) > MAX_SUBJECT:
            res.problems.append(f"commit {h}: subject is {len(s)} characters (at most {MAX_SUBJECT}; "
                                f"`area: what changed`, the why in the body): {s[:MAX_SUBJECT]}…")
    res.summary = f"{count} commit subjects since {base[:12]} are at most {MAX_SUBJECT} characters"
    return res


# ---------------------------------------------------------------- main


def run_checks(root: Path, base: str) -> list[Result]:
    return [check_settings(root), check_links(root), check_invariants(root), check_subjects(root, base)]


def report(results: list[Result], out=sys.stdout) -> bool:
    ok = True
    for r in results:
        if r.problems:
            ok = False
            print(f"check-docs: FAIL {r.name}: {len(r.problems)} problem(s)", file=out)
            for p in r.problems:
                print(f"  {p}", file=out)
        elif r.notice:
            print(f"check-docs: skip {r.name}: {r.notice}", file=out)
        else:
            print(f"check-docs: ok   {r.name}: {r.summary}", file=out)
    return ok


# ---------------------------------------------------------------- self-test


FIXTURE = {
    "crates/runtime/Cargo.toml": '[package]\nname = "threadline-runtime"\n',
    "crates/runtime/src/config.rs": """\
        //! Shared settings (DESIGN §2).
        pub struct Source;
        impl Source {
            /// The environment over the file THREADLINE_CONFIG_FILE names.
            pub fn from_env() -> Self { Source }
        }
        pub struct CommonConfig;
        impl CommonConfig {
            pub fn from_source(src: &Source) -> Result<Self, ()> {
                let _ = src.string("THREADLINE_BUS_PREFIX", "tl");
                let _ = src.bounded("THREADLINE_DB_MAX_CONNECTIONS", 16, 1..=1000);
                let _ = src.url("DATABASE_URL", "postgres://db/x", &["postgres"]);
                Ok(CommonConfig)
            }
        }

        #[cfg(test)]
        mod tests {
            // Only a test reads this one: it needs no documentation.
            const X: &str = "THREADLINE_ONLY_IN_TESTS";
        }
        """,
    "crates/gateway/Cargo.toml": '[package]\nname = "threadline-gateway"\n\n[[bin]]\nname = "threadline-gateway"\n',
    "crates/gateway/src/main.rs": """\
        // A 2xx follows the commit (invariant
        // 1); invariants 2 and 3 hold too.
        fn main() {
            let src = Source::from_env();
            let _ = CommonConfig::from_source(&src);
            let _ = src.millis("THREADLINE_GATEWAY_BODY_TIMEOUT_MS", 5_000, 100..=9_000);
            let _ = src.flag("THREADLINE_STREAMING", true);
            let _ = telemetry::init("threadline-gateway");
        }
        """,
    "crates/inference/Cargo.toml": '[package]\nname = "threadline-inference"\n\n[[bin]]\nname = "threadline-inference"\n',
    "crates/inference/src/main.rs": """\
        fn main() {
            let src = Source::from_env();
            let _ = CommonConfig::from_source(&src);
            let _ = src.flag("THREADLINE_STREAMING", false);
        }
        """,
    "crates/inference/src/config.rs": """\
        //! Checks of DESIGN §3 and the claim of §2; not RFC 6749 §9.
        fn model(src: &Source, prefix: &str) -> Result<(), ()> {
            let base = format!("{prefix}_BASE_URL");
            let _ = src.url(&base, "", &["http"]);
            let _ = src.required(&format!("{prefix}_NAME"));
            Ok(())
        }
        fn read(src: &Source) {
            let _ = model(src, "THREADLINE_MODEL");
            let _ = model(src, "THREADLINE_MODEL_BACKUP");
            // THREADLINE_MODEL_BACKUP_* is a pattern.
        }
        """,
    "crates/testkit/src/lib.rs": 'const T: &str = "THREADLINE_TEST_ONLY";\n',
    "tests/tests/a.rs": "// Invariant #3 from the outside.\n",
    "README.md": """\
        # Fixture

        See [configuration](docs/configuration.md#shared-settings) and
        [the gateway](docs/configuration.md#gateway-threadline-gateway), [a dir](crates/),
        [below](#notes--caveats--snake_case) and [out](https://example.com/x#y).
        `[not a link](nowhere.md)`

        ## Notes — caveats & `snake_case`
        """,
    "docs/architecture.md": """\
        # Architecture

        ## 1. Flow

        ## 2. Invariants

        1. One.
        2. Two.
        3. Three.

        ## 3. Staleness
        """,
    "docs/configuration.md": """\
        # Configuration

        ## Shared settings

        | setting | read by | default | meaning |
        |---|---|---|---|
        | `THREADLINE_CONFIG_FILE` | gateway, inference | unset | a file |
        | `DATABASE_URL` | gateway, inference | `postgres://db/x` | Postgres |
        | `THREADLINE_BUS_PREFIX` | gateway, inference | `tl` | prefix |
        | `THREADLINE_DB_MAX_CONNECTIONS` | gateway, inference | `16` (1–1000) | pool |
        | `THREADLINE_STREAMING` | gateway, inference | gateway `true`, inference `false` | stream |

        ## Gateway (`threadline-gateway`)

        | setting | default | meaning |
        |---|---|---|
        | `THREADLINE_GATEWAY_BODY_TIMEOUT_MS` | `5000` (100–9000) | body \\| time |
        | `RUST_LOG` | `info` | log filter |

        ## Inference (`threadline-inference`)

        | setting | default | meaning |
        |---|---|---|
        | `THREADLINE_MODEL_BASE_URL` | unset | model |
        | `THREADLINE_MODEL_NAME` | unset | model |
        | `THREADLINE_MODEL_BACKUP_BASE_URL` | unset | backup |
        | `THREADLINE_MODEL_BACKUP_NAME` | unset | backup |
        """,
}


def write_fixture(root: Path) -> None:
    for name, text in FIXTURE.items():
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text), encoding="utf-8")


def edit(root: Path, name: str, old: str, new: str) -> None:
    p = root / name
    text = p.read_text(encoding="utf-8")
    assert old in text, f"self-test fixture: {old!r} not in {name}"
    p.write_text(text.replace(old, new, 1), encoding="utf-8")


def git_fixture(root: Path) -> str:
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@example.com",
               GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@example.com")

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(root), "-c", "commit.gpgsign=false", *args], env=env,
                              check=True, capture_output=True, text=True).stdout.strip()

    git("init", "-q")
    git("add", "-A")
    git("commit", "-q", "-m", "base: a subject before the rule that is far longer than seventy-two characters")
    base = git("rev-parse", "HEAD")
    (root / "x.txt").write_text("x\n")
    git("add", "x.txt")
    git("commit", "-q", "-m", "docs: a short subject", "-m", "The why.")
    return base


def self_test() -> bool:
    # (name, check, breakage, text expected in one of its problems)
    cases = [
        ("a: an undocumented setting", "a",
         lambda r: edit(r, "crates/gateway/src/main.rs", "fn main() {",
                        'fn main() {\n    let _ = src.flag("THREADLINE_NEW_THING", false);'),
         "THREADLINE_NEW_THING is in product code but not in a table"),
        ("a: a documented setting nothing reads", "a",
         lambda r: edit(r, "docs/configuration.md", "| `RUST_LOG` |",
                        "| `THREADLINE_GONE` | `1` | gone |\n| `RUST_LOG` |"),
         "THREADLINE_GONE is documented, but no product code"),
        ("a: product code after the test module", "a",
         lambda r: (r / "crates/runtime/src/config.rs").open("a").write(
             'pub fn later(src: &Source) { let _ = src.flag("THREADLINE_LATE", false); }\n'),
         "an item after the file's first #[cfg(test)] line"),
        ("a: one format!-built name undocumented", "a",
         lambda r: edit(r, "docs/configuration.md", "| `THREADLINE_MODEL_BACKUP_NAME` | unset | backup |\n", ""),
         "THREADLINE_MODEL_BACKUP_NAME is in product code"),
        ("a: a format! whose prefixes are not listed", "a",
         lambda r: edit(r, "crates/gateway/src/main.rs", "fn main() {",
                        'fn f(p: &str) -> String { format!("{p}_SUFFIX") }\nfn main() {'),
         "list the literal prefixes"),
        ("a: a name built at run time", "a",
         lambda r: edit(r, "crates/gateway/src/main.rs", "fn main() {",
                        'fn f(x: &str) -> String { format!("THREADLINE_{x}") }\nfn main() {'),
         "built at run time"),
        ("a: a pattern that matches nothing", "a",
         lambda r: edit(r, "crates/inference/src/config.rs", "THREADLINE_MODEL_BACKUP_* is",
                        "THREADLINE_NOTHING_* is"),
         "THREADLINE_NOTHING_* matches no setting"),
        ("a: a shared setting listed for one binary", "a",
         lambda r: edit(r, "docs/configuration.md", "| `THREADLINE_BUS_PREFIX` | gateway, inference |",
                        "| `THREADLINE_BUS_PREFIX` | gateway |"),
         "threadline-inference reads THREADLINE_BUS_PREFIX"),
        ("a: listed for a binary that does not read it", "a",
         lambda r: (edit(r, "docs/configuration.md", "| `RUST_LOG` | `info` | log filter |\n", ""),
                    edit(r, "docs/configuration.md", "| `THREADLINE_BUS_PREFIX` |",
                         "| `RUST_LOG` | gateway, inference | `info` | log filter |\n| `THREADLINE_BUS_PREFIX` |")),
         "RUST_LOG is listed for inference, but threadline-inference does not read it"),
        ("a: listed for a binary no crate builds", "a",
         lambda r: edit(r, "docs/configuration.md", "| `THREADLINE_CONFIG_FILE` | gateway, inference |",
                        "| `THREADLINE_CONFIG_FILE` | gateway, inference, publisher |"),
         "no crate builds it"),
        ("a: a wrong default", "a",
         lambda r: edit(r, "docs/configuration.md", "| `5000` (100–9000) |", "| `3000` (100–9000) |"),
         "the default of THREADLINE_GATEWAY_BODY_TIMEOUT_MS in the code is `5000`"),
        ("a: one of two defaults missing", "a",
         lambda r: edit(r, "docs/configuration.md", "gateway `true`, inference `false`", "`false`"),
         "the default of THREADLINE_STREAMING in the code is `true`"),
        ("a: a wrong range", "a",
         lambda r: edit(r, "docs/configuration.md", "`16` (1–1000)", "`16` (1–100)"),
         "THREADLINE_DB_MAX_CONNECTIONS accepts 1–1000"),
        ("b: a link to a missing file", "b",
         lambda r: edit(r, "README.md", "[a dir](crates/)", "[a dir](crates/nope.md)"),
         "crates/nope.md does not exist"),
        ("b: a link to a missing anchor", "b",
         lambda r: edit(r, "README.md", "#shared-settings", "#shared-setting"),
         "has the anchor #shared-setting"),
        ("b: a link to a missing anchor in the same file", "b",
         lambda r: edit(r, "README.md", "(#notes--caveats--snake_case)", "(#notes-caveats-snake_case)"),
         "has the anchor #notes-caveats-snake_case"),
        ("b: a reference definition to a missing file", "b",
         lambda r: edit(r, "README.md", "## Notes", "[ref]: docs/nope.md\n\n## Notes"),
         "docs/nope.md does not exist"),
        ("b: a broken link in a docs page", "b",
         lambda r: edit(r, "docs/architecture.md", "## 1. Flow", "## 1. Flow\n\n[x](../missing/)"),
         "missing does not exist"),
        ("c: an invariant the architecture lacks", "c",
         lambda r: edit(r, "crates/gateway/src/main.rs", "fn main() {", "// DESIGN invariant 9.\nfn main() {"),
         "cites invariant 9"),
        ("c: a citation wrapped over two comment lines", "c",
         lambda r: edit(r, "crates/gateway/src/main.rs", "// 1);", "// 7);"),
         "cites invariant 7"),
        ("c: a range of invariants running past the list", "c",
         lambda r: edit(r, "tests/tests/a.rs", "Invariant #3", "invariants 2–4"),
         "cites invariant 4"),
        ("c: a DESIGN section the architecture lacks", "c",
         lambda r: edit(r, "crates/inference/src/config.rs", "the claim of §2", "the claim of §7"),
         "cites DESIGN §7"),
        ("c: no invariants section", "c",
         lambda r: edit(r, "docs/architecture.md", "## 2. Invariants", "## 2. Promises"),
         "no heading contains \"Invariants\""),
        ("d: a long subject after the base", "d",
         lambda r: subprocess.run(["git", "-C", str(r), "-c", "commit.gpgsign=false", "-c", "user.name=t",
                                   "-c", "user.email=t@example.com", "commit", "-q", "--allow-empty", "-m",
                                   "docs: " + "x" * 70], check=True),
         "subject is 76 characters"),
    ]
    ok = True
    with tempfile.TemporaryDirectory(prefix="check-docs-") as tmp:
        clean = Path(tmp) / "clean"
        clean.mkdir()
        write_fixture(clean)
        base = git_fixture(clean)
        results = run_checks(clean, base)
        if any(r.problems or r.notice for r in results):
            print("self-test: FAIL: the unbroken fixture does not pass:")
            report(results)
            return False
        print("self-test: ok   the unbroken fixture passes every check (names only tests read, a pattern, "
              "format!-built names, a wrapped citation, an RFC §, anchors with punctuation)")
        for label, check, breakage, expected in cases:
            root = Path(tmp) / "case"
            shutil.rmtree(root, ignore_errors=True)
            shutil.copytree(clean, root)
            breakage(root)
            results = {r.name[0]: r for r in run_checks(root, base)}
            hit = [p for p in results[check].problems if expected in p]
            others = [r.name for k, r in results.items() if k != check and r.problems]
            if hit and not others:
                print(f"self-test: ok   {label}: caught ({hit[0]})")
            else:
                ok = False
                print(f"self-test: FAIL {label}: expected check {check} to report {expected!r}"
                      + (f"; other checks failed too: {others}" if others else ""))
                report(list(results.values()))
        # A clone without the base commit: a notice, no failure.
        results = {r.name[0]: r for r in run_checks(clean, "0" * 40)}
        if results["d"].notice and not results["d"].problems:
            print(f"self-test: ok   d: a missing base commit is skipped ({results['d'].notice})")
        else:
            ok = False
            print("self-test: FAIL d: a missing base commit should be a notice, not a failure")
    print("self-test: " + ("all breakages caught" if ok else "FAILED"))
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", type=Path, default=SCRIPT_ROOT, help="repository root (default: this checkout)")
    ap.add_argument("--base", default=BASE_COMMIT, help="commit subjects are checked after this commit")
    ap.add_argument("--self-test", action="store_true",
                    help="break a small fixture once per check and require each breakage to be caught")
    args = ap.parse_args()
    if args.self_test:
        return 0 if self_test() else 1
    ok = report(run_checks(args.root.resolve(), args.base))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
