"""CheckpointManager: everything a run needs to continue exactly, saved by every rank at once.

Each rank writes its own shards of the policy and optimizer state with torch.distributed.checkpoint
(`dcp.async_save`: the shards are copied to host memory, then written on a background thread while
training goes on; its collectives run on a gloo group of their own, off the training group).
Replicated tensors (DDP, or the optimizer's step counters under FSDP2) are spread over the ranks
but rank 0 (which has the most else to hold), so each is staged and written once. Rank 0 adds a small state file: step, policy version, world
size, LR schedule, every rank's RNG, and the group source's data position and rollout buffer
(prompts issued but not trained are generated again after a resume, so none is skipped or
trained twice). Once every rank's shards are written, rank 0 commits (layout.commit: rename,
`latest`, keepLast). A save is waited for before the next one, before the run ends and before a
suspend completes. Loading reshards (DCP): a checkpoint resumes on any world size and wrapper.
"""
from __future__ import annotations

import logging
import random
import threading
import time
import warnings
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Protocol

import torch
import torch.distributed as tdist
from torch.distributed import checkpoint as dcp

from grpojob.checkpoint import layout, legacy, objects, places, pods, storage
from grpojob.checkpoint.pods import own_part  # noqa: F401 - its home before per-pod claims
from grpojob.learner import dist
from grpojob.learner.errors import TrainerError
from grpojob.sync import adapter
from grpojob.sync.stream import TensorStream

log = logging.getLogger("grpojob.checkpoint")
CLOSE_WAIT_SECONDS = 120.0  # how long the end of a run waits for a save in flight
# A save that fails for its storage (a full disk, a quota, an I/O error) is dropped whole and
# training goes on; this many in a row stop the trainer (the steps since the last checkpoint
# would otherwise grow without bound).
MAX_FAILED_SAVES = 3

# DCP warns on every single-process save and load (one trainer rank, `grpojob export`); that is
# this package's intent, not a misconfiguration.
warnings.filterwarnings("ignore", message="torch.distributed is (disabled, )?unavailable or uninitialized",
                        category=UserWarning)


def storage_oserror(e: BaseException) -> Optional[BaseException]:
    """The storage's own error behind a failed save (a full disk, a quota, a permission, an I/O
    error, an object store that refused or did not answer), when that is why it failed; None for
    any other failure."""
    if isinstance(e, OSError) or objects.store_error(e):
        return e
    if isinstance(e, dcp.CheckpointException):
        for exc, _ in e.failures.values():
            if isinstance(exc, OSError) or objects.store_error(exc):
                return exc
    return None


def storage_error(e: BaseException) -> Optional[str]:
    """What a save's storage said ("[Errno 28] No space left on device: ..."), when that is why it
    failed; None for any other failure."""
    found = storage_oserror(e)
    if found is None:
        return None
    if not isinstance(found, OSError):
        return " ".join(str(found).split())[:300]
    what = found.strerror or str(found)
    return f"{what} ({found.filename})" if found.filename else what


def _outcome(e: Optional[BaseException]) -> Optional[tuple[bool, Optional[int], str]]:
    """What pods.agree tells the other ranks of a failure: the storage's or not, its errno, the text."""
    if e is None:
        return None
    found = storage_oserror(e)
    return (found is not None, getattr(found, "errno", None), f"{type(e).__name__}: {e}"[:600])


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def find_latest(root: str | Path, env) -> Optional[str | Path]:
    """The newest complete checkpoint (collective): in an object store as rank 0 sees it; in a
    directory the newest that every rank finds whole in its own (one shared directory, or a claim
    per pod: each rank's path, under its own root)."""
    if not objects.is_store(str(root)) and env.initialized and env.world > 1:
        return pods.common(Path(root), env)
    found = places.of(root).latest() if env.is_leader else None
    found = dist.broadcast_object(str(found) if found else None, env)
    return (found if objects.is_store(str(root)) else Path(found)) if found else None


@dataclass
class Save:
    """One save: timings (blocking: what the caller waited; total: until committed)."""
    step: int
    tmp: str  # the place's handle: a temporary directory, or the checkpoint's URL
    future: Future
    started: float
    blocking_seconds: float = 0.0
    total_seconds: Optional[float] = None
    error: Optional[BaseException] = None
    done: threading.Event = field(default_factory=threading.Event)


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class Learner(Protocol):
    """What the manager saves of a rank's learner (grpojob.learner.trainer.GRPOTrainer is one): its
    sharded model and optimizer state (DCP), its step and policy version, the files that make a
    checkpoint a model directory, and under LoRA the adapter in PEFT's format."""
    env: dist.DistEnv
    step: int
    version: int

    def sharded_state(self) -> dict[str, Any]: ...

    def load_sharded_state(self, state: dict[str, Any]) -> None: ...

    def load_state(self, weights: Optional[dict[str, torch.Tensor]], optimizer: Optional[dict]) -> None: ...

    def save_model_files(self, directory: Path) -> None: ...

    def adapter_stream(self) -> Optional[TensorStream]: ...


class CheckpointManager:
    """save, wait and load are collective (every rank calls them at the same point).

    states: what else a run needs to continue exactly, saved by rank 0 in the state file under
    its name and given back at load (the LR schedule, the group source's data position and rollout
    buffer): anything with state_dict/load_state_dict."""

    def __init__(self, root: str | Path, learner: Learner, keep_last: int, *,
                 states: Optional[dict[str, Stateful]] = None, asynchronous: bool = True):
        self.place = places.of(root)
        self.root, self.learner, self.keep_last = self.place.root, learner, keep_last
        self.states = dict(states or {})
        self.env = learner.env
        self.asynchronous = asynchronous
        self.last_step: Optional[int] = None
        self.last_save: Optional[Save] = None
        self.pending: Optional[Save] = None
        self._committed: list[tuple[int, str | Path]] = []
        self._lock = threading.Lock()
        self.failed_in_a_row = 0
        self._errors: list[str] = []  # failed saves not yet reported (take_errors)
        multi = self.env.initialized and self.env.world > 1
        self.single = not multi  # one rank: DCP writes and reads in this process alone
        self.pg = self._group()
        self.place.check(self.env)  # a probe write of every rank: storage it cannot write stops it here

    @property
    def per_pod(self) -> bool:
        """A claim per trainer pod (found by the place's check): pods.py."""
        return getattr(self.place, "pods", None) is not None

    def _group(self):
        """A gloo group of its own whenever a process group exists, one rank included: DCP's
        asynchronous save asserts that the group it uses (or, given none, the default one, which
        is NCCL on GPUs) has a CPU backend, and its collectives then stay off the training group."""
        if not (self.env.initialized and tdist.is_available() and tdist.is_initialized()):
            return None
        return tdist.new_group(backend="gloo")

    # ---- saving -------------------------------------------------------------------------------------
    def save(self) -> None:
        """Start saving the current step (after the previous save is committed); returns once this
        rank's shards are staged in host memory (asynchronous) or written (not)."""
        self.wait()
        tr, env = self.learner, self.env
        started = time.perf_counter()
        failed: Optional[BaseException] = None  # rank 0's own writes (a full disk shows here first)
        tmp = dist.broadcast_object(self.place.new(tr.step) if env.is_leader else None, env)
        if self.place.leads(env):  # rank 0, or each pod's leader on per-pod claims
            try:
                self.place.prepare(tmp, env)
            except Exception as e:  # noqa: BLE001 - storage errors only, re-raised otherwise
                if storage_oserror(e) is None:
                    raise
                failed = e
        state = own_part(tr.sharded_state(), env.rank, self.place.savers(env))
        ranks = dist.gather_objects({"rng": rng_state()}, env)
        files = self.place.files(tmp) if env.is_leader else None
        if env.is_leader and failed is None:
            try:
                torch.save({"format": 2, "step": tr.step, "policy_version": tr.version, "world": env.world,
                            "ranks": ranks, **{name: s.state_dict() for name, s in self.states.items()}},
                           files / layout.STATE_FILE)
                tr.save_model_files(files / layout.HF_DIR)
            except OSError as e:
                failed = e
        adapter_stream = tr.adapter_stream()  # LoRA: the adapter in PEFT's format too (small; collective)
        if adapter_stream is not None:
            try:
                if env.is_leader and failed is None:
                    adapter.save(files / layout.ADAPTER_DIR, adapter_stream)
            except OSError as e:
                failed = e
            finally:
                adapter_stream.drain()
        # every rank learns of a leader's failure before DCP's collectives, which they then all skip
        if bool(dist.all_max(torch.tensor([int(failed is not None)]), env).item()):
            self._drop(tmp, tr.step, failed or OSError("a trainer rank could not write the checkpoint's files"))
            return
        target, alone = self.place.writer(tmp, env.rank), self.single or self.per_pod  # per pod: each rank its own
        try:
            if self.asynchronous:
                future = dcp.async_save(state, process_group=self.pg, no_dist=alone, **target)
            else:
                dcp.save(state, process_group=self.pg, no_dist=alone, **target)
                future = Future()
                future.set_result(None)
        except (Exception, dcp.CheckpointException) as e:  # noqa: BLE001 - storage errors only, re-raised
            # otherwise (DCP's CheckpointException is a BaseException)
            if not storage_error(e):
                raise
            if not self.per_pod:
                self._drop(tmp, tr.step, e)
                return
            future = Future()  # per pod: the other ranks wait for this one's word at the commit
            future.set_exception(e)
        del state  # the staged copy (asynchronous) or the files hold it now
        save = Save(tr.step, tmp, future, started, blocking_seconds=time.perf_counter() - started)
        self.pending = self.last_save = save
        future.add_done_callback(lambda f, s=save: self._finish(s, f))

    def _finish(self, save: Save, future: Future) -> None:
        """When this rank's part is written (the writer's thread): rank 0 commits."""
        try:
            final = self._commit(save, future)
            save.total_seconds = time.perf_counter() - save.started
            with self._lock:
                self.last_step = save.step
                self._committed.append((save.step, final))
            if self.env.is_leader:
                log.info("checkpoint saved", extra={"step": save.step, "path": str(final),
                                                    "blocking_seconds": round(save.blocking_seconds, 3),
                                                    "seconds": round(save.total_seconds, 3)})
        except BaseException as e:  # noqa: BLE001 - reported by wait(), in the caller's thread
            save.error = e
            if self.place.leads(self.env):  # nothing of a failed save stays (a full disk gets its space back)
                self.place.drop(save.tmp)
        finally:
            save.done.set()

    def _commit(self, save: Save, future: Future) -> str | Path:
        """Rank 0 commits once DCP says every rank wrote; per pod, every pod's leader commits once
        every rank says so, and prunes once every pod committed (checkpoint.pods)."""
        if not self.per_pod:
            future.result()
            return self.place.commit(save.tmp, save.step, self.keep_last) if self.env.is_leader else save.tmp
        final = None
        for stage in ("write", "commit"):
            error = None
            try:
                if stage == "write":
                    future.result()
                elif self.place.leads(self.env):
                    final = self.place.commit(save.tmp, save.step, self.keep_last)
            except BaseException as e:  # noqa: BLE001 - agreed on, then raised on every rank alike
                error = e
            error = pods.agree(error, _outcome(error), self.env, self.pg)
            if error is not None:
                raise error
        if self.place.leads(self.env):
            self.place.prune(self.keep_last)
        return final or save.tmp

    def wait(self) -> None:
        """Until the pending save (if any) is committed; TrainerError if it failed."""
        save, self.pending = self.pending, None
        if save is None:
            return
        save.done.wait()
        if save.error is None:
            self.failed_in_a_row = 0
        elif storage_error(save.error):
            self._failed(save.step, save.error)
        else:
            raise TrainerError(f"checkpoint of step {save.step} failed: {save.error}") from save.error

    def _drop(self, tmp: str, step: int, error: BaseException) -> None:
        if self.place.leads(self.env):
            self.place.drop(tmp)
        self._failed(step, error)

    def _failed(self, step: int, error: BaseException) -> None:
        """A save its storage refused: dropped whole, the last checkpoint stays; training goes on
        unless MAX_FAILED_SAVES failed in a row (TrainerError, naming the path and the fix)."""
        self.failed_in_a_row += 1
        why = f"checkpoint of step {step} failed: {storage_error(error)}"
        if self.failed_in_a_row >= MAX_FAILED_SAVES:
            found = storage_oserror(error)
            cause = (storage.advice(found, Path(self.root)) if isinstance(found, OSError) else
                     storage.store_advice(found) if found is not None else str(error))
            last = f"step {self.last_step}" if self.last_step is not None else "none yet in this run"
            kind = storage.StorageRefused if isinstance(found, OSError) and found.errno in storage.DETERMINISTIC \
                else TrainerError
            raise kind(f"{self.failed_in_a_row} checkpoints in a row failed (the last saved: {last}); "
                       f"step {step}: {cause}") from error
        why += f" (the last checkpoint is step {self.last_step})" if self.last_step is not None else \
            " (no checkpoint saved yet in this run)"
        log.error("%s; training goes on: the next save is at the next interval; %d failures in a row stop the "
                  "trainer", why, MAX_FAILED_SAVES)
        self._errors.append(why)

    def take_errors(self) -> list[str]:
        """The failed saves since the last call (rank 0 reports them in the step's record)."""
        out, self._errors = self._errors, []
        return out

    def close(self, timeout: float = CLOSE_WAIT_SECONDS) -> None:
        """At the end of a run, however it ends: the pending save is committed before the files
        it writes into can go away, or the log says it was dropped (it failed, or outlasted
        `timeout`: a peer that died mid-save)."""
        save, self.pending = self.pending, None
        if save is None:
            return
        if not save.done.wait(timeout):
            log.error("checkpoint of step %d dropped: still being written %.0f s after the run ended",
                      save.step, timeout)
        elif save.error is not None:
            log.error("checkpoint of step %d dropped: %s", save.step, save.error)

    def covers(self, step: int) -> bool:
        """A save of `step` is committed or under way."""
        return (self.pending is not None and self.pending.step == step) or self.last_step == step

    def committed(self) -> list[tuple[int, str | Path]]:
        """(step, path) of the checkpoints committed since the last call (rank 0: for callbacks)."""
        with self._lock:
            out, self._committed = self._committed, []
        return out

    # ---- loading ------------------------------------------------------------------------------------
    def load(self, path: str | Path) -> None:
        tr = self.learner
        if self.place.is_legacy(path):
            state = legacy.load(tr, path)
        else:
            shards = tr.sharded_state()  # the skeleton in this run's sharding, filled in place
            if self.place.is_per_pod(path):
                pods.load(shards, Path(path), self.env, self.pg)
            else:
                dcp.load(shards, process_group=self.pg, no_dist=self.single, **self.place.reader(path))
            tr.load_sharded_state(shards)
            del shards
            state = self.place.read_state(path) if tr.env.is_leader else None
        state = dist.broadcast_object(state, tr.env)
        tr.step, tr.version = int(state["step"]), int(state["policy_version"])
        for name, s in self.states.items():
            s.load_state_dict(state.get(name) or {})
        if state.get("world") == tr.env.world:  # RNG streams are per rank: only for the same world size
            set_rng_state(state["ranks"][tr.env.rank]["rng"])
        self.last_step = tr.step
        log.info("resumed", extra={"path": str(path), "step": tr.step, "world": tr.env.world,
                                   "saved_world": state.get("world")})
