"""spec.judges: reward models served as children of the job, and how spec.rewards uses them.

A judge is a server (its model, engine, replicas, pods); a reward that names it (`spec.rewards[i].judge`)
is one term of the summed reward, with its weight, like a reward function. Servers and their use are
apart because one served model may score several rewards, and because spec.rewards stays the one
list of what is summed (docs/services.md).
"""
from __future__ import annotations

import string
from typing import Literal, Optional, Union

from pydantic import field_validator

from grpojob.api.base import Model, field
from grpojob.api import quantity
from grpojob.api.workload import WorkloadSpec

JUDGE_PORT = 8100  # a judge server's HTTP port (cluster default; `grpojob run` picks free ones)
MAX_JUDGES = 8
# What a judge's template may name: the rendered prompt and the completion's text.
TEMPLATE_FIELDS = ("prompt", "completion")
ON_FAILURE = ("skip", "zero", "fail")


class JudgeScore(Model):
    """How a sequence classifier's output becomes a reward."""

    label: Union[int, str] = field(0, description="The output read: its index or its id2label name.")
    transform: Literal["logit", "sigmoid", "softmax"] = field(
        "sigmoid", description="logit (raw), sigmoid (its probability), or softmax (among all outputs).")


class JudgeSpec(Model):
    """A reward model the job serves; frozen (weight sync never pushes to it)."""

    name: str = field(description="Judge name (spec.rewards[].judge); children <job>-judge-<name>.", pattern=r"^[a-z]([-a-z0-9]*[a-z0-9])?$", max_length=16)
    kind: Literal["classifier"] = field("classifier", description="classifier: a sequence-classification "
                                        "model; the reward is one of its outputs.")
    model: str = field(description="Hugging Face model directory (in the image, or on volumeClaim at /models).",
                       min_length=1)
    volume_claim: Optional[str] = field(None, description="PersistentVolumeClaim holding the model.")
    engine: Literal["hf", "vllm"] = field(
        "hf", description="hf: transformers (CPU or a GPU); vllm: vLLM's pooling runner (GPU).")
    score: JudgeScore = field(default_factory=JudgeScore, description="Which output is the reward.")
    template: str = field("{prompt}{completion}", description="The text scored: a format string of {prompt} "
                          "and {completion}.", min_length=1)
    image: Optional[str] = field(None, description="Container image; defaults to the operator's runtime image.")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = field(
        "IfNotPresent", description="Kubernetes image pull policy.")
    cpu: Optional[str] = field(None, description="CPU per pod (request = limit).")
    memory: Optional[str] = field(None, description="Memory per pod (request = limit).")
    gpus: int = field(0, ge=0, le=8, description="GPUs per pod (nvidia.com/gpu).")
    max_length: int = field(512, ge=8, description="Tokens per scored text (longer ones keep their end).")
    replicas: int = field(1, ge=1, le=64, description="Judge servers (pods); requests spread over them.")
    port: int = field(JUDGE_PORT, ge=1024, le=65535, description="HTTP port of each judge server.")
    max_batch_size: int = field(64, ge=1, description="Texts a forward pass scores at most.")
    timeout_seconds: float = field(30.0, gt=0, description="Deadline of a scoring request.")
    retries: int = field(3, ge=0, le=20, description="Retries of a request that timed out or found the judge "
                         "unavailable, backing off from 0.5 s.")
    startup_timeout_seconds: float = field(600.0, gt=0, description="The trainer's wait for the judge "
                                           "to be ready.")
    on_failure: Literal[ON_FAILURE] = field(
        "skip", description="A group still unscored after the retries: skip drops it and generates its prompt "
        "again later; zero scores it 0; fail fails the step. A 4xx refusal always fails (docs/services.md).")

    @field_validator("template")
    @classmethod
    def _template(cls, v: str) -> str:
        try:
            names = {f for _, f, _, _ in string.Formatter().parse(v) if f is not None}
        except ValueError as e:
            raise ValueError(f"not a format string: {e}") from None
        unknown = sorted(names - set(TEMPLATE_FIELDS))
        if unknown:
            raise ValueError(f"names {unknown}: a template may name only {{prompt}} and {{completion}}")
        if "completion" not in names:
            raise ValueError("must name {completion}: the judge scores the completion")
        return v

    @field_validator("cpu", "memory")
    @classmethod
    def _quantity(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and quantity.parse(v) is None:
            raise ValueError(f"'{v}' is not a Kubernetes quantity (e.g. 500m, 2, 4Gi)")
        return v

    def workload(self) -> WorkloadSpec:
        """The pod settings as the other roles' (for the operator's pod rendering): cpu, memory and
        gpus as a ResourceRequirements with requests equal to limits."""
        amounts = {k: v for k, v in (("cpu", self.cpu), ("memory", self.memory),
                                     ("nvidia.com/gpu", str(self.gpus) if self.gpus else None)) if v}
        return WorkloadSpec(image=self.image, image_pull_policy=self.image_pull_policy,
                            resources={"requests": amounts, "limits": amounts} if amounts else {})


def problems(judges: list[JudgeSpec], rewards: list) -> list[tuple[str, str]]:
    """Cross-field rules: unique judge names, every reward naming exactly one of name and judge,
    every judge named by a reward and declared."""
    out = []
    names = [j.name for j in judges]
    for i, name in enumerate(names):
        if name in names[:i]:
            out.append((f"judges[{i}].name", f"'{name}' is used twice"))
    used = {r.judge for r in rewards if r.judge is not None}
    for i, r in enumerate(rewards):
        if r.judge is None and r.name is None:
            out.append((f"rewards[{i}].name", "required: a reward function, unless judge names a spec.judges entry"))
        elif r.judge is not None and r.name is not None:
            out.append((f"rewards[{i}].judge", "a reward is a function (name) or a judge (judge), not both"))
        elif r.judge is not None and r.judge not in names:
            out.append((f"rewards[{i}].judge", f"no judge '{r.judge}' in spec.judges"
                        + (f" (declared: {', '.join(names)})" if names else "")))
    for i, name in enumerate(names):
        if name not in used and name not in names[:i]:
            out.append((f"judges[{i}].name", f"'{name}' is named by no spec.rewards[].judge: it would serve nothing"))
    return out
