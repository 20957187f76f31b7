"""spec.judges: reward models served as children of the job, and how spec.rewards uses them.

Two kinds: a classifier (a sequence classifier; the reward is one output, `score.label/transform`)
and a generative judge (a chat model answering a rubric: `system` and `template` are its messages,
`score.pattern/min/max` the declared parser of its answer). Fields of the other kind are refused
with their path (problems).

A judge is a server (its model, engine, replicas, pods); a reward that names it (`spec.rewards[i].judge`)
is one term of the summed reward, with its weight, like a reward function. Servers and their use are
apart because one served model may score several rewards, and because spec.rewards stays the one
list of what is summed (docs/services.md).
"""
from __future__ import annotations

import re
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
# Fields (camelCase, as written) that only one kind reads: set on the other, they are refused.
CLASSIFIER_ONLY = {"score": ("label", "transform")}
GENERATIVE_ONLY = {"": ("system", "maxTokens", "temperature"), "score": ("pattern", "min", "max")}


class JudgeScore(Model):
    """How the model's output becomes a reward."""

    label: Union[int, str] = field(0, description="classifier: the output read (index or id2label name).")
    transform: Literal["logit", "sigmoid", "softmax"] = field(
        "sigmoid", description="classifier: logit, sigmoid or softmax.")
    # One group, one number: a parser simple enough to declare in a manifest, strict enough that an
    # answer it cannot read is a failure (onFailure), never a guessed reward.
    pattern: Optional[str] = field(None, description="generative: a regex; its one group is the number.")
    min: float = field(0.0, description="generative: the number scored 0.")
    max: float = field(1.0, description="generative: the number scored 1.")

    @field_validator("pattern")
    @classmethod
    def _pattern(cls, v: Optional[str]) -> Optional[str]:
        if v is None:
            return v
        try:
            groups = re.compile(v).groups
        except re.error as e:
            raise ValueError(f"not a regular expression: {e}") from None
        if groups != 1:
            raise ValueError(f"has {groups} groups: it needs exactly one, the number")
        return v


class JudgeSpec(Model):
    """A reward model the job serves; frozen (weight sync never pushes to it)."""

    name: str = field(description="Judge name; children <job>-judge-<name>.", pattern=r"^[a-z]([-a-z0-9]*[a-z0-9])?$", max_length=16)
    kind: Literal["classifier", "generative"] = field(
        "classifier", description="classifier: a sequence classifier; generative: a chat model and a rubric.")
    model: str = field(description="Hugging Face model directory (in the image, or on volumeClaim at /models).",
                       min_length=1)
    volume_claim: Optional[str] = field(None, description="PersistentVolumeClaim holding the model.")
    engine: Literal["hf", "vllm"] = field(
        "hf", description="hf: transformers (CPU or a GPU); vllm: vLLM (GPU).")
    score: JudgeScore = field(default_factory=JudgeScore, description="How the output becomes the reward.")
    template: str = field("{prompt}{completion}", description="The text scored (generative: the user message), "
                          "of {prompt} and {completion}.", min_length=1)
    system: Optional[str] = field(None, description="generative: the system message.")
    max_tokens: int = field(32, ge=1, le=4096, description="generative: answer tokens at most.")
    temperature: float = field(0.0, ge=0, description="generative: 0 is greedy.")
    image: Optional[str] = field(None, description="Container image (default: the operator's).")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = field(
        "IfNotPresent", description="Kubernetes image pull policy.")
    cpu: Optional[str] = field(None, description="CPU per pod (request = limit).")
    memory: Optional[str] = field(None, description="Memory per pod (request = limit).")
    gpus: int = field(0, ge=0, le=8, description="GPUs per pod (nvidia.com/gpu).")
    max_length: int = field(512, ge=8, description="Tokens per text or chat (the completion keeps its end).")
    replicas: int = field(1, ge=1, le=64, description="Judge servers (pods).")
    port: int = field(JUDGE_PORT, ge=1024, le=65535, description="HTTP port of each judge server.")
    max_batch_size: int = field(64, ge=1, description="Texts a forward pass scores at most.")
    timeout_seconds: float = field(30.0, gt=0, description="Deadline of a scoring request.")
    retries: int = field(3, ge=0, le=20, description="Retries of a request that timed out or found no judge.")
    startup_timeout_seconds: float = field(600.0, gt=0, description="The trainer's wait for a ready judge.")
    on_failure: Literal[ON_FAILURE] = field(
        "skip", description="A group left unscored: skip (generate it again), zero, or fail the step "
        "(docs/services.md).")

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
    every judge named by a reward and declared, fields of its kind only, a generative judge's parser."""
    out = [p for i, j in enumerate(judges) for p in kind_problems(j, f"judges[{i}]")]
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


def _set(j: JudgeSpec, where: str, changed: bool = False) -> set[str]:
    """The fields written in the manifest, as camelCase names (where: "" the judge, "score" its score);
    changed: only those written with another value than their default (the runtime config that the
    operator and `grpojob run` hand to the pods writes every field, defaults included)."""
    model = j.score if where else j
    return {model.model_fields[n].alias or n for n in model.model_fields_set
            if not changed or getattr(model, n) != model.model_fields[n].get_default(call_default_factory=True)}


def kind_problems(j: JudgeSpec, at: str) -> list[tuple[str, str]]:
    """Fields the judge's kind does not read, and what a generative judge needs."""
    other, kind = (CLASSIFIER_ONLY, "classifier") if j.kind == "generative" else (GENERATIVE_ONLY, "generative")
    out = [(f"{at}.{where + '.' if where else ''}{name}", f"applies to kind {kind} only (this judge is {j.kind})")
           for where, names in other.items() for name in names if name in _set(j, where, changed=True)]
    if j.kind == "generative":
        if j.score.pattern is None:
            out.append((f"{at}.score.pattern", "required for kind generative: the regex whose one group is the "
                        "number in the model's answer"))
        if j.score.min >= j.score.max:
            out.append((f"{at}.score.max", f"must be above score.min ({j.score.min:g})"))
        if "template" not in _set(j, ""):
            out.append((f"{at}.template", "required for kind generative: the rubric's user message, naming "
                        "{completion}"))
    return out
