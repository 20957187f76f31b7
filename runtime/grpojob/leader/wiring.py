"""The rollout side of a trainer rank, wired from the spec (`connect`): rank 0's RolloutManager over
the rollout servers (kind remote) or an in-process engine (kind inprocess), its publisher, turns
with a colocated engine, and evaluation; other ranks only take their shares of each step."""
from __future__ import annotations

from typing import Callable, Optional

from grpojob.api import GRPOJob
from grpojob.api.colocation import COLOCATED
from grpojob.auth import Auth
from grpojob.data import PromptSettings
from grpojob.data.streaming import prompt_stream
from grpojob.leader import workflows
from grpojob.leader.evaluation.evaluator import Evaluation
from grpojob.leader.manager import Pipeline, RolloutManager
from grpojob.leader.remote import RemotePublisher, sync_address
from grpojob.leader.rollout_client import RolloutClient
from grpojob.leader.rollouts import KINDS, EngineGenerator, EnginePublisher, GroupSource, Rollouts
from grpojob.leader.trajectories.queue import EnvironmentQueue
from grpojob.leader.turns import EngineTurns
from grpojob.learner import dist
from grpojob.rewards import RewardScorer
from grpojob.rollout.hf_engine import HFEngine


def connect(job: GRPOJob, tokenizer, env: dist.DistEnv, *, kind: str = "remote", listen_host: str = "127.0.0.1",
            resumed: bool = False, dynamic_sampling: bool = False, checkpoint_dir: str = "",
            auth: Optional[Auth] = None, on_wait: Optional[Callable[[str], None]] = None) -> Rollouts:
    """The rollout side of this rank. Rank 0 builds the manager (and hosts the weight-sync store for
    kind remote); other ranks only take their shares. dynamic_sampling: as the algorithm resolved
    it (DAPO turns it on whatever the spec says). auth: the job's token (kind remote: the rollout
    servers register and generate with it). on_wait: told what a step waits for, and which rollout
    servers fail and why (the leader's /status message; pipeline.WaitReport)."""
    if kind not in KINDS:
        raise ValueError(f"rollout source '{kind}': use one of {', '.join(KINDS)}")
    if not env.is_leader:
        return Rollouts(GroupSource(env, None), None)
    spec = job.spec
    pipeline = Pipeline.from_spec(spec, dynamic_sampling=dynamic_sampling)
    # None: rollout.workflow none (environments only), or mode service (the user's process samples)
    workflow = workflows.build(spec, tokenizer) if spec.mode == "train" else None
    pieces = dict(workflow=workflow, pipeline=pipeline,
                  scorer=RewardScorer(spec, tokenizer) if workflow is not None else None,
                  prompts=prompt_stream(PromptSettings.of(spec), tokenizer) if workflow is not None else None,
                  environments=EnvironmentQueue(pipeline.prompts_per_step, pipeline.queue_limit,
                                                [e.name for e in spec.environments]),
                  on_wait=on_wait)
    if kind == "inprocess":
        engine = HFEngine(spec, device=str(env.device))
        generator = EngineGenerator(engine)
        manager = RolloutManager(generator, **pieces)
        manager.run(engine.start())
        return _with_evaluation(Rollouts(GroupSource(env, manager), EnginePublisher(engine), engine_close=engine.close,
                                         generator=generator), spec, tokenizer)
    if auth is None:
        raise ValueError("rollouts 'remote' need the job's token (grpojob.auth.Auth)")
    # A resumed policy differs from the weights on disk: no version is current until the
    # loop's first push (it pushes once after a resume, before its first step).
    publisher = RemotePublisher(spec.weight_sync, listen_host, sync_address()[1], colocated=spec.placement == COLOCATED,
                                resumed=resumed, device=env.device,
                                checkpoint_dir=checkpoint_dir, token=auth.token)
    client = RolloutClient(publisher.rollout_addresses, token=auth.token, draining=publisher.draining_addresses,
                           timeout=float(spec.weight_sync.timeout_seconds) * 3)
    manager = RolloutManager(client, health=client.health, **pieces)
    turns = None
    if spec.placement == COLOCATED:
        turns = EngineTurns(publisher.server_urls, auth.token, device=env.device,
                            timeout=float(spec.weight_sync.timeout_seconds))
    return _with_evaluation(Rollouts(GroupSource(env, manager), publisher, engine_close=client.close, generator=client,
                                     turns=turns), spec, tokenizer)


def _with_evaluation(side: Rollouts, spec, tokenizer) -> Rollouts:
    """Rank 0's evaluation (spec.evaluation) over the manager: its held-out set is loaded now, so a
    bad one fails before the first step."""
    if spec.evaluation is not None:
        try:
            side.evaluation = Evaluation.build(spec, tokenizer, side.source.manager)
        except BaseException:
            side.close()
            raise
    return side
