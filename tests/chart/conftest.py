"""Chart tests run a real helm: .cache/bin/helm (tests/tools/get-helm.sh puts it there) or the one
on PATH. Without either they skip, saying so (CI always has it)."""
from __future__ import annotations

import copy
import os
import shutil
import subprocess
from functools import lru_cache
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "grpojob"
RELEASE = "grpojob"
NAMESPACE = "grpojob-system"

# The value sets the issue names: defaults, everything on, namespaced mode (with peering too).
ALL_ON = ["--set", "replicaCount=2", "--set", "metrics.serviceMonitor.enabled=true",
          "--set", "metrics.podMonitor.enabled=true", "--set", "dashboard.enabled=true",
          "--set", "dashboard.namespace=monitoring", "--set", "serviceAccount.annotations.team=ml",
          "--set", "image.digest=sha256:" + "a" * 64]
NAMESPACED = ["--set", "watchNamespaces={ml,research}"]
VALUE_SETS = {
    "defaults": [],
    "all-on": ALL_ON,
    "watch-namespaces": NAMESPACED,
    "watch-namespaces-all-on": NAMESPACED + ALL_ON,
}


def helm_path() -> str | None:
    local = ROOT / ".cache" / "bin" / "helm"
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    return shutil.which("helm")


@pytest.fixture(scope="session")
def helm() -> str:
    path = helm_path()
    if path is None:
        pytest.skip("no helm binary: run `bash tests/tools/get-helm.sh` (puts it at .cache/bin/helm)")
    return path


def run_helm(helm: str, *args: str) -> subprocess.CompletedProcess:
    # HELM_* dirs inside .cache so helm never touches the user's config; no network is used.
    env = dict(os.environ, HELM_CACHE_HOME=str(ROOT / ".cache" / "helm" / "cache"),
               HELM_CONFIG_HOME=str(ROOT / ".cache" / "helm" / "config"),
               HELM_DATA_HOME=str(ROOT / ".cache" / "helm" / "data"))
    return subprocess.run([helm, *args], capture_output=True, text=True, env=env, timeout=60)


@lru_cache(maxsize=None)
def _render(helm: str, args: tuple[str, ...]) -> tuple[dict, ...]:
    out = run_helm(helm, "template", RELEASE, str(CHART), "-n", NAMESPACE, "--include-crds", *args)
    assert out.returncode == 0, f"helm template {' '.join(args)} failed:\n{out.stderr}"
    return tuple(d for d in yaml.safe_load_all(out.stdout) if d)


@pytest.fixture(scope="session")
def render(helm):
    """render(*helm_args) -> list of objects (cached: each value set renders once)."""
    def _do(*args: str) -> list[dict]:
        return copy.deepcopy(list(_render(helm, tuple(args))))
    return _do


def by_kind(objs: list[dict], kind: str) -> list[dict]:
    return [o for o in objs if o.get("kind") == kind]


def one(objs: list[dict], kind: str) -> dict:
    found = by_kind(objs, kind)
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]
