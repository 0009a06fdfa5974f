"""Self-test of check_manifests.py: proves that its checks can fail.

Run by `check_manifests.py --self-test` (scripts/deploy-check.sh) on the
very input it has just checked: the rendered overlays and the NATS values.
Every breakage below alters a copy of that input in one deliberate way, runs
all the checks again (check_all, the same functions as the real run), and
must produce at least one new error containing every one of its `expect`
strings (the overlay, the object, the setting or metric...). The unaltered
copy must give the same errors as the real run (none, when it passes).

A breakage that is not caught is a gap in the checker: fix the checker, do
not weaken the breakage. A breakage whose target is gone (a manifest was
renamed) fails too: update it.

The input is shared, not copied wholesale: `Input.edit` deep-copies the one
document it returns and `Input.docs` the list of one overlay, so unchanged
documents keep their cached schema validation and the run stays fast.
"""

from __future__ import annotations

import copy
import json
from collections import Counter
from dataclasses import dataclass
from typing import Callable

import yaml

import check_manifests as cm


class Missing(Exception):
    """The object a breakage alters is not in the input."""


class Input:
    def __init__(self, renders, nats_values, nats_install):
        self.renders = list(renders)
        self._values = nats_values
        self._install = nats_install
        self._own_lists: set[str] = set()
        self._own_values = self._own_install = False

    def docs(self, overlay: str) -> list[dict]:
        """The documents of `overlay`, as a list this input owns."""
        for i, (name, docs) in enumerate(self.renders):
            if name == overlay:
                if overlay not in self._own_lists:
                    docs = list(docs)
                    self.renders[i] = (name, docs)
                    self._own_lists.add(overlay)
                return docs
        raise Missing(f"overlay {overlay}")

    def edit(self, overlay: str, kind: str, name: str, prefix: bool = False) -> dict:
        """A private copy of one document, put in place of the original."""
        docs = self.docs(overlay)
        for i, d in enumerate(docs):
            n = cm.dig(d, "metadata.name") or ""
            if d.get("kind") == kind and (n.startswith(name) if prefix else n == name):
                docs[i] = copy.deepcopy(d)
                return docs[i]
        raise Missing(f"{overlay}: {kind}/{name}")

    @property
    def values(self) -> dict:
        return self._values

    def edit_values(self) -> dict:
        if not self._own_values:
            self._values = copy.deepcopy(self._values)
            self._own_values = True
        return self._values

    @property
    def install(self) -> dict:
        return self._install


# ---------------------------------------------------------------- helpers

def at(obj, path: str):
    """obj's value at a dotted path (list items by index); Missing if none."""
    v = cm.dig(obj, path)
    if v is None:
        raise Missing(path)
    return v


def container(doc: dict, name: str) -> dict:
    for c in (cm.pod_spec(doc) or {}).get("containers") or []:
        if c.get("name") == name:
            return c
    raise Missing(f"{cm.kn(doc)}: container {name}")


def drop_env(c: dict, key: str):
    before = len(c.get("env") or [])
    c["env"] = [e for e in c.get("env") or [] if e.get("name") != key]
    if len(c["env"]) == before:
        raise Missing(f"env {key}")


def set_env(c: dict, key: str, value: str):
    c["env"] = [e for e in c.get("env") or [] if e.get("name") != key] + [{"name": key, "value": value}]


def set_data(cmap: dict, key: str, value: str, must_exist: bool = True):
    if must_exist and key not in (cmap.get("data") or {}):
        raise Missing(f"{cm.kn(cmap)}: data.{key}")
    cmap.setdefault("data", {})[key] = value


def rule(doc: dict, alert: str) -> dict:
    for g in at(doc, "spec.groups"):
        for r in g.get("rules") or []:
            if r.get("alert") == alert:
                return r
    raise Missing(f"alert {alert}")


def replace_in(obj: dict, key: str, old: str, new: str):
    if old not in str(obj.get(key, "")):
        raise Missing(f"{old!r} in {key}")
    obj[key] = str(obj[key]).replace(old, new)


def egress_rule(np: dict, port: int) -> int:
    for i, r in enumerate(at(np, "spec.egress")):
        if any(p.get("port") == port for p in r.get("ports") or []):
            return i
    raise Missing(f"{cm.kn(np)}: egress rule for port {port}")


# ---------------------------------------------------------------- breakages

@dataclass
class Breakage:
    family: str
    what: str
    apply: Callable[[Input], None]
    expect: tuple[str, ...]


BREAKAGES: list[Breakage] = []


def breakage(family: str, what: str, *expect: str):
    def register(fn):
        BREAKAGES.append(Breakage(family, what, fn, expect))
        return fn
    return register


# Settings the binaries read.

@breakage("settings", "a required setting dropped from a Deployment",
          "production/app:", "Deployment/threadline-gateway", "required setting SLACK_SIGNING_SECRET is provided nowhere")
def _(i: Input):
    drop_env(container(i.edit("production/app", "Deployment", "threadline-gateway"), "threadline-gateway"),
             "SLACK_SIGNING_SECRET")


@breakage("settings", "the keys that open tokens given to the public gateway",
          "production/app:", "Deployment/threadline-gateway", "THREADLINE_TOKEN_KEYS", "must not be given to threadline-gateway")
def _(i: Input):
    set_env(container(i.edit("production/app", "Deployment", "threadline-gateway"), "threadline-gateway"),
            "THREADLINE_TOKEN_KEYS", "k1:x25519:" + "11" * 32)


@breakage("settings", "the relay without the audit key its intake records are pseudonymised with",
          "production/app:", "Deployment/threadline-relay", "writes audit records but is not given THREADLINE_AUDIT_KEY")
def _(i: Input):
    drop_env(container(i.edit("production/app", "Deployment", "threadline-relay"), "threadline-gateway"),
             "THREADLINE_AUDIT_KEY")


@breakage("settings", "a setting the binary never reads (meant for another service)",
          "production/app:", "Deployment/threadline-publisher", "THREADLINE_MODEL_NAME", "is not a setting threadline-publisher reads")
def _(i: Input):
    set_env(container(i.edit("production/app", "Deployment", "threadline-publisher"), "threadline-publisher"),
            "THREADLINE_MODEL_NAME", "gpt-x")


@breakage("settings", "a misspelt setting in a ConfigMap",
          "dev/app:", "THREADLINE_CONTEXT_CONCURENCY", "is not a setting threadline-context-builder reads")
def _(i: Input):
    set_data(i.edit("dev/app", "ConfigMap", "threadline-context-builder"), "THREADLINE_CONTEXT_CONCURENCY", "8",
             must_exist=False)


@breakage("settings", "an integer setting outside the range the code accepts",
          "production/app:", "THREADLINE_CONTEXT_CONCURRENCY=0", "is not an integer in 1..=256")
def _(i: Input):
    set_data(i.edit("production/app", "ConfigMap", "threadline-context-builder"), "THREADLINE_CONTEXT_CONCURRENCY", "0")


@breakage("settings", "one service declares the streams with another bus prefix",
          "production/app:", "THREADLINE_BUS_PREFIX differs between services")
def _(i: Input):
    set_env(container(i.edit("production/app", "Deployment", "threadline-inference"), "threadline-inference"),
            "THREADLINE_BUS_PREFIX", "tl2")


@breakage("postgres", "a managed role's password Secret made in a later step than the Cluster",
          "dev/infra:", "Cluster/threadline-db", "threadline-db-publisher, which dev/app makes")
def _(i: Input):
    docs = i.docs("dev/infra")
    sec = next(d for d in docs if d.get("kind") == "Secret" and cm.dig(d, "metadata.name") == "threadline-db-publisher")
    docs.remove(sec)
    i.docs("dev/app").append(sec)


@breakage("postgres", "a managed role's password Secret without cnpg.io/reload",
          "dev/infra:", "Cluster/threadline-db", "threadline-db-gateway lacks the label cnpg.io/reload")
def _(i: Input):
    i.edit("dev/infra", "Secret", "threadline-db-gateway")["metadata"]["labels"].pop("cnpg.io/reload")


def db_secret_ref(c: dict) -> dict:
    """The secretKeyRef of a container's DATABASE_URL."""
    return next(e for e in c["env"] if e["name"] == "DATABASE_URL")["valueFrom"]["secretKeyRef"]


@breakage("postgres", "the relay logged in as the public gateway's role",
          "production/app:", "Deployment/threadline-relay", "must be the key uri of Secret threadline-db-relay")
def _(i: Input):
    db_secret_ref(container(i.edit("production/app", "Deployment", "threadline-relay"),
                            "threadline-gateway"))["name"] = "threadline-db-gateway"


@breakage("postgres", "the public gateway given the relay's role, which consumes the outbox",
          "production/app:", "Deployment/threadline-gateway", "must be the key uri of Secret threadline-db-gateway")
def _(i: Input):
    db_secret_ref(container(i.edit("production/app", "Deployment", "threadline-gateway"),
                            "threadline-gateway"))["name"] = "threadline-db-relay"


@breakage("postgres", "the relay's managed role not a member of the gateway's",
          "production/infra:", "Cluster/threadline-db", "managed role threadline_relay must be a member of")
def _(i: Input):
    roles = i.edit("production/infra", "Cluster", "threadline-db")["spec"]["managed"]["roles"]
    next(r for r in roles if r["name"] == "threadline_relay").pop("inRoles")


# Images: the manifests run what `make images` builds.

@breakage("images", "a dev Deployment on an image tag make images does not build",
          "dev/app:", "Deployment/threadline-publisher", "image threadline-publisher:latest is not threadline-publisher:dev")
def _(i: Input):
    container(i.edit("dev/app", "Deployment", "threadline-publisher"), "threadline-publisher")["image"] = \
        "threadline-publisher:latest"


@breakage("images", "a production workload on another version than the workspace's",
          "production/app:", "CronJob/threadline-purge", "is not <registry>/cli:")
def _(i: Input):
    c = container(i.edit("production/app", "CronJob", "threadline-purge"), "threadline")
    c["image"] = "registry.example.com/threadline/cli:0.0.9"


@breakage("images", "a Deployment running another binary's image",
          "production/app:", "Deployment/threadline-inference", "is not <registry>/inference:")
def _(i: Input):
    c = container(i.edit("production/app", "Deployment", "threadline-inference"), "threadline-inference")
    c["image"] = c["image"].replace("/inference:", "/publisher:")


# Listen addresses, ports and probes.

@breakage("service", "a service listening on 127.0.0.1",
          "production/app:", "THREADLINE_PUBLISHER_ADDR=127.0.0.1:3003", "not reachable from outside the pod")
def _(i: Input):
    set_data(i.edit("production/app", "ConfigMap", "threadline-publisher"), "THREADLINE_PUBLISHER_ADDR", "127.0.0.1:3003")


@breakage("service", "a readiness probe on a path the code does not serve",
          "production/app:", "Deployment/threadline-inference", "readinessProbe must be GET /readyz", "got /ready ")
def _(i: Input):
    c = container(i.edit("production/app", "Deployment", "threadline-inference"), "threadline-inference")
    at(c, "readinessProbe.httpGet")["path"] = "/ready"


@breakage("service", "a liveness probe on the wrong port",
          "dev/app:", "Deployment/threadline-context-builder", "livenessProbe must be GET /healthz on port 3001", "on 9999")
def _(i: Input):
    c = container(i.edit("dev/app", "Deployment", "threadline-context-builder"), "threadline-context-builder")
    at(c, "livenessProbe.httpGet")["port"] = 9999


@breakage("service", "a containerPort that differs from the listen address",
          "production/app:", "Deployment/threadline-gateway", "no containerPort 3000")
def _(i: Input):
    c = container(i.edit("production/app", "Deployment", "threadline-gateway"), "threadline-gateway")
    at(c, "ports.0")["containerPort"] = 8080


# Ingress.

@breakage("ingress", "the Ingress no longer routes /slack/events",
          "production/app:", "Deployment/threadline-gateway", "no Ingress of this overlay routes /slack/events")
def _(i: Input):
    paths = at(i.edit("production/app", "Ingress", "threadline-gateway"), "spec.rules.0.http.paths")
    paths[:] = [p for p in paths if p.get("path") != "/slack/events"]


@breakage("ingress", "the Ingress exposes /metrics",
          "dev/app:", "Ingress/threadline-gateway", "path /metrics is not a public gateway route")
def _(i: Input):
    paths = at(i.edit("dev/app", "Ingress", "threadline-gateway"), "spec.rules.0.http.paths")
    paths.append(dict(copy.deepcopy(paths[0]), path="/metrics"))


@breakage("ingress", "an Ingress path to a Service port that does not exist",
          "production/app:", "Ingress/threadline-gateway", "Service threadline-gateway has no port web")
def _(i: Input):
    at(i.edit("production/app", "Ingress", "threadline-gateway"),
       "spec.rules.0.http.paths.0.backend.service.port")["name"] = "web"


# Alerts.

@breakage("alerts", "an alert on a metric the code does not emit",
          "production/app:", "ThreadlineDuplicateReply", "threadline_duplicate_replies_total is not emitted")
def _(i: Input):
    replace_in(rule(i.edit("production/app", "PrometheusRule", "threadline"), "ThreadlineDuplicateReply"), "expr",
               "threadline_duplicate_reply_incidents_total", "threadline_duplicate_replies_total")


@breakage("alerts", "a label matcher on a label the metric does not have",
          "production/app:", "ThreadlineReplyIntentsUnsettled", "threadline_reply_intents has no label 'status'")
def _(i: Input):
    replace_in(rule(i.edit("production/app", "PrometheusRule", "threadline"), "ThreadlineReplyIntentsUnsettled"),
               "expr", "{state=~", "{status=~")


@breakage("alerts", "an aggregation by a label the metric does not have (by before)",
          "production/app-without-keda:", "ThreadlineConsumerLag", "aggregates by 'stream_name'")
def _(i: Input):
    replace_in(rule(i.edit("production/app-without-keda", "PrometheusRule", "threadline"), "ThreadlineConsumerLag"),
               "expr", "by (consumer)", "by (stream_name)")


@breakage("alerts", "an aggregation by a label the metric does not have (by after)",
          "production/app:", "ThreadlineConsumerQueueAge", "aggregates by 'queue'")
def _(i: Input):
    r = rule(i.edit("production/app", "PrometheusRule", "threadline"), "ThreadlineConsumerQueueAge")
    replace_in(r, "expr", "max by (consumer) (threadline_consumer_oldest_message_age_seconds)",
               "max(threadline_consumer_oldest_message_age_seconds) by (queue)")


# KEDA.

@breakage("keda", "a ScaledObject watching a consumer the code does not declare",
          "production/app:", "ScaledObject/threadline-inference", "consumer inference-v2 is not one threadline-inference consumes")
def _(i: Input):
    at(i.edit("production/app", "ScaledObject", "threadline-inference"), "spec.triggers.0.metadata")["consumer"] = "inference-v2"


@breakage("keda", "a ScaledObject missing a stream its worker consumes",
          "production/app:", "ScaledObject/threadline-context-builder", "does not watch", "TL_RECONSIDER")
def _(i: Input):
    triggers = at(i.edit("production/app", "ScaledObject", "threadline-context-builder"), "spec.triggers")
    triggers[:] = [t for t in triggers if cm.dig(t, "metadata.stream") != "TL_RECONSIDER"]


@breakage("keda", "a ScaledObject reading lag from a port NATS does not monitor on",
          "dev/app:", "ScaledObject/threadline-publisher", "natsServerMonitoringEndpoint nats-headless.threadline.svc.cluster.local:8223")
def _(i: Input):
    md = at(i.edit("dev/app", "ScaledObject", "threadline-publisher"), "spec.triggers.0.metadata")
    md["natsServerMonitoringEndpoint"] = md["natsServerMonitoringEndpoint"].replace(":8222", ":8223")


# Socket Mode: the gateway's connections within Slack's 10 per app, counting
# a rollout's surge pods and the old pods terminating beside the new ones.

@breakage("socket", "the Socket Mode gateway may scale to 5 (6 pods with the one terminating in a rollout)",
          "production/app-socket-mode:", "Deployment/threadline-gateway: up to 6 pods",
          "HorizontalPodAutoscaler/threadline-gateway maxReplicas 5", "+ 1 terminating in a rollout",
          "= 12", "more than the 10 Slack allows")
def _(i: Input):
    at(i.edit("production/app-socket-mode", "HorizontalPodAutoscaler", "threadline-gateway"), "spec")["maxReplicas"] = 5


@breakage("socket", "a surge pod during a rollout at the most Socket Mode replicas",
          "production/app-socket-mode:", "Deployment/threadline-gateway: up to 6 pods",
          "+ 1 surging + 1 terminating in a rollout", "= 12", "more than the 10 Slack allows")
def _(i: Input):
    d = i.edit("production/app-socket-mode", "Deployment", "threadline-gateway")
    at(d, "spec.strategy.rollingUpdate")["maxSurge"] = 1


@breakage("socket", "two old Socket Mode pods terminating at once in a rollout (maxUnavailable 2)",
          "production/app-socket-mode:", "Deployment/threadline-gateway: up to 6 pods",
          "+ 2 terminating in a rollout", "= 12", "more than the 10 Slack allows")
def _(i: Input):
    d = i.edit("production/app-socket-mode", "Deployment", "threadline-gateway")
    at(d, "spec.strategy.rollingUpdate")["maxUnavailable"] = 2


@breakage("socket", "more connections per Socket Mode gateway pod",
          "production/app-socket-mode:", "THREADLINE_SOCKET_CONNECTIONS=3", "= 15", "more than the 10 Slack allows")
def _(i: Input):
    set_data(i.edit("production/app-socket-mode", "ConfigMap", "threadline-gateway"), "THREADLINE_SOCKET_CONNECTIONS", "3")


def socket_mode_from_secret(i: Input) -> dict:
    """THREADLINE_SOCKET_MODE moved from the gateway's ConfigMap to a
    secretKeyRef (a value the check cannot know); the gateway container."""
    cmap = i.edit("production/app-socket-mode", "ConfigMap", "threadline-gateway")
    if "THREADLINE_SOCKET_MODE" not in (cmap.get("data") or {}):
        raise Missing(f"{cm.kn(cmap)}: data.THREADLINE_SOCKET_MODE")
    del cmap["data"]["THREADLINE_SOCKET_MODE"]
    c = container(i.edit("production/app-socket-mode", "Deployment", "threadline-gateway"), "threadline-gateway")
    c["env"] = (c.get("env") or []) + [{"name": "THREADLINE_SOCKET_MODE", "valueFrom": {
        "secretKeyRef": {"name": "threadline-slack", "key": "THREADLINE_SOCKET_MODE"}}}]
    return c


@breakage("socket", "THREADLINE_SOCKET_MODE from a Secret, and too many pods",
          "production/app-socket-mode:", "Deployment/threadline-gateway (THREADLINE_SOCKET_MODE from Secret "
          "threadline-slack/THREADLINE_SOCKET_MODE, not knowable offline: taken as on): up to 6 pods",
          "= 12", "more than the 10 Slack allows")
def _(i: Input):
    socket_mode_from_secret(i)
    at(i.edit("production/app-socket-mode", "HorizontalPodAutoscaler", "threadline-gateway"), "spec")["maxReplicas"] = 5


@breakage("socket", "Socket Mode without the app-level token",
          "production/app-socket-mode:", "Deployment/threadline-gateway",
          "SLACK_APP_TOKEN is required with THREADLINE_SOCKET_MODE=true")
def _(i: Input):
    drop_env(container(i.edit("production/app-socket-mode", "Deployment", "threadline-gateway"), "threadline-gateway"),
             "SLACK_APP_TOKEN")


@breakage("socket", "THREADLINE_SOCKET_MODE from a Secret, without the app-level token",
          "production/app-socket-mode:", "Deployment/threadline-gateway",
          "SLACK_APP_TOKEN is required with THREADLINE_SOCKET_MODE=true", "from a Secret, counts as true")
def _(i: Input):
    drop_env(socket_mode_from_secret(i), "SLACK_APP_TOKEN")


# NetworkPolicies.

@breakage("network", "the services' egress to Postgres dropped (dev)",
          "dev/app:", "Deployment/threadline-publisher", "no NetworkPolicy lets its pods", "reach Postgres on 5432")
def _(i: Input):
    np = i.edit("dev/app", "NetworkPolicy", "threadline-services-egress")
    del np["spec"]["egress"][egress_rule(np, 5432)]


@breakage("network", "the Postgres policy no longer admits the purge CronJob",
          "production/app:", "CronJob/threadline-purge", "the Postgres NetworkPolicy does not admit its pods")
def _(i: Input):
    expr = at(i.edit("production/infra", "NetworkPolicy", "threadline-db"), "spec.ingress.0.from.0.podSelector.matchExpressions.0")
    if "threadline-purge" not in expr["values"]:
        raise Missing("threadline-purge in the threadline-db ingress rule")
    expr["values"] = [v for v in expr["values"] if v != "threadline-purge"]


@breakage("network", "the services' egress to NATS dropped",
          "production/app:", "Deployment/threadline-inference", "no NetworkPolicy lets its pods", "reach NATS on 4222")
def _(i: Input):
    np = i.edit("production/app", "NetworkPolicy", "threadline-services-egress")
    del np["spec"]["egress"][egress_rule(np, 4222)]


@breakage("network", "the NATS policy no longer admits a worker",
          "dev/app:", "Deployment/threadline-context-builder", "the NATS NetworkPolicy does not admit its pods")
def _(i: Input):
    expr = at(i.edit("dev/infra", "NetworkPolicy", "nats"), "spec.ingress.0.from.0.podSelector.matchExpressions.0")
    expr["values"] = [v for v in expr["values"] if v != "threadline-context-builder"]


# Traces.

@breakage("traces", "the collector exports to a Service that does not exist",
          "production/infra:", "exporter otlp", "deploys no Service observability/jaeger-colector")
def _(i: Input):
    cmap = i.edit("production/infra", "ConfigMap", "otel-collector", prefix=True)
    if "config.yaml" not in (cmap.get("data") or {}):
        raise Missing(f"{cm.kn(cmap)}: data[config.yaml]")
    cfg = yaml.safe_load(cmap["data"]["config.yaml"])
    exp = next((e for n, e in (cfg.get("exporters") or {}).items() if n.split("/")[0] == "otlp"), None)
    if not exp or "jaeger-collector" not in str(exp.get("endpoint")):
        raise Missing("otlp exporter to jaeger-collector")
    exp["endpoint"] = exp["endpoint"].replace("jaeger-collector", "jaeger-colector")
    cmap["data"]["config.yaml"] = yaml.safe_dump(cfg)


@breakage("traces", "the collector's egress policy on the wrong port",
          "production/infra:", "no NetworkPolicy in threadline lets the collector reach StatefulSet/jaeger")
def _(i: Input):
    np = i.edit("production/infra", "NetworkPolicy", "otel-collector")
    at(np, f"spec.egress.{egress_rule(np, 4317)}.ports.0")["port"] = 4318


@breakage("traces", "the services send traces to a Service that does not exist",
          "production/app:", "OTEL_EXPORTER_OTLP_ENDPOINT=http://otel-colector:4318",
          "the production environment deploys no Service threadline/otel-colector")
def _(i: Input):
    set_data(i.edit("production/app", "ConfigMap", "threadline-common"), "OTEL_EXPORTER_OTLP_ENDPOINT",
             "http://otel-colector:4318")


@breakage("traces", "the services send OTLP/HTTP to the gRPC port",
          "dev/app:", "OTEL_EXPORTER_OTLP_ENDPOINT points at 4317")
def _(i: Input):
    set_data(i.edit("dev/app", "ConfigMap", "threadline-common"), "OTEL_EXPORTER_OTLP_ENDPOINT", "http://jaeger:4317")


# NATS: the Helm values and what the services need of them.

@breakage("nats", "JetStream disabled in the NATS values",
          "deploy/k8s/nats/values.yaml (production)", "config.jetstream.enabled must be true")
def _(i: Input):
    at(i.edit_values(), "config.jetstream")["enabled"] = False


@breakage("nats", "JetStream without file storage",
          "deploy/k8s/nats/values.yaml (production)", "config.jetstream.fileStore.enabled must be true")
def _(i: Input):
    at(i.edit_values(), "config.jetstream.fileStore")["enabled"] = False


@breakage("nats", "file storage on the pods' ephemeral disk (no PVC)",
          "deploy/k8s/nats/values.yaml (dev", "config.jetstream.fileStore.pvc.enabled must be true")
def _(i: Input):
    at(i.edit_values(), "config.jetstream.fileStore.pvc")["enabled"] = False


@breakage("nats", "a NATS cluster of 2 servers",
          "deploy/k8s/nats/values.yaml (production)", "config.cluster.replicas 2", "at least 3 servers")
def _(i: Input):
    at(i.edit_values(), "config.cluster")["replicas"] = 2


@breakage("nats", "production NATS without a cluster (one server for 3 stream replicas)",
          "production/app:", "THREADLINE_STREAM_REPLICAS=3 exceeds the 1 NATS server(s)")
def _(i: Input):
    at(i.edit_values(), "config.cluster")["enabled"] = False


@breakage("nats", "stream replicas above the production cluster size",
          "production/app:", "THREADLINE_STREAM_REPLICAS=5 exceeds the 3 NATS server(s)")
def _(i: Input):
    set_data(i.edit("production/app", "ConfigMap", "threadline-common"), "THREADLINE_STREAM_REPLICAS", "5")


@breakage("nats", "stream replicas above the single dev server (README's --set config.cluster.enabled=false)",
          "dev/app:", "THREADLINE_STREAM_REPLICAS=3 exceeds the 1 NATS server(s)")
def _(i: Input):
    set_data(i.edit("dev/app", "ConfigMap", "threadline-common"), "THREADLINE_STREAM_REPLICAS", "3")


@breakage("nats", "production streams no longer replicated",
          "production/app-without-keda:", "THREADLINE_STREAM_REPLICAS=1", "keeps every stream on 3 NATS servers")
def _(i: Input):
    set_data(i.edit("production/app-without-keda", "ConfigMap", "threadline-common"), "THREADLINE_STREAM_REPLICAS", "1")


@breakage("nats", "max_payload too small for a 1 MiB Slack event",
          "deploy/k8s/nats/values.yaml (production)", "config.merge.max_payload << 1MB >>", "cannot carry an EventAccepted")
def _(i: Input):
    at(i.edit_values(), "config.merge")["max_payload"] = "<< 1MB >>"


@breakage("nats", "NATS_URL on the wrong port",
          "production/app:", "NATS_URL=nats://nats:4223", "is not the client Service of the NATS release")
def _(i: Input):
    set_data(i.edit("production/app", "ConfigMap", "threadline-common"), "NATS_URL", "nats://nats:4223")


@breakage("nats", "NATS_URL no longer given to the services (the default is the pod itself)",
          "dev/app:", "Deployment/threadline-gateway", "NATS_URL is not set")
def _(i: Input):
    cmap = i.edit("dev/app", "ConfigMap", "threadline-common")
    if cmap.get("data", {}).pop("NATS_URL", None) is None:
        raise Missing("NATS_URL in threadline-common")


# NATS authorization: the broker's users are the code's, and each service
# logs in as its own.

def user_entry(values: dict, user: str) -> dict:
    for u in at(values, "config.merge.authorization.users"):
        if u.get("user") == user:
            return u
    raise Missing(f"NATS user {user}")


@breakage("nats-auth", "the NATS values let the gateway publish proposals",
          "deploy/k8s/nats/values.yaml (production)", "config.merge.authorization is not what the code renders",
          "user gateway: publish allows tl.proposals")
def _(i: Input):
    user_entry(i.edit_values(), "gateway")["permissions"]["publish"] = {"allow": ["tl.proposals"]}


@breakage("nats-auth", "a password the authorization names is not given to nats-server",
          "deploy/k8s/nats/values.yaml (dev", "$NATS_PASSWORD_INFERENCE", "container.env does not set it")
def _(i: Input):
    if at(i.edit_values(), "container.env").pop("NATS_PASSWORD_INFERENCE", None) is None:
        raise Missing("container.env.NATS_PASSWORD_INFERENCE")


@breakage("nats-auth", "inference logs in with the publisher's password",
          "production/app:", "Deployment/threadline-inference", "NATS_PASSWORD_PUBLISHER",
          "reads the password of inference from Secret threadline-nats/NATS_PASSWORD_INFERENCE")
def _(i: Input):
    c = container(i.edit("production/app", "Deployment", "threadline-inference"), "threadline-inference")
    for e in c.get("env") or []:
        if e.get("name") == "NATS_PASSWORD":
            e["valueFrom"]["secretKeyRef"]["key"] = "NATS_PASSWORD_PUBLISHER"
            return
    raise Missing("NATS_PASSWORD of threadline-inference")


@breakage("nats-auth", "the NATS password as a plain value in the manifest",
          "dev/app:", "Deployment/threadline-publisher", "NATS_PASSWORD comes from env")
def _(i: Input):
    set_env(container(i.edit("dev/app", "Deployment", "threadline-publisher"), "threadline-publisher"),
            "NATS_PASSWORD", "hunter2")


@breakage("nats-auth", "a worker without its NATS user",
          "production/app-without-keda:", "Deployment/threadline-context-builder", "NATS_USER is not set")
def _(i: Input):
    drop_env(container(i.edit("production/app-without-keda", "Deployment", "threadline-context-builder"),
                       "threadline-context-builder"), "NATS_USER")


@breakage("nats-auth", "the internet-facing gateway relays the outbox again",
          "production/app:", "Deployment/threadline-gateway", "NATS_USER=gateway, but it must log in as relay")
def _(i: Input):
    set_data(i.edit("production/app", "ConfigMap", "threadline-gateway"), "THREADLINE_RELAY_ENABLED", "true")


@breakage("nats-auth", "nothing relays the outbox",
          "dev/app:", "no workload relays the outbox")
def _(i: Input):
    set_data(i.edit("dev/app", "ConfigMap", "threadline-relay"), "THREADLINE_RELAY_ENABLED", "false")


@breakage("nats-auth", "a bus prefix the NATS users' permissions are not for",
          "production/app:", "THREADLINE_BUS_PREFIX=tl2", "permissions are for the prefix tl")
def _(i: Input):
    set_data(i.edit("production/app", "ConfigMap", "threadline-common"), "THREADLINE_BUS_PREFIX", "tl2")


# Kubernetes itself: schemas, pod security, namespaces, CLI jobs.

@breakage("kubernetes", "an unknown field in a Deployment",
          "production/app:", "Deployment/threadline-publisher does not validate against Kubernetes")
def _(i: Input):
    at(i.edit("production/app", "Deployment", "threadline-publisher"), "spec")["replica"] = 2


@breakage("kubernetes", "a writable root filesystem",
          "production/app:", "Deployment/threadline-gateway container threadline-gateway", "readOnlyRootFilesystem must be true")
def _(i: Input):
    c = container(i.edit("production/app", "Deployment", "threadline-gateway"), "threadline-gateway")
    at(c, "securityContext")["readOnlyRootFilesystem"] = False


@breakage("kubernetes", "an object without a namespace",
          "production/app:", "Service/threadline-gateway: no metadata.namespace")
def _(i: Input):
    at(i.edit("production/app", "Service", "threadline-gateway"), "metadata").pop("namespace", None)


@breakage("kubernetes", "a migrate Job running a subcommand the CLI does not have",
          "production/migrate:", "Job/threadline-migrate", "'migrat' is not a threadline subcommand")
def _(i: Input):
    c = container(i.edit("production/migrate", "Job", "threadline-migrate"), "threadline")
    c["args"] = ["migrat"] + list(c.get("args") or [])[1:]


# ---------------------------------------------------------------- run

def run(renders, code, nats_values, nats_install, kv, real_errors, verbose=False):
    """(summary line, failures): every breakage must be caught."""
    fingerprint = json.dumps([renders, nats_values, nats_install], sort_keys=True, default=str)
    failures: list[str] = []
    details: list[str] = []

    base = cm.Report()
    cm.check_all(base, list(renders), code, nats_values, nats_install, kv)
    baseline = set(base.errors)
    if not baseline <= set(real_errors):
        failures.append(f"self-test: the unaltered copy gives errors the real run did not: "
                        f"{sorted(baseline - set(real_errors))}")

    caught = 0
    for b in BREAKAGES:
        inp = Input(renders, nats_values, nats_install)
        label = f"{b.family}: {b.what}"
        try:
            b.apply(inp)
        except Missing as e:
            failures.append(f"self-test: breakage [{label}] could not be applied, {e} is gone: update selftest.py")
            continue
        rep = cm.Report()
        cm.check_all(rep, inp.renders, code, inp.values, inp.install, kv)
        new = [e for e in rep.errors if e not in baseline]
        hits = [e for e in new if all(x in e for x in b.expect)]
        if hits:
            caught += 1
            details.append(f"  caught  [{label}] {hits[0]}")
        else:
            failures.append(f"self-test: NOT CAUGHT [{label}]: no new error contains {list(b.expect)}; "
                            f"new errors: {new or 'none'}")
            details.append(f"  MISSED  [{label}]")

    if json.dumps([renders, nats_values, nats_install], sort_keys=True, default=str) != fingerprint:
        failures.append("self-test: a check or a breakage altered the shared input (checks must not "
                        "modify documents; breakages must use Input.edit)")

    families = Counter(b.family for b in BREAKAGES)
    summary = (f"self-test: {len(BREAKAGES)} breakages, "
               + ("all caught" if caught == len(BREAKAGES) else f"{len(BREAKAGES) - caught} FAILED")
               + f" ({', '.join(f'{f} {n}' for f, n in families.items())}); "
               + f"unaltered input: {len(baseline) or 'no'} error{'' if len(baseline) == 1 else 's'}")
    if verbose:
        summary = "\n".join([summary] + details)
    return summary, failures
