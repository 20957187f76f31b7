"""A trainer rank for the per-pod checkpoint tests (tests/trainer/test_checkpoint_pods.py), started
by torchrun once per "pod" (--nnodes, --node-rank), each pod with its own checkpoint directory
(GRPOJOB_CHECKPOINT_DIR), as a StatefulSet's claim per pod is. The learner is the real sharding
of grpojob.learner.dist (FSDP2 or DDP over gloo) on a small MLP with Adam, so the checkpoint
holds DTensor shards, replicated tensors and non-tensor values as a trainer's does.

    python -m tests.trainer.pods_worker save STEPS OUT   train and save STEPS steps; OUT/saved.pt
    python -m tests.trainer.pods_worker resume OUT       resume the newest; OUT/resumed.pt

GRPOJOB_TEST_DIE_AT_COMMIT=STEP: pod 1's leader dies right before renaming that step's directory
(after every rank wrote, so pod 0 commits it)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
from torch import nn

from grpojob import lifeline
from grpojob.checkpoint import places
from grpojob.checkpoint.manager import CheckpointManager, find_latest
from grpojob.learner import dist


class Learner:
    def __init__(self, env: dist.DistEnv, kind: str, seed: int):
        torch.manual_seed(seed)
        self.env, self.step, self.version = env, 0, 0
        model = nn.Module()  # its weights under "model.", as the trainer's policy has them (grpojob export)
        model.model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))
        model.forward = model.model.forward
        layers = [model.model[0], model.model[2]] if kind == "fsdp" else None
        self.policy = dist.wrap(model, kind, env, layers=layers)
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=0.01)

    def train_step(self) -> None:
        g = torch.Generator().manual_seed(1000 * self.step + self.env.rank)
        x = torch.randn(8, 16, generator=g)
        loss = self.policy(x).pow(2).mean()
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad()
        self.step += 1
        self.version += 1

    def sharded_state(self):
        return dist.sharded_state(self.policy, self.optimizer, trainable_only=False)

    def load_sharded_state(self, state) -> None:
        dist.load_sharded_state(self.policy, self.optimizer, state, trainable_only=False)

    def load_state(self, weights, optimizer) -> None:
        raise AssertionError("no legacy checkpoints here")

    def save_model_files(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "config.json").write_text("{}\n")

    def adapter_stream(self):
        return None

    def full(self) -> dict[str, torch.Tensor]:
        """Every parameter and Adam moment whole (collective under FSDP2)."""
        out = {}
        for name, p in self.policy.named_parameters():
            out[f"param/{name}"] = _whole(p)
            for k, v in self.optimizer.state.get(p, {}).items():
                out[f"opt/{name}/{k}"] = _whole(v)
        return out


def _whole(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().clone()


def main() -> int:
    action, env = sys.argv[1], dist.init(timeout_seconds=60)
    root = Path(os.environ["GRPOJOB_CHECKPOINT_DIR"])
    die = int(os.environ.get("GRPOJOB_TEST_DIE_AT_COMMIT", "0"))
    if die:
        commit = places.Directory.commit

        def dying(self, handle, step, keep_last):
            if step == die and env.rank == env.world // 2:  # pod 1's leader
                os._exit(9)
            return commit(self, handle, step, keep_last)
        places.Directory.commit = dying
    try:
        tr = Learner(env, os.environ.get("STRATEGY", "fsdp"), seed=0 if action == "save" else 1)
        found = find_latest(root, env)
        mgr = CheckpointManager(root, tr, keep_last=int(os.environ.get("KEEP_LAST", "2")), states={})
        if action == "save":
            for _ in range(int(sys.argv[2])):
                tr.train_step()
                mgr.save()
            mgr.wait()
            out = Path(sys.argv[3])
        else:
            mgr.load(found)
            out = Path(sys.argv[2])
        full = tr.full()
        if env.is_leader:
            torch.save({"step": tr.step, "found": str(found), "pods": mgr.place.pods, **full},
                       out / f"{action}d.pt")
        mgr.close()
    finally:
        dist.shutdown(env)
    return 0


if __name__ == "__main__":
    lifeline.exit_now(main())
