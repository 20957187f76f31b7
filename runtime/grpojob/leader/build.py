"""One trainer rank, assembled: learner, rollout side, checkpoints and loop, in the order their
dependencies need (a resume restores the learner and the rollout side's data position before the
first step). `grpojob trainer` and the trainer's tests use the same assembly."""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from grpojob.checkpoint import objects
from grpojob.checkpoint.manager import CheckpointManager, find_latest
from grpojob.api import GRPOJob
from grpojob.auth import Auth
from grpojob.plan import ENV_CHECKPOINT_DIR, ENV_RUN_DIR
from grpojob.learner import dist
from grpojob.leader.trajectories.api import TrajectoryAPI
from grpojob.leader.trajectories.atropos import AtroposAPI, http_lookup
from grpojob.leader.trajectories.sessions import Sessions
from grpojob.leader.trajectories.wire import Limits
from grpojob.rewards import RewardScorer
from grpojob.api.colocation import COLOCATED
from grpojob.leader.callbacks import Callbacks
from grpojob.leader.loop import Loop
from grpojob.learner.plugin import trainer_class
from grpojob.leader.record import StepRecord
from grpojob.leader.remote import RemotePublisher
from grpojob.leader.rollouts import Rollouts
from grpojob.leader.wiring import connect
from grpojob.leader.server import StatusBoard
from grpojob.leader.turns import Separate, TurnTaking
from grpojob.learner.trainer import GRPOTrainer


@dataclass
class TrainerRun:
    trainer: GRPOTrainer
    rollouts: Rollouts
    checkpoints: CheckpointManager
    loop: Loop
    resumed_from: Optional[Path] = None

    def run(self, hold: bool = False) -> str:
        """The loop to its end (completed or suspended); the rollout side and the trackers are
        closed either way. hold: once completed, stay up until asked to stop (Loop.hold), the rollout
        side open so that a rollout server that restarts meanwhile still gets the final weights."""
        def body() -> str:
            phase = self.loop.run()
            if phase == "completed" and hold:
                self.loop.hold()
            return phase

        return self.closing(body)

    def closing(self, body: Callable[[], str]) -> str:
        """body() (the loop, or spec.mode service's server), then close, whatever happened."""
        try:
            return body()
        finally:
            self.close()

    def close(self) -> None:
        """The save in flight is committed (or said dropped), then the rollout side and the
        trackers close: whoever drives the loop step by step (a benchmark) calls this too."""
        try:
            self.checkpoints.close()
        finally:
            self.rollouts.close()
            self.loop.callbacks.close()

    def request_suspend(self) -> None:
        self.loop.request_suspend()

    def trajectory_api(self, auth: Optional[Auth] = None):
        """Rank 0: the trajectory API over this run's RolloutManager (None on other ranks); with the
        job's token (`auth`), also Atropos's run-api routes, which look versions up on the rollout servers."""
        manager = self.rollouts.source.manager
        if manager is None:
            return None
        spec, model, tokenizer = self.trainer.spec, self.trainer.model, self.trainer.tokenizer
        limits = Limits(group_size=spec.algorithm.group_size, vocab_size=model.get_input_embeddings().num_embeddings,
                        max_sequence_tokens=spec.training.micro_batch_tokens)
        # agent sessions (X-Session-Id on the rollout servers); the job's rewards score those ended without one
        sessions = Sessions(manager, limits, scorer=RewardScorer(spec, tokenizer) if spec.rewards else None,
                            tokenizer=tokenizer)
        api = TrajectoryAPI(manager, limits, spec.rollout.sampling.model_dump(),
                            policy_version=lambda: self.trainer.version, sessions=sessions)
        publisher = self.rollouts.publisher
        # Atropos: versions from the rollout servers' record (an in-process engine has no servers to ask)
        if isinstance(publisher, RemotePublisher) and auth is not None:
            api.atropos = AtroposAPI(api, http_lookup(publisher.rollout_addresses, auth.token),
                                     batch_size=spec.training.prompts_per_step * spec.algorithm.group_size,
                                     total_steps=spec.training.steps)
        return api


def build(job: GRPOJob, *, env: Optional[dist.DistEnv] = None, rollouts: str = "inprocess",
          listen_host: str = "127.0.0.1", checkpoint_dir: Optional[str] = None, run_dir: Optional[str] = None,
          board: Optional[StatusBoard] = None, on_step: Optional[Callable[[StepRecord], None]] = None,
          suspend: Optional[threading.Event] = None, auth: Optional[Auth] = None) -> TrainerRun:
    """`auth`: the job's token, which rollouts "remote" need (weight-sync membership, /generate)."""
    env = env or dist.lone()
    spec = job.spec
    trainer = trainer_class(spec.trainer.class_)(job, env)  # spec.trainer.class, default GRPOTrainer
    where = checkpoint_dir or os.environ.get(ENV_CHECKPOINT_DIR) or spec.checkpoint.path
    root = where if objects.is_store(where) else Path(where)  # a directory, or an object store's URL
    found = find_latest(root, env) if spec.checkpoint.resume else None
    side = connect(job, trainer.tokenizer, env, kind=rollouts, listen_host=listen_host, resumed=found is not None,
                   dynamic_sampling=trainer.algorithm.settings.dynamic_sampling, checkpoint_dir=str(root),
                   auth=auth, on_wait=(lambda text: board.update(message=text)) if board is not None else None)
    if board is not None and side.publisher is not None:  # rollout server count and lag, read at each scrape
        board.watch_rollouts(side.publisher.servers)
    try:
        checkpoints = CheckpointManager(root, trainer, spec.checkpoint.keep_last,
                                        states={"scheduler": trainer.scheduler, "data": side.source})
        if found is not None:
            checkpoints.load(found)
        run_dir = run_dir or os.environ.get(ENV_RUN_DIR)
        run_path = Path(run_dir) if run_dir else None
        callbacks = Callbacks.build(job, run_path) if env.is_leader else None
        loop = Loop(trainer, side.source, side.publisher, checkpoints, run_dir=run_path,
                    board=board, on_step=on_step, suspend=suspend, callbacks=callbacks, evaluation=side.evaluation,
                    placement=TurnTaking(side.turns, env) if spec.placement == COLOCATED else Separate())
    except BaseException:
        side.close()
        raise
    return TrainerRun(trainer, side, checkpoints, loop, found)
