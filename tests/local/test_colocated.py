"""`grpojob run` with spec.placement colocated: the trainer and its engine take turns on the device
(the engine sleeps while a step trains and wakes before the push), the weights go through shared
memory, and the tiny task still learns."""
from __future__ import annotations

import json

import pytest

from grpojob.local.progress import read_records

from .test_run import grpojob_run, processes_of, workdir  # noqa: F401 - the fixture

pytestmark = pytest.mark.slow
STEPS = 60  # as the separate run's learning test (test_run): 40-80 s on 2 shared cores


def _turns(log_path) -> list[dict]:
    """The engine's sleep and wake events, in order, from the rollout server's JSON log."""
    out = []
    for line in log_path.read_text().splitlines():
        if line.startswith("{") and '"turn"' in line:
            out.append(json.loads(line))
    return out


def test_colocated_run_takes_turns_pushes_through_shared_memory_and_learns(workdir):  # noqa: F811
    run_dir = workdir / "run"
    proc = grpojob_run(run_dir, f"training.steps={STEPS}", "placement=colocated", "algorithm.maxStaleness=1",
                       cwd=workdir)
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, out
    records = read_records(run_dir / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))

    # (a) it learns
    first, last = records[0]["reward_mean"], max(r["reward_mean"] for r in records[-3:])
    assert last >= first + 0.5, f"reward {first:.3f} -> {last:.3f}"
    assert max(r["policy_staleness_max"] for r in records) <= 1  # maxStaleness still bounds the lag

    # (b) the engine slept through every step's training and woke for generation: no decode step
    # ran between its sleep and its wake. With maxStaleness 1 the next step's groups may all be
    # there before the engine wakes (a loaded machine): then it sleeps again without having
    # decoded, with no KV slots to free (they come back as a forward writes them), so freeing and
    # decoding between turns hold over the run, not at every step (it failed so under load).
    for r in records:
        assert r["placement"] == "colocated (turn-taking)"
        sleep, wake = r["turns"]["sleep"], r["turns"]["wake"]
        assert sleep["servers"] == wake["servers"] == 1
        assert sleep["decode_steps"] == wake["decode_steps"], r["step"]
    assert sum(r["turns"]["sleep"]["freed_bytes"] > 0 for r in records) >= STEPS // 2
    for before, after in zip(records, records[1:]):
        assert after["turns"]["sleep"]["decode_steps"] >= before["turns"]["wake"]["decode_steps"]
    assert records[-1]["turns"]["sleep"]["decode_steps"] > records[0]["turns"]["wake"]["decode_steps"]
    events = _turns(run_dir / "logs" / "rollout-0.log")
    assert [e["turn"] for e in events] == ["sleep", "wake"] * STEPS
    assert all(a["at"] <= b["at"] for a, b in zip(events, events[1:]))

    # (c) every push went through shared memory (weightSync.backend auto, colocated on the CPU)
    assert {r["weight_sync_backend"] for r in records} == {"shm"}
    trainer_log = (run_dir / "logs" / "trainer-0.log").read_text()
    assert "via shm" in trainer_log

    # peak memory per phase: the trainer's and the engine's, every step, and the log line
    for r in records:
        assert set(r["engine_host_peak_bytes"]) == {"generate", "train", "sync"}
        assert {"generate", "train", "sync"} <= set(r["stage_host_peak_bytes"])
    assert f"step {STEPS} peak memory (MiB): generate trainer" in trainer_log
    assert processes_of(run_dir) == []


def test_colocated_lora_pushes_only_the_adapter_through_shared_memory_and_learns(workdir, tiny_sharp_dir):  # noqa: F811
    """LoRA and colocated combine: every push is the adapter alone (2 layers x 7 linear modules x
    A and B = 28 tensors), through shared memory to the sleeping-and-waking engine, which merges
    it; the tiny task learns (on the sharpened tiny model: tests/conftest.py says why LoRA needs it)."""
    steps = 40  # reward about 0.1 -> 0.95 (maxStaleness 0; with 1 it stalls near 0.5 at this learning rate)
    run_dir = workdir / "run"
    proc = grpojob_run(run_dir, f"training.steps={steps}", "placement=colocated", "algorithm.maxStaleness=0",
                       f"model.path={tiny_sharp_dir}", "model.lora.rank=8", "model.lora.alpha=16",
                       "training.learningRate=0.01", cwd=workdir)
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, out
    records = read_records(run_dir / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, steps + 1))
    assert {r["weight_sync_backend"] for r in records} == {"shm"}
    assert {r["sync_tensors"] for r in records} == {28}
    full = sum(p.stat().st_size for p in tiny_sharp_dir.glob("*.safetensors"))
    assert all(r["sync_bytes"] < 0.2 * full for r in records)
    first, last = records[0]["reward_mean"], max(r["reward_mean"] for r in records[-3:])
    assert last >= first + 0.5, f"reward {first:.3f} -> {last:.3f}"
    assert processes_of(run_dir) == []
