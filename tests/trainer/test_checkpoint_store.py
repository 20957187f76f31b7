"""Checkpoints in an object store (issue #56): spec.checkpoint.path s3://bucket/prefix, against
moto's real S3 API (tests/helpers/s3.py). Every rank's shards go straight to the store
(checkpoint.store_dcp), a commit marker stands in for `latest`, keepLast deletes old ones, a run
resumes from them and `grpojob export` reads them; a store cut off mid-save (a TCP forwarder that
drops every connection once the save reaches its state file) and a save killed before its marker
leave the previous checkpoint whole."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import obstore
import pytest
import torch

from grpojob.checkpoint import objects
from grpojob.leader.build import build

from tests.helpers.cut_proxy import CutProxy
from tests.helpers.s3 import s3, s3_server  # noqa: F401 - fixtures

from .conftest import make_job
from .procs import ROOT

MARKER = objects.MARKER


def _keys(bucket) -> list[str]:
    return sorted(m["path"] for batch in obstore.list(bucket.store()) for m in batch)


def _steps(keys: list[str], prefix: str = "run1/") -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for k in keys:
        top, _, rest = k.removeprefix(prefix).partition("/")
        out.setdefault(top, set()).add(rest)
    return out


def _params(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_checkpoints_in_s3_are_committed_pruned_resumed_and_exported(tiny_dir, s3, tmp_path):
    url = f"s3://{s3.name}/run1"
    job = make_job(tiny_dir, training={"steps": 3}, checkpoint={"path": url, "everySteps": 1, "keepLast": 2})
    run = build(job, run_dir=str(tmp_path / "run"))
    assert run.run() == "completed"
    trained = _params(run.trainer.model)
    steps = _steps(_keys(s3))
    assert sorted(steps) == ["step-000002", "step-000003"], steps  # keepLast 2: step 1 deleted
    for name in steps:
        assert {MARKER, "trainer_state.pt", "state/.metadata", "state/__0_0.distcp", "hf/config.json"} <= steps[name]
    assert not (tmp_path / "run" / "checkpoints").exists() and not any(tmp_path.rglob("s3:*"))
    assert objects.Store(url).latest() == f"{url}/step-000003"

    again = build(make_job(tiny_dir, training={"steps": 4}, checkpoint={"path": url, "everySteps": 1, "keepLast": 2}),
                  run_dir=str(tmp_path / "run2"))
    assert again.trainer.step == 3
    for k, v in _params(again.trainer.model).items():
        torch.testing.assert_close(v, trained[k], atol=0, rtol=0)
    assert again.run() == "completed"
    assert sorted(_steps(_keys(s3))) == ["step-000003", "step-000004"]

    from grpojob.cli import main
    from transformers import AutoModelForCausalLM

    assert main(["export", url, str(tmp_path / "out")]) == 0  # the newest: step 4
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32).state_dict()
    final = AutoModelForCausalLM.from_pretrained(tmp_path / "run2" / "final-model", dtype=torch.float32).state_dict()
    assert exported.keys() == final.keys()
    for k, v in final.items():  # the run's own final model, written at the same step
        torch.testing.assert_close(exported[k], v, atol=0, rtol=0, msg=lambda m, k=k: f"{k}: {m}")


def test_the_store_cut_off_mid_save_drops_that_save_and_the_next_one_commits(tiny_dir, s3, s3_server, tmp_path,
                                                                           monkeypatch):
    proxy = CutProxy(int(s3_server.endpoint.rsplit(":", 1)[1]))
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
    url = f"s3://{s3.name}/run1"
    job = make_job(tiny_dir, checkpoint={"path": url, "keepLast": 2})
    run = build(job, run_dir=str(tmp_path / "run"))
    tr, m = run.trainer, run.checkpoints
    try:
        tr.step = 1
        m.save()
        m.wait()
        # step 2: the shards and DCP's .metadata reach the store, then it goes away (the state file)
        proxy.cut_at(b"step-000002/trainer_state.pt")
        tr.step = 2
        m.save()
        m.wait()
        assert proxy.cut_seen.is_set() and m.failed_in_a_row == 1
        (said,) = m.take_errors()
        assert said.startswith("checkpoint of step 2 failed: ") and said.endswith("(the last checkpoint is step 1)")
        proxy.mend()
        steps = _steps(_keys(s3))
        assert MARKER in steps["step-000001"] and MARKER not in steps["step-000002"], steps
        assert objects.Store(url).latest() == f"{url}/step-000001"  # the previous one, whole
        tr.step = 3
        m.save()
        m.wait()
        steps = _steps(_keys(s3))
        assert sorted(steps) == ["step-000001", "step-000003"], steps  # step 2's leftovers pruned
        assert m.failed_in_a_row == 0 and m.last_step == 3
    finally:
        m.close()
        proxy.close()


KILLED = """
import os, signal, sys
from grpojob.checkpoint import objects
from grpojob.leader.build import build
from tests.trainer.conftest import make_job

commit = objects.Store.commit
def kill_before_marker(self, url, keep_last):
    if url.endswith("step-000002"):  # every object of step 2 is in the store: not its marker
        os.kill(os.getpid(), signal.SIGKILL)
    commit(self, url, keep_last)
objects.Store.commit = kill_before_marker
job = make_job(sys.argv[1], training={"steps": 3}, checkpoint={"path": sys.argv[2], "everySteps": 1})
build(job, run_dir=sys.argv[3]).run()
"""


@pytest.mark.slow  # a trainer process of its own, killed
def test_a_save_killed_before_its_marker_leaves_the_previous_checkpoint_the_one_resumed(tiny_dir, s3, tmp_path):
    url = f"s3://{s3.name}/run1"
    proc = subprocess.run([sys.executable, "-c", KILLED, str(tiny_dir), url, str(tmp_path / "run")], cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": f"{ROOT}/runtime:{ROOT}"}, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == -9, proc.stderr[-3000:]
    steps = _steps(_keys(s3))
    assert MARKER in steps["step-000001"] and MARKER not in steps["step-000002"], steps
    assert {"trainer_state.pt", "state/.metadata"} <= steps["step-000002"]  # killed at the very last moment
    resumed = build(make_job(tiny_dir, training={"steps": 3}, checkpoint={"path": url, "everySteps": 1}),
                    run_dir=str(tmp_path / "run2"))
    assert resumed.trainer.step == 1
    assert resumed.run() == "completed"
    # step 2 saved again whole (what the killed save left went first), keepLast 2
    assert sorted(_steps(_keys(s3))) == ["step-000002", "step-000003"]
    assert all(MARKER in objs for objs in _steps(_keys(s3)).values())


def test_a_store_the_trainer_cannot_write_to_is_refused_at_start(tiny_dir, s3, tmp_path):
    from grpojob.checkpoint.storage import StorageRefused

    job = make_job(tiny_dir, checkpoint={"path": f"s3://no-such-bucket-{s3.name}/run1"})
    with pytest.raises(StorageRefused) as e:
        build(job, run_dir=str(tmp_path / "run"))
    said = str(e.value)
    # the first request, rank 0's look for a checkpoint to resume from, is refused
    assert said.startswith(f"spec.checkpoint.path: the trainer cannot list checkpoints at s3://no-such-bucket-"), said
    assert "NoSuchBucket" in said and "Debug source" not in said
    assert "spec.checkpoint.credentialsSecret" in said and "the bucket exists" in said
    assert not Path(tmp_path / "run").exists() or not any((tmp_path / "run").rglob("metrics.jsonl"))


@pytest.mark.slow
def test_two_fsdp_ranks_each_put_their_shards_in_the_store_and_one_rank_resumes_them_whole(tiny_dir, s3, tmp_path,
                                                                                        procs):
    """2 gloo ranks under torchrun (FSDP2): one object of shards per rank, DCP's .metadata from the
    coordinator; a lone trainer then loads the step-3 checkpoint from the store, resharded whole."""
    from safetensors.torch import load_file

    from grpojob.plan import CONFIG_FILE, ENV_CHECKPOINT_DIR, ENV_CONFIG, ENV_RUN_DIR, render_config

    from .procs import free_port

    url = f"s3://{s3.name}/run1"
    over = dict(training={"steps": 3, "promptsPerStep": 8, "microBatchTokens": 128, "strategy": "fsdp"},
                algorithm={"name": "grpo", "groupSize": 4}, checkpoint={"everySteps": 1, "keepLast": 5})
    job = make_job(tiny_dir, trainer={"processesPerReplica": 2}, **over)
    (tmp_path / CONFIG_FILE).write_text(render_config(job))
    env = {**os.environ, ENV_CONFIG: str(tmp_path / CONFIG_FILE), ENV_RUN_DIR: str(tmp_path),
           ENV_CHECKPOINT_DIR: url, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "runtime")]),
           "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", "--master-addr=127.0.0.1",
           f"--master-port={free_port()}", "-m", "tests.trainer.dist_worker"]
    proc = procs(cmd, env, tmp_path / "torchrun.log")
    assert proc.wait(600) == 0, proc.tail(8000)
    steps = _steps(_keys(s3))
    assert sorted(steps) == ["step-000001", "step-000002", "step-000003"], steps
    for objs in steps.values():
        assert {MARKER, "state/.metadata", "state/__0_0.distcp", "state/__1_0.distcp"} <= objs, objs
    double = load_file(str(tmp_path / "final-model" / "model.safetensors"))
    alone = build(make_job(tiny_dir, **over), checkpoint_dir=url, run_dir=str(tmp_path / "alone"))
    assert alone.trainer.step == 3 and alone.trainer.strategy == "none"
    loaded = alone.trainer.model.state_dict()
    for k in double:
        assert torch.equal(loaded[k], double[k]), k
    alone.rollouts.close()
