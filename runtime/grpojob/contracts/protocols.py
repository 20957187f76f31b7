"""The plug-in contracts a user implements, in one place, free of torch (each is also importable
from where it is used). The others: a rollout workflow and its generator (grpojob.contracts.rollout),
the trainer hooks (grpojob.learner.trainer.GRPOTrainer: a torch class, subclassed), a reward
function's signatures (grpojob.rewards.forms), a dataset factory or class (grpojob.data), an
environment (the trajectory API over HTTP: grpojob.leader.trajectories.wire)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Protocol

from grpojob.contracts.rollout import Completion, SamplingParams


class Engine(Protocol):
    """What a rollout server drives. Class attributes an engine class declares:

    backend: its name in logs and /info.
    weight_sync: the spec.weightSync.backend values it can receive (a subset of ALL_SYNC; include
        "auto"). `receive_push` gets every path but checkpoint, `load_dir` the checkpoint path.
    delta_files (optional, default False): True when `load_dir` also takes delta versions
        (backend checkpoint with weightSync.delta: what changed since the weights it holds, read
        with grpojob.sync.files.read_delta); other engines get every version whole.

    Instance state: `version` (policy version of the weights loaded now; 0 = the model on disk),
    `weights` (the weights id of grpojob.sync.protocol, DISK at start), `last_pause_seconds` (how long
    the last weight load kept generation from running; None when not measured: the trainer's step
    record shows it), and, once `start` returned, `tokenizer`, `vocab_size`, `context_len` (prompt +
    completion tokens that fit)."""
    backend: str
    weight_sync: tuple[str, ...]
    version: int
    weights: str
    last_pause_seconds: Optional[float]
    tokenizer: object
    vocab_size: int
    context_len: int

    async def start(self) -> None:
        """Load the model (spec.model) and get ready to generate; may take minutes (the server
        answers /healthz meanwhile)."""
        ...

    async def generate(self, prompt_ids: list[int], n: int, sampling: SamplingParams) -> list[Completion]:
        """n completions of one prompt, each with its per-token log-probs (the Completion contract of
        contracts/rollout.py) and the policy version of the weights that produced it. Concurrent calls
        are expected (batch them); ValueError for bad parameters."""
        ...

    def load_info(self) -> tuple[int, int]:
        """(requests waiting for the engine, requests being generated)."""
        ...

    # The weight sink (WeightSink below), called from the sync agent's thread.
    def endpoints(self) -> list:
        """One grpojob.sync.placement.Endpoint per process that receives a share of a push
        (placement.local(device) for an engine that holds its model in this process)."""
        ...

    def receive_push(self, cmd: dict, store_addr: str, instance: str) -> None:
        """Receive pushed weights: grpojob.sync.receiver.PushReceiver(store_addr, instance, device)
        .receive(cmd) yields (name, tensor) in Hugging Face names; load them all, then switch
        `version`/`weights` to cmd["version"]/cmd["weights"] atomically for generation. With
        spec.model.lora, cmd["adapter"] is the PEFT config and the tensors are the adapter alone
        (PEFT's names, grpojob.sync.adapter): apply it to the base weights loaded at start."""
        ...

    def load_dir(self, path: str, version: int, weights: str) -> None:
        """Load a Hugging Face model directory (grpojob.sync.tensorfiles.iter_dir), then switch version;
        with LoRA a version is a PEFT adapter directory (grpojob.sync.adapter.is_adapter_dir). With
        `delta_files`, a delta version (grpojob.sync.files.is_delta): apply it in place only when
        its `base` is the engine's `weights` (else raise), then switch."""
        ...

    def errored(self) -> Optional[str]:
        """Why the engine is dead, or None."""
        ...

    async def close(self) -> None: ...

    # Sleep mode (spec.placement colocated), for an engine class that declares `sleep_mode = True`:
    async def sleep(self, level: int) -> dict:
        """Stop generating (requests that come meanwhile wait; those in flight may be kept) and give
        the device back (level 1: keep the weights, free the KV cache); return once asleep, with
        numbers for the trainer's step record (seconds, freed_bytes, decode_steps: any of them)."""
        ...

    async def wake(self) -> dict:
        """Take the device back and generate again; the same kind of numbers."""
        ...


class WeightSink(Protocol):
    """What the agent loads weights into (the rollout engine). Both calls block until the new
    weights serve requests, and switch the engine's policy version together with the weights.
    `last_pause_seconds`: how long the last load kept generation from running (None: unknown)."""
    last_pause_seconds: Optional[float]

    def endpoints(self) -> list: ...  # one per receiving process (vLLM: one per worker)

    def receive_push(self, cmd: dict, store_addr: str, instance: str) -> None: ...

    def load_dir(self, path: str, version: int, weights: str) -> None: ...


class Callback:
    """Base class of user callbacks (every method optional to override)."""

    def on_step_end(self, record) -> None:
        """After each step; `record` is the StepRecord (record.scalars() flattens its numbers)."""

    def on_checkpoint(self, step: int, path: Path) -> None:
        """After the checkpoint of `step` was committed at `path` (a torch.distributed.checkpoint
        directory; `grpojob export PATH OUT` makes a Hugging Face model of it). Saves are written
        in the background: this comes on the loop's thread at the first step boundary after."""

    def on_evaluation(self, record) -> None:
        """After an evaluation of the policy of `record.step` (grpojob.leader.evaluation.EvalRecord;
        record.scalars() names its numbers eval/...)."""

    def close(self) -> None:
        """The run ended (completed, suspended or failed)."""


class DatasetClass(Protocol):
    """spec.dataset.class (cosmos-rl's dataset shape): constructed with spec.dataset.args."""

    def setup(self, spec: Any, tokenizer: Any) -> None: ...

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Any:
        """The prompt text, a list of chat messages, or a dict row."""
        ...

    def reference_answer(self, index: int) -> Any:
        """The answer the rewards get (None: the row's own)."""
        ...


# spec.rewards[].name: a function in one of three signatures (grpojob.rewards.forms), sync or async.
class NativeReward(Protocol):
    def __call__(self, prompt: str, completion: str, **row: Any) -> float: ...


class CosmosReward(Protocol):  # cosmos-rl's
    def __call__(self, to_be_evaluated: str, reference: Any, *args: Any, **kwargs: Any) -> float: ...


class TrlReward(Protocol):  # TRL GRPOTrainer's: once per group; None leaves a completion unscored
    def __call__(self, prompts: list, completions: list, **kwargs: Any) -> list[Optional[float]]: ...
