"""A trainer as the runtime behaves (grpojob.trainer.main and loop), acted out over the TrainerStub
for the operator's tests, where no trainer process runs: what its /status says while it starts
(step 0 until it has loaded its newest checkpoint), trains, suspends and finishes (it then holds,
saying "completed", with the termination message grpojob.failures.report_completed writes).

Its checkpoints live where trainer pod 0 mounts the checkpoint directory, as the operator rendered
it: on a PersistentVolumeClaim they last as long as the claim object does; in an emptyDir they
last as long as the pod does ("When a Pod is removed from a node for any reason, the data in the
emptyDir is deleted permanently": https://kubernetes.io/docs/concepts/storage/volumes/#emptydir).
"""
from __future__ import annotations

import asyncio
from typing import Any, Optional

from grpojob.api import plugins
from grpojob_operator import names as n
from grpojob_operator.pods import CHECKPOINTS_VOLUME

from .harness import TrainerStub
from .kmock_shim import PODS, PVCS, Emulator


class ActedTrainer:
    def __init__(self, emu: Emulator, stub: TrainerStub, ns: str, job: str, total: int, every: int = 1):
        self.emu, self.stub, self.ns, self.job, self.total, self.every = emu, stub, ns, job, total, every
        self.saved: dict[tuple[str, str], int] = {}  # checkpoint volume -> its newest checkpoint's step
        self.step = 0
        self.termination_message = ""  # what the container leaves for the kubelet when it ends

    def _pod(self) -> dict[str, Any]:
        name = f"{n.trainer_name(self.job)}-0"
        return next(p for p in self.emu.live(PODS, self.ns) if p["metadata"]["name"] == name)

    def _volume(self) -> tuple[str, str]:
        """Where pod 0 keeps checkpoints: ("claim", name) or ("emptyDir", pod uid)."""
        pod = self._pod()
        (container,) = pod["spec"]["containers"]
        mount = next(m for m in container["volumeMounts"] if m["name"] == CHECKPOINTS_VOLUME)
        volume = next(v for v in pod["spec"]["volumes"] if v["name"] == mount["name"])
        if "persistentVolumeClaim" in volume:
            return "claim", volume["persistentVolumeClaim"]["claimName"]
        assert "emptyDir" in volume, volume
        return "emptyDir", pod["metadata"]["uid"]

    def _newest(self) -> int:
        key = self._volume()
        if key[0] == "claim" and self.emu.get_obj(PVCS, self.ns, key[1]) is None:
            self.saved.pop(key, None)  # the claim was deleted: its volume with it
        return self.saved.get(key, 0)

    def _report(self, **fields: Any) -> None:
        self.stub.set(self.ns, self.job, totalSteps=self.total, **fields)

    async def start(self, loading: float = 0.6) -> int:
        """A (re)started trainer process: step 0 while it loads, then its newest checkpoint's step
        (and "completed" at once when that is the last step). Returns the step it resumed at."""
        self.termination_message = ""
        self._report(phase="starting", step=0, policyVersion=0, lastCheckpointStep=None, weightsInSync=None)
        await asyncio.sleep(loading)  # the operator looks meanwhile
        self.step = self._newest()
        self._report(phase="running", step=self.step, policyVersion=self.step,
                     lastCheckpointStep=self.step or None, weightsInSync=True)
        if self.step >= self.total:
            self._finish()
        return self.step

    async def train(self, to: int, seconds_per_step: float = 0.3) -> None:
        while self.step < min(to, self.total):
            await asyncio.sleep(seconds_per_step)
            self.step += 1
            fields: dict[str, Any] = {"step": self.step, "policyVersion": self.step, "weightsInSync": True}
            if self.step % self.every == 0 or self.step == self.total:
                self.saved[self._volume()] = self.step
                fields["lastCheckpointStep"] = self.step
            self._report(phase="running", **fields)
        if self.step >= self.total:
            self._finish()

    def suspend(self) -> None:
        """POST /suspend: checkpoint, then stop (the process exits 0)."""
        self.saved[self._volume()] = self.step
        self._report(phase="suspended", lastCheckpointStep=self.step)

    def _finish(self) -> None:
        self.termination_message = plugins.completion_message(self.step, self.total)
        self._report(phase="completed", step=self.step)

    @property
    def checkpoint_claim(self) -> Optional[str]:
        kind, name = self._volume()
        return name if kind == "claim" else None
