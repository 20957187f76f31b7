"""The Helm chart, rendered by a real helm: lint, strict Kubernetes validation of every render, the
values schema, security settings, RBAC per mode, leader election, monitoring objects, NOTES."""
from __future__ import annotations

import re
import shutil
import textwrap
import tomllib

import jsonschema
import pytest
import yaml

from grpojob.cli import parser as cli_parser
from tests.helpers.k8s_schema import validate_all, validate_grpojob
from tests.helpers.pod_security import restricted

from .conftest import (ALL_ON, CHART, NAMESPACE, NAMESPACED, RELEASE, ROOT, VALUE_SETS, by_kind, one,
                       run_helm)

VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
PEERING_CRDS = {c["spec"]["names"]["kind"]: c for c in yaml.safe_load_all((CHART / "crds" / "kopf-peering.yaml").read_text())}

def operator_rules() -> set[tuple[str, str, str]]:
    """What the operator says it uses (operator/grpojob_operator/rbac.py), as (group, resource, verb)."""
    try:
        from grpojob_operator.rbac import RBAC_RULES
    except ImportError:
        pytest.skip("operator/grpojob_operator/rbac.py (RBAC_RULES) is not in this tree")
    return {(r.api_group, r.resource, v) for r in RBAC_RULES for v in r.verbs}


CLUSTER_SCOPED = {"customresourcedefinitions", "namespaces", "clusterkopfpeerings"}
PEERING = {"ClusterKopfPeering": "clusterkopfpeerings", "KopfPeering": "kopfpeerings"}


def without(rules: set[tuple[str, str, str]], *resources: str) -> set[tuple[str, str, str]]:
    return {t for t in rules if t[1] not in resources}


def triples(rules: list[dict]) -> set[tuple[str, str, str]]:
    return {(g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


def operator_container(objs: list[dict]) -> dict:
    (c,) = one(objs, "Deployment")["spec"]["template"]["spec"]["containers"]
    return c


# --- lint and validation -------------------------------------------------------------------------

@pytest.mark.parametrize("name", VALUE_SETS)
def test_helm_lint_strict(helm, name):
    out = run_helm(helm, "lint", "--strict", str(CHART), "-n", NAMESPACE, *VALUE_SETS[name])
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in out.stdout


@pytest.mark.parametrize("name", VALUE_SETS)
def test_every_render_passes_strict_kubernetes_validation(render, name):
    objs = render(*VALUE_SETS[name])
    peerings = [o for o in objs if o["apiVersion"].startswith("kopf.dev/")]
    monitors = [o for o in objs if o["apiVersion"].startswith("monitoring.coreos.com/")]
    builtin = [o for o in objs if o not in peerings and o not in monitors]
    assert validate_all(builtin) == len(builtin) >= 8
    for obj in peerings:  # custom objects: checked against the CRD the chart ships for them
        schema = PEERING_CRDS[obj["kind"]]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        jsonschema.validate(obj, schema, cls=jsonschema.Draft4Validator)
    for obj in monitors:
        check_monitor(obj)


def test_chart_crd_is_the_repository_crd():
    chart_copy = (CHART / "crds" / "grpojob.yaml").read_bytes()
    assert chart_copy == (ROOT / "crds" / "grpojob.yaml").read_bytes(), \
        "helm/grpojob/crds/grpojob.yaml differs from crds/grpojob.yaml: run `make crd`"


def test_peering_crds_are_the_resources_kopf_looks_for():
    """kopf's own selectors for its peering resources match the CRDs the chart ships."""
    from kopf._cogs.structs.references import CLUSTER_PEERINGS_K, NAMESPACED_PEERINGS_K, Resource

    for kind, selector, scope in [("ClusterKopfPeering", CLUSTER_PEERINGS_K, "Cluster"),
                                  ("KopfPeering", NAMESPACED_PEERINGS_K, "Namespaced")]:
        spec = PEERING_CRDS[kind]["spec"]
        names = spec["names"]
        resource = Resource(group=spec["group"], version=spec["versions"][0]["name"], plural=names["plural"],
                            kind=names["kind"], singular=names["singular"], namespaced=scope == "Namespaced")
        assert spec["scope"] == scope
        assert selector.check(resource), f"kopf would not find {kind} as the chart defines it"


def test_default_render_is_exactly_the_operator(render):
    objs = render()
    kinds = sorted((o["kind"], o["metadata"]["name"]) for o in objs)
    assert kinds == sorted([
        ("CustomResourceDefinition", "grpojobs.grpojob.io"),
        ("CustomResourceDefinition", "clusterkopfpeerings.kopf.dev"),
        ("CustomResourceDefinition", "kopfpeerings.kopf.dev"),
        ("ServiceAccount", RELEASE), ("ClusterRole", RELEASE), ("ClusterRoleBinding", RELEASE),
        ("Service", f"{RELEASE}-metrics"), ("Deployment", RELEASE),
    ])
    for o in objs:
        if o["kind"] not in ("CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding"):
            assert o["metadata"]["namespace"] == NAMESPACE, o["kind"]


# --- values schema -------------------------------------------------------------------------------

@pytest.mark.parametrize("args, field", [
    (["--set", "replicaCount=two"], "replicaCount"),
    (["--set", "replicaCount=0"], "replicaCount"),
    (["--set", "unknownKey=1"], "unknownKey"),
    (["--set", "image.registry=docker.io"], "registry"),
    (["--set", "metrics.serviceMonitor.scrape=true"], "scrape"),
    (["--set", "image.pullPolicy=Sometimes"], "pullPolicy"),
    (["--set", "metrics.podMonitor.interval=often"], "interval"),
    (["--set", "watchNamespaces={Not_A_Namespace}"], "watchNamespaces"),
    (["--set", "metrics.port=70000"], "port"),
    (["--set", "resources.limits.memory=lots"], "memory"),
    (["--set", "leaderElection.enabled=yes-please"], "enabled"),
    (["--set", "metrics.bindAddress=everywhere"], "bindAddress"),
    (["--set", "health.bindAddress=localhost"], "bindAddress"),
    (["--set", "jobs.metricsAuth=sometimes"], "metricsAuth"),
    (["--set", "networkPolicy.monitoringNamespaces={Prometheus_NS}"], "monitoringNamespaces"),
], ids=lambda v: v if isinstance(v, str) else v[1])
def test_schema_rejects_wrong_values(helm, args, field):
    out = run_helm(helm, "template", RELEASE, str(CHART), "-n", NAMESPACE, *args)
    assert out.returncode != 0, f"{args} rendered:\n{out.stdout[:500]}"
    assert "values don't meet the specifications of the schema" in out.stderr, out.stderr
    assert field in out.stderr, out.stderr


def test_schema_forbids_unknown_keys_at_every_level():
    """Every object the chart itself defines is closed (Kubernetes pass-through objects are checked
    by the API server instead)."""
    import json

    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def walk(node, path):
        if node.get("properties"):
            assert node.get("additionalProperties") is False, f"{path} accepts unknown keys"
            for k, child in node["properties"].items():
                walk(child, f"{path}.{k}")
    walk(schema, "values")
    assert set(values) <= set(schema["properties"]), "values.yaml keys missing from the schema"
    jsonschema.validate(values, schema)  # the defaults themselves pass


# --- the operator Deployment ---------------------------------------------------------------------

@pytest.mark.parametrize("name", VALUE_SETS)
def test_operator_pod_is_locked_down(render, name):
    objs = render(*VALUE_SETS[name])
    pod = one(objs, "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] > 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    c = operator_container(objs)
    sc = c["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    assert sc["privileged"] is False and sc["capabilities"] == {"drop": ["ALL"]}
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(c["resources"][kind]), kind
    # The only writable path is an emptyDir.
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert mounts == {"tmp": "/tmp"} and pod["volumes"][0]["emptyDir"]
    # PodSecurity admission, acted out: the operator's namespace may enforce `restricted`.
    assert restricted(pod) == []


def test_default_images_are_the_release_images(render):
    c = operator_container(render())
    assert c["image"] == f"ghcr.io/grpojob/operator:{VERSION}"
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["GRPOJOB_RUNTIME_IMAGE"] == f"ghcr.io/grpojob/runtime:{VERSION}"
    assert yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"] == VERSION
    assert operator_container(render(*ALL_ON))["image"] == "ghcr.io/grpojob/operator@sha256:" + "a" * 64


@pytest.mark.parametrize("name", VALUE_SETS)
def test_operator_args_parse_with_the_real_cli(render, name):
    """The container runs `grpojob <args>` (the image's entrypoint): parse the args with grpojob's own
    parser and check they agree with the ports, probes, namespaces and replicas of the render."""
    objs = render(*VALUE_SETS[name])
    deploy = one(objs, "Deployment")
    c = operator_container(objs)
    args = cli_parser().parse_args(c["args"])
    assert args.command == "operator"
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert args.metrics_port == ports["metrics"] and args.metrics_host == "0.0.0.0"
    assert args.liveness == f"http://0.0.0.0:{ports['health']}/healthz"
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    watch = ["ml", "research"] if "watch" in name else []
    assert args.namespace == watch
    replicas = deploy["spec"]["replicas"]
    assert args.peering == ("grpojob" if replicas > 1 else None)
    # Without leader election two operators must never overlap during an upgrade.
    assert deploy["spec"]["strategy"]["type"] == ("RollingUpdate" if args.peering else "Recreate")
    env = {e["name"]: e for e in c["env"]}
    assert env["POD_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"  # kopf's peer id


@pytest.mark.parametrize("metrics, health, liveness", [
    ("127.0.0.1", "10.0.0.7", "http://10.0.0.7:8081/healthz"),
    ("::", "::", "http://[::]:8081/healthz"),
])
def test_the_operators_bind_addresses_come_from_the_values(render, metrics, health, liveness):
    objs = render("--set", f"metrics.bindAddress={metrics}", "--set", f"health.bindAddress={health}")
    args = cli_parser().parse_args(operator_container(objs)["args"])
    assert args.metrics_host == metrics and args.liveness == liveness


def test_the_operator_reads_its_namespace_and_the_jobs_settings_from_the_chart(render, monkeypatch):
    """The env the chart sets, read by the operator's own config (OperatorConfig.from_env)."""
    from grpojob_operator.config import OperatorConfig

    env = {e["name"]: e for e in operator_container(render(
        "--set", "networkPolicy.monitoringNamespaces={prom,obs}", "--set", "jobs.metricsAuth=true"))["env"]}
    assert env["GRPOJOB_OPERATOR_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    monkeypatch.setenv("GRPOJOB_OPERATOR_NAMESPACE", NAMESPACE)  # what the downward API gives
    for name in ("GRPOJOB_MONITORING_NAMESPACES", "GRPOJOB_JOBS_METRICS_AUTH"):
        monkeypatch.setenv(name, env[name]["value"])
    cluster = OperatorConfig.from_env().cluster
    assert (cluster.operator_namespace, cluster.monitoring_namespaces, cluster.metrics_auth) == \
        (NAMESPACE, ("prom", "obs"), True)
    defaults = {e["name"]: e.get("value") for e in operator_container(render())["env"]}
    assert defaults["GRPOJOB_MONITORING_NAMESPACES"] == "monitoring"
    assert defaults["GRPOJOB_JOBS_METRICS_AUTH"] == "false"


def test_jobs_metrics_auth_refuses_the_chart_pod_monitor_that_cannot_present_a_token(helm):
    out = run_helm(helm, "template", RELEASE, str(CHART), "-n", NAMESPACE, "--set", "jobs.metricsAuth=true",
                   "--set", "metrics.podMonitor.enabled=true")
    assert out.returncode != 0 and "metrics.podMonitor cannot scrape with jobs.metricsAuth" in out.stderr
    ok = run_helm(helm, "template", RELEASE, str(CHART), "-n", NAMESPACE, "--set", "jobs.metricsAuth=true")
    assert ok.returncode == 0, ok.stderr


# --- RBAC ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("args, peering", [([], None), (["--set", "replicaCount=2"], "clusterkopfpeerings")])
def test_cluster_mode_grants_exactly_the_operator_rules(render, args, peering):
    rules = operator_rules()
    objs = render(*args)
    role = one(objs, "ClusterRole")
    assert not by_kind(objs, "Role") and not by_kind(objs, "RoleBinding")
    assert triples(role["rules"]) == without(rules, *({"clusterkopfpeerings", "kopfpeerings"} - {peering}))
    binding = one(objs, "ClusterRoleBinding")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": role["metadata"]["name"]}
    sa = one(objs, "ServiceAccount")["metadata"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["name"], "namespace": NAMESPACE}]
    assert one(objs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == sa["name"]


@pytest.mark.parametrize("args, peering", [([], None), (["--set", "replicaCount=2"], "kopfpeerings")])
def test_namespaced_mode_grants_the_operator_rules_per_namespace(render, args, peering):
    rules = without(operator_rules(), *({"clusterkopfpeerings", "kopfpeerings"} - {peering}))
    objs = render(*NAMESPACED, *args)
    # Cluster-wide only what cannot be namespaced: kopf's CRD discovery and namespace listing.
    cluster = triples(one(objs, "ClusterRole")["rules"])
    assert cluster == {t for t in rules if t[1] in CLUSTER_SCOPED}
    roles = {r["metadata"]["namespace"]: r for r in by_kind(objs, "Role")}
    bindings = {b["metadata"]["namespace"]: b for b in by_kind(objs, "RoleBinding")}
    assert set(roles) == set(bindings) == {"ml", "research"}
    for ns, role in roles.items():
        assert triples(role["rules"]) == rules - cluster
        assert bindings[ns]["roleRef"]["name"] == role["metadata"]["name"]
        assert bindings[ns]["subjects"][0]["namespace"] == NAMESPACE


@pytest.mark.parametrize("mode, args, kind", [
    ("cluster", ["--set", "replicaCount=2"], "ClusterKopfPeering"),
    ("namespaced", ["--set", "replicaCount=3"] + NAMESPACED, "KopfPeering"),
    ("forced", ["--set", "leaderElection.enabled=true"], "ClusterKopfPeering"),
])
def test_leader_election_uses_kopf_peering(render, mode, args, kind):
    objs = render(*args)
    peerings = by_kind(objs, kind)
    c = operator_container(objs)
    assert "--peering=grpojob" in c["args"]
    assert {p["metadata"]["name"] for p in peerings} == {"grpojob"}
    granted = set().union(*(triples(r["rules"]) for r in by_kind(objs, "Role") + by_kind(objs, "ClusterRole")))
    assert {("kopf.dev", PEERING[kind], v) for v in ("get", "list", "watch", "patch")} <= granted
    if kind == "KopfPeering":  # one per watched namespace: kopf peers per namespace there
        assert sorted(p["metadata"]["namespace"] for p in peerings) == ["ml", "research"]
    assert not any(o["kind"].endswith("KopfPeering") for o in render()), "peering without replicas"


# --- monitoring ----------------------------------------------------------------------------------

_DURATION = {"type": "string", "pattern": r"^(\d+(ms|s|m|h))+$"}
_SELECTOR = {"type": "object", "additionalProperties": False, "properties": {
    "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}},
    "matchExpressions": {"type": "array", "items": {
        "type": "object", "additionalProperties": False, "required": ["key", "operator"],
        "properties": {"key": {"type": "string"}, "operator": {"enum": ["In", "NotIn", "Exists", "DoesNotExist"]},
                       "values": {"type": "array", "items": {"type": "string"}}}}}}}
_RELABEL = {"type": "object", "additionalProperties": False, "properties": {
    "sourceLabels": {"type": "array", "items": {"type": "string", "pattern": "^[a-zA-Z_][a-zA-Z0-9_]*$"}},
    "separator": {"type": "string"}, "targetLabel": {"type": "string"}, "regex": {"type": "string"},
    "replacement": {"type": "string"},
    "action": {"enum": ["replace", "keep", "drop", "labelmap", "labeldrop", "labelkeep"]}}}
_ENDPOINT = {"type": "object", "additionalProperties": False, "required": ["port"], "properties": {
    "port": {"type": "string"}, "path": {"type": "string"}, "interval": _DURATION, "scrapeTimeout": _DURATION,
    "honorLabels": {"type": "boolean"}, "relabelings": {"type": "array", "items": _RELABEL},
    # SafeAuthorization: the bearer credentials from a Secret in the monitor's namespace.
    "authorization": {"type": "object", "additionalProperties": False, "properties": {
        "type": {"type": "string"}, "credentials": {
            "type": "object", "additionalProperties": False, "required": ["key"], "properties": {
                "name": {"type": "string"}, "key": {"type": "string"}, "optional": {"type": "boolean"}}}}}}}
_NS_SELECTOR = {"type": "object", "additionalProperties": False, "properties": {
    "any": {"type": "boolean"}, "matchNames": {"type": "array", "items": {"type": "string"}}}}
# The subset of monitoring.coreos.com/v1 the chart uses, with the Prometheus Operator's field names.
MONITOR_SCHEMAS = {
    "ServiceMonitor": {"type": "object", "required": ["apiVersion", "kind", "metadata", "spec"], "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "spec": {"type": "object", "additionalProperties": False, "required": ["selector", "endpoints"],
                 "properties": {"jobLabel": {"type": "string"}, "selector": _SELECTOR,
                                "namespaceSelector": _NS_SELECTOR,
                                "endpoints": {"type": "array", "minItems": 1, "items": _ENDPOINT}}}}},
    "PodMonitor": {"type": "object", "required": ["apiVersion", "kind", "metadata", "spec"], "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "spec": {"type": "object", "additionalProperties": False, "required": ["selector", "podMetricsEndpoints"],
                 "properties": {"jobLabel": {"type": "string"}, "selector": _SELECTOR,
                                "namespaceSelector": _NS_SELECTOR,
                                "podMetricsEndpoints": {"type": "array", "minItems": 1, "items": _ENDPOINT}}}}},
}


def check_monitor(obj: dict) -> None:
    jsonschema.validate(obj, MONITOR_SCHEMAS[obj["kind"]])
    for ep in obj["spec"].get("endpoints", []) + obj["spec"].get("podMetricsEndpoints", []):
        for r in ep.get("relabelings", []):
            re.compile(r.get("regex", "(.*)"))  # Prometheus would refuse a bad regex


def selects(selector: dict, labels: dict) -> bool:
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for e in selector.get("matchExpressions", []):
        present, value = e["key"] in labels, labels.get(e["key"])
        ok = {"In": present and value in e.get("values", []), "NotIn": value not in e.get("values", []),
              "Exists": present, "DoesNotExist": not present}[e["operator"]]
        if not ok:
            return False
    return True


def test_monitoring_is_off_by_default_and_needs_no_prometheus_crds(render):
    """Defaults render no third-party object; turned on they render without the Prometheus
    Operator's CRDs being known to helm (no Capabilities gate that would silently drop them)."""
    assert not [o for o in render() if o["apiVersion"].startswith("monitoring.coreos.com")]
    kinds = {o["kind"] for o in render(*ALL_ON)}
    assert {"ServiceMonitor", "PodMonitor", "ConfigMap"} <= kinds


def test_service_monitor_scrapes_the_operator_metrics_port(render):
    objs = render(*ALL_ON)
    sm, svc, deploy = one(objs, "ServiceMonitor"), one(objs, "Service"), one(objs, "Deployment")
    assert selects(sm["spec"]["selector"], svc["metadata"]["labels"])
    assert NAMESPACE in sm["spec"]["namespaceSelector"]["matchNames"]
    (ep,) = sm["spec"]["endpoints"]
    svc_port = {p["name"]: p for p in svc["spec"]["ports"]}[ep["port"]]
    container_ports = {p["name"] for p in operator_container(objs)["ports"]}
    assert svc_port["targetPort"] in container_ports
    assert selects({"matchLabels": svc["spec"]["selector"]}, deploy["spec"]["template"]["metadata"]["labels"])
    # The per-job gauges carry namespace/job labels of their own: they must not be renamed exported_*.
    assert ep["honorLabels"] is True and ep["path"] == "/metrics"


# Labels the operator puts on job pods (the contract the PodMonitor relies on).
def job_pod_labels(job: str, component: str) -> dict:
    return {"app.kubernetes.io/name": "grpojob", "app.kubernetes.io/instance": job,
            "app.kubernetes.io/component": component, "grpojob.io/job": job}


@pytest.mark.parametrize("args, namespaces", [(ALL_ON, None), (NAMESPACED + ALL_ON, ["ml", "research"])])
def test_pod_monitor_selects_trainer_and_rollout_pods_only(render, args, namespaces):
    objs = render(*args)
    pm = one(objs, "PodMonitor")
    sel = pm["spec"]["selector"]
    assert selects(sel, job_pod_labels("qwen", "trainer")) and selects(sel, job_pod_labels("qwen", "rollout"))
    operator_pod = one(objs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert not selects(sel, operator_pod)
    # The Prometheus `job` label becomes the GRPOJob name, like the operator's per-job gauges.
    assert pm["spec"]["jobLabel"] == "grpojob.io/job"
    assert pm["spec"]["namespaceSelector"] == ({"any": True} if namespaces is None else {"matchNames": namespaces})
    (ep,) = pm["spec"]["podMetricsEndpoints"]
    assert ep["port"] == "http" and ep["path"] == "/metrics"


@pytest.mark.parametrize("component, index, scraped", [
    ("trainer", "0", True), ("trainer", "1", False), ("trainer", "12", False),
    ("rollout", "3", True), ("rollout", "", True), ("trainer", "", True),
])
def test_pod_monitor_scrapes_only_trainer_rank_zero(render, component, index, scraped):
    """Prometheus applies relabelings with anchored regexes on `;`-joined source labels."""
    (ep,) = one(render(*ALL_ON), "PodMonitor")["spec"]["podMetricsEndpoints"]
    meta = {"__meta_kubernetes_pod_label_app_kubernetes_io_component": component,
            "__meta_kubernetes_pod_label_apps_kubernetes_io_pod_index": index}
    kept = True
    for r in ep["relabelings"]:
        if r.get("action") == "drop":
            value = r.get("separator", ";").join(meta.get(s, "") for s in r["sourceLabels"])
            kept = kept and not re.fullmatch(r["regex"], value)
    assert kept is scraped


def test_dashboard_configmap_carries_the_dashboard(render):
    import json

    objs = render(*ALL_ON)
    (cm,) = [o for o in by_kind(objs, "ConfigMap") if o["metadata"]["name"].endswith("-dashboard")]
    assert cm["metadata"]["namespace"] == "monitoring"
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"  # kube-prometheus-stack's sidecar label
    files = sorted(p.name for p in (CHART / "dashboards").glob("*.json"))
    assert sorted(cm["data"]) == files == ["grpojob.json"]
    assert json.loads(cm["data"]["grpojob.json"]) == json.loads((CHART / "dashboards" / "grpojob.json").read_text())
    assert len(cm["data"]["grpojob.json"]) < 256 * 1024  # fits a ConfigMap and kubectl's apply annotation


# --- NOTES ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def notes(helm, tmp_path_factory):
    """NOTES.txt as `helm install` prints it. helm renders NOTES only when installing, which needs a
    cluster; so render it from a copy of the chart through `tpl`, which evaluates the same template
    text with the same values and helpers."""
    chart = tmp_path_factory.mktemp("notes") / "grpojob"
    shutil.copytree(CHART, chart)
    (chart / "templates" / "NOTES.txt").rename(chart / "notes-src.txt")
    (chart / "templates" / "notes.yaml").write_text(
        'apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\n'
        'data:\n  notes: {{ tpl (.Files.Get "notes-src.txt") . | quote }}\n')

    def _do(*args: str) -> str:
        out = run_helm(helm, "template", RELEASE, str(chart), "-n", NAMESPACE,
                       "--show-only", "templates/notes.yaml", *args)
        assert out.returncode == 0, out.stderr
        return yaml.safe_load(out.stdout)["data"]["notes"]
    return _do


@pytest.mark.parametrize("args, namespace", [([], "default"), (NAMESPACED, "ml")])
def test_notes_first_job_is_a_valid_grpojob(notes, args, namespace):
    """NOTES.txt tells how to submit a first job: that manifest passes the CRD schema and grpojob's
    own validation, and goes to a namespace the operator watches."""
    from grpojob.api import check

    text = notes(*args)
    m = re.search(r"kubectl apply -n (\S+) -f -\n(.*?)\n\s*YAML\n", text, re.S)
    assert m, text
    assert m.group(1) == namespace
    doc = yaml.safe_load(textwrap.dedent(m.group(2)))
    validate_grpojob(doc)
    job, errors = check(doc)
    assert not errors, errors
    assert job.spec.model.path == "/opt/grpojob/models/tiny"  # baked into the runtime image
    # No claim that only a default StorageClass would bind: it runs on a cluster without one (issue 31).
    from grpojob_operator import children
    assert children.checkpoint_claim_template(job) is None and job.spec.model.volume_claim is None
    assert "spec.checkpoint.storageClassName" in text and "spec.checkpoint.volumeClaim" in text
    assert f"rollout status deployment/{RELEASE}" in text and "kubectl get grpo" in text


def test_notes_name_the_monitoring_that_is_on(notes):
    assert "Monitoring is off" in notes()
    text = notes(*ALL_ON)
    assert f"ServiceMonitor {RELEASE} " in text and f"PodMonitor {RELEASE}-jobs " in text
    assert "ConfigMap grpojob-dashboard in monitoring" in text
    assert "Leader election is on (2 replicas" in text
