#!/usr/bin/env python3
# Checks what deploy/ ships, offline: renders the Helm chart with Helm's own engine (the Go
# library inside helm-python-sdk) for several value sets, validates every manifest against the
# Kubernetes JSON schemas, checks the values that must refuse to render, parses the Grafana
# dashboard and the alert rules (every PromQL expression with a PromQL parser; the alerts' unit
# tests too when promtool is at hand), and lists the metric names they use. Run it through
# scripts/check-deploy.sh, which makes its venv.
#
#   check.py [--metric-names-out PATH] [--kube-versions 1.25.0,1.30.0,1.37.0]
#
# Exit status 0 when everything holds; 1, after naming each failure, otherwise.

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import helm_python as helm
import kubernetes_validate
import promql_parser
import yaml

DEPLOY = Path(__file__).resolve().parent
REPO = DEPLOY.parent
CHART = DEPLOY / "helm" / "inferq"
RULES = CHART / "files" / "inferq-alerts.yaml"
DASHBOARD = DEPLOY / "grafana" / "inferq.json"
OPERATIONS = REPO / "docs" / "src" / "operations.md"
RUNBOOK_PAGE = "https://github.com/inferq/inferq/blob/main/docs/src/operations.md"
RELEASE, NAMESPACE = "prod", "inferq"

# Kinds without a Kubernetes schema: checked by hand (apiVersion, kind, spec's keys).
CRDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): {"selector", "endpoints"},
    ("monitoring.coreos.com/v1", "PrometheusRule"): {"groups"},
}
# Series Prometheus makes itself rather than reads from a target.
SYNTHETIC_METRICS = {"up"}
# Grafana's variables, replaced by something PromQL parses.
GRAFANA_VARIABLES = {
    "$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h",
    "${namespace}": ".*", "$namespace": ".*", "${queue}": ".*", "$queue": ".*",
}


class Failures:
    """Every failure found, so one run names them all."""

    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, where: str, what: str) -> None:
        self.items.append(f"{where}: {what}")

    def check(self, ok: bool, where: str, what: str) -> bool:
        if not ok:
            self.add(where, what)
        return ok


# --- The chart ---------------------------------------------------------------------------------

def merged(*layers: dict[str, Any]) -> dict[str, Any]:
    """Deep merge of value overrides, later layers winning."""
    out: dict[str, Any] = {}
    for layer in layers:
        for key, value in layer.items():
            if isinstance(value, dict) and isinstance(out.get(key), dict):
                out[key] = merged(out[key], value)
            else:
                out[key] = copy.deepcopy(value)
    return out


BATCH_KEYS = {"sk-team-a-0123456789abcdef": "team-a", "sk-team-b-fedcba9876543210": "team-b"}

# name -> (values, the kinds and names the render must hold)
VALUE_SETS: dict[str, tuple[dict[str, Any], set[tuple[str, str]]]] = {
    "defaults": ({}, {
        ("Deployment", "prod-inferq"), ("Service", "prod-inferq-metrics"),
        ("ConfigMap", "prod-inferq-config"), ("Secret", "prod-inferq-redis"),
        ("ServiceAccount", "prod-inferq"),
    }),
    "batch-api-on-s3": ({
        "batchApi": {
            "enabled": True, "replicaCount": 2, "queue": "request-sortedset",
            "files": {"url": "s3://inferq-batches/prod", "s3": {
                "existingSecret": "batch-s3", "region": "eu-west-1",
                "endpoint": "http://minio:9000", "allowHttp": True}},
            "apiKeys": {"keys": {**BATCH_KEYS, "sk-team-c-0123456789abcdef": {
                "tenant": "team-c", "weight": 2, "max_enqueued_lines": 100_000}}},
            "maxLines": 1000, "maxFileBytes": 50_000_000, "allowCompletionWindows": ["1h", "30s"],
            "lease": "15s", "cancelGrace": "20s",
            "maxEnqueuedLines": 200_000, "fileRetention": "168h", "batchRetention": "720h",
            "minExpiresAfter": "1h", "sweepInterval": "30s", "orphanGrace": "2h",
        },
    }, {
        ("Deployment", "prod-inferq"), ("Deployment", "prod-inferq-batch-api"),
        ("Service", "prod-inferq-batch-api"), ("Secret", "prod-inferq-api-keys"),
        ("PodDisruptionBudget", "prod-inferq-batch-api"),
    }),
    "existing-secrets": ({
        "redis": {"url": "", "existingSecret": "redis-credentials", "existingSecretKey": "url"},
        "transportConfig": {"existingSecret": "inferq-transport", "existingSecretKey": "config.json",
                            "rolloutOnChange": False, "watchInterval": "30s"},
        "processor": {
            "replicaCount": 2,
            "poolConfig": [{"id": "default", "workers": 32},
                           {"id": "bulk", "workers": 8, "gate_type": "redis",
                            "gate_params": {"address": "redis:6379"}}],
            "mergePolicyConfig": {"type": "random-robin", "parameters": {}},
            "claimLeaseTtl": "45s", "claimReclaimInterval": "5s",
            "extraEnv": [{"name": "OTEL_EXPORTER_OTLP_ENDPOINT", "value": "http://otel:4317"}],
        },
        "batchApi": {
            "enabled": True, "replicaCount": 2,
            "files": {"persistence": {"existingClaim": "shared-batch-files"}},
            "apiKeys": {"existingSecret": "batch-api-keys", "existingSecretKey": "keys.json"},
        },
        "serviceAccount": {"create": False, "name": "inferq-runner"},
    }, {
        ("Deployment", "prod-inferq"), ("Deployment", "prod-inferq-batch-api"),
        ("ConfigMap", "prod-inferq-config"), ("PodDisruptionBudget", "prod-inferq"),
    }),
    "monitoring-and-budgets": ({
        "processor": {"replicaCount": 3},
        "batchApi": {"enabled": True, "insecureNoAuth": True,
                     "files": {"persistence": {"enabled": False}},
                     "podDisruptionBudget": {"enabled": True, "minAvailable": 1}},
        "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
        "prometheusRule": {"enabled": True, "labels": {"release": "kube-prometheus-stack"},
                           "additionalRuleLabels": {"team": "ml-platform"},
                           "runbookBaseUrl": "https://docs.example.com/inferq/operations.html"},
    }, {
        ("ServiceMonitor", "prod-inferq"), ("ServiceMonitor", "prod-inferq-batch-api"),
        ("PrometheusRule", "prod-inferq"), ("PodDisruptionBudget", "prod-inferq"),
        ("PodDisruptionBudget", "prod-inferq-batch-api"),
    }),
    "go-url-secret": ({
        "redis": {"url": ""},
        "processor": {"gateWaitTimeout": "30s"},
        "transportConfig": {"config": {
            "urlSecret": {"name": "redis-auth", "key": "url"},
            "queues": [{"queue_name": "q", "igw_base_url": "http://gateway:80"}]}},
    }, {("Deployment", "prod-inferq"), ("ConfigMap", "prod-inferq-config")}),
    "pubsub-long-drain": ({
        "processor": {"transport": "redis-pubsub", "drainTimeout": "3m30s",
                      "terminationGracePeriodSeconds": 240, "logging": {"format": "console"},
                      "transformConfig": {"requestTransforms": []}},
        "transportConfig": {"config": {"queues": [
            {"queue_name": "request-queue", "igw_base_url": "http://gateway:80"}]}},
    }, {("Deployment", "prod-inferq")}),
}

# name -> (values, text the refusal must contain)
REFUSED: dict[str, tuple[dict[str, Any], str]] = {
    "grace period below the drain timeout": (
        {"processor": {"terminationGracePeriodSeconds": 100}},
        "processor.terminationGracePeriodSeconds (100) must be above processor.drainTimeout (2m = 120s)"),
    "grace period equal to the drain timeout": (
        {"processor": {"drainTimeout": "1m30s", "terminationGracePeriodSeconds": 90}},
        "processor.terminationGracePeriodSeconds (90) must be above processor.drainTimeout (1m30s = 90s)"),
    "a drain timeout that is no duration (values.schema.json)": (
        {"processor": {"drainTimeout": "two minutes"}},
        "at '/processor/drainTimeout': 'two minutes' does not match pattern"),
    "a misspelt key (values.schema.json)": (
        {"processor": {"drainTimeOut": "2m"}},
        "additional properties 'drainTimeOut' not allowed"),
    "a key's tenant weight of 0 (values.schema.json)": (
        {"batchApi": {"enabled": True, "apiKeys": {"keys": {
            "sk-team-a-0123456789abcdef": {"tenant": "team-a", "weight": 0}}}}},
        "/batchApi/apiKeys/keys/sk-team-a-0123456789abcdef"),
    "a Batch API without keys": (
        {"batchApi": {"enabled": True}},
        "batchApi: give API keys"),
    "Batch API replicas on an emptyDir": (
        {"batchApi": {"enabled": True, "replicaCount": 2, "insecureNoAuth": True,
                      "files": {"persistence": {"enabled": False}}}},
        "every replica must see the same files"),
    "Batch API replicas on a ReadWriteOnce claim": (
        {"batchApi": {"enabled": True, "replicaCount": 2, "insecureNoAuth": True}},
        "ReadWriteMany"),
    "a urlSecret without its key": (
        {"transportConfig": {"urlSecret": {"name": "redis-auth"}}},
        "transportConfig.urlSecret.key"),
    "no Redis URL anywhere": (
        {"redis": {"url": ""}},
        "no Redis URL"),
    "the Batch API beside redis-pubsub": (
        {"processor": {"transport": "redis-pubsub"}, "batchApi": {"enabled": True, "insecureNoAuth": True}},
        "cannot run beside processor.transport=redis-pubsub"),
}


def go_seconds(text: str) -> float:
    """A Go duration in seconds (the chart's own parser is what is under test; this is the reference)."""
    if text == "0":
        return 0.0
    factors = {"h": 3600, "m": 60, "s": 1, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
    parts = re.findall(r"([0-9.]+)(ns|us|µs|ms|s|m|h)", text)
    return sum(float(n) * factors[u] for n, u in parts)


def cli_flags() -> dict[str, set[str]]:
    """The long flags `inferq run` and `inferq batch-api` accept, read from their clap definitions."""
    sources = {
        "run": REPO / "crates" / "inferq" / "src" / "config" / "args.rs",
        "batch-api": REPO / "crates" / "inferq" / "src" / "cli" / "batch_api.rs",
    }
    flags: dict[str, set[str]] = {}
    for command, path in sources.items():
        text = path.read_text()
        found = set()
        for attrs, field in re.findall(r"#\[arg\(((?:[^()]|\([^()]*\))*)\)\]\s*(?:///[^\n]*\n\s*)*pub (\w+):", text):
            named = re.search(r'\blong\s*=\s*"([^"]+)"', attrs)
            if named:
                found.add(named.group(1))
            elif re.search(r"\blong\b", attrs):
                found.add(field.replace("_", "-"))
        flags[command] = found
    if "drain-timeout" not in flags["run"] or "files-dir" not in flags["batch-api"]:
        raise SystemExit("check.py: cannot read the flags of inferq's command line from crates/; has the source moved?")
    return flags


def used_flags(args: list[str]) -> list[str]:
    return [a[2:].split("=", 1)[0] for a in args if a.startswith("--")]


def render(chart: helm.Chart, values: dict[str, Any]) -> dict[str, str]:
    chart.validate_schema(values)
    return chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)


def documents(rendered: dict[str, str], fail: Failures, where: str) -> list[dict[str, Any]]:
    docs = []
    for path, text in sorted(rendered.items()):
        if path.endswith("NOTES.txt"):
            continue
        try:
            for doc in yaml.safe_load_all(text):
                if doc is None:
                    continue
                if not isinstance(doc, dict):
                    fail.add(f"{where} {path}", f"a document that is not a mapping: {doc!r:.80}")
                    continue
                docs.append(doc)
        except yaml.YAMLError as e:
            fail.add(f"{where} {path}", f"not YAML: {e}")
    return docs


def check_crd(doc: dict[str, Any], fail: Failures, where: str) -> None:
    keys = CRDS[(doc["apiVersion"], doc["kind"])]
    spec = doc.get("spec")
    if not fail.check(isinstance(spec, dict), where, "spec is not a mapping"):
        return
    fail.check(keys <= set(spec), where, f"spec lacks {sorted(keys - set(spec))}")
    if doc["kind"] == "ServiceMonitor":
        sel = spec.get("selector", {}).get("matchLabels")
        fail.check(isinstance(sel, dict) and bool(sel), where, "selector.matchLabels is empty")
        for ep in spec.get("endpoints", []):
            fail.check(isinstance(ep.get("port"), str) and ep.get("path") == "/metrics", where,
                       f"endpoint {ep} does not scrape a named port's /metrics")
    if doc["kind"] == "PrometheusRule":
        check_rule_groups(spec, fail, where, runbook_page=None)


def check_manifests(docs: list[dict[str, Any]], versions: list[str], fail: Failures, where: str) -> None:
    for doc in docs:
        kind, api = doc.get("kind"), doc.get("apiVersion")
        name = (doc.get("metadata") or {}).get("name")
        at = f"{where} {kind}/{name}"
        if not fail.check(bool(kind and api and name), at, "apiVersion, kind and metadata.name are required"):
            continue
        fail.check(doc["metadata"].get("namespace") == NAMESPACE, at, "metadata.namespace is not the release's")
        if (api, kind) in CRDS:
            check_crd(doc, fail, at)
            continue
        for version in versions:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                path = "/".join(str(p) for p in e.path)
                fail.add(at, f"invalid for Kubernetes {version} at {path or '(top)'}: {e.message}")
            except kubernetes_validate.SchemaNotFoundError as e:
                fail.add(at, e.message)


def pod_spec_checks(docs: list[dict[str, Any]], values: dict[str, Any], flags: dict[str, set[str]],
                    fail: Failures, where: str) -> None:
    """What the manifests must say whatever the values: the command, real flags, probes, the
    grace period, a locked-down container."""
    by_component = {}
    for doc in docs:
        if doc["kind"] == "Deployment":
            by_component[doc["metadata"]["labels"]["app.kubernetes.io/component"]] = doc
    processor = by_component.get("processor")
    if not fail.check(processor is not None, where, "no processor Deployment"):
        return
    wanted = {"processor": ("run", "health"), "batch-api": ("batch-api", "http")}
    for component, doc in by_component.items():
        at = f"{where} Deployment/{doc['metadata']['name']}"
        command, port = wanted[component]
        pod = doc["spec"]["template"]["spec"]
        c = pod["containers"][0]
        fail.check(c.get("command") == ["/usr/local/bin/inferq"], at, f"command is {c.get('command')}")
        fail.check(c["args"][0] == command, at, f"the subcommand is {c['args'][0]!r}, not {command!r}")
        unknown = sorted(set(used_flags(c["args"])) - flags[command])
        fail.check(not unknown, at, f"flags `inferq {command}` does not have: {unknown}")
        fail.check(c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": port}, at, "liveness is not /healthz")
        fail.check(c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": port}, at, "readiness is not /readyz")
        sc = c.get("securityContext", {})
        fail.check(sc.get("readOnlyRootFilesystem") is True and sc.get("allowPrivilegeEscalation") is False
                   and sc.get("capabilities", {}).get("drop") == ["ALL"], at, "the container is not locked down")
        fail.check(pod.get("securityContext", {}).get("runAsNonRoot") is True, at, "the pod may run as root")
        mounts = {m["mountPath"] for m in c.get("volumeMounts", [])}
        fail.check("/etc/inferq" in mounts, at, "/etc/inferq is not mounted")
        fail.check("--transport-config-file=/etc/inferq/transport.json" in c["args"], at,
                   "the transport config is not /etc/inferq/transport.json")
    c = processor["spec"]["template"]["spec"]["containers"][0]
    at = f"{where} Deployment/{processor['metadata']['name']}"
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    fail.check(c["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}, at, "start-up is not /healthz")
    fail.check(set(ports) == {"health", "metrics"}, at, f"ports are {ports}")
    drain = next(a.split("=", 1)[1] for a in c["args"] if a.startswith("--drain-timeout="))
    grace = processor["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    fail.check(grace > go_seconds(drain), at, f"terminationGracePeriodSeconds {grace} is not above --drain-timeout {drain}")
    given = values.get("processor", {}).get("terminationGracePeriodSeconds")
    if given is None:
        fail.check(grace == int(go_seconds(drain)) + 10, at, f"the computed grace period is {grace}, not drain + 10s")
    env = {e["name"]: e for e in c.get("env", [])}
    redis = values.get("redis", {})
    tc = values.get("transportConfig", {})
    url_secret = tc.get("urlSecret", {}) if tc.get("urlSecret", {}).get("name") else tc.get("config", {}).get("urlSecret", {})
    if url_secret.get("name"):
        ref = env.get("REDIS_URL", {}).get("valueFrom", {}).get("secretKeyRef", {})
        fail.check(ref == {"name": url_secret["name"], "key": url_secret["key"]}, at,
                   f"REDIS_URL does not come from transportConfig.urlSecret: {ref}")
    elif redis.get("existingSecret"):
        ref = env.get("REDIS_URL", {}).get("valueFrom", {}).get("secretKeyRef", {})
        fail.check(ref == {"name": redis["existingSecret"], "key": redis["existingSecretKey"]}, at,
                   f"REDIS_URL does not come from the existing Secret: {ref}")


def check_rendered_rules(docs: list[dict[str, Any]], values: dict[str, Any], fail: Failures, where: str) -> None:
    """The PrometheusRule carries the canonical file's alerts, with the values' labels and runbook page."""
    source = yaml.safe_load(RULES.read_text())
    for doc in docs:
        if doc["kind"] != "PrometheusRule":
            continue
        at = f"{where} PrometheusRule/{doc['metadata']['name']}"
        want = [r["alert"] for g in source["groups"] for r in g["rules"]]
        got = [r.get("alert") for g in doc["spec"]["groups"] for r in g["rules"]]
        fail.check(got == want, at, f"alerts {got} are not the rules file's {want}")
        pr = values.get("prometheusRule", {})
        for g in doc["spec"]["groups"]:
            for r in g["rules"]:
                for k, v in pr.get("additionalRuleLabels", {}).items():
                    fail.check(r["labels"].get(k) == v, at, f"{r['alert']} lacks label {k}={v}")
                fail.check("severity" in r["labels"], at, f"{r['alert']} lost its severity")
                if pr.get("runbookBaseUrl"):
                    fail.check(r["annotations"]["runbook_url"].startswith(pr["runbookBaseUrl"] + "#"), at,
                               f"{r['alert']}'s runbook_url is not on {pr['runbookBaseUrl']}")


def check_chart(versions: list[str], fail: Failures) -> None:
    flags = cli_flags()
    report = helm.lint(str(CHART), strict=True, namespace=NAMESPACE, kube_version=f"v{versions[-1]}")
    for m in report.get("messages", []):
        if m["severity"] >= 2:
            fail.add(f"helm lint {m['path']}", m["error"])
    for e in report.get("errors", []):
        if not any(e == m["error"] for m in report.get("messages", [])):
            fail.add("helm lint", e)
    with helm.Chart.load(str(CHART)) as chart:
        for name, (values, expected) in VALUE_SETS.items():
            where = f"[{name}]"
            try:
                rendered = render(chart, values)
            except helm.HelmError as e:
                fail.add(where, f"does not render: {e}")
                continue
            docs = documents(rendered, fail, where)
            have = {(d.get("kind"), (d.get("metadata") or {}).get("name")) for d in docs}
            fail.check(expected <= have, where, f"missing {sorted(expected - have)}")
            check_manifests(docs, versions, fail, where)
            pod_spec_checks(docs, merged(chart.values, values), flags, fail, where)
            check_rendered_rules(docs, values, fail, where)
            for doc in docs:
                if doc["kind"] == "ConfigMap":
                    for key, text in (doc.get("data") or {}).items():
                        try:
                            parsed = json.loads(text)
                        except json.JSONDecodeError as e:
                            fail.add(f"{where} ConfigMap/{doc['metadata']['name']} {key}", f"not JSON: {e}")
                            continue
                        # The Go chart's urlSecret is the chart's: the processor must not see it.
                        fail.check(not (key == "transport.json" and "urlSecret" in parsed),
                                   f"{where} ConfigMap/{doc['metadata']['name']}", "transport.json keeps urlSecret")
                if doc["kind"] == "Secret" and doc["metadata"]["name"].endswith("-redis"):
                    tc = values.get("transportConfig", {})
                    fail.check(not (tc.get("urlSecret") or tc.get("config", {}).get("urlSecret")), where,
                               "a Redis URL Secret is made beside the urlSecret")
            print(f"  chart [{name}]: {len(docs)} manifests")
        for name, (values, message) in REFUSED.items():
            where = f"[refuses {name}]"
            try:
                render(chart, values)
                fail.add(where, "rendered, but must fail")
            except helm.HelmError as e:
                fail.check(message in str(e), where, f"failed without saying {message!r}: {e}")
        print(f"  chart: {len(REFUSED)} value sets refused with their message")


# --- PromQL ------------------------------------------------------------------------------------

def metric_names(expr: str, fail: Failures, where: str) -> set[str]:
    """The metric names an expression selects, from its parsed syntax tree."""
    try:
        tree = promql_parser.parse(expr)
    except ValueError as e:
        fail.add(where, f"PromQL does not parse ({e}): {expr}")
        return set()
    names: set[str] = set()

    def visit(node: Any, *_: Any) -> bool:
        if isinstance(node, promql_parser.VectorSelector):
            if node.name:
                names.add(node.name)
            else:
                exact = re.search(r'__name__="([^"]+)"', str(node.matchers))
                if exact:
                    names.add(exact.group(1))
                else:
                    fail.add(where, f"a selector without a plain metric name: {node}")
        return True

    promql_parser.walk(tree, visit)
    return names


def grafana_expr(expr: str) -> str:
    """The expression with Grafana's variables replaced; an unknown one is left to fail the parse."""
    for var, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(var, value)
    return expr


def label_values_selector(query: str) -> str | None:
    """The series selector of a Grafana `label_values(selector, label)` variable query."""
    m = re.fullmatch(r"\s*label_values\((.*),\s*\w+\s*\)\s*", query)
    return m.group(1) if m else None


# --- The dashboard -----------------------------------------------------------------------------

def check_dashboard(fail: Failures) -> set[str]:
    where = str(DASHBOARD.relative_to(REPO))
    try:
        dash = json.loads(DASHBOARD.read_text())
    except (OSError, json.JSONDecodeError) as e:
        fail.add(where, f"not JSON: {e}")
        return set()
    names: set[str] = set()
    variables = {v["name"]: v for v in dash.get("templating", {}).get("list", [])}
    ds = variables.get("datasource", {})
    fail.check(ds.get("type") == "datasource" and ds.get("query") == "prometheus", where,
               "no Prometheus data source variable named datasource")
    fail.check("queue" in variables, where, "no queue variable")
    for var in variables.values():
        if var.get("type") != "query":
            continue
        query = var["query"] if isinstance(var["query"], str) else var["query"].get("query", "")
        selector = label_values_selector(query)
        if fail.check(selector is not None, f"{where} variable {var['name']}", f"not a label_values() query: {query}"):
            names |= metric_names(grafana_expr(selector), fail, f"{where} variable {var['name']}")
    ids: set[int] = set()
    cells: dict[tuple[int, int], str] = {}
    panels = dash.get("panels", [])
    fail.check(bool(panels), where, "no panels")
    for panel in panels:
        title = panel.get("title", "?")
        at = f"{where} panel {title!r}"
        fail.check(panel.get("id") not in ids, at, f"id {panel.get('id')} is used twice")
        ids.add(panel.get("id"))
        pos = panel.get("gridPos", {})
        if fail.check(all(isinstance(pos.get(k), int) for k in "xywh") and pos["x"] + pos["w"] <= 24, at,
                      f"gridPos {pos} is not inside the 24 columns"):
            for x in range(pos["x"], pos["x"] + pos["w"]):
                for y in range(pos["y"], pos["y"] + pos["h"]):
                    fail.check((x, y) not in cells, at, f"overlaps panel {cells.get((x, y))!r}")
                    cells[(x, y)] = title
        if panel.get("type") == "row":
            fail.check(not panel.get("panels"), at, "a collapsed row: its panels would go unchecked")
            continue
        targets = panel.get("targets") or []
        fail.check(bool(targets), at, "no targets")
        fail.check(panel.get("datasource", {}).get("uid") == "${datasource}", at, "does not use the datasource variable")
        for t in targets:
            expr = t.get("expr", "")
            if fail.check(bool(expr.strip()) and bool(t.get("refId")), at, f"a target without expr or refId: {t}"):
                names |= metric_names(grafana_expr(expr), fail, at)
    print(f"  dashboard: {len(panels)} panels, {len(names)} metric names")
    return names


# --- The alert rules ---------------------------------------------------------------------------

def heading_anchors(markdown: str) -> set[str]:
    """The anchors mdbook and GitHub give the headings of a page."""
    anchors = set()
    for line in markdown.splitlines():
        m = re.match(r"#{1,6}\s+(.*)", line)
        if m:
            text = re.sub(r"[`*_\[\]]|\(.*?\)", "", m.group(1)).strip().lower()
            anchors.add(re.sub(r"[^a-z0-9 _-]", "", text).replace(" ", "-"))
    return anchors


def check_rule_groups(spec: dict[str, Any], fail: Failures, where: str, runbook_page: str | None) -> set[str]:
    names: set[str] = set()
    groups = spec.get("groups")
    if not fail.check(isinstance(groups, list) and bool(groups), where, "no groups"):
        return names
    anchors = heading_anchors(OPERATIONS.read_text()) if runbook_page else set()
    seen: set[str] = set()
    for group in groups:
        if not fail.check(isinstance(group, dict) and group.get("name") and isinstance(group.get("rules"), list),
                          where, f"a group without name or rules: {group!r:.80}"):
            continue
        for rule in group["rules"]:
            alert = rule.get("alert", "?")
            at = f"{where} {alert}"
            fail.check(alert not in seen, at, "alert name used twice")
            seen.add(alert)
            fail.check(set(rule) <= {"alert", "expr", "for", "keep_firing_for", "labels", "annotations"}, at,
                       f"unknown keys {sorted(set(rule) - {'alert', 'expr', 'for', 'labels', 'annotations'})}")
            if "for" in rule:
                fail.check(bool(re.fullmatch(r"([0-9]+(ms|s|m|h|d|w|y))+", str(rule["for"]))), at, f"`for: {rule['for']}` is no duration")
            fail.check(rule.get("labels", {}).get("severity") in {"critical", "warning", "info"}, at, "no severity label")
            notes = rule.get("annotations", {})
            for key in ("summary", "description", "runbook_url"):
                fail.check(bool(notes.get(key)), at, f"no {key} annotation")
            if runbook_page and notes.get("runbook_url"):
                page, _, anchor = notes["runbook_url"].partition("#")
                fail.check(page == runbook_page, at, f"runbook_url is not on {runbook_page}")
                fail.check(anchor in anchors, at, f"runbook_url's #{anchor} is no heading of docs/src/operations.md")
            if fail.check(isinstance(rule.get("expr"), str), at, "no expr"):
                names |= metric_names(rule["expr"], fail, at)
    return names


def check_rules(fail: Failures) -> set[str]:
    where = str(RULES.relative_to(REPO))
    fail.check(not (DEPLOY / "prometheus" / "inferq-alerts.yaml").exists(), "deploy/prometheus/inferq-alerts.yaml",
               f"must not exist: the canonical rules file is {where}")
    try:
        rules = yaml.safe_load(RULES.read_text())
    except (OSError, yaml.YAMLError) as e:
        fail.add(where, f"not YAML: {e}")
        return set()
    if not fail.check(isinstance(rules, dict) and set(rules) == {"groups"}, where, "the top level must be `groups:` alone"):
        return set()
    names = check_rule_groups(rules, fail, where, runbook_page=RUNBOOK_PAGE)
    count = sum(len(g.get("rules", [])) for g in rules["groups"])
    print(f"  rules: {count} alerts, {len(names)} metric names")
    return names


def run_promtool(fail: Failures) -> None:
    """`promtool check rules` and the alerts' unit tests (alerts-test.yaml), when promtool is here:
    $PROMTOOL, or on PATH. No PyPI package ships it, so without it they are skipped, saying so."""
    named = os.environ.get("PROMTOOL")
    promtool = named or shutil.which("promtool")
    if not promtool:
        print("  promtool: not found (set PROMTOOL or put it on PATH): alert unit tests skipped")
        return
    for command in (["check", "rules", str(RULES.relative_to(DEPLOY))], ["test", "rules", "alerts-test.yaml"]):
        try:
            done = subprocess.run([promtool, *command], cwd=DEPLOY, capture_output=True, text=True, timeout=120)
        except OSError as e:
            fail.add("promtool", f"cannot run {promtool}: {e}")
            return
        if not fail.check(done.returncode == 0, f"promtool {' '.join(command)}", (done.stdout + done.stderr).strip()):
            return
    print(f"  promtool: rules checked, alert unit tests passed ({promtool})")


# --- The metric names --------------------------------------------------------------------------

def exported_metrics() -> set[str]:
    """Every family name inferq's source registers (processor, process collector, Batch API)."""
    found = set()
    for rel in ("crates/inferq/src/ops/metrics.rs", "crates/inferq/src/ops/dispatch_metrics.rs",
                "crates/inferq/src/ops/process.rs", "crates/batch/src/metrics.rs"):
        text = (REPO / rel).read_text()
        found |= {"llm_d_async_async_" + n for n in re.findall(r'go_name\(\s*"([a-z0-9_]+)"', text)}
        found |= set(re.findall(r'register\(\s*"([a-z_][a-z0-9_]*)"', text))
        found |= set(re.findall(r'"(process_[a-z_]+)"', text))
    return found


def check_names_exist(names: set[str], fail: Failures) -> None:
    """A static pre-check: each name is a registered family, or one with the suffix the text format adds."""
    families = exported_metrics()
    for name in sorted(names - SYNTHETIC_METRICS):
        base = re.sub(r"_(total|bucket|sum|count)$", "", name)
        fail.check(name in families or base in families, f"metric {name}",
                   "no family of that name is registered in inferq's source")


# --- Main --------------------------------------------------------------------------------------

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--metric-names-out", type=Path,
                        help="write every metric name the dashboard and the rules use here, one a line "
                             "(`up`, which Prometheus makes, is left out)")
    parser.add_argument("--kube-versions", default="1.25.0,1.30.0,1.37.0",
                        help="Kubernetes versions whose schemas the manifests must pass (comma-separated)")
    args = parser.parse_args()
    versions = [v.strip() for v in args.kube_versions.split(",") if v.strip()]
    started = time.monotonic()
    fail = Failures()
    print(f"deploy check: Helm {helm.helm_sdk_version()} (helm-python-sdk {helm.__version__}), "
          f"kubernetes-validate {kubernetes_validate.__version__} for Kubernetes {', '.join(versions)}")
    check_chart(versions, fail)
    names = check_dashboard(fail) | check_rules(fail)
    run_promtool(fail)
    check_names_exist(names, fail)
    listed = sorted(names - SYNTHETIC_METRICS)
    if args.metric_names_out:
        args.metric_names_out.parent.mkdir(parents=True, exist_ok=True)
        args.metric_names_out.write_text("".join(f"{n}\n" for n in listed))
        print(f"  metric names: {len(listed)} written to {args.metric_names_out}")
    elapsed = time.monotonic() - started
    if fail.items:
        print(f"\ndeploy check FAILED ({len(fail.items)} problems, {elapsed:.1f}s):", file=sys.stderr)
        for item in fail.items:
            print(f"  - {item}", file=sys.stderr)
        return 1
    print(f"deploy check passed in {elapsed:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
