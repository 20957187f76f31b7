"""A judge's model: a sequence classifier whose chosen output is the reward (spec.judges[i].score),
or a generative judge (grpojob.judge.generative).

One contract for every kind and engine (`Judge`): `render(prompt, completion)` gives what the model
reads of one item (a classifier's text; a generative judge's chat), `score(rendered)` their rewards,
blocking, batched by the caller; None is an answer the parser could not read (generative only).
A classifier's two engines:
- hf: transformers' AutoModelForSequenceClassification on CPU or one GPU, in eval mode under
  torch.inference_mode; its parameters never require grad and nothing ever writes them (frozen).
- vllm: vLLM's pooling runner (`LLM(runner="pooling")`, `LLM.classify`: what its /classify endpoint
  serves). vLLM applies the model's activation itself (sigmoid for one output, softmax for several),
  so transform logit is refused with it.
"""
from __future__ import annotations

import logging
import math
from typing import Any, Optional, Protocol, Union

from grpojob.api.judge import JudgeSpec
from grpojob.judge.generative import HFGenerative, VLLMGenerative

log = logging.getLogger("grpojob.judge")


class Judge(Protocol):
    def render(self, prompt: str, completion: str) -> Any: ...

    def score(self, rendered: list[Any]) -> list[Optional[float]]: ...


class _Template:
    """A classifier reads the judge's template filled in."""
    spec: JudgeSpec

    def render(self, prompt: str, completion: str) -> str:
        return self.spec.template.format(prompt=prompt, completion=completion)


def label_index(label: Union[int, str], id2label: dict[Any, str], num_labels: int, where: str) -> int:
    """The output index of `label` (its index or its id2label name); ValueError names the labels."""
    if isinstance(label, int):
        if not 0 <= label < num_labels:
            raise ValueError(f"{where}: label {label} is out of range: the model has {num_labels} outputs")
        return label
    names = {str(v): int(k) for k, v in (id2label or {}).items()}
    if label not in names:
        raise ValueError(f"{where}: label '{label}' is not one of the model's labels {sorted(names)}")
    return names[label]


def transform(logits: list[float], index: int, how: str) -> float:
    """The reward from one text's logits: the raw logit, its sigmoid or the label's softmax share."""
    x = logits[index]
    if how == "logit":
        return float(x)
    if how == "sigmoid":
        return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))
    top = max(logits)
    exps = [math.exp(v - top) for v in logits]
    return exps[index] / sum(exps)


class HFClassifier(_Template):
    """transformers on CPU (or the one GPU it is given): texts tokenized with the model's tokenizer,
    truncated from the left to max_length (the completion sits at the end), padded per batch."""

    def __init__(self, spec: JudgeSpec, device: Optional[str] = None):
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.spec, self.torch = spec, torch
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.tokenizer = AutoTokenizer.from_pretrained(spec.model)
        self.tokenizer.truncation_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForSequenceClassification.from_pretrained(spec.model).to(self.device).eval()
        self.model.requires_grad_(False)  # frozen: a judge's weights are never trained or pushed to
        if self.model.config.pad_token_id is None:
            self.model.config.pad_token_id = self.tokenizer.pad_token_id
        cfg = self.model.config
        self.index = label_index(spec.score.label, cfg.id2label, cfg.num_labels, f"judge {spec.name}: score.label")

    def score(self, texts: list[str]) -> list[float]:
        torch = self.torch
        batch = self.tokenizer(texts, return_tensors="pt", padding=True, truncation=True,
                               max_length=self.spec.max_length).to(self.device)
        with torch.inference_mode():
            logits = self.model(**batch).logits.float().cpu().tolist()
        return [transform(row, self.index, self.spec.score.transform) for row in logits]


class VLLMClassifier(_Template):
    """vLLM's pooling runner (GPU): LLM.classify returns each text's class probabilities."""

    def __init__(self, spec: JudgeSpec, **engine_args: Any):
        """engine_args: more of vLLM's LLM(...) arguments (gpu_memory_utilization on a shared device)."""
        if spec.score.transform == "logit":
            raise ValueError(f"judge {spec.name}: engine vllm serves probabilities (its classify applies the "
                             "model's activation): use score.transform sigmoid or softmax, or engine hf")
        from vllm import LLM

        self.spec = spec
        self.llm = LLM(model=spec.model, runner="pooling", max_model_len=spec.max_length, enforce_eager=True,
                       **engine_args)
        cfg = self.llm.llm_engine.model_config.hf_config
        self.index = label_index(spec.score.label, getattr(cfg, "id2label", {}), cfg.num_labels,
                                 f"judge {spec.name}: score.label")

    def score(self, texts: list[str]) -> list[float]:
        outputs = self.llm.classify(texts, use_tqdm=False)
        return [float(o.outputs.probs[self.index]) for o in outputs]


def build(spec: JudgeSpec) -> Judge:
    if spec.kind == "generative":
        return VLLMGenerative(spec) if spec.engine == "vllm" else HFGenerative(spec)
    return VLLMClassifier(spec) if spec.engine == "vllm" else HFClassifier(spec)
