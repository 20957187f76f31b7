"""The frameworks' packages (cosmos-rl, verl) where the frameworks set installs them
(.ci/sets/frameworks.sh): tests that need one skip elsewhere. cosmos-rl imports qwen-vl-utils at package
import, which needs a CUDA torchvision: the stand-in in stubs/ takes its place when torchvision does not load."""
import importlib.util
import sys
from pathlib import Path

import pytest

STUBS = Path(__file__).parent / "stubs"


def _torchvision_loads() -> bool:
    try:
        import torchvision  # noqa: F401
    except Exception:  # noqa: BLE001 - a CUDA build beside a CPU torch raises RuntimeError
        return False
    return True


def framework(module: str):
    """The package `module` of a framework, imported, or a skip naming the set that installs it."""
    if importlib.util.find_spec(module.split(".")[0]) is None:
        pytest.skip(f"{module.split('.')[0]} is not installed here (the frameworks set, .ci/sets/frameworks.sh, installs it)")
    if module.startswith("cosmos_rl") and str(STUBS) not in sys.path and not _torchvision_loads():
        sys.path.insert(0, str(STUBS))
    return importlib.import_module(module)


def learn(job, tmp_path, reached) -> list[dict]:
    """Run `job` in this process until three steps in a row satisfy `reached(record)` (or its steps
    run out); its step records."""
    from grpojob.leader.build import build

    records: list[dict] = []

    def on_step(r):
        records.append(r.to_json())
        if len(records) >= 3 and all(reached(x) for x in records[-3:]):
            run.request_suspend()

    run = build(job, checkpoint_dir=str(tmp_path / "ck"), on_step=on_step)
    run.run()
    return records


def run_example(doc: dict, tmp_path: Path, steps: int) -> tuple[list[dict], float, float]:
    """`grpojob run` of an example's manifest `doc` (already pointed at this machine's paths) for
    `steps` steps: its step records, every step's groups from its one environment, and the mean
    reward of its first and last three steps."""
    import subprocess

    import yaml

    from grpojob.local.progress import read_records

    (tmp_path / "job.yaml").write_text(yaml.safe_dump(doc))
    proc = subprocess.run([sys.executable, "-m", "grpojob", "run", str(tmp_path / "job.yaml"), "--run-dir",
                           str(tmp_path / "run"), "--no-progress", "--set", f"training.steps={steps}"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    records = read_records(tmp_path / "run" / "metrics.jsonl")
    name, pps = doc["spec"]["environments"][0]["name"], doc["spec"]["training"]["promptsPerStep"]
    assert len(records) == steps and all(r["environments"][name]["groups"] == pps for r in records)
    first = sum(r["reward_mean"] for r in records[:3]) / 3
    last = sum(r["reward_mean"] for r in records[-3:]) / 3
    print(f"reward {first:.3f} -> {last:.3f} in {steps} steps: {[round(r['reward_mean'], 2) for r in records]}")
    return records, first, last
