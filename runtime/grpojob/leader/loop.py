"""The training loop: a short loop over explicit components.

    groups  = source.next_step()                 # GroupSource: rank 0's manager, shared out
    placement.turn("sleep")                      # placement colocated: the engine gives the device back
    update  = trainer.step_training(groups)      # GRPOTrainer: advantages, packed updates
    placement.turn("wake")                       # ... and takes it again, before the push
    report  = publisher.publish(stream, v)       # every weightSync.everySteps steps: rank 0 pushes the
                                                 # weights as every rank gathers them, tensor by tensor
    evaluation.start(step, v) ... .finish()      # spec.evaluation: after a push, done before the next
    checkpoints.save()                           # every checkpoint.everySteps steps: each rank stages
                                                 # its shards, written in the background
    record  -> metrics.jsonl, /status, Prometheus, trackers and callbacks (the StepRecord is their
               one source)

Generation runs ahead in the background (up to algorithm.maxStaleness versions), so the loop's
wait for groups is what remains of generation on the critical path. Suspension (HTTP /suspend,
SIGTERM) is agreed by every rank at a step boundary: checkpoint, then stop.

The last step publishes too, so the rollouts end on the final policy. A finished run says so
(/status "completed", and rank 0's termination message) and, in a pod, `hold`s until it is asked
to stop: a StatefulSet restarts a container that exits, even with code 0.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Callable, Optional

import torch

from grpojob import devices, failures
from grpojob.checkpoint.manager import CheckpointManager
from grpojob.leader.evaluation import EvalRecord
from grpojob.rollout.engine import torch_dtype_name
from grpojob.learner import dist
from grpojob.leader.callbacks import Callbacks
from grpojob.memory import StageMemory
from grpojob.leader.record import StepRecord
from grpojob.leader.rollouts import GroupSource, PushReport, WeightPublisher
from grpojob.leader.server import StatusBoard
from grpojob.learner.trainer import GRPOTrainer
from grpojob.leader.turns import Placement, Separate

log = logging.getLogger("grpojob.trainer")

METRICS_FILE = "metrics.jsonl"
FINAL_MODEL_DIR = "final-model"


class Loop:
    def __init__(self, trainer: GRPOTrainer, source: GroupSource, publisher: Optional[WeightPublisher],
                 checkpoints: CheckpointManager, *, run_dir: Optional[Path] = None,
                 board: Optional[StatusBoard] = None, on_step: Optional[Callable[[StepRecord], None]] = None,
                 suspend: Optional[threading.Event] = None, callbacks: Optional[Callbacks] = None,
                 evaluation=None, placement: Optional[Placement] = None):
        """`placement`: separate (the default) or turn-taking with a colocated engine (leader.turns)."""
        self.trainer, self.source, self.publisher, self.checkpoints = trainer, source, publisher, checkpoints
        self.callbacks = callbacks or Callbacks([])  # rank 0's trackers and user callbacks
        self.spec, self.env = trainer.spec, trainer.env
        self.run_dir, self.board, self.on_step = run_dir, board, on_step
        self.suspend = suspend or threading.Event()
        self.published: Optional[int] = None
        self.backend: Optional[str] = None
        self.memory = StageMemory(trainer.env.device)
        # rank 0's grpojob.leader.evaluation.evaluator.Evaluation (spec.evaluation; None elsewhere), and a
        # finished evaluation waiting to be reported before the next step's record
        self.evaluation, self._evaluated = evaluation, None
        self.where = placement or Separate()
        self.placement = self.where.description

    def request_suspend(self) -> None:
        """Finish the current step, checkpoint, stop."""
        self.suspend.set()

    def _status(self, **fields) -> None:
        if self.board is not None:
            self.board.update(**fields)

    # ---- the run -------------------------------------------------------------------------------------
    def run(self) -> str:
        """Train to training.steps, or until suspended. Returns the final phase."""
        tr, total = self.trainer, self.spec.training.steps
        self._status(phase="starting", step=tr.step, policy_version=tr.version, placement=self.placement,
                     last_checkpoint_step=self.checkpoints.last_step)
        if tr.version > 0:  # resumed: the rollouts must serve the resumed policy first
            self.publish()
        if tr.step < total:  # else resumed from the final checkpoint: nothing to generate or train
            self.source.start()
            self._status(phase="running")
            if tr.step == 0:
                self._start_evaluation()  # evaluation.atStart: the initial policy
        while tr.step < total:
            if self._suspend_agreed():
                return self._stop()
            record = self.train_step()
            if record is None:  # suspended while waiting for the step's groups
                return self._stop()
            self.emit(record)
        # the last step's push started the final evaluation (spec.evaluation): it ends here
        self._finish_evaluation()
        self._emit_evaluation()
        if not self.checkpoints.covers(tr.step):
            self.checkpoint()
        self.wait_checkpoint()
        self.save_final_model()
        failed = self.checkpoints.take_errors()  # the final save's, if it failed (the final model is written)
        self._status(phase="completed", step=tr.step, last_checkpoint_step=self.checkpoints.last_step,
                     message="training completed" + "".join(f"; {f}" for f in failed[-1:]), **self._sync_status())
        if self.env.is_leader:
            failures.report_completed(tr.step, total)
        return "completed"

    def hold(self, poll_seconds: float = 1.0) -> None:
        """After completion: stay up (rank 0 serving /status "completed") until any rank is asked
        to stop (SIGTERM, POST /suspend); every rank leaves together, with nothing left to save."""
        while True:
            self.suspend.wait(poll_seconds)
            if self._suspend_agreed():
                return

    def train_step(self) -> Optional[StepRecord]:
        """One step; None when a suspend came while its groups were not all there (generation
        stalled: a suspend must not wait for it)."""
        spec, tr = self.spec, self.trainer
        t0 = time.perf_counter()
        self.memory.mark(None)
        devices.release_cpu_threads()  # this thread waits: its OpenMP team would throttle an in-process engine's
        got = self.source.next_step(self.suspend)
        if got is None:
            return None
        t1 = time.perf_counter()
        self.memory.mark("generate")
        turns = {"sleep": self.where.turn("sleep")}  # colocated: nothing generates while the step trains
        prep, stats = tr.step_training(got.groups)
        extra = stats.pop("extra", {})
        t2 = time.perf_counter()
        self.memory.mark("train")
        turns["wake"] = self.where.turn("wake")
        self._finish_evaluation()  # started after the previous push: it ends before the next one
        te = time.perf_counter()
        report = None
        # The last step too (the rollouts end serving the final policy); not when suspending: the
        # rollout servers may be stopping too (a resume pushes first).
        if (tr.step % spec.weight_sync.every_steps == 0 or tr.step >= spec.training.steps) \
                and not self._suspend_agreed():
            report = self.publish()
            self._start_evaluation()
        t3 = time.perf_counter()
        self.memory.mark("sync")
        turns["sync"] = self.where.turn("sync")
        if tr.step % spec.checkpoint.every_steps == 0 or tr.step >= spec.training.steps:
            self._status(phase="checkpointing")
            self.checkpoint()
        t4 = time.perf_counter()
        self.memory.mark("checkpoint")
        host_peaks, device_peaks = self.memory.take()
        train_flops = tr.train_flops(prep) / (t2 - t1) if t2 > t1 else None
        seconds = t4 - t0
        rollouts = self._rollouts()
        parts = {**got.environment_rewards, **prep.reward_parts}  # the spec's rewards, then environments' own
        return StepRecord(
            step=tr.step, policy_version=tr.version, **prep.stats, **stats,
            rewards={k: v[0] for k, v in parts.items()}, rewards_std={k: v[1] for k, v in parts.items()},
            tokens=prep.total_tokens, trained_tokens=prep.n_tokens,
            tokens_per_second=prep.total_tokens / seconds if seconds > 0 else None,
            train_tokens_per_second=prep.total_tokens / (t2 - t1) if t2 > t1 else None,
            train_flops_per_second=train_flops,
            mfu=train_flops / tr.peak_flops if train_flops is not None and tr.peak_flops else None,
            wait_seconds=t1 - t0, rollout_idle_fraction=got.idle_fraction, groups_in_flight=got.in_flight,
            groups_resampled=got.resampled, groups_stale=got.stale, sync_seconds=t3 - te,
            generation_paused_seconds=report.paused_seconds if report else None,
            sync_bytes=report.bytes if report else None, sync_tensors=report.tensors if report else None,
            weight_sync_backend=self.backend, rollouts=rollouts, published=report is not None,
            sample_ids=list(got.sample_ids), groups_from_environments=got.from_environments,
            environments=got.environments, extra={**prep.extra, **extra, **_failed_saves(self.checkpoints.take_errors())},
            stage_seconds={"generate": round(t1 - t0, 6), "score": round(got.score_seconds, 6),
                           "train": round(t2 - t1, 6), "sync": round(t3 - te, 6), "checkpoint": round(t4 - t3, 6),
                           # the wait for the evaluation (spec.evaluation) before this step's push
                           **({"evaluate": round(te - t2, 6)} if spec.evaluation is not None else {})},
            stage_host_peak_bytes=host_peaks, stage_device_peak_bytes=device_peaks, step_seconds=seconds,
            placement=self.placement, **_turn_fields(turns))

    def _rollouts(self) -> list[dict]:
        """Every rollout server's version and lag behind the trainer (rank 0; [] elsewhere)."""
        if self.publisher is None:
            return []
        return [{"replica": s["replica"], "version": s["version"], "lag": self.trainer.version - s["version"]}
                for s in self.publisher.servers()]

    def _sync_status(self) -> dict:
        """/status's rollout fields as they are now (after the final push, or a resume's)."""
        if not self.env.is_leader:
            return {}
        rollouts = self._rollouts()
        return {"rollouts": rollouts, "weights_in_sync": _in_sync(rollouts), "policy_version": self.trainer.version}

    def checkpoint(self) -> None:
        """Start a checkpoint (collective; written in the background, after the previous one)."""
        self.checkpoints.save()
        self._announce_checkpoints()

    def wait_checkpoint(self) -> None:
        """Until the last checkpoint is committed (collective)."""
        self.checkpoints.wait()
        self._announce_checkpoints()

    def _announce_checkpoints(self) -> None:
        """Tell the callbacks (rank 0, this thread) of the checkpoints committed since."""
        for step, path in self.checkpoints.committed():
            if self.env.is_leader:
                self.callbacks.on_checkpoint(step, path)

    def publish(self) -> Optional[PushReport]:
        """The weights to the rollouts as the trainer's current version, then the version floor
        moves. Collective: every rank gathers each tensor as rank 0's push takes it."""
        tr = self.trainer
        # The rollouts' dtype (rollout.engine's rule; they run where the trainer does: GPU or CPU),
        # so fp32 master weights under bf16 autocast go out as the bf16 the engines serve.
        stream = tr.weight_stream(getattr(torch, torch_dtype_name(self.spec.model.dtype, tr.env.device.type == "cuda")))
        try:
            report = self.publisher.publish(stream, tr.version) if self.publisher is not None else None
        finally:
            stream.drain()  # ranks without a publisher walk it alongside; rank 0 after a failed push
        if report is not None:
            self.backend = report.backend
        self.published = tr.version
        self.source.set_published(tr.version)
        return report

    def _write(self, doc: dict) -> None:
        if self.run_dir is not None:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            with open(self.run_dir / METRICS_FILE, "a") as f:
                f.write(json.dumps(doc) + "\n")

    def emit(self, record: StepRecord) -> None:
        if not self.env.is_leader:
            return
        self._emit_evaluation()  # the one that ended in this step, reported before it
        doc = record.to_json()
        self._write(doc)
        self._announce_checkpoints()
        if self.board is not None:
            self.board.observe(doc)
            self._status(phase="running", last_checkpoint_step=self.checkpoints.last_step,
                         weights_in_sync=_in_sync(record.rollouts),
                         **record.status_fields())
        mfu = f" = {record.mfu:.1%} MFU" if record.mfu is not None else ""
        log.info("step %d/%d reward %.3f loss %.4f %.0f tok/s wait %.2fs, train stage %.0f tok/s%s", record.step,
                 self.spec.training.steps, record.reward_mean or 0.0, record.loss, record.tokens_per_second or 0.0,
                 record.wait_seconds, record.train_tokens_per_second or 0.0, mfu, extra={"record": doc})
        log.info("step %d peak memory (MiB): %s", record.step, memory_line(record),
                 extra={"memory": {"placement": record.placement, "trainer_host": record.stage_host_peak_bytes,
                                   "trainer_device": record.stage_device_peak_bytes,
                                   "engine_host": record.engine_host_peak_bytes}})
        self.callbacks.on_step_end(record)
        if self.on_step is not None:
            self.on_step(record)

    # ---- evaluation (spec.evaluation, rank 0) ----------------------------------------------------------
    def _start_evaluation(self) -> None:
        """Evaluate the policy the rollouts were just given, when its step is due."""
        tr = self.trainer
        if self.evaluation is not None and self.spec.evaluation.due(tr.step, self.spec.training.steps):
            self.evaluation.start(tr.step, tr.version)

    def _finish_evaluation(self) -> None:
        if self.evaluation is not None:
            self._evaluated = self.evaluation.finish() or self._evaluated

    def _emit_evaluation(self) -> None:
        """metrics.jsonl (a row of kind "evaluation"), /status and /metrics, the trackers."""
        rec: Optional[EvalRecord] = self._evaluated
        if rec is None:
            return
        self._evaluated = None
        doc = rec.to_json()
        self._write(doc)
        if self.board is not None:
            self.board.observe_evaluation(rec)
        log.info("evaluation of step %d: reward %.3f %s (%d prompts, %.1fs)", rec.step, rec.reward_mean or 0.0,
                 " ".join(f"pass@{k} {v:.3f}" for k, v in rec.pass_at.items()), rec.prompts, rec.seconds,
                 extra={"evaluation": doc})
        self.callbacks.on_evaluation(rec)

    # ---- stopping ------------------------------------------------------------------------------------
    def _suspend_agreed(self) -> bool:
        flag = torch.tensor([int(self.suspend.is_set())])
        return bool(dist.all_max(flag, self.env).item())

    def _stop(self) -> str:
        tr = self.trainer
        self._status(phase="checkpointing", message="suspending")
        if not self.checkpoints.covers(tr.step):
            self.checkpoint()
        self.wait_checkpoint()
        self._status(phase="suspended", last_checkpoint_step=self.checkpoints.last_step,
                     message=f"suspended after step {tr.step}")
        log.info("suspended", extra={"step": tr.step})
        return "suspended"

    def save_final_model(self) -> None:
        """HF model + tokenizer in the run directory's final-model/ (collective, streamed tensor by
        tensor; rank 0 writes)."""
        if self.run_dir is not None:  # the same on every rank
            self.trainer.export_model(self.run_dir / FINAL_MODEL_DIR)


def _failed_saves(errors: list[str]) -> dict:
    """The step record's word on checkpoints that failed since the last step (`grpojob run` shows it)."""
    return {"checkpoint_failed": errors[-1]} if errors else {}


PEAK_KEY = "host_peak_bytes"  # the engine's peak in the phase a turn ended (grpojob.rollout.turns)
TURN_PHASE = {"sleep": "generate", "wake": "train", "sync": "sync"}


def _turn_fields(turns: dict[str, dict]) -> dict:
    """The step record's turns and engine peaks from the three turns' replies ({} when separate)."""
    if not any(turns.values()):
        return {}
    peaks = {TURN_PHASE[k]: int(v[PEAK_KEY]) for k, v in turns.items() if v.get(PEAK_KEY) is not None}
    return {"turns": {k: {n: x for n, x in v.items() if n != PEAK_KEY} for k, v in turns.items()},
            "engine_host_peak_bytes": peaks}


def _mib(value: Optional[int]) -> str:
    return "-" if value is None else f"{value / 2**20:.0f}"


def memory_line(record: StepRecord) -> str:
    """Peak memory per phase in MiB: the trainer (rank 0: host, and device on CUDA) and a colocated
    engine's process (host)."""
    parts = []
    for phase in ("generate", "train", "sync"):
        text = f"{phase} trainer {_mib(record.stage_host_peak_bytes.get(phase))}"
        if record.stage_device_peak_bytes:
            text += f" (device {_mib(record.stage_device_peak_bytes.get(phase))})"
        if record.engine_host_peak_bytes:
            text += f" engine {_mib(record.engine_host_peak_bytes.get(phase))}"
        parts.append(text)
    return "; ".join(parts)


def _in_sync(rollouts: list[dict]) -> Optional[bool]:
    """Every rollout server holds the trainer's version (None: no server known)."""
    return all(r["lag"] == 0 for r in rollouts) if rollouts else None
