"""Old module paths keep working (CHANGELOG.md, Deprecated): each is the very same module as its new
home and warns, naming the path to use and the version that removes it; plug-ins written from the
0.1 docs (tests/plugins/legacy/) load unchanged and their custom parts take effect."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

from grpojob.api import parse, plugins
from grpojob.contracts.rollout import Sample
from grpojob.deprecation import REMOVED_IN

ROOT = Path(__file__).resolve().parents[2]
LEGACY = Path(__file__).resolve().parent / "legacy"

# old path -> (the module it is now, the path its warning tells users to import instead)
FORWARDED = {
    "grpojob.rollout.types": ("grpojob.contracts.rollout", "grpojob.plugins"),
    "grpojob.api.rollout": ("grpojob.contracts.rollout", "grpojob.plugins"),
    "grpojob.api.contracts": ("grpojob.contracts.protocols", "grpojob.plugins"),
    "grpojob.trainer.trainer": ("grpojob.learner.trainer", "grpojob.plugins"),
    "grpojob.trainer.dist": ("grpojob.learner.dist", "grpojob.plugins.dist"),
    "grpojob.trainer.batch": ("grpojob.learner.batch", "grpojob.plugins"),
    "grpojob.trainer.packing": ("grpojob.learner.packing", "grpojob.plugins"),
    "grpojob.trainer.callbacks": ("grpojob.leader.callbacks", "grpojob.plugins"),
    "grpojob.trainer.record": ("grpojob.leader.record", "grpojob.plugins"),
    "grpojob.trainer.server": ("grpojob.leader.server", "grpojob.leader.server"),
    "grpojob.evaluation": ("grpojob.leader.evaluation", "grpojob.plugins"),
    "grpojob.trajectories": ("grpojob.leader.trajectories", "grpojob.leader.trajectories"),
}
# submodules of a moved package: aliased with it (no second copy of their classes)
SUBMODULES = {"grpojob.evaluation.scores": "grpojob.leader.evaluation.scores",
              "grpojob.trajectories.api": "grpojob.leader.trajectories.api"}

PROBE = """
import importlib, json, sys, warnings
out = {}
for old, new in json.loads(sys.argv[1]).items():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mod = importlib.import_module(old)
    out[old] = {"same": mod is importlib.import_module(new),
                "warnings": [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)
                             and "grpojob" in str(w.message)]}
from grpojob.trainer import dist
out["from grpojob.trainer import dist"] = {"same": dist is importlib.import_module("grpojob.learner.dist")}
print(json.dumps(out))
"""


def python(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT, timeout=300, **kw)


def test_every_old_path_is_its_new_module_and_warns_once_naming_the_new_path_and_the_removal():
    paths = {old: new for old, (new, _) in FORWARDED.items()} | SUBMODULES
    r = python("-c", PROBE, json.dumps(paths))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert all(v["same"] for v in out.values()), out
    for old, (_, use) in FORWARDED.items():
        [msg] = out[old]["warnings"]
        assert msg.startswith(f"{old} is deprecated: import from {use}") and f"removed in grpojob {REMOVED_IN}" in msg


def test_an_old_path_fails_under_error_deprecation_warning():
    r = python("-W", "error::DeprecationWarning", "-c", "import grpojob.rollout.types")
    assert r.returncode == 1
    assert "grpojob.rollout.types is deprecated: import from grpojob.plugins" in r.stderr


def _refs() -> list[str]:
    return [f"rollout.backend={LEGACY / 'cosmos_rollout.py'}:EchoRollout",
            f"rollout.workflow={LEGACY / 'areal_workflow.py'}:GreedyBaselineWorkflow",
            f"trainer.class={LEGACY / 'nexrl_trainer.py'}:SummingTrainer"]


def test_last_weeks_plugins_validate_unchanged_and_the_user_sees_the_warnings():
    argv = ["-m", "grpojob", "validate", str(ROOT / "examples" / "tiny-local.yaml")]
    for ref in _refs():
        argv += ["--set", ref]
    env = {k: v for k, v in __import__("os").environ.items() if k != "PYTHONWARNINGS"}
    r = python(*argv, env=env)
    assert r.returncode == 0, r.stderr
    for old in ("grpojob.rollout.types", "grpojob.trainer.dist", "grpojob.trainer.trainer", "grpojob.trainer.batch"):
        assert f"{old} is deprecated" in r.stderr, r.stderr
    assert r.stderr.count("grpojob.rollout.types is deprecated") == 1  # once, though two plug-ins import it


def test_last_weeks_plugins_custom_parts_take_effect():
    spec = parse({"apiVersion": "grpojob.io/v1alpha1", "kind": "GRPOJob", "metadata": {"name": "legacy"},
                  "spec": {"model": {"path": "/m"}, "dataset": {"factory": "toy"}, "rewards": [{"name": "toy"}],
                           "algorithm": {"groupSize": 3}, "rollout": {"sampling": {"maxTokens": 4}}}}).spec
    loaded = {}
    for ref, kind in zip(_refs(), ("engine", "workflow", "trainer")):
        field, _, name = ref.partition("=")
        loaded[kind] = plugins.load_checked(name, f"spec.{field}", lambda o, k=kind: plugins.check_object(k, o),
                                            ValueError)
    engine, workflow = loaded["engine"](spec), loaded["workflow"](spec, None)
    group = asyncio.run(workflow.run(engine, Sample(index=0, prompt="p", prompt_ids=[5, 6])))
    assert [c.completion_ids for c in group.completions] == [[6, 7, 8, 9], [7, 8, 9, 10], [8, 9, 10, 11]]
    assert [c.reward for c in group.completions] == [4.0] * 3 and group.baseline_reward == 2.0

    from grpojob.learner import dist
    from grpojob.learner.errors import TrainerError

    trainer = loaded["trainer"]
    assert trainer.total(3, dist.lone()) == 3.0
    try:
        trainer.total(-1, dist.lone())
    except TrainerError as e:  # the old path's TrainerError is the class grpojob catches
        assert "negative" in str(e)
    else:
        raise AssertionError("TrainerError was not raised")
