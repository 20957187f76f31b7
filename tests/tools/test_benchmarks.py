"""Every benchmark runs at a toy size and ends with its closing line: a benchmark nobody runs breaks
unseen (weight_sync.py did, when the sink contract grew). Pinned to the CPU, as everywhere in the
suite; the GPU runs are in docs/gpu.md. Figures are not checked here (timings
belong to the benchmarks themselves); only that each measured what it prints."""
from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NUMBER = r"(\d+(?:\.\d+)?)"


def run(name: str, *args: str, timeout: float = 300) -> str:
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / f"{name}.py"), *args], cwd=ROOT,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-4000:]
    return proc.stdout


def figures(pattern: str, out: str) -> list[float]:
    m = re.search(pattern, out)
    assert m, f"no line matching {pattern!r} in:\n{out[-2000:]}"
    values = [float(v) for v in m.groups()]
    assert all(math.isfinite(v) and v > 0 for v in values), m.group(0)
    return values


def test_async_pipeline():
    out = run("async_pipeline", "--steps", "4", "--warmup", "1", "--repeat", "1", "--staleness", "0", "1",
              "--device", "cpu")
    figures(rf"async speedup \(staleness 1 / 0\): {NUMBER}x", out)


def test_weight_sync():
    out = run("weight_sync", "--layers", "2", "--hidden", "64", "--vocab", "512", "--rounds", "2", "--receivers", "1",
              "--device", "cpu")
    figures(rf"ours / flat \(goal <= 1.3\): +{NUMBER}", out)
    # its closing JSON line (stderr shares the stream: a torch thread may still print at teardown)
    doc = json.loads([line for line in out.splitlines() if line.startswith("{")][-1])
    assert doc["path"] == ["gloo"] and doc["receivers"] == 1 and set(doc["median_seconds"]) == {
        "ours", "flat", "per-tensor"}


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("backend", ["gloo", "checkpoint"])
def test_weight_sync_delta(backend):
    out = run("weight_sync", "--delta", "--layers", "2", "--hidden", "64", "--vocab", "512", "--rounds", "2",
              "--receivers", "1", "--lr", "1e-3", "--device", "cpu", "--backend", backend)
    figures(rf"push seconds: delta {NUMBER}, dense {NUMBER}; all pushes' total, delta / dense: {NUMBER}; "
            rf"delta / dense: {NUMBER}", out)
    doc = json.loads([line for line in out.splitlines() if line.startswith("{")][-1])
    assert 0 < doc["changed_fraction"] < 1 and 0 < doc["sent_fraction"] <= 1 and doc["path"] == backend


def test_trainer_throughput():
    out = run("trainer_throughput", "--shape", "tiny", "--steps", "2", "--prompts", "2", "--group", "2",
              "--max-tokens", "8", "--device", "cpu", "--liger", "both")
    figures(rf"ratio grpojob / trl: {NUMBER}x end to end, {NUMBER}x train only", out)
    assert "train stage, liger off: " in out  # --liger both: the train stage alone (CPU: off only)
    figures(rf"grpojob hf engine {NUMBER}, trl generate {NUMBER}, ratio {NUMBER}x", out)
    # the train stage's own figure: tokens it trained, from the step records (every group trains)
    figures(rf"grpojob train stage: {NUMBER} tok/s, {NUMBER} TFLOP/s \(trained tokens, median of {NUMBER} steps", out)


def test_train_stage():
    out = run("train_stage", "--shape", "tiny", "--steps", "2", "--prompts", "2", "--group", "2", "--max-tokens", "8")
    assert "liger's kernels are CUDA only" in out  # --liger both on a CPU: off only
    figures(rf"train stage, liger off: {NUMBER} tok/s \(([0-9.e+-]+) TFLOP/s\), own layers", out)


def test_trainer_throughput_reports_what_it_measured_when_its_time_is_up():
    out = run("trainer_throughput", "--shape", "tiny", "--steps", "6", "--prompts", "2", "--group", "2",
              "--max-tokens", "4", "--device", "cpu", "--max-seconds", "0.1")
    assert "--max-seconds 0 reached after 2 steps of each" in out
    figures(rf"ratio grpojob / trl: {NUMBER}x end to end, {NUMBER}x train only", out)


def test_generation():
    out = run("generation", "--shape", "tiny", "--rows", "8", "--group", "4", "--max-tokens", "3", "--rounds", "1")
    figures(rf"decode step: {NUMBER} ms per step of 8 rows \(eager; first step {NUMBER} ms", out)
    figures(rf"ratio transformers / ours \(time per token\): generate {NUMBER}x", out)


def test_autoscale():
    out = run("autoscale", "--steps", "3", "--warmup", "1", "--repeat", "1", "--pace", "0.05", "--train-seconds", "0.1",
              "--drain-step", "1", "--device", "cpu", "--cpu-steps", "2", timeout=480)  # five runs
    figures(rf"wait share: fixed {NUMBER}, autoscale {NUMBER}: {NUMBER}x", out)
    figures(rf"step time: fixed {NUMBER}s, autoscale {NUMBER}s: {NUMBER}x", out)
    figures(rf"cpu \(autoscale.yaml, 2 steps, \d+ cores\): wall fixed {NUMBER}s, autoscale {NUMBER}s: {NUMBER}x; ", out)
    assert re.search(r"^cpu .*x; ScaleUpNoGain \d+; changes: ", out, re.M), out[-2000:]  # a count: 0 is one
    assert re.search(r"^drain: (\d+ requests in flight|rollout-1 had nothing in flight)", out, re.M), out[-2000:]


def test_operator_scale():
    out = run("operator_scale", "--jobs", "2", "--steady", "1")
    rows = [line.split() for line in out.splitlines() if line.strip().startswith("2 ")]
    assert rows and float(rows[-1][1]) > 0 and float(rows[-1][2]) > 0, out[-2000:]


def test_checkpoint():
    out = run("checkpoint", "--shape", "tiny", "--rounds", "1", "--ranks", "2", "--device", "cpu")
    for line in ("rank-0 peak during push, streamed / full", "rank-0 peak during save, sharded / full"):
        assert re.search(rf"^{line}: {NUMBER}$", out, re.M), out[-2000:]  # at a toy size a rise may round to 0
    assert re.fullmatch(rf"rank-0 peak during save, sharded / full: {NUMBER}", out.strip().splitlines()[-1])
    doc = json.loads(next(line for line in out.splitlines() if line.startswith("{")))
    assert doc["ranks"] == 2 and doc["strategy"] == "fsdp"
    for kind in ("full", "sharded"):
        for key in ("save_blocking", "save_total", "load", "push"):
            assert doc[f"{kind}_{key}"] > 0, (kind, key)
    # the sharded save is committed after it returned; the stream held at most the whole (tiny) model
    assert doc["sharded_save_total"] >= doc["sharded_save_blocking"]
    assert 0 < doc["sharded_push_gathered"] <= doc["sharded_push_bytes"]
