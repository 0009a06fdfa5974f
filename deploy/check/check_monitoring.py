"""Offline checks of threadline's monitoring as code against the code and
the runbook. Run by scripts/deploy-check.sh after `promtool check rules`
and `promtool test rules`:

    python check_monitoring.py --root REPO [--self-test] [--verbose]
    python check_monitoring.py --root REPO --write-prometheusrule

The inputs: the alerting and recording rules (RULES, the one source), their
promtool unit tests (RULE_TESTS), the Prometheus Operator's copy of the
rules (PROMETHEUSRULE), the Grafana dashboard (DASHBOARD) and the operator
runbook (RUNBOOK).

1. PROMETHEUSRULE's spec.groups equal RULES' groups: it is generated from
   RULES by --write-prometheusrule, never edited by hand.
2. Every threadline_* metric the rules and the dashboard query is one the
   code exports (rust_settings.metric_names); a histogram is queried
   through _bucket, _sum or _count, and _bucket only where the exporter
   gives it buckets (crates/runtime/src/telemetry.rs: the others are
   summaries). Label names in matchers and in `by (…)` are labels the code
   sets (check_manifests.label_problems), and a label value matched is one
   the code gives, where the code gives that label only literal values.
   A recording rule queried (threadline:…) is one RULES records.
3. Every alert has a severity label (critical, warning or info), a summary,
   a description and a runbook_url ending in docs/operations.md#<anchor>,
   where <anchor> is the anchor of a `### <alert name>` heading in the
   runbook's "## Alerts" section; every heading there names an alert.
4. Every alert has a promtool test case that expects it to fire, every
   recording rule a promql_expr_test, and every test names a rule that
   exists.
5. The dashboard parses, selects its Prometheus through the `datasource`
   variable in every panel and query, and has unique panel ids.
6. Every `alert = "…"` code the services log is named in the runbook as
   alert=<code>, so the operator who finds the line finds what to do.
7. With --self-test (selftest_monitoring.py), the checks run again on
   altered copies of the same input, each of which must be caught.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).parent))
import check_manifests as cm  # noqa: E402
import rust_settings  # noqa: E402

RULES = "deploy/monitoring/prometheus/threadline-rules.yaml"
RULE_TESTS = "deploy/monitoring/prometheus/threadline-rules.test.yaml"
PROMETHEUSRULE = "deploy/k8s/components/monitoring/prometheusrule.yaml"
DASHBOARD = "deploy/monitoring/grafana/threadline-pipeline.json"
RUNBOOK = "docs/operations.md"
TELEMETRY = "crates/runtime/src/telemetry.rs"

SEVERITIES = {"critical", "warning", "info"}

PROMETHEUSRULE_HEADER = f"""\
# GENERATED from {RULES}; do not edit.
# Change the rules there, then regenerate this file:
#   python3 deploy/check/check_monitoring.py --root . --write-prometheusrule
# (`make deploy-check` fails when the two differ). What each alert means and
# what to do: {RUNBOOK}.
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: threadline
  labels:
    release: prometheus # what a kube-prometheus-stack release selects by default; match yours
spec:
"""


# ---------------------------------------------------------------- the code

@dataclass
class Metric:
    kind: str  # counter, gauge, histogram
    labels: set[str] = field(default_factory=set)
    # label -> the literal values the code gives it; None: some value is
    # computed, so any value may occur.
    values: dict[str, set[str] | None] = field(default_factory=dict)


# The state names of the domain's machines (crates/domain/src/state.rs):
# `IntentState::Sent.name()` in a label is the literal "sent".
STATE_NAMES: dict[tuple[str, str], str] = {}


def state_names(root: Path) -> dict[tuple[str, str], str]:
    """(machine, variant) -> the state's name, from the `states!` blocks."""
    text = (root / "crates/domain/src/state.rs").read_text()
    out: dict[tuple[str, str], str] = {}
    for block in re.finditer(r'states!\s*\{.*?\b(\w+),\s*"[^"]*"\s*\{(.*?)\}\s*\}', text, re.S):
        machine = block.group(1)
        for v in re.finditer(r'(\w+)\s*=\s*"([a-z_]+)"', block.group(2)):
            out[(machine, v.group(1))] = v.group(2)
    return out


def label_literals(expr: str) -> set[str] | None:
    """The values a label argument can take, when they are literals:
    `"x"`, a domain state (`IntentState::Sent.name()`), or
    `if c { "x" } else { "y" }`; None otherwise."""
    expr = expr.strip()
    m = re.fullmatch(r'"([^"\\]*)"', expr)
    if m:
        return {m.group(1)}
    m = re.fullmatch(r'(?:\w+::)*(\w+)::(\w+)\.(?:name|as_str)\(\)', expr)
    if m and (m.group(1), m.group(2)) in STATE_NAMES:
        return {STATE_NAMES[(m.group(1), m.group(2))]}
    m = re.fullmatch(r'if\s+[\w.!()&|\s]+?\{\s*"([^"\\]*)"\s*\}\s*else\s*\{\s*"([^"\\]*)"\s*\}', expr)
    if m:
        return {m.group(1), m.group(2)}
    return None


def exported_metrics(root: Path) -> dict[str, Metric]:
    """Every metric the services export, with its labels and label values."""
    STATE_NAMES.clear()
    STATE_NAMES.update(state_names(root))
    out: dict[str, Metric] = {}
    for f in sorted((root / "crates").rglob("*.rs")):
        code = rust_settings.collapse(rust_settings.non_test_code(f.read_text()))
        for m in re.finditer(r'metrics::(counter|gauge|histogram)!\(\s*"([a-z0-9_]+)"', code):
            kind, name = m.group(1), m.group(2)
            metric = out.setdefault(name, Metric(kind))
            if metric.kind != kind:
                raise rust_settings.ExtractError(
                    f"{f.relative_to(root)}: metric {name} is a {kind} here and a {metric.kind} elsewhere")
            for a in rust_settings.call_args(code, code.index("(", m.start()))[1:]:
                lm = re.match(r'"([a-z_][a-z0-9_]*)"\s*=>\s*(.*)$', a)
                if not lm:
                    raise rust_settings.ExtractError(
                        f"{f.relative_to(root)}: metric {name}: label {a!r} is not a literal name")
                label, vals = lm.group(1), label_literals(lm.group(2))
                metric.labels.add(label)
                if label in metric.values and metric.values[label] is None:
                    continue
                metric.values[label] = None if vals is None else (metric.values.get(label) or set()) | vals
    # The code's names agree with what the manifests' check extracts.
    names = rust_settings.metric_names(root)
    if names != set(out):
        raise rust_settings.ExtractError(f"metrics seen differently: {sorted(names ^ set(out))}")
    return out


def bucket_suffixes(root: Path) -> list[str]:
    """Name suffixes of the histograms the exporter gives buckets; the others
    are exported as summaries (quantile, _sum, _count)."""
    code = (root / TELEMETRY).read_text()
    found = re.findall(r'Matcher::Suffix\(\s*"([a-z0-9_]+)"', code)
    if not found:
        raise rust_settings.ExtractError(f"{TELEMETRY}: no set_buckets_for_metric(Matcher::Suffix(…))")
    return found


def log_alerts(root: Path) -> dict[str, str]:
    """`alert = "code"` fields of the services' log lines -> a file naming it."""
    out: dict[str, str] = {}
    for f in sorted((root / "crates").rglob("*.rs")):
        if "/tests/" in str(f) or "slack-sim" in str(f):
            continue
        for code in re.findall(r'\balert\s*=\s*"([a-z0-9_]+)"', rust_settings.non_test_code(f.read_text())):
            out.setdefault(code, str(f.relative_to(root)))
    if not out:
        raise rust_settings.ExtractError('no `alert = "…"` log field found in crates/')
    return out


# ---------------------------------------------------------------- input

@dataclass
class Input:
    rules: dict
    tests: dict
    prometheusrule: dict
    dashboard: dict
    runbook: str
    metrics: dict[str, Metric]
    buckets: list[str]
    log_alerts: dict[str, str]


def load(root: Path) -> tuple[Input, list[str]]:
    """The input, and the errors of reading it (a file that does not parse)."""
    errors = []

    def read(rel, parse):
        try:
            return parse((root / rel).read_text())
        except FileNotFoundError:
            errors.append(f"{rel}: missing")
        except (yaml.YAMLError, json.JSONDecodeError) as e:
            errors.append(f"{rel}: does not parse: {e}")
        return None

    inp = Input(
        rules=read(RULES, yaml.safe_load) or {},
        tests=read(RULE_TESTS, yaml.safe_load) or {},
        prometheusrule=read(PROMETHEUSRULE, yaml.safe_load) or {},
        dashboard=read(DASHBOARD, json.loads) or {},
        runbook=read(RUNBOOK, str) or "",
        metrics=exported_metrics(root),
        buckets=bucket_suffixes(root),
        log_alerts=log_alerts(root),
    )
    return inp, errors


def rules_of(inp: Input):
    for g in inp.rules.get("groups") or []:
        for r in g.get("rules") or []:
            yield g.get("name"), r


# ---------------------------------------------------------------- checks

def anchor(heading: str) -> str:
    """The anchor GitHub (and most Markdown renderers) give a heading."""
    a = heading.strip().lower()
    a = re.sub(r"[^\w\- ]", "", a)
    return a.replace(" ", "-")


def alert_headings(runbook: str) -> dict[str, str]:
    """`### Name` headings of the runbook's "## Alerts" section -> anchor."""
    out, inside = {}, False
    for line in runbook.splitlines():
        if line.startswith("## "):
            inside = line[3:].strip().lower() == "alerts"
        elif inside and line.startswith("### "):
            name = line[4:].strip()
            out[name] = anchor(name)
    return out


def check_prometheusrule(rep, inp: Input):
    where = PROMETHEUSRULE
    doc = inp.prometheusrule
    if doc.get("kind") != "PrometheusRule" or doc.get("apiVersion") != "monitoring.coreos.com/v1":
        rep.error(where, "is not a monitoring.coreos.com/v1 PrometheusRule")
        return
    got, want = cm.dig(doc, "spec.groups") or [], inp.rules.get("groups") or []
    if got == want:
        return
    detail = f"{len(got)} groups, the rules file has {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        if g == w:
            continue
        detail = f"group {i} ({w.get('name')})"
        for r, s in zip(g.get("rules") or [], w.get("rules") or []):
            if r != s:
                keys = sorted(k for k in set(r) | set(s) if r.get(k) != s.get(k))
                detail += f", rule {s.get('alert') or s.get('record')}: {', '.join(keys)}"
                break
        else:
            detail += f": {len(g.get('rules') or [])} rules, the rules file has {len(w.get('rules') or [])}"
        break
    rep.error(where, f"PrometheusRule spec.groups differs from {RULES} ({detail}); regenerate it: "
                     f"python3 deploy/check/check_monitoring.py --root . --write-prometheusrule")


def metric_problems(expr: str, inp: Input, recorded: set[str]) -> list[str]:
    """What in a PromQL expression names a metric, label or value the code
    does not export."""
    out = []
    labels = {n: m.labels | ({"le"} if m.kind == "histogram" else set()) for n, m in inp.metrics.items()}
    for name in sorted(set(re.findall(r"\b(threadline_[a-z0-9_]+)", expr))):
        base, suffix = name, ""
        m = re.fullmatch(r"(.+)_(bucket|sum|count)", name)
        if name not in inp.metrics and m and m.group(1) in inp.metrics:
            base, suffix = m.group(1), m.group(2)
        metric = inp.metrics.get(base)
        if metric is None:
            out.append(f"metric {name} is not exported by the code (grep metrics:: in crates/)")
            continue
        bucketed = metric.kind == "histogram" and any(base.endswith(s) for s in inp.buckets)
        if suffix and metric.kind != "histogram":
            out.append(f"metric {name}: {base} is a {metric.kind}, it has no _{suffix} series")
        elif suffix == "bucket" and not bucketed:
            out.append(f"metric {name}: {base} is exported as a summary, with no buckets "
                       f"(only histograms named *{' or *'.join(inp.buckets)} have them, {TELEMETRY})")
        elif not suffix and bucketed:
            out.append(f"metric {name} is a histogram: query {name}_bucket, _sum or _count")
    for rec in sorted(set(re.findall(r"\b(threadline:[a-z0-9_:]+)", expr))):
        if rec not in recorded:
            out.append(f"recording rule {rec} is not recorded in {RULES}")
    out += cm.label_problems(expr, labels)
    # Label values: `metric{label="v"}` and `label=~"a|b"` with plain words.
    for m in re.finditer(r"\b(threadline_[a-z0-9_]+)\s*\{([^}]*)\}", expr):
        name = m.group(1)
        metric = inp.metrics.get(name) or inp.metrics.get(re.sub(r"_(bucket|sum|count)$", "", name))
        if metric is None:
            continue
        for label, op, value in re.findall(r'([a-zA-Z_]\w*)\s*(=~|!~|!=|=)\s*"([^"]*)"', m.group(2)):
            known = metric.values.get(label)
            if not known or "$" in value:
                continue
            if op in ("=", "!="):
                wanted = [value]
            elif re.fullmatch(r"[\w.:-]+(\|[\w.:-]+)*", value):
                wanted = value.split("|")
            else:
                continue
            for v in wanted:
                if v not in known:
                    out.append(f"{name}{{{label}{op}\"{value}\"}}: the code never gives {label} the value "
                               f"{v!r} (it gives {sorted(known)})")
    return out


def check_rules(rep, inp: Input):
    where = RULES
    groups = inp.rules.get("groups")
    if not groups:
        rep.error(where, "no groups")
        return
    recorded = {r["record"] for _, r in rules_of(inp) if r.get("record")}
    headings = alert_headings(inp.runbook)
    alerts = []
    for group, r in rules_of(inp):
        name = r.get("alert") or r.get("record")
        if not name or not r.get("expr"):
            rep.error(where, f"group {group}: a rule without alert/record or expr")
            continue
        for msg in metric_problems(str(r["expr"]), inp, recorded):
            rep.error(where, f"{name}: {msg}")
        if not r.get("alert"):
            continue
        alerts.append(name)
        labels, ann = r.get("labels") or {}, r.get("annotations") or {}
        if labels.get("severity") not in SEVERITIES:
            rep.error(where, f"alert {name}: severity label {labels.get('severity')!r} is not one of {sorted(SEVERITIES)}")
        for a in ("summary", "description", "runbook_url"):
            if not ann.get(a):
                rep.error(where, f"alert {name}: no annotations.{a}")
        if name not in headings:
            rep.error(where, f"alert {name} has no runbook entry: no `### {name}` heading under "
                             f"`## Alerts` in {RUNBOOK}")
        url = str(ann.get("runbook_url") or "")
        if url and not url.endswith(f"{RUNBOOK}#{headings.get(name, anchor(name))}"):
            rep.error(where, f"alert {name}: runbook_url {url!r} does not end in "
                             f"{RUNBOOK}#{headings.get(name, anchor(name))}")
    for name in headings:
        if name not in alerts:
            rep.error(RUNBOOK, f"`### {name}` under `## Alerts` names no alert of {RULES}")
    dup = {a for a in alerts if alerts.count(a) > 1}
    if dup:
        rep.error(where, f"alerts defined twice: {sorted(dup)}")


def check_tests(rep, inp: Input):
    where = RULE_TESTS
    rule_file = Path(RULES).name
    if rule_file not in (inp.tests.get("rule_files") or []):
        rep.error(where, f"rule_files does not list {rule_file}")
    alerts = {r["alert"] for _, r in rules_of(inp) if r.get("alert")}
    records = {r["record"] for _, r in rules_of(inp) if r.get("record")}
    fired, evaluated = set(), set()
    for t in inp.tests.get("tests") or []:
        for a in t.get("alert_rule_test") or []:
            name = a.get("alertname")
            if name not in alerts:
                rep.error(where, f"test {t.get('name')!r}: alert {name} is not in {RULES}")
            if a.get("exp_alerts"):
                fired.add(name)
        for e in t.get("promql_expr_test") or []:
            evaluated.update(re.findall(r"threadline:[a-z0-9_:]+", str(e.get("expr"))))
    for name in sorted(alerts - fired):
        rep.error(where, f"alert {name}: no promtool test fires it (an alert_rule_test with exp_alerts)")
    for name in sorted(records - evaluated):
        rep.error(where, f"recording rule {name}: no promql_expr_test evaluates it")


def check_dashboard(rep, inp: Input):
    where = DASHBOARD
    d = inp.dashboard
    if not d.get("panels"):
        rep.error(where, "no panels")
        return
    variables = {v.get("name"): v for v in cm.dig(d, "templating.list") or []}
    ds = variables.get("datasource")
    if not ds or ds.get("type") != "datasource" or ds.get("query") != "prometheus":
        rep.error(where, "no `datasource` variable of type datasource for Prometheus")
    recorded = {r["record"] for _, r in rules_of(inp) if r.get("record")}
    ids = []
    panels = list(d["panels"])
    for p in list(panels):
        panels += p.get("panels") or []  # (a collapsed row keeps its panels)
    for p in panels:
        title = p.get("title") or f"panel {p.get('id')}"
        ids.append(p.get("id"))
        if p.get("type") == "row":
            continue
        if not p.get("targets"):
            rep.error(where, f"panel {title!r}: no queries")
        for obj in [p] + list(p.get("targets") or []):
            uid = cm.dig(obj, "datasource.uid")
            if uid != "${datasource}":
                rep.error(where, f"panel {title!r}: datasource {uid!r} instead of the variable ${{datasource}}")
        for t in p.get("targets") or []:
            for msg in metric_problems(str(t.get("expr") or ""), inp, recorded):
                rep.error(where, f"panel {title!r}: {msg}")
    dup = {i for i in ids if ids.count(i) > 1}
    if None in ids or dup:
        rep.error(where, f"panel ids missing or repeated: {sorted(x for x in dup if x is not None)}")


def check_log_alerts(rep, inp: Input):
    for code, path in sorted(inp.log_alerts.items()):
        if not re.search(rf"\balert={re.escape(code)}\b", inp.runbook):
            rep.error(RUNBOOK, f'the services log alert="{code}" ({path}), which the runbook never names '
                               f"(as alert={code}): say what it means and what to do")


def check_all(rep, inp: Input):
    check_prometheusrule(rep, inp)
    check_rules(rep, inp)
    check_tests(rep, inp)
    check_dashboard(rep, inp)
    check_log_alerts(rep, inp)


# ---------------------------------------------------------------- main

def prometheusrule_text(rules_text: str) -> str:
    """The PrometheusRule wrapping the rules file's `groups:` (comments kept)."""
    lines = rules_text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("groups:")), None)
    if start is None:
        raise SystemExit(f"{RULES}: no top-level `groups:`")
    body = "\n".join(("  " + line) if line.strip() else "" for line in lines[start:])
    return PROMETHEUSRULE_HEADER + body + "\n"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    ap.add_argument("--self-test", action="store_true",
                    help="then check altered copies of the input (selftest_monitoring.py): every breakage must be caught")
    ap.add_argument("--verbose", action="store_true", help="list each self-test breakage and the error it gave")
    ap.add_argument("--write-prometheusrule", action="store_true",
                    help=f"regenerate {PROMETHEUSRULE} from {RULES}, then check")
    args = ap.parse_args()
    root = Path(args.root)

    if args.write_prometheusrule:
        (root / PROMETHEUSRULE).write_text(prometheusrule_text((root / RULES).read_text()))
        print(f"wrote {PROMETHEUSRULE} from {RULES}")

    try:
        inp, errors = load(root)
    except rust_settings.ExtractError as e:
        print(f"FAIL reading the Rust sources: {e}")
        return 1
    rep = cm.Report()
    for e in errors:
        rep.error("input", e)
    check_all(rep, inp)

    alerts = [r["alert"] for _, r in rules_of(inp) if r.get("alert")]
    sev = {s: sum(1 for _, r in rules_of(inp) if r.get("alert") and (r.get("labels") or {}).get("severity") == s)
           for s in sorted(SEVERITIES)}
    queries = sum(len(p.get("targets") or []) for p in inp.dashboard.get("panels") or [])
    print(f"monitoring: {len(alerts)} alerts ({', '.join(f'{s} {n}' for s, n in sev.items())}), each with a "
          f"runbook entry and a firing test; PrometheusRule equal to the rules file; dashboard "
          f"{len(inp.dashboard.get('panels') or [])} panels, {queries} queries on {len(inp.metrics)} exported "
          f"metrics; {len(inp.log_alerts)} logged alert codes named in the runbook")

    if args.self_test:
        import selftest_monitoring
        summary, failures = selftest_monitoring.run(inp, rep.errors, args.verbose)
        print(summary)
        rep.errors.extend(failures)
    for e in rep.errors:
        print(f"FAIL {e}")
    return 1 if rep.errors else 0


if __name__ == "__main__":
    sys.exit(main())
