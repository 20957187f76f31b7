"""vLLM worker extension: weight pushes land directly in each vLLM worker.

The vllm engine starts vLLM with `worker_extension_cls=` this class, so its methods run inside
every worker through `collective_rpc`. Each worker is an endpoint of its own: it reports where
it computes (`grpojob_endpoint`), and receives its share of a push over its route (a collective
group, CUDA IPC from the trainer's GPU, or /dev/shm) with `receiver.PushReceiver`. The weights
are then loaded with the worker's in-place reload path (`reload_weights(weights_iterator=...,
is_checkpoint_format=True)`): `model.load_weights` is not usable on CPU, where vLLM repacks
linear weights at load time. With tied embeddings vLLM's CPU path keeps a separately packed copy
in lm_head, so it is re-processed after every reload.
With LoRA (`grpojob_receive_adapter`) a push is the adapter alone: every worker receives it (its
route must be served) and worker 0 writes it as a PEFT adapter directory, which the engine then
hands to vLLM's LoRA support as a new LoRARequest.
"""
from __future__ import annotations

import json
import time
from typing import Iterable

import torch


class WeightSyncExtension:
    def grpojob_endpoint(self) -> dict:
        from grpojob.sync.placement import local

        return local(self.device).to_json()

    def grpojob_receive_push(self, cmd_json: str, store_addr: str, instance: str) -> dict:
        from grpojob.sync.receiver import PushReceiver

        cmd = json.loads(cmd_json)
        rx = getattr(self, "_grpojob_receiver", None)
        if rx is None or rx.addr != store_addr or rx.instance != instance:
            rx = self._grpojob_receiver = PushReceiver(store_addr, instance, self.device)
        return self._grpojob_reload(rx.receive(cmd, endpoint=int(self.rank)))

    def grpojob_receive_adapter(self, cmd_json: str, store_addr: str, instance: str, path: str) -> dict:
        from grpojob.sync.adapter import save
        from grpojob.sync.receiver import PushReceiver
        from grpojob.sync.stream import TensorStream

        cmd = json.loads(cmd_json)
        rx = getattr(self, "_grpojob_receiver", None)
        if rx is None or rx.addr != store_addr or rx.instance != instance:
            rx = self._grpojob_receiver = PushReceiver(store_addr, instance, self.device)
        named = rx.receive(cmd, endpoint=int(self.rank))
        if int(self.rank) == 0:
            save(path, TensorStream.of(named, adapter=cmd["adapter"]))
        return {"path": path}

    def grpojob_load_dir(self, path: str) -> dict:
        from grpojob.sync.tensorfiles import iter_dir

        return self._grpojob_reload(iter_dir(path))

    def _grpojob_reload(self, named: Iterable[tuple[str, torch.Tensor]]) -> dict:
        start = time.perf_counter()
        self.reload_weights(weights_iterator=iter(named), is_checkpoint_format=True)
        model = self.model_runner.model
        config = getattr(model, "config", None)
        lm_head = getattr(model, "lm_head", None)
        if getattr(config, "tie_word_embeddings", False) and hasattr(lm_head, "quant_method"):
            lm_head.quant_method.process_weights_after_loading(lm_head)
        return {"seconds": time.perf_counter() - start}
