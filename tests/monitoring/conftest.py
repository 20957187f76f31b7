"""The live scene (a `grpojob run` and the operator against kmock, started once for the module) and a
real Prometheus scraping it through the chart's PodMonitor and ServiceMonitor relabelling."""
from __future__ import annotations

import pytest
import yaml

from tests.chart.conftest import ALL_ON, CHART, RELEASE, helm_path, run_helm
from tests.chart.conftest import NAMESPACE as CHART_NAMESPACE

from . import promconfig
from .prometheus import INSTALL_HINT, Prometheus, binary
from .scene import Scene


@pytest.fixture(scope="module")
def scene(tmp_path_factory, tiny_dir):
    s = Scene(tmp_path_factory.mktemp("monitoring"), tiny_dir)
    try:
        s.start_run()
        s.start_emulator()
        s.wait_run()
        s.create_job()
        s.start_operator()
        s.run_pods()
        s.wait_steps(2)
        s.wait_operator_reports()
        yield s
    finally:
        s.close()


SCRAPE = ["--set", "metrics.podMonitor.interval=1s", "--set", "metrics.podMonitor.scrapeTimeout=1s",
          "--set", "metrics.serviceMonitor.interval=1s", "--set", "metrics.serviceMonitor.scrapeTimeout=1s"]


def chart_objects() -> list[dict]:
    helm = helm_path()
    if helm is None:
        pytest.skip("no helm binary to render the chart's PodMonitor and ServiceMonitor: run "
                    "`bash tests/tools/get-helm.sh`; the dashboard was NOT checked against a real Prometheus")
    out = run_helm(helm, "template", RELEASE, str(CHART), "-n", CHART_NAMESPACE, *ALL_ON, *SCRAPE)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def _one(objs: list[dict], kind: str, name_suffix: str = "") -> dict:
    found = [o for o in objs if o["kind"] == kind and o["metadata"]["name"].endswith(name_suffix)]
    assert len(found) == 1, f"{kind} *{name_suffix}: {len(found)} in the chart"
    return found[0]


def scrape_configs(scene: Scene, objs: list[dict]) -> list[dict]:
    """The chart's monitors over the scene: its pods at the local processes' ports, and the chart's
    operator Service backed by an operator pod made from the chart's Deployment (acted out: no
    Deployment controller here) at the in-process operator's metrics port."""
    pods = scene.pods()
    address = {}
    for pod in pods:
        role = pod["metadata"]["labels"]["grpojob.io/role"]
        same_role = sorted(p["metadata"]["name"] for p in pods if p["metadata"]["labels"]["grpojob.io/role"] == role)
        local = scene.endpoints[f"{role}-{same_role.index(pod['metadata']['name'])}"]
        address[(pod["metadata"]["name"], "http")] = local.removeprefix("http://")
    deployment = _one(objs, "Deployment")
    template = deployment["spec"]["template"]
    operator_pod = {"metadata": {"name": f"{deployment['metadata']['name']}-7d4b9c-x5k2p",
                                 "namespace": deployment["metadata"]["namespace"],
                                 "labels": template["metadata"]["labels"]},
                    "spec": template["spec"], "status": {"phase": "Running"}}
    return (promconfig.pod_monitor(_one(objs, "PodMonitor"), pods, address)
            + promconfig.service_monitor(_one(objs, "ServiceMonitor"), _one(objs, "Service", "-metrics"),
                                         operator_pod, {"metrics": scene.operator_url.removeprefix("http://")}))


@pytest.fixture(scope="module")
def prometheus(scene, tmp_path_factory):
    exe = binary()
    if exe is None:
        pytest.skip(f"no prometheus binary ({INSTALL_HINT}): the dashboard was NOT checked against a real "
                    f"Prometheus")
    prom = Prometheus(exe, tmp_path_factory.mktemp("prometheus"), scrape_configs(scene, chart_objects())).start()
    try:
        yield prom
    finally:
        prom.stop()
