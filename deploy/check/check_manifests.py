"""Offline checks of the rendered Kubernetes manifests against Kubernetes'
schemas and against what the Rust code reads. Run by scripts/deploy-check.sh:

    python check_manifests.py --root REPO [--self-test] NAME=rendered.yaml [NAME=rendered.yaml ...]

NAME is the overlay's path under deploy/k8s/overlays (dev/app,
production/infra, ...); its first part is the environment: checks that span
overlays (NetworkPolicies, NATS, traces) look at one environment at a time.

1. Built-in kinds validate strictly (unknown fields fail) against the
   Kubernetes schemas shipped by kubernetes-validate, for every version in
   K8S_VERSIONS.
2. Custom resources (KEDA, CloudNativePG, Barman Cloud, Prometheus Operator,
   cert-manager) are checked here for the fields threadline relies on;
   any other kind fails.
3. Every pod runs non-root with a read-only root filesystem, no privilege
   escalation, all capabilities dropped, RuntimeDefault seccomp, and
   resource requests and limits.
4. Every threadline container gets each setting its binary requires, and
   every setting it is given is one its binary reads (rust_settings.py);
   listen addresses, probes, ports, KEDA streams/consumers, Ingress paths
   and alert metrics match the code. A Socket Mode gateway's pods, as many
   as its scaling and rollout can run at once, hold at most the 10
   connections Slack allows per app.
5. The OpenTelemetry Collector's OTLP exporters, and the services' own
   OTEL_EXPORTER_OTLP_ENDPOINT, send to a Service the environment deploys
   (name, namespace, port, pods behind it), and the NetworkPolicies of both
   ends let the traffic through; so do the services' connections to
   Postgres and NATS.
6. The NATS Helm values (k8s/nats/values.yaml, with the --set flags of the
   environment's `helm upgrade --install nats` in deploy/README.md) run
   JetStream on file storage on PVCs, as a cluster of 3+ servers in
   production, with at least as many servers as THREADLINE_STREAM_REPLICAS,
   a max_payload above the largest Slack event, and the client and
   monitoring ports NATS_URL and KEDA use. Their authorization is exactly
   what the code renders (k8s/nats/authorization.json, which a Rust test
   keeps equal to `threadline nats auth --prefix tl --format helm`), for the
   services' THREADLINE_BUS_PREFIX, with every password from a Secret; each
   threadline container logs in as the user of its role (NATS_USER, and
   NATS_PASSWORD from that user's key), the gateway does not relay, and
   something relays the outbox as the user relay.
7. With --self-test (selftest.py), the checks above run again on copies of
   the same input with deliberate breakages, each of which must be caught.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import math
import re
import shlex
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).parent))
import rust_settings  # noqa: E402

# Oldest Kubernetes minor version supported and the newest one known.
K8S_VERSIONS = ["1.30.0", "1.37.0"]

# Environment variables read outside the `src` config API (checked below).
EXTRA_READS = {
    "RUST_LOG": ("crates/runtime/src/telemetry.rs", "try_from_default_env"),
    "THREADLINE_CONFIG_FILE": ("crates/runtime/src/settings.rs", '"THREADLINE_CONFIG_FILE"'),
}


def is_set(p, key):
    return p.get(key) is not None


def equals(key, value):
    return lambda p: p.get(key) is not None and p[key][1] == value


def when_set(key):
    return lambda p: is_set(p, key)


# What src.flag takes for true (crates/runtime/src/config.rs), any case.
FLAG_TRUE = {"1", "true", "yes", "on"}


def flag_on(key):
    """The flag may be on: set to a true value, or from a source whose value
    is not knowable offline (a Secret, a key reference, a fieldRef), which
    is taken as on — conservative, so that what the flag requires or bounds
    is still checked. Unset or empty is off (src.flag's default)."""
    def test(p):
        given = p.get(key)
        if given is None:
            return False
        return given[1] is None or given[1].strip().lower() in FLAG_TRUE
    return test


def flag_unknowable(p, key) -> bool:
    """`key` is given, from a source whose value is not knowable offline."""
    return p.get(key) is not None and p[key][1] is None


def never(_p):
    return False


# Settings the code requires only in some configurations (the syntax alone
# says "required"). (binary or "*", key) -> (condition on what is provided,
# why). Entries that no longer match a required read fail the check.
CONDITIONAL = {
    ("threadline-gateway", "SLACK_SIGNING_SECRET_PREVIOUS"): (
        never, "gateway config.rs: the loop requires only SLACK_SIGNING_SECRET"),
    ("*", "SLACK_CLIENT_SECRET"): (
        when_set("SLACK_CLIENT_ID"), "with SLACK_CLIENT_ID (OAuth, token refresh)"),
    ("threadline-gateway", "THREADLINE_OAUTH_REDIRECT_URL"): (
        when_set("SLACK_CLIENT_ID"), "with SLACK_CLIENT_ID (OAuth install flow)"),
    ("threadline-gateway", "THREADLINE_TOKEN_PUBLIC_KEYS"): (
        when_set("SLACK_CLIENT_ID"), "with SLACK_CLIENT_ID (installs store sealed tokens)"),
    ("threadline-gateway", "SLACK_APP_TOKEN"): (
        flag_on("THREADLINE_SOCKET_MODE"),
        "with THREADLINE_SOCKET_MODE=true (Socket Mode intake; a value not knowable offline, "
        "from a Secret, counts as true)"),
    ("threadline-inference", "THREADLINE_MODEL_BASE_URL"): (
        equals("THREADLINE_MODEL_PROVIDER", "openai"), "with THREADLINE_MODEL_PROVIDER=openai"),
    ("threadline-inference", "THREADLINE_MODEL_NAME"): (
        equals("THREADLINE_MODEL_PROVIDER", "openai"), "with THREADLINE_MODEL_PROVIDER=openai"),
    ("threadline-inference", "THREADLINE_MODEL_BACKUP_NAME"): (
        when_set("THREADLINE_MODEL_BACKUP_BASE_URL"), "with THREADLINE_MODEL_BACKUP_BASE_URL"),
    ("threadline", "THREADLINE_TOKEN_KEYS"): (
        never, "cli: only `keys rotate` and `install add` need it, not `migrate`"),
}

# Binaries that write audit records naming a channel by its pseudonym
# (crates/runtime/src/audit.rs): every Deployment of one is given the key,
# the same in all, or its records do not correlate with the others' (the
# gateway, relay or not, refuses to relay or install without it).
AUDIT_WRITERS = {"threadline-gateway", "threadline-context-builder", "threadline-inference",
                 "threadline-publisher"}

# Settings a binary must never be given, though it links code that reads
# them: binary -> {key: why}.
FORBIDDEN = {
    "threadline-gateway": {
        "THREADLINE_TOKEN_KEYS": "the public gateway holds no key that opens a token (DESIGN §8; "
                                 "it refuses to start with them); give it THREADLINE_TOKEN_PUBLIC_KEYS",
    },
}

# Metrics the alerts may name before the code emits them (while being
# added; empty now: every metric the alerts use is emitted).
PENDING_METRICS: set[str] = set()

# Labels Prometheus adds to every scraped series (ServiceMonitor, pod
# annotations): alerts may aggregate by these besides the code's own labels.
TARGET_LABELS = {"job", "instance", "namespace", "pod", "service", "container", "endpoint"}

# Listen-address setting and health port of each service binary.
SERVICES = {
    "threadline-gateway": "THREADLINE_GATEWAY_ADDR",
    "threadline-context-builder": "THREADLINE_CONTEXT_BUILDER_ADDR",
    "threadline-inference": "THREADLINE_INFERENCE_ADDR",
    "threadline-publisher": "THREADLINE_PUBLISHER_ADDR",
}

WORKLOADS = {"Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob"}

# Kinds without a namespace; every other object of an overlay names one
# (without, `kubectl apply -k` puts it in the current context's namespace).
CLUSTER_SCOPED = {"Namespace", "ClusterIssuer", "ClusterRole", "ClusterRoleBinding",
                  "CustomResourceDefinition", "PriorityClass", "StorageClass", "IngressClass"}

# Known defects of the manifests, reported as notices until fixed: (overlay,
# how the error's text after "overlay: " begins) -> the fix. An entry that
# no longer matches an error fails the check (remove it).
KNOWN_DEFECTS: dict[tuple[str, str], str] = {}


class Report:
    def __init__(self):
        self.errors: list[str] = []
        self.notes: list[str] = []

    def error(self, where: str, msg: str):
        line = f"{where}: {msg}"
        if line not in self.errors:
            self.errors.append(line)

    def note(self, msg: str):
        self.notes.append(msg)


def dig(obj, path: str):
    cur = obj
    for part in path.split("."):
        if isinstance(cur, list):
            try:
                cur = cur[int(part)]
            except (ValueError, IndexError):
                return None
        elif isinstance(cur, dict):
            cur = cur.get(part)
        else:
            return None
        if cur is None:
            return None
    return cur


def kn(doc) -> str:
    return f"{doc.get('kind')}/{dig(doc, 'metadata.name')}"


# ---------------------------------------------------------------- custom resources

def need(rep, where, doc, paths):
    for p in paths:
        v = dig(doc, p)
        if v is None or v == "" or v == []:
            rep.error(where, f"{kn(doc)} lacks {p}")


def check_scaledobject(rep, where, doc, ctx):
    need(rep, where, doc, ["spec.scaleTargetRef.name", "spec.triggers",
                           "spec.minReplicaCount", "spec.maxReplicaCount"])
    target = dig(doc, "spec.scaleTargetRef.name")
    kind = dig(doc, "spec.scaleTargetRef.kind") or "Deployment"
    dep = ctx["by_kind"].get(kind, {}).get(target)
    if dep is None:
        rep.error(where, f"{kn(doc)} scales {kind}/{target}, which this overlay does not have")
        return
    binary = ctx["binary_of"].get(target)
    topo: rust_settings.Topology = ctx["topology"]
    prefix = ctx["settings_of"].get(target, {}).get("THREADLINE_BUS_PREFIX", (None, topo.prefix_default))[1]
    expected = {
        (topo.stream(prefix, t), topo.topics[t][1]) for t in topo.consumed_by.get(binary, set())
    }
    seen = set()
    for i, trig in enumerate(dig(doc, "spec.triggers") or []):
        t = trig.get("type")
        md = trig.get("metadata") or {}
        if t == "nats-jetstream":
            for k in ("natsServerMonitoringEndpoint", "account", "stream", "consumer", "lagThreshold"):
                if not md.get(k):
                    rep.error(where, f"{kn(doc)} trigger {i} lacks metadata.{k}")
            pair = (md.get("stream"), md.get("consumer"))
            if pair not in expected:
                rep.error(where, f"{kn(doc)} trigger {i}: stream {pair[0]} / consumer {pair[1]} is not "
                                 f"one {binary} consumes (the code: {sorted(expected)})")
            seen.add(pair)
            if not str(md.get("lagThreshold", "")).isdigit():
                rep.error(where, f"{kn(doc)} trigger {i}: lagThreshold must be a quoted integer")
        elif t == "cpu" or t == "memory":
            if not md.get("value") or trig.get("metricType") not in ("Utilization", "AverageValue"):
                rep.error(where, f"{kn(doc)} trigger {i}: {t} needs metricType and metadata.value")
        else:
            rep.error(where, f"{kn(doc)} trigger {i}: type {t!r} is not one this check knows")
    if expected - seen:
        rep.error(where, f"{kn(doc)} does not watch {sorted(expected - seen)}, which {binary} consumes")


def check_servicemonitor(rep, where, doc, ctx):
    need(rep, where, doc, ["spec.selector", "spec.endpoints"])
    ports = {e.get("port") for e in dig(doc, "spec.endpoints") or []}
    for e in dig(doc, "spec.endpoints") or []:
        if e.get("path", "/metrics") != "/metrics":
            rep.error(where, f"{kn(doc)}: the services serve /metrics, not {e.get('path')}")
    matched = [s for s in ctx["by_kind"].get("Service", {}).values() if selects(dig(doc, "spec.selector"), s)]
    if not matched:
        rep.error(where, f"{kn(doc)} selects no Service")
    for s in matched:
        names = {p.get("name") for p in dig(s, "spec.ports") or []}
        if not ports & names:
            rep.error(where, f"{kn(doc)}: Service {dig(s, 'metadata.name')} has no port named {sorted(ports)}")


def check_prometheusrule(rep, where, doc, ctx):
    need(rep, where, doc, ["spec.groups"])
    known = ctx["metrics"]
    for g in dig(doc, "spec.groups") or []:
        if not g.get("name") or not g.get("rules"):
            rep.error(where, f"{kn(doc)}: a group without name or rules")
        for r in g.get("rules") or []:
            if not (r.get("alert") or r.get("record")) or not r.get("expr"):
                rep.error(where, f"{kn(doc)}: rule {r.get('alert')} lacks alert/record or expr")
                continue
            expr = str(r["expr"])
            for m in re.findall(r"\b(threadline_[a-z0-9_]+)", expr):
                base = re.sub(r"_(bucket|count|sum)$", "", m)
                if m in known or base in known:
                    continue
                if m in PENDING_METRICS:
                    ctx["pending_used"].add(m)
                    continue
                rep.error(where, f"{kn(doc)} alert {r.get('alert')}: metric {m} is not emitted by the code "
                                 f"(grep metrics:: in crates/) nor listed as pending")
            for msg in label_problems(expr, ctx["metric_labels"]):
                rep.error(where, f"{kn(doc)} alert {r.get('alert')}: {msg}")
            if r.get("alert") and not dig(r, "annotations.summary"):
                rep.error(where, f"{kn(doc)} alert {r.get('alert')}: no annotations.summary")


def metric_label_set(name: str, labels: dict[str, set[str]]) -> set[str] | None:
    """The labels of a series named `name` (histogram _bucket/_sum/_count included)."""
    if name in labels:
        return labels[name]
    base = re.sub(r"_(bucket|count|sum)$", "", name)
    if base in labels:
        return labels[base] - ({"le"} if not name.endswith("_bucket") else set())
    return None


def label_problems(expr: str, labels: dict[str, set[str]]) -> list[str]:
    """Label names in `metric{...}` matchers and in `by (...)` of an
    aggregation over threadline metrics that the code never sets: such a
    matcher selects nothing, so the alert could never fire."""
    out = []
    for m in re.finditer(r"\b(threadline_[a-z0-9_]+)\s*\{([^}]*)\}", expr):
        have = metric_label_set(m.group(1), labels)
        if have is None:
            continue
        for name in re.findall(r"([a-zA-Z_]\w*)\s*(?:=~|!~|!=|=)", m.group(2)):
            if name not in have | TARGET_LABELS | {"__name__"}:
                out.append(f"{m.group(1)} has no label {name!r} (the code sets {sorted(have - {'le'})})")
    groups = []  # (labels of `by (…)`, the expression aggregated)
    for m in re.finditer(r"\bby\s*\(([^)]*)\)\s*\(", expr):  # sum by (x) (expr)
        depth, i = 1, m.end()
        while i < len(expr) and depth:
            depth += {"(": 1, ")": -1}.get(expr[i], 0)
            i += 1
        groups.append((m.group(1), expr[m.end():i - 1]))
    for m in re.finditer(r"\)\s*by\s*\(([^)]*)\)", expr):  # sum(expr) by (x)
        depth, i = 1, m.start() - 1
        while i >= 0 and depth:
            depth += {")": 1, "(": -1}.get(expr[i], 0)
            i -= 1
        groups.append((m.group(1), expr[i + 2:m.start()]))
    for by, inner in groups:
        sets = [metric_label_set(n, labels) for n in re.findall(r"\b(threadline_[a-z0-9_]+)", inner)]
        sets = [s for s in sets if s is not None]
        if not sets:
            continue
        have = set().union(*sets) | TARGET_LABELS
        for name in (x.strip() for x in by.split(",")):
            if name and name not in have:
                out.append(f"aggregates by {name!r}, which {', '.join(sorted(set(re.findall(r'threadline_[a-z0-9_]+', inner))))} "
                           f"does not have")
    return out


def check_cnpg_cluster(rep, where, doc, ctx):
    need(rep, where, doc, ["spec.instances", "spec.storage.size", "spec.bootstrap.initdb.database",
                           "spec.bootstrap.initdb.owner"])
    if not isinstance(dig(doc, "spec.instances"), int) or dig(doc, "spec.instances") < 1:
        rep.error(where, f"{kn(doc)}: spec.instances must be a positive integer")
    sync = dig(doc, "spec.postgresql.synchronous")
    if sync is not None and (sync.get("method") not in ("any", "first") or
                             not isinstance(sync.get("number"), int) or
                             sync["number"] >= dig(doc, "spec.instances")):
        rep.error(where, f"{kn(doc)}: synchronous needs method any|first and number < instances")
    for p in dig(doc, "spec.plugins") or []:
        if not p.get("name"):
            rep.error(where, f"{kn(doc)}: a plugin without name")
        obj = dig(p, "parameters.barmanObjectName")
        if obj and obj not in ctx["by_kind"].get("ObjectStore", {}):
            rep.error(where, f"{kn(doc)}: plugin uses ObjectStore {obj}, which this overlay does not have")
    for key, v in (dig(doc, "spec.postgresql.parameters") or {}).items():
        if not isinstance(v, str):
            rep.error(where, f"{kn(doc)}: postgresql parameter {key} must be a string")
    # A managed role's password Secret exists before the Cluster asks for it:
    # made in the Cluster's own overlay (or out of band, before it), never
    # in one applied later, or the roles are missing when the migration
    # grants them (migrations/0029_service_roles.sql stops).
    secrets = ctx["by_kind"].get("Secret", {})
    managed = {r.get("name"): r for r in dig(doc, "spec.managed.roles") or []}
    for rname, in_roles in SERVICE_DB_ROLES.items():
        role = managed.get(rname)
        if role is None:
            rep.error(where, f"{kn(doc)}: no managed role {rname}: the migrations grant it and stop without it")
            continue
        if sorted(role.get("inRoles") or []) != in_roles:
            rep.error(where, f"{kn(doc)}: managed role {rname} must be a member of "
                             f"{in_roles or 'no role'}, not {role.get('inRoles') or 'none'} "
                             f"(migrations/0031_relay_role.sql)")
        if dig(role, "passwordSecret.name") != "threadline-db-" + rname.removeprefix("threadline_").replace("_", "-"):
            rep.error(where, f"{kn(doc)}: managed role {rname} takes its password from "
                             f"{dig(role, 'passwordSecret.name')}, not its service's Secret")
    for role in dig(doc, "spec.managed.roles") or []:
        sname = dig(role, "passwordSecret.name")
        if not sname:
            continue
        if sname in secrets:
            sec = secrets[sname]
            if sec.get("type") != "kubernetes.io/basic-auth":
                rep.error(where, f"{kn(doc)}: managed role {role.get('name')}'s Secret {sname} must be of type "
                                 f"kubernetes.io/basic-auth")
            if str(dig(sec, "metadata.labels") and sec["metadata"]["labels"].get("cnpg.io/reload")) != "true":
                rep.error(where, f"{kn(doc)}: managed role {role.get('name')}'s Secret {sname} lacks the label "
                                 f"cnpg.io/reload: \"true\" (a changed password waits for a reconciliation)")
            continue
        for other, docs in ctx["renders"]:
            if other.split("/")[0] == where.split("/")[0] and other != where and any(
                    d.get("kind") == "Secret" and dig(d, "metadata.name") == sname for d in docs):
                rep.error(where, f"{kn(doc)}: managed role {role.get('name')} takes its password from Secret "
                                 f"{sname}, which {other} makes: applied after the Cluster, so the role is "
                                 f"missing when the migration grants it; make it in {where}")


def check_scheduledbackup(rep, where, doc, ctx):
    need(rep, where, doc, ["spec.schedule", "spec.cluster.name"])
    if len(str(dig(doc, "spec.schedule") or "").split()) != 6:
        rep.error(where, f"{kn(doc)}: schedule takes six fields (seconds first)")
    if dig(doc, "spec.cluster.name") not in ctx["by_kind"].get("Cluster", {}):
        rep.error(where, f"{kn(doc)}: cluster {dig(doc, 'spec.cluster.name')} is not in this overlay")
    method = dig(doc, "spec.method") or "barmanObjectStore"
    if method not in ("barmanObjectStore", "volumeSnapshot", "plugin"):
        rep.error(where, f"{kn(doc)}: unknown method {method}")
    if method == "plugin":
        need(rep, where, doc, ["spec.pluginConfiguration.name"])


def check_objectstore(rep, where, doc, ctx):
    need(rep, where, doc, ["spec.configuration.destinationPath"])


def check_certificate(rep, where, doc, ctx):
    need(rep, where, doc, ["spec.secretName", "spec.issuerRef.name", "spec.dnsNames"])


def check_issuer(rep, where, doc, ctx):
    need(rep, where, doc, ["spec"])


def check_podmonitor(rep, where, doc, ctx):
    need(rep, where, doc, ["spec.selector", "spec.podMetricsEndpoints"])


CUSTOM = {
    ("keda.sh/v1alpha1", "ScaledObject"): check_scaledobject,
    ("monitoring.coreos.com/v1", "ServiceMonitor"): check_servicemonitor,
    ("monitoring.coreos.com/v1", "PodMonitor"): check_podmonitor,
    ("monitoring.coreos.com/v1", "PrometheusRule"): check_prometheusrule,
    ("postgresql.cnpg.io/v1", "Cluster"): check_cnpg_cluster,
    ("postgresql.cnpg.io/v1", "ScheduledBackup"): check_scheduledbackup,
    ("barmancloud.cnpg.io/v1", "ObjectStore"): check_objectstore,
    ("cert-manager.io/v1", "Certificate"): check_certificate,
    ("cert-manager.io/v1", "Issuer"): check_issuer,
    ("cert-manager.io/v1", "ClusterIssuer"): check_issuer,
}


# ---------------------------------------------------------------- workloads

def selects(selector, obj) -> bool:
    """A Service/ServiceMonitor-style selector (matchLabels or plain map, matchExpressions In)."""
    if not selector:
        return False
    labels = dig(obj, "metadata.labels") or {}
    plain = selector.get("matchLabels", None)
    if plain is None and "matchExpressions" not in selector:
        plain = selector
    for k, v in (plain or {}).items():
        if labels.get(k) != v:
            return False
    for e in selector.get("matchExpressions") or []:
        if e.get("operator") == "In" and labels.get(e["key"]) not in e.get("values", []):
            return False
    return True


def pod_spec(doc):
    if doc["kind"] == "CronJob":
        return dig(doc, "spec.jobTemplate.spec.template.spec")
    return dig(doc, "spec.template.spec")


def check_pod_security(rep, where, doc):
    spec = pod_spec(doc) or {}
    psc = spec.get("securityContext") or {}
    if dig(psc, "seccompProfile.type") != "RuntimeDefault":
        rep.error(where, f"{kn(doc)}: pod securityContext.seccompProfile.type must be RuntimeDefault")
    for c in (spec.get("initContainers") or []) + (spec.get("containers") or []):
        sc = c.get("securityContext") or {}
        name = f"{kn(doc)} container {c.get('name')}"
        if not (sc.get("runAsNonRoot") or psc.get("runAsNonRoot")):
            rep.error(where, f"{name}: runAsNonRoot is not set")
        if sc.get("readOnlyRootFilesystem") is not True:
            rep.error(where, f"{name}: readOnlyRootFilesystem must be true")
        if sc.get("allowPrivilegeEscalation") is not False:
            rep.error(where, f"{name}: allowPrivilegeEscalation must be false")
        if "ALL" not in (dig(sc, "capabilities.drop") or []):
            rep.error(where, f"{name}: capabilities.drop must include ALL")
        for part in ("requests.cpu", "requests.memory", "limits.memory"):
            if dig(c, f"resources.{part}") is None:
                rep.error(where, f"{name}: resources.{part} is not set")


def provided_settings(rep, where, doc, container, docs_by_kind):
    """key -> (source, value-or-None, definite)."""
    out = {}
    for ef in container.get("envFrom") or []:
        if "configMapRef" in ef:
            name = ef["configMapRef"]["name"]
            cm = docs_by_kind.get("ConfigMap", {}).get(name)
            if cm is None:
                if not ef["configMapRef"].get("optional"):
                    rep.error(where, f"{kn(doc)}: envFrom ConfigMap {name} is not in this overlay")
                continue
            for k, v in (cm.get("data") or {}).items():
                out[k] = (f"ConfigMap {name}", str(v), str(v).strip() != "")
        elif "secretRef" in ef:
            name = ef["secretRef"]["name"]
            sec = docs_by_kind.get("Secret", {}).get(name)
            if sec is None:
                rep.error(where, f"{kn(doc)}: envFrom Secret {name} is not in the overlay, so its keys "
                                 f"cannot be checked; reference keys one by one with secretKeyRef")
                continue
            for k in list((sec.get("data") or {})) + list((sec.get("stringData") or {})):
                out[k] = (f"Secret {name}", None, True)
    for e in container.get("env") or []:
        k = e["name"]
        if "value" in e:
            out[k] = ("env", str(e["value"]), str(e["value"]).strip() != "")
        elif "valueFrom" in e:
            vf = e["valueFrom"]
            ref = vf.get("secretKeyRef") or vf.get("configMapKeyRef")
            if ref is not None:
                out[k] = (f"{'Secret' if 'secretKeyRef' in vf else 'ConfigMap'} {ref.get('name')}/{ref.get('key')}",
                          None, not ref.get("optional", False))
            else:
                out[k] = ("fieldRef", None, True)
    return out


def check_settings(rep, where, doc, container, binary, provided, bins):
    reads = bins[binary].reads
    name = f"{kn(doc)} container {container['name']} ({binary})"
    for k, (src, _, _) in sorted(provided.items()):
        if k not in reads.keys and k not in EXTRA_READS:
            rep.error(where, f"{name}: {k} (from {src}) is not a setting {binary} reads — a typo, "
                             f"or a setting meant for another service")
    for k, (src, value, _) in sorted(provided.items()):
        if k in reads.bounds and value is not None and value.strip():
            lo, hi = reads.bounds[k]
            if not value.strip().isdigit() or not lo <= int(value) <= hi:
                rep.error(where, f"{name}: {k}={value} (from {src}) is not an integer in {lo}..={hi} "
                                 f"(read in {reads.where.get(k)}); the binary refuses to start")
    for k in sorted(FORBIDDEN.get(binary, {}).keys() & provided.keys()):
        rep.error(where, f"{name}: {k} (from {provided[k][0]}) must not be given to {binary}: "
                         f"{FORBIDDEN[binary][k]}")
    for k in sorted(reads.required):
        cond = CONDITIONAL.get((binary, k)) or CONDITIONAL.get(("*", k))
        if cond is None:
            if k not in provided:
                rep.error(where, f"{name}: required setting {k} is provided nowhere "
                                 f"(read in {reads.where.get(k)})")
            elif not provided[k][2]:
                rep.error(where, f"{name}: required setting {k} comes from {provided[k][0]}, which is "
                                 f"optional or empty")
        else:
            test, why = cond
            if test(provided) and k not in provided:
                rep.error(where, f"{name}: {k} is required {why}, and is provided nowhere")


# The database role each service logs in as (migrations/0029_service_roles.sql,
# 0031_relay_role.sql): the `uri` of its own Secret threadline-db-<role>.
DB_SECRET_OF = {
    "threadline-context-builder": "threadline-db-context-builder",
    "threadline-inference": "threadline-db-inference",
    "threadline-publisher": "threadline-db-publisher",
}
# Managed roles: the one membership allowed (the relay holds the gateway's
# rights and the outbox's consumption); any other would hand a role rights
# it was not granted.
SERVICE_DB_ROLES = {"threadline_gateway": [], "threadline_relay": ["threadline_gateway"],
                    "threadline_context_builder": [], "threadline_inference": [],
                    "threadline_publisher": []}


def check_database_login(rep, where, doc, binary, provided):
    """A service's DATABASE_URL is its own role's: the relay's for a gateway
    that relays (it consumes the outbox), the gateway's for one that does
    not (it may only add to the outbox), each worker's its own."""
    name = f"{kn(doc)} ({binary})"
    if binary == "threadline-gateway":
        relay_on = (provided.get("THREADLINE_RELAY_ENABLED") or ("", "true"))[1] != "false"
        want = "threadline-db-relay" if relay_on else "threadline-db-gateway"
        why = (" (THREADLINE_RELAY_ENABLED is on: the relay reads, leases and deletes outbox rows, which only "
               "threadline_relay may)" if relay_on else
               " (THREADLINE_RELAY_ENABLED is off: the public gateway's role only adds to the outbox)")
    else:
        want, why = DB_SECRET_OF.get(binary), ""
    if want is None:
        return
    got = provided.get("DATABASE_URL")
    if got is None or got[0] != f"Secret {want}/uri":
        rep.error(where, f"{name}: DATABASE_URL must be the key uri of Secret {want}{why}; it is "
                         f"{got[0] if got else 'not set'}")


def check_service_container(rep, where, doc, container, binary, provided, ctx):
    check_database_login(rep, where, doc, binary, provided)
    addr_key = SERVICES[binary]
    name = f"{kn(doc)} container {container['name']}"
    addr = provided.get(addr_key)
    if addr is None or addr[1] is None:
        rep.error(where, f"{name}: {addr_key} must be set to 0.0.0.0:PORT (the default listens on 127.0.0.1)")
        return
    m = re.fullmatch(r"(0\.0\.0\.0|\[::\]):(\d+)", addr[1])
    if not m:
        rep.error(where, f"{name}: {addr_key}={addr[1]} is not reachable from outside the pod; use 0.0.0.0:PORT")
        return
    port = int(m.group(2))
    ports = {p.get("name"): p.get("containerPort") for p in container.get("ports") or []}
    if port not in ports.values():
        rep.error(where, f"{name}: no containerPort {port} ({addr_key})")
    routes = ctx["routes"]
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        p = container.get(probe)
        if p is None:
            rep.error(where, f"{name}: no {probe}")
            continue
        got_path = dig(p, "httpGet.path")
        got_port = dig(p, "httpGet.port")
        got_port = ports.get(got_port, got_port)
        if got_path != path or got_port != port:
            rep.error(where, f"{name}: {probe} must be GET {path} on port {port}, got {got_path} on {got_port}")
        if path not in routes:
            rep.error(where, f"{name}: the code serves no {path}")
    otlp = provided.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if otlp and otlp[1]:
        if not re.match(r"https?://", otlp[1]) or otlp[1].rstrip("/").endswith("/v1/traces"):
            rep.error(where, f"{name}: OTEL_EXPORTER_OTLP_ENDPOINT is the OTLP/HTTP base URL "
                             f"(the code appends /v1/traces), got {otlp[1]}")
        elif ":4317" in otlp[1]:
            rep.error(where, f"{name}: OTEL_EXPORTER_OTLP_ENDPOINT points at 4317 (gRPC); the code speaks OTLP/HTTP (4318)")
    grace = dig(doc, "spec.template.spec.terminationGracePeriodSeconds") or 30
    timeout = provided.get("THREADLINE_MODEL_TIMEOUT_MS")
    if binary == "threadline-inference":
        ms = int(timeout[1]) if timeout and timeout[1] else 20000
        if grace * 1000 <= ms:
            rep.error(where, f"{name}: terminationGracePeriodSeconds {grace} does not cover a model call "
                             f"(THREADLINE_MODEL_TIMEOUT_MS {ms})")


# Routes Slack calls, which every overlay deploying the gateway must route
# to it through an Ingress: route -> the setting that turns it on (None:
# always; the OAuth install flow when the gateway is given SLACK_CLIENT_ID).
SLACK_ROUTES = {
    "/slack/events": None,  # the Events API Request URL
    "/slack/install": "SLACK_CLIENT_ID",
    "/slack/oauth/callback": "SLACK_CLIENT_ID",
}


def check_ingress(rep, where, doc, ctx):
    """Paths are public gateway routes (never /healthz, /readyz, /metrics)
    on a Service port; records which ones reach the gateway's pods."""
    services = ctx["by_kind"].get("Service", {})
    public = ctx["public_routes"]
    for rule in dig(doc, "spec.rules") or []:
        for p in dig(rule, "http.paths") or []:
            svc = dig(p, "backend.service.name")
            port = dig(p, "backend.service.port.name") or dig(p, "backend.service.port.number")
            s = services.get(svc)
            if s is None:
                rep.error(where, f"{kn(doc)}: backend Service {svc} is not in this overlay")
                continue
            if port not in {q.get("name") for q in dig(s, "spec.ports") or []} | {q.get("port") for q in dig(s, "spec.ports") or []}:
                rep.error(where, f"{kn(doc)}: Service {svc} has no port {port}")
            if p.get("path") not in public:
                rep.error(where, f"{kn(doc)}: path {p.get('path')} is not a public gateway route "
                                 f"({sorted(public)}; health and metrics stay inside the cluster)")
                continue
            if any(ctx["binary_of"].get(dig(w, "metadata.name")) == "threadline-gateway"
                   and selects(dig(s, "spec.selector"), {"metadata": {"labels": pod_labels(w)}})
                   for w in ctx["by_kind"].get("Deployment", {}).values()):
                ctx["ingress_routes"].add(p.get("path"))
    if not dig(doc, "spec.tls"):
        rep.error(where, f"{kn(doc)}: no TLS")


def check_slack_routes(rep, where, ctx):
    """An overlay that deploys the gateway routes Slack's calls to it."""
    gateways = [w for w, b in ctx["binary_of"].items() if b == "threadline-gateway"]
    for route, setting in SLACK_ROUTES.items():
        if route not in ctx["public_routes"]:
            rep.error("check_manifests.py", f"SLACK_ROUTES lists {route}, which the gateway no longer serves")
            continue
        for w in gateways:
            if setting is not None and setting not in ctx["settings_of"][w]:
                continue
            if route not in ctx["ingress_routes"]:
                rep.error(where, f"Deployment/{w}: no Ingress of this overlay routes {route} to its pods"
                                 + (f" (it is given {setting})" if setting else " (Slack's Request URL)"))


# Slack holds at most this many Socket Mode connections per app at once;
# it closes the ones beyond (disconnect, reason too_many_websockets).
SLACK_SOCKET_LIMIT = 10
KEDA_DEFAULT_MAX_REPLICAS = 100  # a ScaledObject without maxReplicaCount


def rolling_pods(value, replicas: int, default: str, round_up: bool) -> int:
    """A RollingUpdate's maxSurge (round_up) or maxUnavailable, resolved
    against `replicas` as Kubernetes does (percentages: surge rounds up,
    unavailable down)."""
    v = default if value is None else str(value)
    if v.endswith("%"):
        n = replicas * int(v[:-1])
        return -(-n // 100) if round_up else n // 100
    return int(v)


def peak_pods(doc, by_kind) -> tuple[int, int, int, str]:
    """(replicas, surge, terminating, how): the most replicas workload `doc`
    can be scaled to (the largest maxReplicas of the HPAs and KEDA
    ScaledObjects of its overlay that scale it, else spec.replicas), the
    pods a RollingUpdate starts above them (maxSurge, 25% unset), and the
    old pods it deletes meanwhile, which are Terminating — still running,
    holding what they hold through preStop and the grace period — while
    their replacements start (maxUnavailable, 25% unset). Kubernetes
    resolves both against the replicas (surge rounding up, unavailable
    down; both 0 makes unavailable 1). Recreate deletes every old pod
    before starting any new one: no overlap."""
    kind, name = doc["kind"], dig(doc, "metadata.name")
    scalers = [(int(dig(h, "spec.maxReplicas") or 0), f"{kn(h)} maxReplicas")
               for h in by_kind.get("HorizontalPodAutoscaler", {}).values()
               if (dig(h, "spec.scaleTargetRef.kind"), dig(h, "spec.scaleTargetRef.name")) == (kind, name)]
    scalers += [(int(dig(o, "spec.maxReplicaCount") or KEDA_DEFAULT_MAX_REPLICAS), f"{kn(o)} maxReplicaCount")
                for o in by_kind.get("ScaledObject", {}).values()
                if (dig(o, "spec.scaleTargetRef.kind") or "Deployment", dig(o, "spec.scaleTargetRef.name")) == (kind, name)]
    if scalers:
        replicas, how = max(scalers)
    else:
        replicas = dig(doc, "spec.replicas")
        replicas, how = (1, "spec.replicas unset") if replicas is None else (int(replicas), "spec.replicas")
    surge = terminating = 0
    if kind == "Deployment" and (dig(doc, "spec.strategy.type") or "RollingUpdate") == "RollingUpdate":
        surge = rolling_pods(dig(doc, "spec.strategy.rollingUpdate.maxSurge"), replicas, "25%", True)
        terminating = rolling_pods(dig(doc, "spec.strategy.rollingUpdate.maxUnavailable"), replicas, "25%", False)
        if surge == 0 and terminating == 0:
            terminating = 1
    return replicas, surge, terminating, f"{how} {replicas}"


def check_socket_connections(rep, where, ctx):
    """Each pod of a gateway with THREADLINE_SOCKET_MODE on (or not knowable
    offline) holds THREADLINE_SOCKET_CONNECTIONS connections to Slack: the
    most pods the overlay can run at once (scaled to the maximum, plus a
    rollout's surge pods and the old pods still terminating beside them),
    summed over its Socket Mode workloads, times theirs must stay within
    what Slack allows per app."""
    terms, total = [], 0
    for w, doc, binary, provided in ctx["workloads"]:
        if w != where or binary != "threadline-gateway" or not flag_on("THREADLINE_SOCKET_MODE")(provided):
            continue
        given = provided.get("THREADLINE_SOCKET_CONNECTIONS")
        if given is None:
            conn, src = ctx["socket_connections_default"], "unset, the default"
        elif given[1] is None:  # from a Secret: it could be the most the code accepts
            conn, src = ctx["bins"][binary].reads.bounds["THREADLINE_SOCKET_CONNECTIONS"][1], f"from {given[0]}, up to"
        elif given[1].strip().isdigit():
            conn, src = int(given[1]), given[0]
        else:
            continue  # check_settings reports it
        replicas, surge, terminating, how = peak_pods(doc, ctx["by_kind"])
        pods = replicas + surge + terminating
        total += pods * conn
        mode = provided["THREADLINE_SOCKET_MODE"]
        terms.append(f"{kn(doc)}"
                     + (f" (THREADLINE_SOCKET_MODE from {mode[0]}, not knowable offline: taken as on)"
                        if flag_unknowable(provided, "THREADLINE_SOCKET_MODE") else "")
                     + f": up to {pods} pods ({how}"
                     + (f" + {surge} surging" if surge else "")
                     + (f" + {terminating} terminating" if terminating else "")
                     + (" in a rollout" if surge or terminating else "")
                     + f") × THREADLINE_SOCKET_CONNECTIONS={conn} ({src}) = {pods * conn}")
    if not terms:
        return
    ctx["socket_summary"].append(f"{where}: {'; '.join(terms)} of the {SLACK_SOCKET_LIMIT} Slack allows per app")
    if total > SLACK_SOCKET_LIMIT:
        rep.error(where, f"{'; '.join(terms)} Socket Mode connections"
                         + (f" ({total} together)" if len(terms) > 1 else "")
                         + f", more than the {SLACK_SOCKET_LIMIT} Slack allows per app (it closes the rest): "
                           f"lower maxReplicas or THREADLINE_SOCKET_CONNECTIONS, or roll with maxSurge 0 "
                           f"and maxUnavailable 1")


# Settings every service must agree on within one overlay: each service
# declares the streams at start with them, so differing values would make
# the services rewrite each other's stream configuration.
SHARED_SETTINGS = ["THREADLINE_BUS_PREFIX", "THREADLINE_STREAM_REPLICAS", "THREADLINE_DLQ_MAX_AGE_HOURS"]


def check_shared_settings(rep, where, ctx):
    for key in SHARED_SETTINGS:
        values = {}
        for workload, binary in ctx["binary_of"].items():
            if binary in SERVICES:
                got = ctx["settings_of"][workload].get(key)
                values[workload] = got[1] if got and got[1] is not None else "(default)"
        if len(set(values.values())) > 1:
            rep.error(where, f"{key} differs between services ({values}); every service declares "
                             f"the streams with it, so they must agree")


def check_cli_container(rep, where, doc, container, ctx):
    name = f"{kn(doc)} container {container['name']}"
    args = container.get("args") or []
    if container.get("command") or not args:
        rep.error(where, f"{name}: run the cli image's entrypoint with args [<subcommand>, ...]")
    elif args[0] not in ctx["cli_commands"]:
        rep.error(where, f"{name}: {args[0]!r} is not a threadline subcommand ({sorted(ctx['cli_commands'])})")
    if doc["kind"] == "CronJob" and dig(doc, "spec.concurrencyPolicy") != "Forbid":
        rep.error(where, f"{kn(doc)}: concurrencyPolicy must be Forbid (runs of a CLI command must not overlap)")


def np_selects(selector, labels) -> bool:
    """A NetworkPolicy podSelector ({} selects every pod)."""
    if selector is None:
        return False
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for e in selector.get("matchExpressions") or []:
        op, val = e.get("operator"), labels.get(e.get("key"))
        if (op == "In" and val not in e.get("values", [])) or (op == "NotIn" and val in e.get("values", [])) \
                or (op == "Exists" and val is None) or (op == "DoesNotExist" and val is not None):
            return False
    return True


def allows_port(rule, port: int) -> bool:
    ports = rule.get("ports")
    return not ports or any(p.get("port") in (port, None) for p in ports)


DB_POD = {"cnpg.io/cluster": "threadline-db"}


def env_of(where: str) -> str:
    """The environment of an overlay (dev/app -> dev)."""
    return where.split("/", 1)[0]


def env_policy_sets(ctx, where):
    """The NetworkPolicies in force next to the pods of overlay `where`: its
    own and those of the other overlays of its environment that it does not
    redefine. Overlays that define one policy differently are alternatives
    (production/app or app-without-keda): one set per combination."""
    own = {(ns_of(np), dig(np, "metadata.name")): np for w, np in ctx["policies"] if w == where}
    others: dict[tuple, list] = {}
    for w, np in ctx["policies"]:
        key = (ns_of(np), dig(np, "metadata.name"))
        if w != where and env_of(w) == env_of(where) and key not in own:
            variants = others.setdefault(key, [])
            if np not in variants:
                variants.append(np)
    return [list(own.values()) + list(combo) for combo in itertools.product(*others.values())]


def reachable(ctx, where, ns, labels, peer_ns, peer_labels, port, default_deny=True):
    """(egress allowed, ingress allowed) for pods (ns, labels) of overlay
    `where` connecting to pods (peer_ns, peer_labels) on `port`, under every
    set of policies of the environment. default_deny: judge as under the
    namespace's default-deny (the infra overlays deploy it), so that the
    connection needs a rule of its own on both sides."""
    egress = ingress = True
    for policies in env_policy_sets(ctx, where):
        egress &= np_allows(policies, "Egress", ns, labels, peer_ns, peer_labels, port, default_deny)
        ingress &= np_allows(policies, "Ingress", peer_ns, peer_labels, ns, labels, port, default_deny)
    return egress, ingress


def check_db_reachable(rep, ctx):
    """Every pod given DATABASE_URL may connect to Postgres under the
    namespace's default-deny: an egress rule of its own and an ingress rule
    of the threadline-db policy (rendered in the infra overlays)."""
    seen = set()
    for where, doc, _binary, provided in ctx["workloads"]:
        if "DATABASE_URL" not in provided or (where, kn(doc)) in seen:
            continue
        seen.add((where, kn(doc)))
        labels = pod_labels(doc)
        egress, ingress = reachable(ctx, where, ns_of(doc), labels, ns_of(doc), DB_POD, 5432)
        if not egress:
            rep.error(where, f"{kn(doc)}: reads DATABASE_URL but no NetworkPolicy lets its pods "
                             f"({labels.get('app.kubernetes.io/name')}) reach Postgres on 5432")
        if not ingress:
            rep.error(where, f"{kn(doc)}: reads DATABASE_URL but the Postgres NetworkPolicy does not admit its pods "
                             f"({labels.get('app.kubernetes.io/name')}) on 5432 (k8s/postgres/networkpolicy.yaml)")


# ---------------------------------------------------------------- NATS

NATS_VALUES = "deploy/k8s/nats/values.yaml"
# Where deploy/README.md gives each environment's `helm upgrade --install`
# of the NATS chart: its release name, namespace and --set flags apply on
# top of values.yaml (dev: --set config.cluster.enabled=false, one server).
NATS_INSTALLS = {"production": "## Step by step (production)", "dev": "### Dev cluster"}
# Environments that must survive losing a NATS server or its volume: a
# cluster of 3+ servers, and every stream on 3 of them (values.yaml: "3 in
# the production overlay, which needs the 3 servers below").
HA_ENVS = {"production"}
NATS_CLIENT_PORT = 4222      # the chart's config.nats.port
NATS_MONITOR_PORT = 8222     # the chart's config.monitor.port
KEDA_NAMESPACE = "keda"      # deploy/README.md, "Prerequisites in the cluster"
# nats-server refuses a max_payload above max_pending (default 64 MiB).
NATS_MAX_PENDING = 64 * 1024 * 1024
# What an EventAccepted adds to the Slack body it carries (ids, team,
# channel, timestamps, trace context): generously.
ENVELOPE_ALLOWANCE = 64 * 1024
# Size suffixes of nats-server's configuration parser (conf/parse.go).
NATS_UNITS = {"": 1, "k": 1000, "kb": 1024, "m": 1000 ** 2, "mb": 1024 ** 2, "g": 1000 ** 3, "gb": 1024 ** 3}


def nats_installs(rep, readme: str) -> dict[str, dict]:
    """env -> {release, namespace, sets, command} of the NATS chart, from
    the `helm upgrade --install` commands of deploy/README.md."""
    out = {}
    for env, heading in NATS_INSTALLS.items():
        where = f"deploy/README.md ({heading.lstrip('# ')})"
        if "\n" + heading not in readme:
            rep.error(where, "section not found: update NATS_INSTALLS in deploy/check/check_manifests.py")
            continue
        section = re.split(r"\n#{2,3} ", readme.split("\n" + heading, 1)[1], maxsplit=1)[0]
        m = re.search(r"helm upgrade --install ((?:[^\n\\]|\\\n)*)", section)
        if not m:
            rep.error(where, "no `helm upgrade --install` of the NATS chart")
            continue
        args = shlex.split(m.group(1).replace("\\\n", " "))
        inst = {"namespace": "default", "sets": {}, "set_args": [], "values": [], "positional": [],
                "command": "helm upgrade --install " + " ".join(args)}
        i = 0
        while i < len(args):
            a = args[i]
            if a in ("-n", "--namespace", "-f", "--values", "--set", "--version") and i + 1 < len(args):
                v = args[i + 1]
                if a in ("-n", "--namespace"):
                    inst["namespace"] = v
                elif a in ("-f", "--values"):
                    inst["values"].append(v)
                elif a == "--set":
                    inst["set_args"].append(f"--set {v}")
                    for kv_ in v.split(","):
                        k, _, val = kv_.partition("=")
                        inst["sets"][k] = (True if val == "true" else False if val == "false"
                                           else int(val) if val.isdigit() else val)
                i += 2
            else:
                if not a.startswith("-"):
                    inst["positional"].append(a)
                i += 1
        if len(inst["positional"]) < 2 or inst["positional"][1].rsplit("/", 1)[-1] != "nats":
            rep.error(where, f"`{inst['command']}` does not install the nats chart (release chart)")
            continue
        if NATS_VALUES not in inst["values"]:
            rep.error(where, f"`{inst['command']}` does not use -f {NATS_VALUES}")
        inst["release"] = inst["positional"][0]
        out[env] = inst
    return out


def nats_effective_values(values: dict, sets: dict) -> dict:
    out = copy.deepcopy(values)
    for key, val in sets.items():
        cur = out
        parts = key.split(".")
        for part in parts[:-1]:
            if not isinstance(cur.get(part), dict):
                cur[part] = {}
            cur = cur[part]
        cur[parts[-1]] = val
    return out


def nats_size(value) -> int | None:
    """A size as nats-server reads it ("<< 4MB >>": the chart passes it unquoted)."""
    m = re.fullmatch(r"\s*(?:<<)?\s*(\d+)\s*([A-Za-z]*)\s*(?:>>)?\s*", str(value))
    if not m or m.group(2).lower() not in NATS_UNITS:
        return None
    return int(m.group(1)) * NATS_UNITS[m.group(2).lower()]


def check_nats(rep, ctx, values: dict, installs: dict):
    """For every environment that deploys the services: the NATS release
    it installs (values.yaml + README's --set flags) against what the
    services and the KEDA triggers of that environment need."""
    envs = sorted({env_of(w) for w, _, b, _ in ctx["workloads"] if b in SERVICES})
    for env in envs:
        if env not in installs:
            rep.error(f"{env}/*", f"deploys the services, but deploy/README.md does not say how NATS is installed "
                                  f"for {env} (NATS_INSTALLS in deploy/check/check_manifests.py)")
            continue
        inst = installs[env]
        v = nats_effective_values(values, inst["sets"])
        sets = " ".join(inst["set_args"])
        vwhere = f"{NATS_VALUES} ({env}{': ' + sets if sets else ''})"
        servers = check_nats_values(rep, vwhere, env, v, ctx)
        ctx["nats_summary"].append(
            f"{env}: release {inst['release']} in {inst['namespace']}, {servers} server(s), JetStream "
            f"{'on' if dig(v, 'config.jetstream.enabled') is True else 'OFF'}, file store "
            f"{dig(v, 'config.jetstream.fileStore.pvc.size') or '?'} PVC, max_payload "
            f"{str(dig(v, 'config.merge.max_payload') or '1MB (default)').strip('<> ')}")
        services = [(w, d, b, p) for w, d, b, p in ctx["workloads"] if env_of(w) == env]

        # Stream replicas: every service declares the streams with them.
        by_overlay: dict[str, set[int]] = {}
        for w, d, b, p in services:
            if b not in SERVICES:
                continue
            got = p.get("THREADLINE_STREAM_REPLICAS")
            val = got[1] if got and got[1] is not None else "1"  # the code's default
            if val.strip().isdigit():
                by_overlay.setdefault(w, set()).add(int(val))
        ctx["nats_summary"][-1] += ", stream replicas " + ", ".join(
            f"{w.split('/', 1)[-1]} {'/'.join(map(str, sorted(r)))}" for w, r in sorted(by_overlay.items()))
        for w, reps in sorted(by_overlay.items()):
            for r in sorted(reps):
                if r > servers:
                    rep.error(w, f"THREADLINE_STREAM_REPLICAS={r} exceeds the {servers} NATS server(s) of {vwhere}: "
                                 f"JetStream would refuse to create the streams")
                if env in HA_ENVS and r < min(3, servers):
                    rep.error(w, f"THREADLINE_STREAM_REPLICAS={r}: {env} keeps every stream on 3 NATS servers "
                                 f"(with fewer, losing one server or its volume loses queued messages)")

        # max_payload: an EventAccepted carries a whole Slack body.
        raw = dig(v, "config.merge.max_payload")
        payload = 1024 * 1024 if raw is None else nats_size(raw)
        if payload is None:
            rep.error(vwhere, f"config.merge.max_payload {raw!r} is not a size nats-server reads "
                              f"(<< N[k|kb|m|mb|g|gb] >>)")
        else:
            if payload > NATS_MAX_PENDING:
                rep.error(vwhere, f"config.merge.max_payload {raw} exceeds nats-server's max_pending (64 MiB)")
            gateway = ctx["bins"].get("threadline-gateway")
            bounds = gateway.reads.bounds.get("THREADLINE_GATEWAY_MAX_BODY_BYTES") if gateway else None
            if bounds is None:
                rep.error("check_manifests.py", "THREADLINE_GATEWAY_MAX_BODY_BYTES is no longer a bounded setting "
                                                "of the gateway: update check_nats")
            for w, d, b, p in services:
                if b != "threadline-gateway" or bounds is None:
                    continue
                got = p.get("THREADLINE_GATEWAY_MAX_BODY_BYTES")
                body = int(got[1]) if got and got[1] and got[1].strip().isdigit() else bounds[1]
                if payload < body + ENVELOPE_ALLOWANCE:
                    rep.error(vwhere, f"config.merge.max_payload {'(default 1 MiB)' if raw is None else raw} = "
                                      f"{payload} bytes cannot carry an EventAccepted of {kn(d)} in {w} "
                                      f"(a Slack body of up to {body} bytes, THREADLINE_GATEWAY_MAX_BODY_BYTES, "
                                      f"plus its envelope)")

        # NATS_URL: the release's client Service, reachable through the policies.
        release, nats_ns = inst["release"], inst["namespace"]
        client_port = dig(v, "config.nats.port") or NATS_CLIENT_PORT
        nats_pod = {"app.kubernetes.io/name": "nats", "app.kubernetes.io/instance": release}
        for w, d, b, p in services:
            if "NATS_URL" not in ctx["bins"][b].reads.keys or (b not in SERVICES and "NATS_URL" not in p):
                continue
            got = p.get("NATS_URL")
            if got is None:
                rep.error(w, f"{kn(d)}: NATS_URL is not set (the default nats://127.0.0.1:4222 is the pod "
                             f"itself); point it at the client Service {release} of the NATS release")
                continue
            for url in (got[1] or "").split(","):
                if not url.strip():
                    continue
                m = re.fullmatch(r"(?:nats|tls)://(?:[^@/]*@)?([A-Za-z0-9.-]+):(\d+)", url.strip())
                host = m.group(1).split(".") if m else []
                ok_host = m and host[0] == release and (
                    (len(host) == 1 and ns_of(d) == nats_ns) or
                    (len(host) > 1 and host[1] == nats_ns and host[2:] in ([], ["svc"], ["svc", "cluster", "local"])))
                if not ok_host or int(m.group(2)) != client_port:
                    rep.error(w, f"{kn(d)}: NATS_URL={url} (from {got[0]}) is not the client Service of the NATS "
                                 f"release: nats://{release}{'' if ns_of(d) == nats_ns else '.' + nats_ns}:{client_port} "
                                 f"({inst['command']})")
            labels = pod_labels(d)
            egress, ingress = reachable(ctx, w, ns_of(d), labels, nats_ns, nats_pod, client_port)
            if not egress:
                rep.error(w, f"{kn(d)}: reads NATS_URL but no NetworkPolicy lets its pods "
                             f"({labels.get('app.kubernetes.io/name')}) reach NATS on {client_port}")
            if not ingress:
                rep.error(w, f"{kn(d)}: reads NATS_URL but the NATS NetworkPolicy does not admit its pods "
                             f"({labels.get('app.kubernetes.io/name')}) on {client_port} (k8s/nats/networkpolicy.yaml)")

        check_nats_users(rep, ctx, env, vwhere, v, services)

        # KEDA reads consumer lag from every server's monitoring port,
        # through the release's headless Service.
        monitor_port = dig(v, "config.monitor.port") or NATS_MONITOR_PORT
        for w, docs in ctx["renders"]:
            if env_of(w) != env:
                continue
            for so in docs:
                if so["kind"] != "ScaledObject":
                    continue
                for i, trig in enumerate(dig(so, "spec.triggers") or []):
                    if trig.get("type") != "nats-jetstream":
                        continue
                    if dig(v, "config.monitor.enabled") is not True:
                        rep.error(vwhere, f"config.monitor.enabled must be true: {kn(so)} in {w} reads consumer "
                                          f"lag from the monitoring port")
                    ep = str(dig(trig, "metadata.natsServerMonitoringEndpoint") or "")
                    m = re.fullmatch(r"([A-Za-z0-9.-]+):(\d+)", ep)
                    host = m.group(1).split(".") if m else []
                    if not m or host[:2] != [f"{release}-headless", nats_ns] or \
                            host[2:] not in ([], ["svc"], ["svc", "cluster", "local"]) or int(m.group(2)) != monitor_port:
                        rep.error(w, f"{kn(so)} trigger {i}: natsServerMonitoringEndpoint {ep} is not the monitoring "
                                     f"port of the NATS release's headless Service: "
                                     f"{release}-headless.{nats_ns}.svc.cluster.local:{monitor_port}")
                    elif not reachable(ctx, w, KEDA_NAMESPACE, {}, nats_ns, nats_pod, monitor_port)[1]:
                        rep.error(w, f"{kn(so)} trigger {i}: the NATS NetworkPolicy does not admit KEDA "
                                     f"(namespace {KEDA_NAMESPACE}) on the monitoring port {monitor_port}")


NATS_AUTHORIZATION = "deploy/k8s/nats/authorization.json"
RENDER_AUTHORIZATION = "threadline nats auth --prefix tl --format helm > " + NATS_AUTHORIZATION
# The NATS user each threadline binary logs in as (the gateway binary:
# gateway when serving Slack, relay when relaying the outbox).
NATS_USER_OF = {
    "threadline-context-builder": "context-builder",
    "threadline-inference": "inference",
    "threadline-publisher": "publisher",
    "threadline": "operator",
}


def nats_password_var(value) -> str | None:
    """The environment variable a user's password names ("<< $X >>" -> X)."""
    m = re.fullmatch(r"\s*<<\s*\$([A-Za-z_][A-Za-z0-9_]*)\s*>>\s*", str(value))
    return m.group(1) if m else None


def nats_user_diff(want: dict, got: dict) -> list[str]:
    """How the authorization `got` differs from `want`, user by user."""
    def users(a):
        return {u.get("user"): u for u in (dig(a, "users") or []) if isinstance(u, dict)}
    w, g = users(want), users(got)
    out = [f"user {u} is missing" for u in sorted(set(w) - set(g))]
    out += [f"user {u} is not one the code renders" for u in sorted(set(g) - set(w))]
    for u in sorted(set(w) & set(g)):
        if w[u].get("password") != g[u].get("password"):
            out.append(f"user {u}: password {g[u].get('password')!r}, the code renders {w[u].get('password')!r}")
        for side in ("publish", "subscribe"):
            for kind in ("allow", "deny"):
                ws = set(dig(w[u], f"permissions.{side}.{kind}") or [])
                gs = set(dig(g[u], f"permissions.{side}.{kind}") or [])
                for extra in sorted(gs - ws):
                    out.append(f"user {u}: {side} {kind}s {extra}, which the code does not")
                for lack in sorted(ws - gs):
                    out.append(f"user {u}: {side} does not {kind} {lack}, which the code does")
    if not out and want != got:
        out.append("the same users and subjects, otherwise different")
    return out


def check_nats_users(rep, ctx, env, vwhere, v, services):
    """The broker's users are the code's, and each threadline container
    logs in as the one of its role."""
    want = dig(ctx.get("nats_authorization") or {}, "authorization")
    if not want:
        rep.error(NATS_AUTHORIZATION, f"no authorization in it: regenerate it ({RENDER_AUTHORIZATION})")
        return
    got = dig(v, "config.merge.authorization")
    if got != want:
        diff = nats_user_diff(want, got or {}) if got else ["config.merge.authorization is not set"]
        rep.error(vwhere, f"config.merge.authorization is not what the code renders ({NATS_AUTHORIZATION}; "
                          f"copy it from there): " + "; ".join(diff[:6]))
    users = {u["user"]: nats_password_var(u.get("password")) for u in want["users"]}
    # The prefix the permissions are for: the operator's "<prefix>.>".
    prefix = next((s[:-2] for u in want["users"] if u["user"] == "operator"
                   for s in dig(u, "permissions.publish.allow") or [] if s.endswith(".>") and not s.startswith("$")),
                  None)
    # Every password the authorization names comes from a Secret.
    cenv = dig(v, "container.env") or {}
    secret_of = {}
    for user, var in sorted(users.items()):
        if var is None:
            rep.error(NATS_AUTHORIZATION, f"user {user}: the password is not a variable (<< $NAME >>)")
            continue
        e = cenv.get(var)
        ref = dig(e, "valueFrom.secretKeyRef") if isinstance(e, dict) else None
        if e is None:
            rep.error(vwhere, f"config.merge.authorization names ${var} (user {user}) but container.env does not "
                              f"set it: nats-server would not start")
        elif not ref or not ref.get("name") or ref.get("key") is None:
            rep.error(vwhere, f"container.env.{var} (user {user}) must come from a Secret (valueFrom.secretKeyRef), "
                              f"not a value in the chart's values")
        else:
            secret_of[var] = (ref["name"], ref["key"])
    relays: dict[str, list[str]] = {}
    for w, d, b, p in services:
        if b not in SERVICES and not (b in NATS_USER_OF and "NATS_URL" in p):
            continue
        name = f"{kn(d)} ({b})"
        if b in SERVICES:
            got_prefix = p.get("THREADLINE_BUS_PREFIX")
            got_prefix = got_prefix[1] if got_prefix and got_prefix[1] else "tl"  # the code's default
            if prefix is not None and got_prefix != prefix:
                rep.error(w, f"{name}: THREADLINE_BUS_PREFIX={got_prefix}, but the NATS users' permissions are "
                             f"for the prefix {prefix} ({NATS_AUTHORIZATION}): the services could use no subject")
        relay_on = b == "threadline-gateway" and (p.get("THREADLINE_RELAY_ENABLED") or ("", "true"))[1] != "false"
        expected = ("relay" if relay_on else "gateway") if b == "threadline-gateway" else NATS_USER_OF[b]
        user = p.get("NATS_USER")
        if user is None or not user[1]:
            rep.error(w, f"{name}: NATS_USER is not set: the broker admits only its users; this one logs in "
                         f"as {expected}")
            continue
        if user[1] != expected:
            why = (" (THREADLINE_RELAY_ENABLED is on: the user gateway may publish only to the spool)" if relay_on
                   else " (THREADLINE_RELAY_ENABLED is off)" if b == "threadline-gateway" else "")
            rep.error(w, f"{name}: NATS_USER={user[1]}, but it must log in as {expected}{why}")
        if relay_on:
            relays.setdefault(w, []).append(kn(d))
        password = p.get("NATS_PASSWORD")
        var = users.get(user[1])
        if password is None:
            rep.error(w, f"{name}: NATS_PASSWORD is not set (NATS_USER is {user[1]})")
        elif not password[0].startswith("Secret ") or password[1] is not None:
            rep.error(w, f"{name}: NATS_PASSWORD comes from {password[0]}: take it from the Secret of the NATS "
                         f"passwords")
        elif var is not None and var in secret_of:
            sname, skey = secret_of[var]
            if password[0] != f"Secret {sname}/{skey}":
                rep.error(w, f"{name}: NATS_PASSWORD comes from {password[0]}, but the broker reads the password "
                             f"of {user[1]} from Secret {sname}/{skey}")
    for w in sorted({w for w, _, b, _ in services if b in SERVICES}):
        if w not in relays:
            rep.error(w, "no workload relays the outbox (the gateway binary with THREADLINE_RELAY_ENABLED on, "
                         "as the NATS user relay): no event reaches the bus")


def check_nats_values(rep, where, env, v, ctx) -> int:
    """JetStream on the storage the code declares its streams with, on
    volumes that outlive the pods; returns the number of NATS servers."""
    js = dig(v, "config.jetstream") or {}
    if js.get("enabled") is not True:
        rep.error(where, "config.jetstream.enabled must be true: every service declares JetStream streams "
                         "and consumers at start (crates/runtime/src/bus.rs)")
    storage = ctx["stream_storage"]
    if "File" in storage:
        if dig(js, "fileStore.enabled") is not True:
            rep.error(where, "config.jetstream.fileStore.enabled must be true: bus.rs declares the streams with "
                             "file storage (StorageType::File)")
        elif dig(js, "fileStore.pvc.enabled") is not True:
            rep.error(where, "config.jetstream.fileStore.pvc.enabled must be true: without a PersistentVolumeClaim "
                             "the streams live on the pod's ephemeral disk, and a restart loses queued messages")
        elif not dig(js, "fileStore.pvc.size"):
            rep.error(where, "config.jetstream.fileStore.pvc.size is not set")
    if "Memory" in storage and dig(js, "memoryStore.enabled") is not True:
        rep.error(where, "config.jetstream.memoryStore.enabled must be true: bus.rs declares memory-storage streams")
    cluster = dig(v, "config.cluster") or {}
    servers = 1
    if cluster.get("enabled") is True:
        n = cluster.get("replicas")
        if isinstance(n, bool) or not isinstance(n, int) or n < 3:
            rep.error(where, f"config.cluster.replicas {n!r}: a JetStream cluster needs at least 3 servers "
                             f"(a majority that survives losing one)")
            servers = n if isinstance(n, int) and not isinstance(n, bool) and n >= 1 else 1
        else:
            servers = n
    if env in HA_ENVS and servers < 3:
        rep.error(where, f"{env} runs {servers} NATS server(s): it needs a JetStream cluster of at least 3 "
                         f"(config.cluster.enabled: true, replicas: 3)")
    return servers


# ---------------------------------------------------------------- trace pipeline

def ns_of(doc):
    return dig(doc, "metadata.namespace")


def pod_labels(doc):
    tmpl = dig(doc, "spec.jobTemplate.spec.template") if doc["kind"] == "CronJob" else dig(doc, "spec.template")
    return dig(tmpl, "metadata.labels") or {}


def policy_types(np):
    return dig(np, "spec.policyTypes") or (["Ingress"] + (["Egress"] if dig(np, "spec.egress") else []))


def peer_matches(peer, policy_ns, pod_ns, labels) -> bool:
    """A NetworkPolicy peer (an entry of `to`/`from`) of a policy in
    namespace policy_ns matches pods with `labels` in namespace pod_ns
    (namespaces carry only their kubernetes.io/metadata.name label here)."""
    if "ipBlock" in peer:
        return False
    if "namespaceSelector" in peer:
        if not np_selects(peer["namespaceSelector"], {"kubernetes.io/metadata.name": pod_ns}):
            return False
    elif pod_ns != policy_ns:
        return False
    return np_selects(peer.get("podSelector", {}), labels)


def np_allows(policies, direction, ns, labels, peer_ns, peer_labels, port, default_deny=False) -> bool:
    """Whether the policies let pods (`labels`, namespace ns) send to
    (Egress) / receive from (Ingress) the peer pods on `port`. Pods that no
    policy of that direction selects are not isolated, unless default_deny
    (then only a rule that selects them lets the traffic through)."""
    key, side = ("egress", "to") if direction == "Egress" else ("ingress", "from")
    selecting = [np for np in policies if ns_of(np) == ns and direction in policy_types(np)
                 and np_selects(dig(np, "spec.podSelector"), labels)]
    if not selecting:
        return not default_deny
    return any(allows_port(r, port) and (not r.get(side) or
                                         any(peer_matches(p, ns, peer_ns, peer_labels) for p in r[side]))
               for np in selecting for r in dig(np, f"spec.{key}") or [])


def collector_config(rep, where, doc, container, docs):
    """The collector's configuration: the file named by --config, read from
    the ConfigMap mounted there."""
    args = container.get("args") or []
    path = None
    for i, a in enumerate(args):
        if a.startswith("--config="):
            path = a.split("=", 1)[1]
        elif a == "--config" and i + 1 < len(args):
            path = args[i + 1]
    if not path or ":" in path.split("/")[0]:
        rep.error(where, f"{kn(doc)}: the collector's --config is not a file from a ConfigMap ({args})")
        return None
    volumes = {v.get("name"): v for v in (pod_spec(doc) or {}).get("volumes") or []}
    for m in container.get("volumeMounts") or []:
        mount = m.get("mountPath", "").rstrip("/") + "/"
        if not path.startswith(mount):
            continue
        cm_name = dig(volumes.get(m.get("name"), {}), "configMap.name")
        cm = next((d for d in docs if d["kind"] == "ConfigMap" and dig(d, "metadata.name") == cm_name
                   and ns_of(d) == ns_of(doc)), None)
        key = path[len(mount):]
        if cm is None or key not in (cm.get("data") or {}):
            rep.error(where, f"{kn(doc)}: --config={path}: no key {key} in ConfigMap {cm_name} of this overlay")
            return None
        return yaml.safe_load(cm["data"][key]) or {}
    rep.error(where, f"{kn(doc)}: --config={path} is on no ConfigMap volume")
    return None


def service_backends(rep, where, label, endpoint, client_ns, docs, scope="this overlay"):
    """The pods behind an in-cluster endpoint `[scheme://]svc[.ns[.svc[.cluster.local]]]:port[/path]`
    among `docs`: [(workload, container port)], or None after reporting why
    it does not resolve."""
    m = re.fullmatch(r"(?:https?://)?([A-Za-z0-9.-]+):(\d+)(?:/.*)?", endpoint)
    if not m:
        rep.error(where, f"{label}: endpoint {endpoint!r} is not host:port")
        return None
    host, port = m.group(1).split("."), int(m.group(2))
    if len(host) > 2 and host[2:] not in (["svc"], ["svc", "cluster", "local"]):
        rep.error(where, f"{label} sends outside the cluster; this check only knows in-cluster Services")
        return None
    svc_name, svc_ns = host[0], host[1] if len(host) > 1 else client_ns
    svc = next((d for d in docs if d["kind"] == "Service" and dig(d, "metadata.name") == svc_name
                and ns_of(d) == svc_ns), None)
    if svc is None:
        rep.error(where, f"{label}: {scope} deploys no Service {svc_ns}/{svc_name}")
        return None
    sp = next((p for p in dig(svc, "spec.ports") or [] if p.get("port") == port), None)
    if sp is None:
        rep.error(where, f"{label}: Service {svc_ns}/{svc_name} has no port {port}")
        return None
    backends = [w for w in docs if w["kind"] in WORKLOADS and ns_of(w) == svc_ns
                and selects(dig(svc, "spec.selector"), {"metadata": {"labels": pod_labels(w)}})]
    if not backends:
        rep.error(where, f"{label}: Service {svc_ns}/{svc_name} selects no pods of {scope}")
        return None
    out = []
    for b in backends:
        target = sp.get("targetPort", port)
        if isinstance(target, str):
            target = next((p.get("containerPort") for bc in (pod_spec(b) or {}).get("containers") or []
                           for p in bc.get("ports") or [] if p.get("name") == target), None)
            if target is None:
                rep.error(where, f"{label}: {kn(b)} has no container port {sp.get('targetPort')}")
                continue
        out.append((b, target))
    return out


def check_trace_pipeline(rep, where, docs, ctx):
    """Every OTLP exporter of an OpenTelemetry Collector names a Service of
    this overlay (svc, svc.ns, svc.ns.svc[.cluster.local]) with that port and
    pods behind it, and both ends' NetworkPolicies allow the connection."""
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    workloads = [d for d in docs if d["kind"] in WORKLOADS]
    for doc in workloads:
        for c in (pod_spec(doc) or {}).get("containers") or []:
            if "opentelemetry-collector" not in str(c.get("image")):
                continue
            cfg = collector_config(rep, where, doc, c, docs)
            if cfg is None:
                continue
            used = {e for p in (dig(cfg, "service.pipelines") or {}).values() for e in p.get("exporters") or []}
            for name in sorted(used):
                if name.split("/")[0] not in ("otlp", "otlphttp"):
                    continue
                endpoint = str(dig(cfg, f"exporters.{name}.endpoint") or "")
                label = f"{kn(doc)} exporter {name} ({endpoint})"
                for b, target in service_backends(rep, where, label, endpoint, ns_of(doc), docs) or []:
                    b_ns = ns_of(b)
                    egress = np_allows(policies, "Egress", ns_of(doc), pod_labels(doc), b_ns, pod_labels(b), target)
                    ingress = np_allows(policies, "Ingress", b_ns, pod_labels(b), ns_of(doc), pod_labels(doc), target)
                    if not egress:
                        rep.error(where, f"{label}: no NetworkPolicy in {ns_of(doc)} lets the collector reach "
                                         f"{kn(b)} ({b_ns}) on {target}")
                    if not ingress:
                        rep.error(where, f"{label}: the NetworkPolicies in {b_ns} do not admit the collector "
                                         f"({ns_of(doc)}) to {kn(b)} on {target}")
                    if egress and ingress:
                        ctx["trace_routes"].append(f"{where}: {kn(doc)} -> {endpoint} -> {kn(b)}")


def check_service_traces(rep, ctx):
    """Each service's OTEL_EXPORTER_OTLP_ENDPOINT names a Service that its
    environment deploys (the collector or Jaeger, in the infra overlay),
    with pods behind it that the NetworkPolicies let the service reach."""
    resolved = {}
    for where, doc, binary, provided in ctx["workloads"]:
        got = provided.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        if binary not in SERVICES or not got or not got[1]:
            continue
        label = f"OTEL_EXPORTER_OTLP_ENDPOINT={got[1]} (from {got[0]})"
        if (where, got[1]) not in resolved:
            env_docs = [d for w, docs in ctx["renders"] if env_of(w) == env_of(where) for d in docs]
            resolved[(where, got[1])] = service_backends(rep, where, label, got[1], ns_of(doc), env_docs,
                                                         scope=f"the {env_of(where)} environment")
        for b, target in resolved[(where, got[1])] or []:
            egress, ingress = reachable(ctx, where, ns_of(doc), pod_labels(doc), ns_of(b), pod_labels(b), target,
                                        default_deny=False)
            if not egress:
                rep.error(where, f"{label}: no NetworkPolicy lets {kn(doc)} reach {kn(b)} on {target}")
            if not ingress:
                rep.error(where, f"{label}: the NetworkPolicies of {kn(b)} do not admit {kn(doc)} on {target}")
            route = f"{where}: services -> {got[1]} -> {kn(b)}"
            if egress and ingress and route not in ctx["trace_routes"]:
                ctx["trace_routes"].append(route)


# ---------------------------------------------------------------- main

# Schema validation results (the slow part), by document: the self-test
# checks mostly unchanged documents again. id -> (doc, result) for the very
# same object, JSON text -> result for an equal copy.
_VALIDATED_BY_ID: dict[int, tuple[dict, str | None]] = {}
_VALIDATED_BY_TEXT: dict[str, str | None] = {}
_NO_SCHEMA = "\0no schema"


def _validate(doc, kv) -> str | None:
    for version in K8S_VERSIONS:
        try:
            kv.validate(doc, version, strict=True)
        except kv.SchemaNotFoundError:
            return _NO_SCHEMA
        except kv.ValidationError as e:
            path = ".".join(str(p) for p in e.path)
            return f"{kn(doc)} does not validate against Kubernetes {e.version}: {path}: {e.message}"
    return None


def validate_builtin(rep, where, doc, kv):
    """True when kubernetes-validate has a schema for the kind."""
    hit = _VALIDATED_BY_ID.get(id(doc))
    if hit is not None and hit[0] is doc:
        result = hit[1]
    else:
        text = json.dumps(doc, sort_keys=True, default=str)
        if text not in _VALIDATED_BY_TEXT:
            _VALIDATED_BY_TEXT[text] = _validate(doc, kv)
        result = _VALIDATED_BY_TEXT[text]
        _VALIDATED_BY_ID[id(doc)] = (doc, result)
    if result == _NO_SCHEMA:
        return False
    if result is not None:
        rep.error(where, result)
    return True


def image_target(binary: str) -> str:
    """deploy/Dockerfile's target (and image threadline-<target>) of a binary."""
    return "cli" if binary == "threadline" else binary.removeprefix("threadline-")


def check_image(rep, where, doc, c, images):
    """A threadline container runs the image `make images` builds for its
    binary: threadline-<target>:dev in dev, <registry>/<target>:<workspace
    version>[@sha256:…] in production (the same image, pushed)."""
    target = image_target(c["name"])
    image = str(c.get("image") or "")
    name = f"{kn(doc)}: container {c['name']}"
    if target not in images["targets"]:
        rep.error(where, f"{name}: make images builds no image {target} (targets: {sorted(images['targets'])})")
        return
    if where.startswith("dev/"):
        want = f"threadline-{target}:dev"
        if image != want:
            rep.error(where, f"{name}: image {image} is not {want}, which make images builds")
    else:
        version = re.escape(images["version"])
        # Any registry (a host:port one too) and path; the last segment is the target.
        if not re.fullmatch(rf"[^@]+/{re.escape(target)}:{version}(@sha256:[0-9a-f]{{64}})?", image):
            rep.error(where, f"{name}: image {image} is not <registry>/{target}:{images['version']} "
                             f"(make images tags threadline-{target}:{images['version']}, pushed renamed)")


def image_set(root: Path) -> dict:
    """The images scripts/images.sh builds (its TARGETS), checked against
    deploy/Dockerfile's runtime stages, and the workspace version they are
    tagged with."""
    script = (root / "scripts/images.sh").read_text()
    m = re.search(r"^TARGETS=\(([^)]*)\)", script, re.M)
    targets = set(m.group(1).split()) if m else set()
    stages = set(re.findall(r"^FROM runtime AS (\S+)", (root / "deploy/Dockerfile").read_text(), re.M))
    version = re.search(r'^\[workspace\.package\][^\[]*?^version\s*=\s*"([^"]+)"',
                        (root / "Cargo.toml").read_text(), re.M | re.S)
    if not targets or targets != stages or not version:
        raise rust_settings.ExtractError(
            f"scripts/images.sh TARGETS {sorted(targets)} must equal deploy/Dockerfile's runtime stages "
            f"{sorted(stages)}, and Cargo.toml must have a [workspace.package] version")
    return dict(targets=targets, version=version.group(1))


def check_overlay(rep, where, docs, ctx_base, kv):
    by_kind: dict[str, dict[str, dict]] = {}
    for d in docs:
        by_kind.setdefault(d["kind"], {})[dig(d, "metadata.name")] = d
    ctx = dict(ctx_base, by_kind=by_kind, binary_of={}, settings_of={}, ingress_routes=set())
    bins = ctx["bins"]

    # First pass: which binary each workload runs and what it is given.
    for d in docs:
        if d["kind"] not in WORKLOADS:
            continue
        for c in (pod_spec(d) or {}).get("containers") or []:
            if c["name"].startswith("threadline"):
                if c["name"] not in bins:
                    rep.error(where, f"{kn(d)}: container {c['name']} is named like a threadline binary but "
                                     f"no crate builds one (names: {sorted(bins)})")
                    continue
                ctx["binary_of"][dig(d, "metadata.name")] = c["name"]
                check_image(rep, where, d, c, ctx["images"])
                ctx["settings_of"][dig(d, "metadata.name")] = provided_settings(rep, where, d, c, by_kind)
                ctx["workloads"].append((where, d, c["name"], ctx["settings_of"][dig(d, "metadata.name")]))
    ctx["policies"].extend((where, d) for d in docs if d["kind"] == "NetworkPolicy")
    check_shared_settings(rep, where, ctx)

    for d in docs:
        for k in ("apiVersion", "kind"):
            if not d.get(k):
                rep.error(where, f"a document without {k}: {str(d)[:80]}")
        if not dig(d, "metadata.name"):
            rep.error(where, f"{d.get('kind')} without metadata.name")
            continue
        if d["kind"] not in CLUSTER_SCOPED and not ns_of(d):
            rep.error(where, f"{kn(d)}: no metadata.namespace (kubectl apply would put it in the current "
                             f"context's namespace, away from the objects it belongs with)")
        if (d["apiVersion"], d["kind"]) in CUSTOM:
            CUSTOM[(d["apiVersion"], d["kind"])](rep, where, d, ctx)
            ctx["custom_seen"].add(f"{d['apiVersion']} {d['kind']}")
        elif not validate_builtin(rep, where, d, kv):
            rep.error(where, f"{kn(d)} ({d['apiVersion']}): no Kubernetes schema and not a custom "
                             f"resource this check knows — add a check in deploy/check/check_manifests.py")
        if d["kind"] in WORKLOADS:
            check_pod_security(rep, where, d)
            for c in (pod_spec(d) or {}).get("containers") or []:
                binary = c["name"]
                if binary not in bins:
                    continue
                provided = ctx["settings_of"][dig(d, "metadata.name")]
                check_settings(rep, where, d, c, binary, provided, bins)
                if binary == "threadline":
                    check_cli_container(rep, where, d, c, ctx)
                if binary in AUDIT_WRITERS and "THREADLINE_AUDIT_KEY" not in provided:
                    rep.error(where, f"{kn(d)} container {c['name']}: writes audit records but is not given "
                                     f"THREADLINE_AUDIT_KEY (Secret threadline-audit): its channel pseudonyms "
                                     f"would not match the other services'")
                if binary in SERVICES:
                    if d["kind"] != "Deployment":
                        rep.error(where, f"{kn(d)}: {binary} is a long-running service: run it as a Deployment")
                    check_service_container(rep, where, d, c, binary, provided, ctx)
                ctx["binaries_deployed"].add(binary)
        if d["kind"] == "Ingress":
            check_ingress(rep, where, d, ctx)
    check_slack_routes(rep, where, ctx)
    check_socket_connections(rep, where, ctx)
    check_trace_pipeline(rep, where, docs, ctx)


def check_dockerfile(rep, root: Path, bins):
    text = (root / "deploy/Dockerfile").read_text()
    toolchain = re.search(r'channel\s*=\s*"([^"]+)"', (root / "rust-toolchain.toml").read_text())
    arg = re.search(r"^ARG RUST_VERSION=(\S+)", text, re.M)
    if not toolchain or not arg or arg.group(1) != toolchain.group(1):
        rep.error("deploy/Dockerfile", f"ARG RUST_VERSION={arg and arg.group(1)} differs from "
                                       f"rust-toolchain.toml channel {toolchain and toolchain.group(1)}")
    entry = set(re.findall(r'^ENTRYPOINT \["/usr/local/bin/([^"]+)"\]', text, re.M))
    for b in ("threadline-gateway", "threadline-context-builder", "threadline-inference",
              "threadline-publisher", "threadline", "threadline-slack-sim"):
        if b not in bins:
            rep.error("deploy/Dockerfile", f"{b} is built by the Dockerfile but no crate declares it")
        if b not in entry:
            rep.error("deploy/Dockerfile", f"no image runs {b}")
    if not re.search(r"^USER 65532:65532", text, re.M):
        rep.error("deploy/Dockerfile", "the runtime stage must run as USER 65532:65532")
    for key in re.findall(r"^ENV (THREADLINE_\w+|SLACK_SIM_\w+)=", text, re.M):
        if not any(key in b.reads.keys for b in bins.values()):
            rep.error("deploy/Dockerfile", f"ENV {key} is read by no binary")
    # The store's query! macros read offline data at build time: the image
    # build must see crates/store/.sqlx and the .env that makes it offline.
    uses_macros = [p for p in (root / "crates").rglob("*.rs")
                   if re.search(r"\bquery(_as|_scalar)?!\(", p.read_text())]
    outside = sorted(str(p.relative_to(root)) for p in uses_macros
                     if not p.is_relative_to(root / "crates/store"))
    if outside:
        rep.error("deploy/Dockerfile", f"query! macros outside crates/store ({', '.join(outside)}): "
                                       "only the store's offline data (.sqlx) reaches the image build")
    # Every statement lives in the store and is checked at build time: a
    # statement given to sqlx as a runtime string (query(...), query_as(...),
    # raw_sql) is refused everywhere, the tests, the test kit and the
    # benches included, but in the store's own DDL that names a database
    # (an identifier no statement takes as a parameter: CREATE/DROP/ALTER
    # DATABASE in crates/store/src/testing/server.rs).
    runtime_sql = re.compile(
        r"\bsqlx::(query|query_as|query_scalar|raw_sql)(_with)?\s*(::<.+?>)?\s*\("  # sqlx::query(…), turbofish too
        r"|\buse\s+sqlx::[^;]*\b(query|query_as|query_scalar|raw_sql)(_with)?\b(?!!)"  # imported to call bare
    )
    # SQL text handed to an executor; the store's one is the snapshot
    # transaction's BEGIN, which no macro can check.
    sql_text = re.compile(r"\.(execute|fetch|fetch_one|fetch_all|fetch_optional|begin_with)\(\s*r?#*\"")
    ddl_file = Path("crates/store/src/testing/server.rs")
    # (the privilege probes of tests/tests/roles.rs: statements each role
    # must be refused, checked at run time by the code of the refusal,
    # 42501, so a probe that does not parse fails the test)
    probe_file = Path("crates/store/src/testing/roles.rs")
    sources = sorted(set((root / "crates").glob("*/src/**/*.rs"))
                     | set((root / "crates").glob("*/tests/**/*.rs"))
                     | set((root / "crates").glob("*/benches/**/*.rs"))
                     | set((root / "tests").glob("**/*.rs")))
    for p in sources:
        rel = p.relative_to(root)
        in_store = rel.parts[:2] == ("crates", "store")
        for n, line in enumerate(p.read_text().splitlines(), 1):
            if rel == ddl_file and re.search(r"\bsqlx::raw_sql\(&format!\(", line):
                continue
            if rel == probe_file and re.search(r"\bsqlx::raw_sql\(statement\)", line):
                continue
            if runtime_sql.search(line) or (not in_store and sql_text.search(line)):
                rep.error(str(rel), f"line {n}: a statement checked only at run time; put it in crates/store "
                                    "as a query!/query_as!/query_scalar! macro")
    if uses_macros:
        sqlx_dir = root / "crates/store/.sqlx"
        if not any(sqlx_dir.glob("query-*.json")):
            rep.error("crates/store/.sqlx", "the store uses query! macros but has no offline data: "
                                            "run make sqlx-prepare")
        env = root / "crates/store/.env"
        if not env.exists() or not re.search(r"^SQLX_OFFLINE=true$", env.read_text(), re.M):
            rep.error("crates/store/.env", "must set SQLX_OFFLINE=true so that no build goes online")
        ignore = (root / "deploy/Dockerfile.dockerignore").read_text()
        for pattern in ignore.split("\n"):
            pat = pattern.strip()
            if pat and not pat.startswith("#") and (".sqlx" in pat or pat in (".env", "**/.env", "crates")):
                rep.error("deploy/Dockerfile.dockerignore", f"{pat!r} keeps the store's offline data "
                                                            "out of the image build")


def socket_connections_default(root: Path) -> int:
    """THREADLINE_SOCKET_CONNECTIONS' default, from the gateway's config."""
    path = "crates/gateway/src/config.rs"
    m = re.search(r'src\s*\.\s*bounded\(\s*"THREADLINE_SOCKET_CONNECTIONS"\s*,\s*(\d+)\s*,', (root / path).read_text())
    if not m:
        raise rust_settings.ExtractError(f"{path}: the default of THREADLINE_SOCKET_CONNECTIONS not found")
    return int(m.group(1))


def load_code(root: Path) -> dict:
    """What the Rust sources say (raises rust_settings.ExtractError)."""
    bins = rust_settings.binaries(root)
    return dict(
        bins=bins,
        topology=rust_settings.topology(root, bins),
        images=image_set(root),
        metrics=rust_settings.metric_names(root),
        metric_labels=rust_settings.metric_labels(root),
        cli_commands=rust_settings.cli_commands(root),
        routes=rust_settings.gateway_routes(root),
        public_routes=rust_settings.public_routes(root),
        stream_storage=rust_settings.stream_storage(root),
        socket_connections_default=socket_connections_default(root),
        # Generated from the code and kept equal to it by a Rust test
        # (crates/runtime/src/nats_auth.rs).
        nats_authorization=json.loads((root / NATS_AUTHORIZATION).read_text()),
    )


def check_all(rep, renders: list[tuple[str, list[dict]]], code: dict, nats_values: dict,
              nats_install: dict, kv) -> dict:
    """Every check of the rendered overlays [(name, documents)] and of the
    NATS values; returns the context (what was seen, for the summary). Reads
    no file: the self-test calls it again on altered copies."""
    ctx = dict(code, renders=renders, pending_used=set(), custom_seen=set(), binaries_deployed=set(),
               workloads=[], policies=[], trace_routes=[], nats_summary=[], socket_summary=[])
    for name, docs in renders:
        check_overlay(rep, name, docs, ctx, kv)
    check_db_reachable(rep, ctx)
    check_service_traces(rep, ctx)
    check_nats(rep, ctx, nats_values, nats_install)
    for b in SERVICES:
        if b not in ctx["binaries_deployed"]:
            rep.error("overlays", f"no overlay deploys {b}")
    ctx["known_defects"] = []
    for (where, msg), why in KNOWN_DEFECTS.items():
        line = f"{where}: {msg}"
        found = [e for e in rep.errors if e.startswith(line)]
        if found:
            rep.errors.remove(found[0])
            ctx["known_defects"].append(f"{line} ({why})")
        else:
            rep.error("check_manifests.py", f"KNOWN_DEFECTS lists {line!r}, which is no longer found: remove it")
    return ctx


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    ap.add_argument("--self-test", action="store_true",
                    help="then check altered copies of the input (selftest.py): every breakage must be caught")
    ap.add_argument("--verbose", action="store_true", help="list each self-test breakage and the error it gave")
    ap.add_argument("renders", nargs="+", help="NAME=rendered.yaml")
    args = ap.parse_args()
    root = Path(args.root)
    rep = Report()

    import kubernetes_validate.utils as kv

    for key, (path, needle) in EXTRA_READS.items():
        if needle not in (root / path).read_text():
            rep.error("check_manifests.py", f"{key} is no longer read in {path}; update EXTRA_READS")

    try:
        code = load_code(root)
    except rust_settings.ExtractError as e:
        print(f"FAIL reading the Rust sources: {e}")
        return 1
    bins = code["bins"]

    all_required = {(b, k) for b, x in bins.items() for k in x.reads.required}
    for (b, k) in CONDITIONAL:
        if not any(k == rk and (b == "*" or b == rb) for rb, rk in all_required):
            rep.error("check_manifests.py", f"CONDITIONAL lists {k} for {b}, which the code no longer requires")

    nats_values = yaml.safe_load((root / NATS_VALUES).read_text()) or {}
    nats_install = nats_installs(rep, (root / "deploy/README.md").read_text())
    renders = []
    for item in args.renders:
        name, _, path = item.partition("=")
        renders.append((name, [d for d in yaml.safe_load_all(Path(path).read_text()) if d]))
    ctx = check_all(rep, renders, code, nats_values, nats_install, kv)
    check_dockerfile(rep, root, bins)

    for line in ctx["known_defects"]:
        print(f"notice: known defect, not failing the check: {line}")
    if ctx["pending_used"]:
        print("notice: alerts name metrics the code does not emit yet: " + ", ".join(sorted(ctx["pending_used"])))
    print(f"checked {sum(len(d) for _, d in renders)} objects in {len(renders)} renders "
          f"(Kubernetes {', '.join(v.rsplit('.', 1)[0] for v in K8S_VERSIONS)}; custom: "
          f"{', '.join(sorted(ctx['custom_seen']))})")
    for b in sorted(ctx["binaries_deployed"]):
        print(f"  {b}: reads {len(bins[b].reads.keys)} settings, requires {sorted(bins[b].reads.required)}")
    for route in ctx["trace_routes"]:
        print(f"  traces: {route}")
    for line in ctx["nats_summary"]:
        print(f"  nats: {line}")
    for line in ctx["socket_summary"]:
        print(f"  socket mode: {line}")

    if args.self_test:
        sys.modules.setdefault("check_manifests", sys.modules[__name__])  # one copy of this module
        import selftest
        summary, failures = selftest.run(renders, code, nats_values, nats_install, kv, rep.errors, args.verbose)
        print(summary)
        rep.errors.extend(failures)
    for e in rep.errors:
        print(f"FAIL {e}")
    return 1 if rep.errors else 0


if __name__ == "__main__":
    sys.exit(main())
