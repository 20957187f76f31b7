"""The cross-field rules of a GRPOJob spec: what each field allows alone is in the models; what
fields allow together is here. `problems` returns every broken rule at once, each as (field path
relative to spec, message), so `grpojob validate` and the operator list them all in one run
(GRPOJobSpec's model validator raises them together)."""
from __future__ import annotations

from typing import Any, Optional, Protocol

from grpojob.api.ports import RENDEZVOUS_PORT, SYNC_STORE_PORT
from grpojob.api import autoscale, colocation, judge, plugins

Problems = list[tuple[str, str]]


class SpecParts(colocation.Parts, Protocol):
    """What the cross-field rules read of a GRPOJobSpec (whose validator calls them: naming that
    class here would make spec.py and this module import each other)."""
    algorithm: Any
    checkpoint: Any
    code: Any
    mode: str
    dataset: Any
    evaluation: Optional[Any]
    judges: list
    rewards: list
    training: Any

    @property
    def max_prompt_length(self) -> int: ...

    @property
    def context_length(self) -> int: ...

    @property
    def evaluation_sampling(self) -> Optional[Any]: ...


def problems(spec: SpecParts) -> Problems:
    out = sources(spec) + evaluation(spec) + colocation.problems(spec) + ports(spec) + autoscale.problems(spec)
    out += judge.problems(spec.judges, spec.rewards)
    t = spec.training
    longest = spec.max_prompt_length + spec.rollout.sampling.max_tokens
    if t.micro_batch_tokens < longest:
        out.append(("training.microBatchTokens", f"({t.micro_batch_tokens}) must hold one whole sequence: "
                    f"dataset.maxPromptLength + rollout.sampling.maxTokens = {longest}"))
    a = spec.algorithm
    if a.partial_rollouts and a.max_staleness == 0:
        # The floor follows the published version, so at maxStaleness 0 no generation runs
        # while weights are pushed, whatever weightSync.everySteps is: nothing to resume.
        out.append(("algorithm.partialRollouts", "needs algorithm.maxStaleness >= 1: at 0 no generation is in "
                    "flight when weights are pushed, so there is nothing to resume"))
    if spec.checkpoint.in_store and spec.weight_sync.backend == "checkpoint":
        out.append(("weightSync.backend", f"checkpoint: rollout servers read the weights from a checkpoint "
                    f"directory, and checkpoint.path {spec.checkpoint.path} is an object store; use auto"))
    if spec.checkpoint.in_store and spec.mode == "service":
        out.append(("checkpoint.path", "mode service keeps its checkpoints in a directory (a mounted volume); "
                    "an object store is for mode train"))
    if spec.weight_sync.backend == "nccl" and spec.rollout.backend == "hf":
        out.append(("weightSync.backend", "nccl needs rollout.backend vllm on GPUs; use auto or gloo"))
    code_volume = (spec.code.volume or {}).get("name")
    for role in ("trainer", "rollout"):
        if code_volume and code_volume in [v.get("name") for v in getattr(spec, role).volumes]:
            out.append(("code.volume.name", f"'{code_volume}' is also a volume of spec.{role}.volumes"))
    return out


def ports(spec: SpecParts) -> Problems:
    """Trainer pod 0 also listens on the rendezvous and weight-sync store ports (one network
    namespace: two servers cannot bind one port)."""
    taken = {RENDEZVOUS_PORT: "the rendezvous port (torchrun) of trainer pod 0",
             SYNC_STORE_PORT: "the weight-sync store port of trainer pod 0"}
    if spec.trainer.port in taken:
        return [("trainer.port", f"{spec.trainer.port} is also {taken[spec.trainer.port]}: pick another port")]
    return []


def evaluation(spec: SpecParts) -> Problems:
    ev = spec.evaluation
    if ev is None:
        return []
    out = []
    if spec.mode == "service":
        out.append(("evaluation", "mode service runs no training loop to evaluate in: the client's own loop "
                    "evaluates (sample through the service), or use mode train"))
    if not spec.rewards:
        out.append(("rewards", "evaluation scores its completions with spec.rewards: at least 1 reward is required"))
    sync = spec.weight_sync.every_steps
    if ev.every_steps % sync:
        out.append(("evaluation.everySteps", f"{ev.every_steps} is not a multiple of weightSync.everySteps "
                    f"({sync}): an evaluation runs on the weights pushed after its step"))
    sampling = spec.evaluation_sampling
    longest = ev.dataset.max_prompt_length + sampling.max_tokens
    if longest > spec.context_length:
        out.append(("evaluation.dataset.maxPromptLength", f"{ev.dataset.max_prompt_length} + the evaluation's "
                    f"maxTokens {sampling.max_tokens} = {longest} tokens exceed the rollout servers' context "
                    f"({spec.context_length}: rollout.maxModelLen, default dataset.maxPromptLength + "
                    "rollout.sampling.maxTokens)"))
    return out


def sources(spec: SpecParts) -> Problems:
    """Where the groups come from: the trainer's own workflow needs a dataset and rewards; with
    rollout.workflow none the environments bring both; in mode service the user's process does
    (and environments have no loop to feed)."""
    out = []
    if spec.mode == "service":
        if spec.environments:
            out.append(("environments", "mode service runs no training loop for environments to feed: leave "
                        "environments out, or use mode train"))
    elif spec.rollout.workflow != plugins.NO_WORKFLOW:
        if spec.dataset is None:
            out.append(("dataset", "required unless rollout.workflow is none (groups only from environments)"))
        if not spec.rewards:
            out.append(("rewards", "at least 1 reward is required unless rollout.workflow is none "
                        "(environments score their own groups)"))
    names = [e.name for e in spec.environments]
    for i, name in enumerate(names):
        if name in names[:i]:
            out.append((f"environments[{i}].name", f"'{name}' is used twice"))
    return out
