"""A generative judge (spec.judges[i].kind generative): a chat model answers a rubric, and the declared
parser reads the score from its answer.

Both engines build the same chat (spec.system as the system message, spec.template filled with the
prompt and the completion as the user message), render it with the model's own chat template, and
generate greedily unless spec.temperature is above 0. The parser (`parse`): the first match of
score.pattern, its one group read as a number in [score.min, score.max], mapped linearly to [0, 1].
An answer it cannot read (no match, not a number, outside the range) scores None: a failure of that
item, never a guessed reward. The server counts it; the trainer applies the judge's onFailure to
the item's group (docs/services.md).
- hf: AutoModelForCausalLM.generate over a left-padded batch under torch.inference_mode (frozen).
- vllm: vLLM's offline chat API (LLM.chat with SamplingParams): the same template, vLLM's scheduler.
"""
from __future__ import annotations

import logging
import math
import re
from typing import Any, Optional

from grpojob.api.judge import JudgeScore, JudgeSpec

log = logging.getLogger("grpojob.judge")
Chat = list[dict[str, str]]


def parse(answer: str, score: JudgeScore) -> Optional[float]:
    """The reward in [0, 1] that the answer states, or None when the parser cannot read one."""
    match = re.search(score.pattern or "", answer)
    if match is None or match.group(1) is None:
        return None
    try:
        x = float(match.group(1))
    except ValueError:
        return None
    if not math.isfinite(x) or not score.min <= x <= score.max:
        return None  # outside the declared scale: the judge misread the rubric, not a score to clamp
    return (x - score.min) / (score.max - score.min)


def messages(spec: JudgeSpec, prompt: str, completion: str) -> Chat:
    user = {"role": "user", "content": spec.template.format(prompt=prompt, completion=completion)}
    return ([{"role": "system", "content": spec.system}] if spec.system else []) + [user]


def render(tokenizer: Any, chat: Chat) -> str:
    """The chat as the model reads it: its own chat template, ending with the assistant's turn."""
    return tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)


def fit(tokenizer: Any, spec: JudgeSpec, prompt: str, completion: str) -> Chat:
    """The chat, its completion cut to its last tokens so that the rendered chat fits spec.max_length
    tokens (as a classifier keeps a text's end). The rubric and the prompt are never cut: a chat
    that is too long without any completion fails at the engine, not silently."""
    chat = messages(spec, prompt, completion)
    over = len(tokenizer(render(tokenizer, chat), add_special_tokens=False)["input_ids"]) - spec.max_length
    if over <= 0:
        return chat
    ids = tokenizer.encode(completion, add_special_tokens=False)
    return messages(spec, prompt, tokenizer.decode(ids[min(over, len(ids)):]))


def read(spec: JudgeSpec, answers: list[str]) -> list[Optional[float]]:
    """Each answer's score; the ones the parser cannot read are logged (what the model said)."""
    out = [parse(a, spec.score) for a in answers]
    for answer, s in zip(answers, out):
        if s is None:
            log.warning("judge %s: no score in the answer %r (score.pattern %r, range %g..%g)", spec.name,
                        answer[:200], spec.score.pattern, spec.score.min, spec.score.max)
    return out


class HFGenerative:
    """transformers on CPU (or the one GPU it is given): chats rendered with the tokenizer's chat
    template, left-padded per batch, answers decoded without special tokens."""

    def __init__(self, spec: JudgeSpec, device: Optional[str] = None):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.spec, self.torch = spec, torch
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.tokenizer = AutoTokenizer.from_pretrained(spec.model)
        self.tokenizer.padding_side = "left"  # generation continues every row from its last token
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        if not self.tokenizer.chat_template:
            raise ValueError(f"judge {spec.name}: {spec.model} has no chat template (kind generative needs a chat model)")
        self.model = AutoModelForCausalLM.from_pretrained(spec.model).to(self.device).eval()
        self.model.requires_grad_(False)  # frozen: a judge's weights are never trained or pushed to

    def render(self, prompt: str, completion: str) -> Chat:
        return fit(self.tokenizer, self.spec, prompt, completion)

    def answer(self, chats: list[Chat]) -> list[str]:
        torch, spec = self.torch, self.spec
        texts = [render(self.tokenizer, c) for c in chats]
        batch = self.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(self.device)
        # plain temperature sampling, as vLLM's SamplingParams(temperature=...) does: no top-k/top-p
        how = dict(do_sample=True, temperature=spec.temperature, top_k=0, top_p=1.0) if spec.temperature > 0 else \
            dict(do_sample=False, temperature=None, top_p=None, top_k=None)
        with torch.inference_mode():
            out = self.model.generate(**batch, max_new_tokens=spec.max_tokens, pad_token_id=self.tokenizer.pad_token_id,
                                      **how)
        return self.tokenizer.batch_decode(out[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)

    def score(self, chats: list[Chat]) -> list[Optional[float]]:
        return read(self.spec, self.answer(chats))


class VLLMGenerative:
    """vLLM (GPU): LLM.chat renders each chat with the model's template and generates them together."""

    def __init__(self, spec: JudgeSpec, **engine_args: Any):
        """engine_args: more of vLLM's LLM(...) arguments (gpu_memory_utilization on a shared device)."""
        from vllm import LLM, SamplingParams

        self.spec = spec
        self.llm = LLM(model=spec.model, max_model_len=spec.max_length + spec.max_tokens, enforce_eager=True,
                       **engine_args)
        self.tokenizer = self.llm.get_tokenizer()
        self.sampling = SamplingParams(max_tokens=spec.max_tokens, temperature=spec.temperature)

    def render(self, prompt: str, completion: str) -> Chat:
        return fit(self.tokenizer, self.spec, prompt, completion)

    def answer(self, chats: list[Chat]) -> list[str]:
        outputs = self.llm.chat(chats, self.sampling, use_tqdm=False, add_generation_prompt=True)
        return [o.outputs[0].text for o in outputs]

    def score(self, chats: list[Chat]) -> list[Optional[float]]:
        return read(self.spec, self.answer(chats))
