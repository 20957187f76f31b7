"""The spec's data models: the training dataset, sampling parameters, and the held-out
evaluation (spec.evaluation) that reuses both."""
from __future__ import annotations

from typing import Literal, Optional

from pydantic import ValidationInfo, field_validator, model_validator

from grpojob.api import arguments, data_url, names, plugins
from grpojob.api.base import FreeForm, Model, deferring, field, invalid_all

MAX_PASS_AT = 16  # values of evaluation.passAt
MAX_SHUFFLE_BUFFER = 1_000_000  # rows held (and checkpointed) by a streamed dataset's shuffle buffer


class DatasetSpec(Model):
    path: Optional[str] = field(None, description="Where the rows are (docs/data.md): .jsonl, .json, .csv or "
                                ".parquet files (a glob too), local or at a URL (s3://, gs://, az://, abfs://, "
                                "https://, hf://datasets/<org>/<name>/<file>), a save_to_disk directory, or a Hub "
                                "dataset (hf://datasets/<org>/<name>[@revision]). One of path, factory, class.", max_length=4096)
    config: Optional[str] = field(None, description="A Hub dataset's configuration (subset), e.g. main for "
                                  "hf://datasets/openai/gsm8k; only with a Hub dataset by name.", max_length=256)
    split: Optional[str] = field(None, description="A Hub dataset's split (default train); only with a Hub dataset "
                                 "by name (files are one split).", max_length=256)
    streaming: bool = field(False, description="Read the rows lazily (datasets streaming): for a dataset larger "
                            "than memory. Its position and shuffle buffer are checkpointed. Only with path.")
    shuffle_buffer: int = field(1000, ge=1, le=MAX_SHUFFLE_BUFFER, description="With streaming and shuffle: rows "
                                "held in the seeded shuffle buffer (a draw picks one of them at random); larger "
                                "mixes more and makes each checkpoint larger.")
    credentials_secret: Optional[names.ObjectName] = field(
        None, description="On a cluster: a Secret in the job's namespace whose keys become the trainer pods' "
        "environment (e.g. AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, HF_TOKEN) for the path's store. grpojob run "
        "uses your own environment.")
    factory: Optional[str] = field(None, description="A built-in dataset (toy, countdown, reasoning-gym) or a reference "
                                   "('module:function' or 'path/to/file.py:function') called with args and "
                                   "returning an iterable of dict rows.",
                                   json_schema_extra={"pattern": plugins.name_pattern("dataset")})
    class_: Optional[str] = field(None, alias="class", description="A dataset class ('module:Class' or "
                                  "'path/to/file.py:Class'), constructed with args, with setup(config, tokenizer), "
                                  "__len__, __getitem__(i) (a prompt, chat or row) and "
                                  "[query_|get_]reference_answer(i).",
                                  json_schema_extra={"pattern": plugins.name_pattern("dataset_class")})
    args: FreeForm = field(default_factory=dict, description="Keyword arguments for the factory or class.")
    format: Literal["auto", "jsonl", "json", "csv", "parquet", "disk"] = field(
        "auto", description="File format of path; auto picks by extension (a directory means disk).")
    prompt_field: str = field("prompt", description="Row field holding the prompt text.")
    messages_field: Optional[str] = field(None, description="Row field holding chat messages "
                                          "(list of {role, content}); used instead of promptField.")
    prompt_template: Optional[str] = field(None, description="Text around each prompt, with {prompt} where the "
                                           "row's promptField goes, e.g. \"{prompt} Let's think step by step and "
                                           "output the final answer after '####'.\" (applied before the chat "
                                           "template; not to messagesField rows).", max_length=4096)
    answer_field: str = field("answer", description="Row field holding the reference answer given to rewards.")
    max_prompt_length: int = field(512, ge=1, description="Prompts longer than this many tokens are dropped.")
    shuffle: bool = field(True, description="Shuffle rows each epoch (seeded by training.seed).")

    @field_validator("factory")
    @classmethod
    def _factory(cls, v: Optional[str]) -> Optional[str]:
        return v if v is None else plugins.checked_name("dataset", v)

    @field_validator("class_")
    @classmethod
    def _class(cls, v: Optional[str]) -> Optional[str]:
        return v if v is None else plugins.checked_name("dataset_class", v)

    @model_validator(mode="after")
    def _one_source(self, info: ValidationInfo) -> "DatasetSpec":
        if deferring(info):
            return self
        problems = []
        if sum(x is not None for x in (self.path, self.factory, self.class_)) != 1:
            problems.append(("", "set exactly one of path, factory and class"))
        problems += self._location_problems()
        builtin = arguments.BUILTIN_DATASETS.get(self.factory or "")
        if builtin is not None:  # a plug-in's args are bound when it is imported (validate.check_plugins)
            problems += [(f"args{sub}", msg) for sub, msg in
                         arguments.problems(builtin, self.args, f"the built-in dataset {self.factory}")]
        if problems:
            raise invalid_all(problems)
        return self

    def _location_problems(self) -> list[tuple[str, str]]:
        """The path's URL, and the fields that only some locations take (static: no I/O)."""
        problems: list[tuple[str, str]] = []
        url = None
        if self.path is not None:
            try:
                url = data_url.parse(self.path)
            except ValueError as e:
                problems.append(("path", str(e)))
        by_name = url is not None and url.by_name
        for name, value in (("config", self.config), ("split", self.split)):
            if value is not None and not by_name:
                problems.append((name, "applies to a Hub dataset by name (path hf://datasets/<org>/<name>) only"))
        if by_name and self.format != "auto":
            problems.append(("format", "a Hub dataset by name has its own format: leave format auto"))
        if self.prompt_template is not None and "{prompt}" not in self.prompt_template:
            problems.append(("promptTemplate", "has no {prompt}: say where the row's prompt goes"))
        if self.streaming and self.path is None:
            problems.append(("streaming", "reads a path: a factory or class gives its rows itself"))
        return problems


class SamplingSpec(Model):
    temperature: float = field(1.0, ge=0, description="Sampling temperature.")
    top_p: float = field(1.0, gt=0, le=1, description="Nucleus sampling.")
    top_k: int = field(-1, ge=-1, description="Top-k sampling; -1 disables.")
    max_tokens: int = field(256, ge=1, description="Maximum completion length in tokens.")


class EvaluationSpec(Model):
    """Evaluation during training (docs/evaluation.md): a held-out dataset, generated on the rollout
    servers through the trainer's own pipeline (never trained on) and scored with spec.rewards."""

    dataset: DatasetSpec = field(description="The held-out prompts, in the same forms as spec.dataset (path, "
                                 "factory or class). Its rows are evaluated in their own order (shuffle is "
                                 "ignored); its prompts are never trained on.")
    every_steps: int = field(10, ge=0, description="Evaluate the policy of every N-th step, a multiple of "
                             "weightSync.everySteps (the rollouts must hold that step's weights); 0: only at "
                             "the end. The last step's policy is always evaluated.")
    at_start: bool = field(False, description="Also evaluate the initial policy (step 0) before the first step "
                           "(not when resuming).")
    samples_per_prompt: int = field(1, ge=1, le=256, description="Completions per prompt. 1: one greedy "
                                    "completion (temperature 0); k > 1: k completions with `sampling`, and "
                                    "pass@k is reported.")
    sampling: Optional[SamplingSpec] = field(None, description="Sampling of the evaluation completions "
                                             "(default: rollout.sampling); with samplesPerPrompt 1 only its "
                                             "maxTokens applies (greedy).")
    pass_threshold: float = field(1.0, description="A completion passes when its reward (the weighted sum of "
                                  "spec.rewards) is at least this.")
    pass_at: list[int] = field(default_factory=list, max_length=MAX_PASS_AT, description="The k of the "
                               "pass@k reported (each at most samplesPerPrompt; unbiased estimator of Chen et al. "
                               "2021); default: 1 and samplesPerPrompt.")
    max_prompts: Optional[int] = field(None, ge=1, description="Evaluate only the first N prompts of the "
                                       "dataset (default: all).")

    @model_validator(mode="after")
    def _ks(self, info: ValidationInfo) -> "EvaluationSpec":
        if deferring(info):
            return self
        problems = [(f"passAt[{i}]", f"{k}: pass@k needs 1 <= k <= samplesPerPrompt ({self.samples_per_prompt})")
                    for i, k in enumerate(self.pass_at) if not 1 <= k <= self.samples_per_prompt]
        if problems:
            raise invalid_all(problems)
        return self

    @property
    def ks(self) -> list[int]:
        """The k of each pass@k reported, ascending."""
        return sorted(set(self.pass_at or (1, self.samples_per_prompt)))

    @property
    def greedy(self) -> bool:
        return self.samples_per_prompt == 1

    def due(self, step: int, total_steps: int) -> bool:
        """Whether the policy after `step` (0: the initial one) is evaluated."""
        if step == 0:
            return self.at_start
        return step == total_steps or (self.every_steps > 0 and step % self.every_steps == 0)
