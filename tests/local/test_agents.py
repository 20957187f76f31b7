"""`grpojob run examples/environments/calculator.yaml` (docs/agents.md): an OpenAI-client agent with
a calculator tool, two turns per session, whose sessions the rollout server records (X-Session-Id)
and whose rewards end them. The trainer trains on the sessions alone, the tool and user turns
masked out, and the tiny model learns what the reward asks of it: to open a tool call."""
from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime

import pytest
import yaml

from grpojob.local.progress import read_records

from .test_run import ROOT, processes_of, workdir  # noqa: F401 - the fixture

pytestmark = [pytest.mark.slow, pytest.mark.serial]  # timing-sensitive: CI runs it alone


def completed_at(trainer_log) -> float:
    """When the trainer logged its completion (epoch seconds; its log's times are local, to the ms)."""
    for line in trainer_log.read_text().splitlines():
        if line.startswith("{") and json.loads(line).get("message") == "trainer completed":
            stamp = json.loads(line)["time"]
            return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
    raise AssertionError(f"{trainer_log} holds no 'trainer completed' line")
EXAMPLE = ROOT / "examples" / "environments" / "calculator.yaml"


def test_the_agent_learns_to_open_a_tool_call_from_its_sessions(workdir):  # noqa: F811
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["environments"][0]["command"] = [sys.executable, str(ROOT / "examples/environments/calculator.py")]
    manifest = workdir / "calculator.yaml"
    manifest.write_text(yaml.safe_dump(doc))
    run_dir = workdir / "run"
    proc = subprocess.run([sys.executable, "-m", "grpojob", "run", str(manifest), "--run-dir", str(run_dir),
                           "--no-progress"], cwd=workdir, capture_output=True, text=True, timeout=1200)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-5000:]
    steps, spec = doc["spec"]["training"]["steps"], doc["spec"]
    group, pps, turn_tokens = spec["algorithm"]["groupSize"], spec["training"]["promptsPerStep"], \
        spec["rollout"]["sampling"]["maxTokens"]
    records = read_records(run_dir / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, steps + 1))
    for r in records:  # every group is the agent's sessions, under its environment name
        assert r["groups_from_environments"] == pps and r["environments"]["calculator"]["groups"] == pps
        assert set(r["rewards"]) == {"call", "parsed", "correct"}
        # two turns of at most maxTokens generated tokens are trained on; the context between them
        # (the template's turn end, the tool or user turn, the next assistant header) is not
        assert r["trained_tokens"] <= 2 * turn_tokens * pps * group
        assert r["completion_length_mean"] > 2 * turn_tokens + 10
    call = [r["rewards"]["call"] for r in records]
    first, last = sum(call[:5]) / 5, sum(call[-5:]) / 5
    assert first < 0.1 and last > 0.5, f"tool calls opened: {first:.3f} -> {last:.3f}"

    log = [json.loads(x) for x in (run_dir / "logs" / "env-calculator-0.log").read_text().splitlines()
           if x.startswith("{")]
    # a session still open when the trainer completes is refused (its trajectory API is gone) before the
    # run stops the environment: that one is expected; a refusal while the trainer ran is not
    done = completed_at(run_dir / "logs" / "trainer-0.log")
    assert not [e for e in log if e["event"] == "reward refused" and e["time"] < done]
    assert sum(e["sessions"] for e in log if e["event"] == "episodes") >= steps * pps * group
    assert processes_of(run_dir) == []
