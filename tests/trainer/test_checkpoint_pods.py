"""Checkpoints on a claim per trainer pod (issue #56, item 2: ReadWriteOnce storage only): real
torch.distributed (gloo), each "pod" a torchrun of its own (--nnodes 2 --node-rank i) with its own
checkpoint directory, as a StatefulSet's volumeClaimTemplate gives each pod its claim. The ranks
find at start that no directory is shared (checkpoint/pods.py), each pod keeps its own ranks'
shards and its own .metadata, and a run of the same world size resumes them whole; a lost claim
and a changed world size are refused with the reason; a pod killed between the pods' commits
leaves the previous checkpoint the one resumed."""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from grpojob.checkpoint import layout
from grpojob.checkpoint.export import ExportError, export

from .procs import ROOT, free_port

pytestmark = pytest.mark.slow


def _launch(procs, tmp_path: Path, args: list[str], *, pods: int = 2, per_pod: int = 2, dirs=None,
            tag: str = "", **env_over):
    port, out = free_port(), []
    for node in range(pods):
        root = (dirs or {}).get(node, tmp_path / f"pod-{node}")
        env = {**os.environ, "GRPOJOB_CHECKPOINT_DIR": str(root), "OMP_NUM_THREADS": "1",
               "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "runtime")]), **env_over}
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={pods}", f"--node-rank={node}",
               f"--nproc-per-node={per_pod}", "--master-addr=127.0.0.1", f"--master-port={port}",
               "-m", "tests.trainer.pods_worker", *args]
        out.append(procs(cmd, env, tmp_path / f"{tag}pod-{node}.log"))
    return out


def _wait(launched, timeout: float = 240) -> list[int]:
    return [p.wait(timeout) for p in launched]


def _same(a: dict, b: dict) -> None:
    keys = [k for k in a if k.startswith(("param/", "opt/"))]
    assert keys and sorted(keys) == sorted(k for k in b if k.startswith(("param/", "opt/")))
    for k in keys:
        assert torch.equal(a[k], b[k]), k


def test_each_pod_keeps_its_ranks_shards_and_the_same_world_resumes_them_whole(procs, tmp_path):
    """2 pods x 2 ranks (FSDP2): each pod's step directory holds its own ranks' DCP checkpoints and
    pod.json, only pod 0 the state file; keepLast prunes on both; a fresh run of the same world
    (other initial weights) resumes the newest step: every parameter and Adam moment equal."""
    assert _wait(_launch(procs, tmp_path, ["save", "3", str(tmp_path)], KEEP_LAST="2")) == [0, 0]
    saved = torch.load(tmp_path / "saved.pt")
    assert saved["pods"] == [[0, 1], [2, 3]] and saved["step"] == 3
    for node, ranks in ((0, [0, 1]), (1, [2, 3])):
        root = tmp_path / f"pod-{node}"
        assert [s for s, _ in layout.list_checkpoints(root)] == [2, 3]  # keepLast 2, on every claim
        step = layout.step_dir(root, 3)
        assert sorted(p.name for p in (step / layout.SHARDS).iterdir()) == [f"rank-{r:05d}" for r in ranks]
        for r in ranks:
            assert (layout.rank_dir(step, r) / ".metadata").is_file()
        assert (step / layout.STATE_FILE).is_file() == (node == 0)
        assert (root / layout.LATEST).read_text().strip() == "step-000003"
    assert _wait(_launch(procs, tmp_path, ["resume", str(tmp_path)], tag="r-")) == [0, 0]
    resumed = torch.load(tmp_path / "resumed.pt")
    assert resumed["step"] == 3 and resumed["found"].endswith("step-000003")
    _same(saved, resumed)
    # grpojob export: pod 0's claim alone holds half of each FSDP2 shard: refused, saying what to copy
    pod0 = layout.step_dir(tmp_path / "pod-0", 3)
    spread = r"spread over the trainer pods' claims \(ranks per pod: \[\[0, 1\], \[2, 3\]\]\)"
    with pytest.raises(ExportError, match=spread):
        export(pod0, tmp_path / "out")
    whole = tmp_path / "copied" / pod0.name
    shutil.copytree(pod0, whole)
    for part in (layout.step_dir(tmp_path / "pod-1", 3) / layout.SHARDS).iterdir():
        shutil.copytree(part, whole / layout.SHARDS / part.name)
    exported = load_file(str(export(whole, tmp_path / "out") / "model.safetensors"))
    assert sorted(exported) == sorted(k.removeprefix("param/model.") for k in saved if k.startswith("param/"))
    for name, t in exported.items():
        assert torch.equal(t, saved[f"param/model.{name}"]), name


def test_a_pod_killed_between_the_pods_commits_resumes_from_the_checkpoint_before(procs, tmp_path):
    """Pod 1's leader dies after every rank wrote step 2 but before renaming it: pod 0 committed
    step 2 and kept step 1 (no pod prunes until every pod committed, keepLast 1); the next run of
    the same world resumes step 1, the newest every pod holds whole."""
    launched = _launch(procs, tmp_path, ["save", "2", str(tmp_path)], per_pod=1, KEEP_LAST="1",
                       STRATEGY="ddp", GRPOJOB_TEST_DIE_AT_COMMIT="2")
    assert all(code != 0 for code in _wait(launched))
    assert [s for s, _ in layout.list_checkpoints(tmp_path / "pod-0")] == [1, 2]
    assert [s for s, _ in layout.list_checkpoints(tmp_path / "pod-1")] == [1]
    assert _wait(_launch(procs, tmp_path, ["resume", str(tmp_path)], per_pod=1, STRATEGY="ddp", tag="r-")) == [0, 0]
    resumed = torch.load(tmp_path / "resumed.pt")
    assert resumed["step"] == 1 and resumed["found"].endswith("step-000001")


def test_a_lost_claim_or_a_changed_world_size_is_refused_with_the_reason(procs, tmp_path):
    """After a save on 2 pods x 1 rank: pod 1 on an empty claim (lost with its pod) is refused, not
    started from step 0; one pod alone on pod 0's claim (a changed world size) is refused too, each
    naming what a resume needs."""
    assert _wait(_launch(procs, tmp_path, ["save", "1", str(tmp_path)], per_pod=1, STRATEGY="ddp")) == [0, 0]
    empty = tmp_path / "new-claim"
    assert all(c != 0 for c in _wait(_launch(procs, tmp_path, ["resume", str(tmp_path)], per_pod=1,
                                             STRATEGY="ddp", dirs={1: empty}, tag="lost-")))
    log = (tmp_path / "lost-pod-0.log").read_text()
    assert "trainer ranks [0] hold checkpoints (steps [1]) but ranks [1] none" in log, log[-3000:]
    assert "a resume needs every pod's" in log
    alone = _launch(procs, tmp_path, ["resume", str(tmp_path)], pods=1, per_pod=1, STRATEGY="ddp", tag="alone-")
    assert _wait(alone) != [0]
    log = (tmp_path / "alone-pod-0.log").read_text()
    assert "was saved by 2 trainer ranks on a claim per pod (pods: [[0], [1]]); this run has 1" in log, log[-3000:]
    assert "per-pod checkpoints resume on the world size that saved them" in log
    assert not (tmp_path / "resumed.pt").exists()
