"""Self-test of check_monitoring.py: proves that its checks can fail.

Run by `check_monitoring.py --self-test` (scripts/deploy-check.sh) on the
very input it has just checked, like selftest.py for the manifests: every
breakage below alters a copy of that input in one deliberate way, runs all
the checks again (check_all), and must produce at least one new error
containing every one of its `expect` strings. The unaltered copy must give
the same errors as the real run (none, when it passes).

A breakage that is not caught is a gap in the checker: fix the checker, do
not weaken the breakage. A breakage whose target is gone (an alert was
renamed) fails too: update it.
"""

from __future__ import annotations

import copy
from collections import Counter
from dataclasses import dataclass
from typing import Callable

import check_manifests as cm
import check_monitoring as mon


class Missing(Exception):
    """The object a breakage alters is not in the input."""


def rule(rules: dict, name: str) -> dict:
    for g in rules.get("groups") or []:
        for r in g.get("rules") or []:
            if name in (r.get("alert"), r.get("record")):
                return r
    raise Missing(f"rule {name}")


def panel(dashboard: dict, title: str) -> dict:
    for p in dashboard.get("panels") or []:
        if p.get("title") == title:
            return p
    raise Missing(f"panel {title!r}")


def replace_in(obj: dict, key: str, old: str, new: str):
    if old not in str(obj.get(key, "")):
        raise Missing(f"{old!r} in {key}")
    obj[key] = str(obj[key]).replace(old, new)


@dataclass
class Breakage:
    family: str
    what: str
    apply: Callable[[mon.Input], None]
    expect: tuple[str, ...]


BREAKAGES: list[Breakage] = []


def breakage(family: str, what: str, *expect: str):
    def register(fn):
        BREAKAGES.append(Breakage(family, what, fn, expect))
        return fn
    return register


# Rules against the code.

@breakage("rules", "an alert on a metric the code does not export",
          mon.RULES, "ThreadlineDeadLetters", "threadline_dead_letter_total is not exported")
def _(i):
    replace_in(rule(i.rules, "ThreadlineDeadLetters"), "expr", "threadline_dead_letters_total",
               "threadline_dead_letter_total")


@breakage("rules", "a label value the code never gives",
          mon.RULES, "ThreadlineRepliesRefused", "never gives state the value 'refused'")
def _(i):
    replace_in(rule(i.rules, "ThreadlineRepliesRefused"), "expr", 'state="failed_permanent"', 'state="refused"')


@breakage("rules", "a value in a regex matcher the code never gives",
          mon.RULES, "ThreadlineTokenRefreshFailing", "never gives result the value 'timeout'")
def _(i):
    replace_in(rule(i.rules, "ThreadlineTokenRefreshFailing"), "expr", "failed|deferred", "failed|timeout")


@breakage("rules", "quantiles of a histogram exported without buckets",
          mon.RULES, "ThreadlineAckLatencyNearSlackDeadline", "threadline_gateway_group_commit_size_bucket",
          "exported as a summary")
def _(i):
    replace_in(rule(i.rules, "ThreadlineAckLatencyNearSlackDeadline"), "expr",
               "threadline_gateway_ack_seconds_bucket", "threadline_gateway_group_commit_size_bucket")


@breakage("rules", "an alert without a severity",
          mon.RULES, "ThreadlineOutboxStuck", "severity label None")
def _(i):
    rule(i.rules, "ThreadlineOutboxStuck").pop("labels")


# Rules against the runbook.

@breakage("runbook", "an alert with no runbook entry",
          mon.RULES, "ThreadlineRepliesHeld has no runbook entry")
def _(i):
    if "\n### ThreadlineRepliesHeld\n" not in i.runbook:
        raise Missing("### ThreadlineRepliesHeld in the runbook")
    i.runbook = i.runbook.replace("\n### ThreadlineRepliesHeld\n", "\n### Replies held\n")


@breakage("runbook", "a runbook_url pointing at another entry",
          mon.RULES, "ThreadlineDuplicateReply", "runbook_url", "threadlineduplicatereply")
def _(i):
    replace_in(rule(i.rules, "ThreadlineDuplicateReply")["annotations"], "runbook_url", "#threadlineduplicatereply",
               "#threadlinerepliesheld")


@breakage("runbook", "a runbook entry for an alert that is gone",
          mon.RUNBOOK, "ThreadlineSlackTokenRejected", "names no alert")
def _(i):
    for g in i.rules["groups"]:
        g["rules"] = [r for r in g["rules"] if r.get("alert") != "ThreadlineSlackTokenRejected"]


@breakage("runbook", "a logged alert code the runbook never names",
          mon.RUNBOOK, 'alert="tokens_on_fire"', "never names")
def _(i):
    i.log_alerts["tokens_on_fire"] = "crates/tenancy/src/tokens.rs"


# The PrometheusRule against the rules file.

@breakage("prometheusrule", "a PrometheusRule edited by hand (drifted)",
          mon.PROMETHEUSRULE, "differs from", "ThreadlineOutboxStuck", "for")
def _(i):
    r = rule(cm.dig(i.prometheusrule, "spec") or {}, "ThreadlineOutboxStuck")
    r["for"] = "30m"


@breakage("prometheusrule", "an alert added to the rules file only",
          mon.PROMETHEUSRULE, "differs from", "rules")
def _(i):
    g = i.rules["groups"][0]
    g["rules"] = g["rules"] + [dict(rule(i.rules, "ThreadlineOutboxStuck"), alert="ThreadlineOutboxStuckToo")]


# Tests.

@breakage("tests", "an alert no test fires",
          mon.RULE_TESTS, "ThreadlineLatePost", "no promtool test fires it")
def _(i):
    before = len(i.tests["tests"])
    i.tests["tests"] = [t for t in i.tests["tests"]
                        if not any(a.get("alertname") == "ThreadlineLatePost" for a in t.get("alert_rule_test") or [])]
    if len(i.tests["tests"]) == before:
        raise Missing("tests of ThreadlineLatePost")


@breakage("tests", "a test of an alert that does not exist",
          mon.RULE_TESTS, "ThreadlineDuplicateReplies is not in")
def _(i):
    for t in i.tests["tests"]:
        for a in t.get("alert_rule_test") or []:
            if a.get("alertname") == "ThreadlineDuplicateReply":
                a["alertname"] = "ThreadlineDuplicateReplies"
                return
    raise Missing("a test of ThreadlineDuplicateReply")


# The dashboard.

@breakage("dashboard", "a panel on a metric the code does not export",
          mon.DASHBOARD, "Streams open", "threadline_streams_open is not exported")
def _(i):
    p = panel(i.dashboard, "Streams open")
    p["targets"][0]["expr"] = 'sum(threadline_streams_open{namespace=~"$namespace"})'


@breakage("dashboard", "a panel aggregating by a label the metric does not have",
          mon.DASHBOARD, "Dead-lettered, by subject", "aggregates by 'stream'")
def _(i):
    p = panel(i.dashboard, "Dead-lettered, by subject")
    replace_in(p["targets"][0], "expr", "by (subject)", "by (stream)")


@breakage("dashboard", "a panel bound to one Prometheus instead of the variable",
          mon.DASHBOARD, "Model latency", "instead of the variable")
def _(i):
    panel(i.dashboard, "Model latency")["datasource"] = {"type": "prometheus", "uid": "prod-prometheus"}


@breakage("dashboard", "a panel on a recording rule that is not recorded",
          mon.DASHBOARD, "Model calls per accepted event", "is not recorded")
def _(i):
    replace_in(panel(i.dashboard, "Model calls per accepted event")["targets"][0], "expr", ":ratio_rate5m",
               ":ratio_rate1m")


# ---------------------------------------------------------------- run

def run(inp: mon.Input, real_errors, verbose=False):
    """(summary line, failures): every breakage must be caught."""
    failures: list[str] = []
    details: list[str] = []
    base = cm.Report()
    mon.check_all(base, copy.deepcopy(inp))
    baseline = set(base.errors)
    if not baseline <= set(real_errors):
        failures.append(f"self-test: the unaltered copy gives errors the real run did not: "
                        f"{sorted(baseline - set(real_errors))}")
    caught = 0
    for b in BREAKAGES:
        label = f"{b.family}: {b.what}"
        altered = copy.deepcopy(inp)
        try:
            b.apply(altered)
        except Missing as e:
            failures.append(f"self-test: breakage [{label}] could not be applied, {e} is gone: "
                            f"update selftest_monitoring.py")
            continue
        rep = cm.Report()
        mon.check_all(rep, altered)
        new = [e for e in rep.errors if e not in baseline]
        hits = [e for e in new if all(x in e for x in b.expect)]
        if hits:
            caught += 1
            details.append(f"  caught  [{label}] {hits[0]}")
        else:
            failures.append(f"self-test: NOT CAUGHT [{label}]: no new error contains {list(b.expect)}; "
                            f"new errors: {new or 'none'}")
            details.append(f"  MISSED  [{label}]")
    families = Counter(b.family for b in BREAKAGES)
    summary = (f"monitoring self-test: {len(BREAKAGES)} breakages, "
               + ("all caught" if caught == len(BREAKAGES) else f"{len(BREAKAGES) - caught} FAILED")
               + f" ({', '.join(f'{f} {n}' for f, n in families.items())}); "
               + f"unaltered input: {len(baseline) or 'no'} error{'' if len(baseline) == 1 else 's'}")
    if verbose:
        summary = "\n".join([summary] + details)
    return summary, failures
