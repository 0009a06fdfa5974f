"""What the threadline binaries read, taken from the Rust sources.

Settings are read through `threadline_runtime::config::Source` values named
`src` (`src.string("KEY", ..)`, `src.required("KEY")`, `src.bounded(..)`,
`src.millis(..)`, `src.flag(..)`, `src.url(..)`, `src.socket_addr(..)`,
`src.secret(..)`, `src.get(..)`, `src.parse(..)`), and by clap arguments with
`env = "KEY"`. A name that is not a literal must be a `const`, a `for` loop
over literals, or a `format!("{prefix}_SUFFIX")` whose prefix is passed as a
literal in the same file (`model(src, "THREADLINE_MODEL")`); anything else
stops the check, so the extraction never silently misses a setting.

Required settings: `src.required(..)`, `ConfigError::Missing { key: "KEY" }`,
and `src.url(KEY, "", ..)` (empty default) unless the same file guards it with
`src.get(KEY)`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

METHODS = "get|string|required|secret|parse|bounded|millis|flag|url|socket_addr"
KEY_RE = re.compile(r"^[A-Z][A-Z0-9_]*$")


class ExtractError(Exception):
    pass


@dataclass
class Reads:
    keys: set[str] = field(default_factory=set)
    required: set[str] = field(default_factory=set)
    where: dict[str, str] = field(default_factory=dict)  # key -> first file that reads it
    bounds: dict[str, tuple[int, int]] = field(default_factory=dict)  # src.bounded/millis ranges

    def add(self, key: str, path: str, required: bool = False) -> None:
        if not KEY_RE.match(key):
            raise ExtractError(f"{path}: {key!r} does not look like a setting name")
        self.keys.add(key)
        self.where.setdefault(key, path)
        if required:
            self.required.add(key)

    def merge(self, other: "Reads") -> None:
        self.keys |= other.keys
        self.required |= other.required
        self.bounds.update(other.bounds)
        for k, v in other.where.items():
            self.where.setdefault(k, v)


def non_test_code(text: str) -> str:
    """The file without its `#[cfg(test)]` module (kept at the end by
    convention) and without comments."""
    text = text.split("#[cfg(test)]", 1)[0]
    text = re.sub(r"(?m)^\s*//.*$", "", text)
    text = re.sub(r"(?m)\s//\s.*$", "", text)
    return text


def collapse(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def file_reads(path: Path, root: Path, global_consts: dict[str, str] | None = None) -> Reads:
    rel = str(path.relative_to(root))
    code = collapse(non_test_code(path.read_text()))
    reads = Reads()

    for name in re.findall(r"\b(\w+)\s*:\s*&(?:[\w:]*::)?Source\b", code):
        if name != "src":
            raise ExtractError(
                f"{rel}: a Source named `{name}`; the check only sees reads through `src`"
            )

    consts = dict(global_consts or {})
    consts.update(re.findall(r'const (\w+): &str = "([^"]*)";', code))
    loops = {
        var: re.findall(r'"([^"]+)"', items)
        for var, items in re.findall(r"for (\w+) in \[([^\]]*)\]", code)
    }
    prefixes = re.findall(r'\b\w+\(\s*src\s*,\s*"([A-Z][A-Z0-9_]*)"\s*\)', code)
    format_lets = dict(re.findall(r'let (\w+) = format!\("\{\w+\}(_[A-Z0-9_]+)"\)', code))

    def names(arg: str) -> list[str]:
        m = re.fullmatch(r'"([^"]*)"', arg)
        if m:
            return [m.group(1)]
        m = re.fullmatch(r'&?format!\("\{\w+\}(_[A-Z0-9_]+)"\)', arg)
        suffix = m.group(1) if m else format_lets.get(arg.lstrip("&"))
        if suffix:
            if not prefixes:
                raise ExtractError(f"{rel}: format!(..{suffix}) with no literal prefix in the file")
            return [p + suffix for p in prefixes]
        ident = arg.lstrip("&").rsplit("::", 1)[-1]  # crate::secrets::TOKEN_KEYS_SETTING
        if ident in consts:
            return [consts[ident]]
        if ident in loops:
            return loops[ident]
        passed = param_literals(code, ident)
        if passed:
            resolved = []
            for v in passed:  # a non-literal argument: a constant, or unresolvable
                if v.startswith("?"):
                    c = v[1:].lstrip("&").rsplit("::", 1)[-1]
                    if c not in consts:
                        raise ExtractError(f"{rel}: cannot resolve the setting name {v[1:]} passed as `{ident}`")
                    v = consts[c]
                resolved.append(v)
            return resolved
        raise ExtractError(f"{rel}: cannot resolve the setting name in src.…({arg})")

    arg_re = r'(&?format!\("[^"]*"\)|"[^"]*"|&?[\w:]+)'
    call_re = re.compile(rf"\bsrc\s*\.\s*({METHODS})\s*\(\s*{arg_re}\s*(,\s*\"([^\"]*)\")?")
    guarded = set()
    for method, arg, _, _ in call_re.findall(code):
        if method == "get":
            guarded.update(names(arg))
    for method, arg, default_part, default in call_re.findall(code):
        for key in names(arg):
            required = method == "required" or (
                method == "url" and default_part and default == "" and key not in guarded
            )
            reads.add(key, rel, required)
    for m in re.finditer(r"\bsrc\s*\.\s*(?:bounded|millis)\s*\(", code):
        args = call_args(code, m.end() - 1)
        rng = range_bounds(args[2]) if len(args) == 3 else None
        if rng is None:
            raise ExtractError(f"{rel}: cannot read the range of src.…({', '.join(args)})")
        for key in names(args[0]):
            reads.bounds[key] = rng
    for key in re.findall(r'Missing\s*\{\s*key:\s*"([^"]+)"', code):
        reads.add(key, rel, required=True)
    for key in re.findall(r'\benv\s*=\s*"([^"]+)"', code):
        reads.add(key, rel)
    return reads


def range_bounds(expr: str) -> tuple[int, int] | None:
    """`1..=1000`, `1_000..=(1 << 20)` -> (lo, hi); None if not literal."""
    lo, sep, hi = expr.partition("..=")
    if not sep:
        return None
    out = []
    for part in (lo, hi):
        if not re.fullmatch(r"[\d_ ()<*+]+", part.strip()):
            return None
        out.append(int(eval(part.strip(), {"__builtins__": {}})))  # digits and << only
    return out[0], out[1]


def call_args(code: str, start: int) -> list[str]:
    """The top-level, comma-separated arguments of the call whose `(` is at `start`."""
    args, depth, cur, i, in_str = [], 0, "", start + 1, False
    while i < len(code):
        ch = code[i]
        if in_str:
            cur += ch
            if ch == "\\":
                cur += code[i + 1]
                i += 1
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str, cur = True, cur + ch
        elif ch in "([{":
            depth, cur = depth + 1, cur + ch
        elif ch in ")]}" and depth > 0:
            depth, cur = depth - 1, cur + ch
        elif ch == ")":
            args.append(cur.strip())
            return [a for a in args if a]
        elif ch == "," and depth == 0:
            args.append(cur.strip())
            cur = ""
        else:
            cur += ch
        i += 1
    return args


def param_literals(code: str, param: str) -> list[str]:
    """Literal values passed for a `param: &str` of a function of this file
    (`fn days(.., key: &str, ..)` called as `days(.., "KEY", ..)`)."""
    out: list[str] = []
    for m in re.finditer(r"\bfn (\w+)\s*(?:<[^>]*>)?\s*\(", code):
        params = call_args(code, m.end() - 1)
        names = [p.split(":")[0].strip() for p in params]
        if param not in names or not re.search(rf"\b{param}\s*:\s*&(?:'\w+ )?str\b", ", ".join(params)):
            continue
        index = names.index(param)
        for call in re.finditer(rf"(?<!fn )\b{m.group(1)}\s*\(", code):
            args = call_args(code, call.end() - 1)
            if index < len(args):
                lit = re.fullmatch(r'"([^"]*)"', args[index])
                out.append(lit.group(1) if lit else "?" + args[index])
    return out


def rust_files(crate_dir: Path) -> list[Path]:
    return sorted((crate_dir / "src").rglob("*.rs"))


@dataclass
class Binary:
    name: str
    crate: str
    reads: Reads


def all_consts(root: Path) -> dict[str, str]:
    """`const NAME: &str = "..."` across the crates (names are unique enough)."""
    out: dict[str, str] = {}
    for f in sorted((root / "crates").rglob("*.rs")):
        out.update(re.findall(r'const (\w+): &str = "([^"]*)";', non_test_code(f.read_text())))
    return out


def entry_points(path: Path) -> list[str]:
    """How other crates reach the settings a runtime (or tenancy) file reads:
    `Type::from_source` for its public types, `module::function` for its
    public functions that take the `Source`."""
    text = non_test_code(path.read_text())
    points = [rf"\b{t}::from_source\b" for t in re.findall(r"pub struct (\w+)", text)]
    points += [rf"\b{path.stem}::{f}\b" for f in
               re.findall(r"pub fn (\w+)\s*\(\s*src\s*:\s*&(?:[\w:]*::)?Source\b", text)]
    return points


def binaries(root: Path) -> dict[str, Binary]:
    """Every `[[bin]]` of crates/*, with the settings its crate reads plus
    those of the runtime and tenancy files it reaches (through `Type::from_source` or
    `module::function(src)`, transitively)."""
    consts = all_consts(root)
    # The library crates every binary reads settings through: runtime, and
    # tenancy above it (token keys, the app's client credentials).
    runtime_files: list[tuple[list[str], Reads, str]] = []
    for lib in ("runtime", "tenancy"):
        for f in rust_files(root / "crates" / lib):
            r = file_reads(f, root, consts)
            runtime_files.append((entry_points(f), r, non_test_code(f.read_text())))

    out: dict[str, Binary] = {}
    for manifest in sorted((root / "crates").glob("*/Cargo.toml")):
        crate_dir = manifest.parent
        bins = re.findall(r'\[\[bin\]\]\s*name\s*=\s*"([^"]+)"', manifest.read_text())
        if not bins:
            continue
        reads = Reads()
        corpus = ""
        for f in rust_files(crate_dir):
            reads.merge(file_reads(f, root, consts))
            corpus += non_test_code(f.read_text())
        included: set[int] = set()
        changed = True
        while changed:  # a runtime file reached from an included one is reached too
            changed = False
            for i, (points, r, text) in enumerate(runtime_files):
                if i not in included and r.keys and any(re.search(p, corpus) for p in points):
                    included.add(i)
                    reads.merge(r)
                    corpus += text
                    changed = True
        for b in bins:
            out[b] = Binary(b, crate_dir.name, reads)
    return out


@dataclass
class Topology:
    prefix_default: str
    topics: dict[str, tuple[str, str]]  # Topic variant -> (as_str, durable consumer)
    consumed_by: dict[str, set[str]]  # binary -> Topic variants it runs a worker on

    def stream(self, prefix: str, variant: str) -> str:
        return f"{prefix}_{self.topics[variant][0]}".upper()


TOPIC_RS = "crates/domain/src/topic.rs"


def fn_body(code: str, name: str) -> str:
    m = re.search(rf"fn {name}\b.*?\{{(.*?)\n    \}}", code, re.S)
    if not m:
        raise ExtractError(f"{TOPIC_RS}: fn {name} not found")
    return m.group(1)


def topology(root: Path, bins: dict[str, Binary]) -> Topology:
    topic = (root / TOPIC_RS).read_text()
    as_str = dict(re.findall(r'Topic::(\w+) => "([^"]+)"', fn_body(topic, "as_str")))
    consumer = dict(re.findall(r'Topic::(\w+) => "([^"]+)"', fn_body(topic, "consumer")))
    if not as_str or as_str.keys() != consumer.keys():
        raise ExtractError(f"{TOPIC_RS}: Topic::as_str and Topic::consumer disagree")
    cfg = (root / "crates/runtime/src/config.rs").read_text()
    m = re.search(r'src\.string\("THREADLINE_BUS_PREFIX",\s*"([^"]+)"\)', cfg)
    if not m:
        raise ExtractError("crates/runtime/src/config.rs: THREADLINE_BUS_PREFIX default not found")
    consumed: dict[str, set[str]] = {}
    for b in bins.values():
        code = "".join(
            collapse(non_test_code(f.read_text())) for f in rust_files(root / "crates" / b.crate)
        )
        consumed[b.name] = set(re.findall(r"worker::run\([^;]*?Topic::(\w+)", code))
    return Topology(m.group(1), {t: (as_str[t], consumer[t]) for t in as_str}, consumed)


def metric_names(root: Path) -> set[str]:
    names = set()
    for f in sorted((root / "crates").rglob("*.rs")):
        code = collapse(non_test_code(f.read_text()))
        names.update(re.findall(r'metrics::(?:counter|gauge|histogram)!\(\s*"([a-z0-9_]+)"', code))
    return names


def metric_labels(root: Path) -> dict[str, set[str]]:
    """Metric name -> the label names the code gives it (histograms: + le)."""
    out: dict[str, set[str]] = {}
    for f in sorted((root / "crates").rglob("*.rs")):
        code = collapse(non_test_code(f.read_text()))
        for m in re.finditer(r'metrics::(counter|gauge|histogram)!\(\s*"([a-z0-9_]+)"', code):
            args = call_args(code, code.index("(", m.start()))
            labels = out.setdefault(m.group(2), set())
            for a in args[1:]:
                lm = re.match(r'"([a-z_][a-z0-9_]*)"\s*=>', a)
                if not lm:
                    raise ExtractError(f"{f.relative_to(root)}: metric {m.group(2)}: label {a!r} is not a literal name")
                labels.add(lm.group(1))
            if m.group(1) == "histogram":
                labels.add("le")
    return out


def gateway_routes(root: Path) -> set[str]:
    code = collapse(non_test_code((root / "crates/gateway/src/lib.rs").read_text()))
    code += collapse(non_test_code((root / "crates/runtime/src/health.rs").read_text()))
    return set(re.findall(r'\.route\(\s*"([^"]+)"', code))


def public_routes(root: Path) -> set[str]:
    """The gateway's own routes (Slack intake, OAuth), without the health
    and metrics routes every service serves (runtime/src/health.rs)."""
    code = collapse(non_test_code((root / "crates/gateway/src/lib.rs").read_text()))
    return set(re.findall(r'\.route\(\s*"([^"]+)"', code))


def stream_storage(root: Path) -> set[str]:
    """The JetStream storage types the streams are declared with (bus.rs)."""
    code = collapse(non_test_code((root / "crates/runtime/src/bus.rs").read_text()))
    found = set(re.findall(r"\bStorageType::(\w+)", code))
    if not found:
        raise ExtractError("crates/runtime/src/bus.rs: no StorageType:: in the stream declarations")
    return found


def cli_commands(root: Path) -> set[str]:
    """The subcommands of the `threadline` CLI (`enum Command` in
    crates/cli/src/main.rs; clap's kebab-case or an explicit name)."""
    code = non_test_code((root / "crates/cli/src/main.rs").read_text())
    m = re.search(r"\benum Command\s*\{", code)
    if not m:
        raise ExtractError("crates/cli/src/main.rs: enum Command not found")
    depth, i, body = 1, m.end(), ""
    while depth:
        ch = code[i]
        depth += {"{": 1, "}": -1}.get(ch, 0)
        body += ch if depth == 1 and ch not in "{}" else ("\0" if ch in "{}" else " ")
        i += 1
    out, named = set(), None
    for token in re.finditer(r'#\[command\(name\s*=\s*"([^"]+)"\)\]|\b([A-Z]\w*)\s*[,({\0]', body):
        if token.group(1):
            named = token.group(1)
        else:
            kebab = re.sub(r"(?<!^)(?=[A-Z])", "-", token.group(2)).lower()
            out.add(named or kebab)
            named = None
    if "migrate" not in out:
        raise ExtractError(f"crates/cli/src/main.rs: no `migrate` among the subcommands read ({sorted(out)})")
    return out
