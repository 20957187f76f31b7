"""The smallest real WeightSink: a dict of named tensors with the model's shapes on one device
(the rollout engines, which are the production sinks, are tested through real servers in
tests/rollout)."""
from __future__ import annotations

import threading

import torch

from grpojob.plugins import is_delta, read_delta
from grpojob.sync import placement, tensorfiles
from grpojob.sync.protocol import DISK
from grpojob.sync.receiver import PushReceiver


class TensorSink:
    last_pause_seconds = None  # a sink that serves no generation pauses none

    def __init__(self, shapes: dict[str, tuple], device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        self.tensors = {n: torch.zeros(s, device=self.device) for n, s in shapes.items()}
        self.version, self.weights = 0, DISK
        self.loads = 0
        self.lock = threading.Lock()
        self._rx = None

    def endpoints(self):
        return [placement.local(self.device)]

    def receive_push(self, cmd, store_addr, instance):
        if self._rx is None or self._rx.instance != instance or self._rx.addr != store_addr:
            self._rx = PushReceiver(store_addr, instance, self.device)
        self._load(self._rx.receive(cmd), cmd["version"], cmd["weights"])

    def load_dir(self, path, version, weights):
        self._load(tensorfiles.iter_dir(path), version, weights)

    def _load(self, named, version, weights):
        named = dict(named)
        for n, t in named.items():
            if n not in self.tensors or self.tensors[n].shape != t.shape:
                raise ValueError(f"tensor {n} {tuple(t.shape)} does not fit this model")
        with self.lock:
            for n, t in named.items():
                self.tensors[n] = t.to(self.device, copy=True)
            self.version, self.weights = version, weights
            self.loads += 1


class DeltaFileSink(TensorSink):
    """A sink that declares `delta_files`: its load_dir also applies delta versions in place, onto
    the weights it holds only (as the hf engine does). `kinds`: per load, "delta" or "whole"."""
    delta_files = True

    def __init__(self, shapes: dict[str, tuple], device: torch.device | str = "cpu"):
        super().__init__(shapes, device)
        self.kinds: list[str] = []
        self.fail_next = False

    def load_dir(self, path, version, weights):
        if self.fail_next:
            self.fail_next = False
            raise ValueError("this server failed to load a version (the test's doing)")
        if not is_delta(path):
            super().load_dir(path, version, weights)
            self.kinds.append("whole")
            return
        delta = read_delta(path)  # the public helper an engine plug-in uses (grpojob.plugins)
        if delta.base != self.weights:
            raise ValueError(f"a delta against {delta.base}, but this sink holds {self.weights}")
        with self.lock:
            for n, change in delta.changes.items():
                if change is None:
                    self.tensors[n] = delta.whole[n].to(self.device, copy=True)
                else:
                    t = self.tensors[n]
                    t.view(-1).index_copy_(0, change[0].to(t.device), change[1].to(t.device, t.dtype))
            self.version, self.weights = version, weights
            self.loads += 1
        self.kinds.append("delta")
