"""Offline checks of the rendered Kubernetes manifests against Kubernetes'
schemas and against what the Rust code reads. Run by scripts/deploy-check.sh:

    python check_manifests.py --root REPO NAME=rendered.yaml [NAME=rendered.yaml ...]

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
   and alert metrics match the code.
5. The OpenTelemetry Collector's OTLP exporters send to a Service the same
   overlay deploys (name, namespace, port, pods behind it), and the
   NetworkPolicies of both ends let the traffic through.
"""

from __future__ import annotations

import argparse
import re
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
    "THREADLINE_CONFIG_FILE": ("crates/runtime/src/config.rs", '"THREADLINE_CONFIG_FILE"'),
}


def is_set(p, key):
    return p.get(key) is not None


def equals(key, value):
    return lambda p: p.get(key) is not None and p[key][1] == value


def when_set(key):
    return lambda p: is_set(p, key)


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
    ("threadline-gateway", "THREADLINE_TOKEN_KEYS"): (
        when_set("SLACK_CLIENT_ID"), "with SLACK_CLIENT_ID (installs store sealed tokens)"),
    ("threadline-inference", "THREADLINE_MODEL_BASE_URL"): (
        equals("THREADLINE_MODEL_PROVIDER", "openai"), "with THREADLINE_MODEL_PROVIDER=openai"),
    ("threadline-inference", "THREADLINE_MODEL_NAME"): (
        equals("THREADLINE_MODEL_PROVIDER", "openai"), "with THREADLINE_MODEL_PROVIDER=openai"),
    ("threadline-inference", "THREADLINE_MODEL_BACKUP_NAME"): (
        when_set("THREADLINE_MODEL_BACKUP_BASE_URL"), "with THREADLINE_MODEL_BACKUP_BASE_URL"),
    ("threadline", "THREADLINE_TOKEN_KEYS"): (
        never, "cli: only `keys rotate` and `install add` need it, not `migrate`"),
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


class Report:
    def __init__(self):
        self.errors: list[str] = []
        self.notes: list[str] = []

    def error(self, where: str, msg: str):
        self.errors.append(f"{where}: {msg}")

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
    for m in re.finditer(r"\bby\s*\(([^)]*)\)\s*\(", expr):
        depth, i = 1, m.end()
        while i < len(expr) and depth:
            depth += {"(": 1, ")": -1}.get(expr[i], 0)
            i += 1
        inner = expr[m.end():i - 1]
        sets = [metric_label_set(n, labels) for n in re.findall(r"\b(threadline_[a-z0-9_]+)", inner)]
        sets = [s for s in sets if s is not None]
        if not sets:
            continue
        have = set().union(*sets) | TARGET_LABELS
        for name in (x.strip() for x in m.group(1).split(",")):
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


def check_service_container(rep, where, doc, container, binary, provided, ctx):
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


def check_ingress(rep, where, doc, ctx):
    services = ctx["by_kind"].get("Service", {})
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
            if p.get("path") not in ctx["routes"]:
                rep.error(where, f"{kn(doc)}: path {p.get('path')} is not a gateway route "
                                 f"({sorted(ctx['routes'])})")
    if not dig(doc, "spec.tls"):
        rep.error(where, f"{kn(doc)}: no TLS")


def nats_cluster_replicas(root: Path, rep) -> int:
    """How many NATS servers k8s/nats/values.yaml runs (1 without a cluster)."""
    values = yaml.safe_load((root / "deploy/k8s/nats/values.yaml").read_text()) or {}
    cluster = dig(values, "config.cluster") or {}
    if not cluster.get("enabled"):
        return 1
    n = cluster.get("replicas")
    if not isinstance(n, int) or n < 1:
        rep.error("deploy/k8s/nats/values.yaml", "config.cluster.replicas must be a positive integer")
        return 1
    return n


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
        for v in set(values.values()):
            if key == "THREADLINE_STREAM_REPLICAS" and v.isdigit() and int(v) > ctx["nats_replicas"]:
                rep.error(where, f"THREADLINE_STREAM_REPLICAS={v} exceeds the {ctx['nats_replicas']} NATS "
                                 f"servers of k8s/nats/values.yaml (JetStream would refuse the streams)")


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


def check_db_reachable(rep, ctx):
    """Every pod given DATABASE_URL may connect to Postgres under the
    namespace's default-deny: an egress rule of its own and an ingress rule
    of the threadline-db policy (rendered in the infra overlays)."""
    nps = list(ctx["network_policies"].values())
    for where, name, labels in ctx["db_clients"]:
        egress = [
            r for np in nps if "Egress" in (dig(np, "spec.policyTypes") or [])
            and np_selects(dig(np, "spec.podSelector"), labels)
            for r in dig(np, "spec.egress") or []
        ]
        if not any(allows_port(r, 5432) and any(np_selects(to.get("podSelector"), DB_POD) and "namespaceSelector" not in to
                                                 for to in r.get("to") or []) for r in egress):
            rep.error(where, f"{name}: reads DATABASE_URL but no NetworkPolicy lets its pods "
                             f"({labels.get('app.kubernetes.io/name')}) reach Postgres on 5432")
        ingress = [
            r for np in nps if "Ingress" in (dig(np, "spec.policyTypes") or ["Ingress"])
            and np_selects(dig(np, "spec.podSelector"), DB_POD)
            for r in dig(np, "spec.ingress") or []
        ]
        if not any(allows_port(r, 5432) and any(np_selects(fr.get("podSelector"), labels) and "namespaceSelector" not in fr
                                                 for fr in r.get("from") or []) for r in ingress):
            rep.error(where, f"{name}: reads DATABASE_URL but the Postgres NetworkPolicy does not admit its pods "
                             f"({labels.get('app.kubernetes.io/name')}) on 5432 (k8s/postgres/networkpolicy.yaml)")


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


def np_allows(policies, direction, ns, labels, peer_ns, peer_labels, port) -> bool:
    """Whether the policies let pods (`labels`, namespace ns) send to
    (Egress) / receive from (Ingress) the peer pods on `port`. Pods that no
    policy of that direction selects are not isolated."""
    key, side = ("egress", "to") if direction == "Egress" else ("ingress", "from")
    selecting = [np for np in policies if ns_of(np) == ns and direction in policy_types(np)
                 and np_selects(dig(np, "spec.podSelector"), labels)]
    if not selecting:
        return True
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
                m = re.fullmatch(r"(?:https?://)?([A-Za-z0-9.-]+):(\d+)(?:/.*)?", endpoint)
                if not m:
                    rep.error(where, f"{kn(doc)}: exporter {name}: endpoint {endpoint!r} is not host:port")
                    continue
                host, port = m.group(1).split("."), int(m.group(2))
                if len(host) > 2 and host[2:] not in (["svc"], ["svc", "cluster", "local"]):
                    rep.error(where, f"{kn(doc)}: exporter {name} sends outside the cluster ({endpoint}); "
                                     f"this check only knows in-cluster Services")
                    continue
                svc_name, svc_ns = host[0], host[1] if len(host) > 1 else ns_of(doc)
                label = f"{kn(doc)} exporter {name} ({endpoint})"
                svc = next((d for d in docs if d["kind"] == "Service" and dig(d, "metadata.name") == svc_name
                            and ns_of(d) == svc_ns), None)
                if svc is None:
                    rep.error(where, f"{label}: this overlay deploys no Service {svc_ns}/{svc_name}")
                    continue
                sp = next((p for p in dig(svc, "spec.ports") or [] if p.get("port") == port), None)
                if sp is None:
                    rep.error(where, f"{label}: Service {svc_ns}/{svc_name} has no port {port}")
                    continue
                backends = [w for w in workloads if ns_of(w) == svc_ns
                            and selects(dig(svc, "spec.selector"), {"metadata": {"labels": pod_labels(w)}})]
                if not backends:
                    rep.error(where, f"{label}: Service {svc_ns}/{svc_name} selects no pods of this overlay")
                    continue
                for b in backends:
                    target = sp.get("targetPort", port)
                    if isinstance(target, str):
                        target = next((p.get("containerPort") for bc in (pod_spec(b) or {}).get("containers") or []
                                       for p in bc.get("ports") or [] if p.get("name") == target), None)
                        if target is None:
                            rep.error(where, f"{label}: {kn(b)} has no container port {sp.get('targetPort')}")
                            continue
                    egress = np_allows(policies, "Egress", ns_of(doc), pod_labels(doc), svc_ns, pod_labels(b), target)
                    ingress = np_allows(policies, "Ingress", svc_ns, pod_labels(b), ns_of(doc), pod_labels(doc), target)
                    if not egress:
                        rep.error(where, f"{label}: no NetworkPolicy in {ns_of(doc)} lets the collector reach "
                                         f"{kn(b)} ({svc_ns}) on {target}")
                    if not ingress:
                        rep.error(where, f"{label}: the NetworkPolicies in {svc_ns} do not admit the collector "
                                         f"({ns_of(doc)}) to {kn(b)} on {target}")
                    if egress and ingress:
                        ctx["trace_routes"].append(f"{where}: {kn(doc)} -> Service {svc_ns}/{svc_name}:{port} "
                                                   f"-> {kn(b)}")


# ---------------------------------------------------------------- main

def validate_builtin(rep, where, doc, kv):
    """True when kubernetes-validate has a schema for the kind."""
    for version in K8S_VERSIONS:
        try:
            kv.validate(doc, version, strict=True)
        except kv.SchemaNotFoundError:
            return False
        except kv.ValidationError as e:
            path = ".".join(str(p) for p in e.path)
            rep.error(where, f"{kn(doc)} does not validate against Kubernetes {e.version}: {path}: {e.message}")
            return True
    return True


def check_overlay(rep, where, docs, ctx_base, kv):
    by_kind: dict[str, dict[str, dict]] = {}
    for d in docs:
        by_kind.setdefault(d["kind"], {})[dig(d, "metadata.name")] = d
    ctx = dict(ctx_base, by_kind=by_kind, binary_of={}, settings_of={})
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
                ctx["settings_of"][dig(d, "metadata.name")] = provided_settings(rep, where, d, c, by_kind)
                if "DATABASE_URL" in ctx["settings_of"][dig(d, "metadata.name")]:
                    tmpl = dig(d, "spec.jobTemplate.spec.template") if d["kind"] == "CronJob" else dig(d, "spec.template")
                    ctx["db_clients"].append((where, kn(d), dig(tmpl, "metadata.labels") or {}))
    for d in by_kind.get("NetworkPolicy", {}).values():
        ctx["network_policies"][dig(d, "metadata.name")] = d
    check_shared_settings(rep, where, ctx)

    for d in docs:
        for k in ("apiVersion", "kind"):
            if not d.get(k):
                rep.error(where, f"a document without {k}: {str(d)[:80]}")
        if not dig(d, "metadata.name"):
            rep.error(where, f"{d.get('kind')} without metadata.name")
            continue
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
                if binary in SERVICES:
                    if d["kind"] != "Deployment":
                        rep.error(where, f"{kn(d)}: {binary} is a long-running service: run it as a Deployment")
                    check_service_container(rep, where, d, c, binary, provided, ctx)
                ctx["binaries_deployed"].add(binary)
        if d["kind"] == "Ingress":
            check_ingress(rep, where, d, ctx)
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
    if "query!" in "".join(p.read_text() for p in (root / "crates").rglob("*.rs")):
        rep.error("deploy/Dockerfile", "sqlx query! macros are used: the image build needs "
                                       "offline query data (.sqlx) now; update Dockerfile and docs")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    ap.add_argument("renders", nargs="+", help="NAME=rendered.yaml")
    args = ap.parse_args()
    root = Path(args.root)
    rep = Report()

    import kubernetes_validate.utils as kv

    for key, (path, needle) in EXTRA_READS.items():
        if needle not in (root / path).read_text():
            rep.error("check_manifests.py", f"{key} is no longer read in {path}; update EXTRA_READS")

    try:
        bins = rust_settings.binaries(root)
        topo = rust_settings.topology(root, bins)
        metrics = rust_settings.metric_names(root)
        metric_labels = rust_settings.metric_labels(root)
        cli_commands = rust_settings.cli_commands(root)
        routes = rust_settings.gateway_routes(root)
    except rust_settings.ExtractError as e:
        print(f"FAIL reading the Rust sources: {e}")
        return 1

    all_required = {(b, k) for b, x in bins.items() for k in x.reads.required}
    for (b, k) in CONDITIONAL:
        if not any(k == rk and (b == "*" or b == rb) for rb, rk in all_required):
            rep.error("check_manifests.py", f"CONDITIONAL lists {k} for {b}, which the code no longer requires")

    ctx = dict(bins=bins, topology=topo, metrics=metrics, metric_labels=metric_labels, routes=routes,
               cli_commands=cli_commands, nats_replicas=nats_cluster_replicas(root, rep),
               pending_used=set(), custom_seen=set(), binaries_deployed=set(),
               db_clients=[], network_policies={}, trace_routes=[])
    count = 0
    for item in args.renders:
        name, _, path = item.partition("=")
        docs = [d for d in yaml.safe_load_all(Path(path).read_text()) if d]
        count += len(docs)
        check_overlay(rep, name, docs, ctx, kv)
    check_dockerfile(rep, root, bins)
    check_db_reachable(rep, ctx)

    for b in SERVICES:
        if b not in ctx["binaries_deployed"]:
            rep.error("overlays", f"no overlay deploys {b}")
    if ctx["pending_used"]:
        print("notice: alerts name metrics the code does not emit yet: " + ", ".join(sorted(ctx["pending_used"])))
    print(f"checked {count} objects in {len(args.renders)} renders "
          f"(Kubernetes {', '.join(v.rsplit('.', 1)[0] for v in K8S_VERSIONS)}; custom: "
          f"{', '.join(sorted(ctx['custom_seen']))})")
    for b in sorted(ctx["binaries_deployed"]):
        print(f"  {b}: reads {len(bins[b].reads.keys)} settings, requires {sorted(bins[b].reads.required)}")
    for route in ctx["trace_routes"]:
        print(f"  traces: {route}")
    for e in rep.errors:
        print(f"FAIL {e}")
    return 1 if rep.errors else 0


if __name__ == "__main__":
    sys.exit(main())
