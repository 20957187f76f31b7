"""Episodes -> groups: the one converter every adapter in grpojob.integrations uses, so that a
library's trajectories reach the trainer with their exact tokens, loss masks, log-probs and
per-token policy versions.

API (what the adapters call; keep it stable):

- `Episode(prompt_ids, completion_ids, logprobs, loss_mask=None, versions=None, reward=None,
  finish_reason="stop", text="")`: one trajectory after its prompt. `completion_ids` are every
  token after the prompt: the policy's and, multi-turn, the environment's/tool's; `logprobs` one
  per completion token (any number where the mask is 0); `loss_mask` 1 where the policy sampled the
  token (None: all 1); `versions` the policy version of each token (None: all `Episode.version`;
  entries where the mask is 0 are ignored, AReaL writes -1 there); `reward` the library's own
  score (None: the job's rewards score the completion).
- `from_sequence(input_ids, loss_mask, logprobs=None, versions=None, reward=None, ...)`: an
  Episode from one flat sequence (AReaL's `input_ids`/`loss_mask`/`logprobs`/`versions` rows,
  verl's prompt + response): the prompt is every token before the first trained one.
- `to_completion(episode, tokenizer=None) -> Completion`: our rollout type; versions of untrained
  tokens are filled from the trained token before them (the first: the oldest), `policy_version`
  is the oldest trained token's version, `versions` is kept only when they differ.
- `to_group(sample, episodes, tokenizer=None) -> Group`: the group of one prompt; `None` entries
  (rejected episodes) are left out; EpisodeError when none is left.
- `EpisodeError(ValueError)`: an episode that does not fit (lengths differ, nothing trained),
  with the reason.

Everything here is plain Python lists: no torch and no library import (an adapter turns its
tensors into lists first: `t.tolist()`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Optional, Sequence

from grpojob.contracts.rollout import Completion, Group, Sample

__all__ = ["Episode", "EpisodeError", "from_sequence", "to_completion", "to_group"]


class EpisodeError(ValueError):
    pass


@dataclass
class Episode:
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    loss_mask: Optional[list[int]] = None
    versions: Optional[list[int]] = None
    reward: Optional[float] = None
    finish_reason: str = "stop"  # stop | length
    text: str = ""
    version: int = 0  # every token's version when `versions` is None

    def mask(self) -> list[int]:
        return [1] * len(self.completion_ids) if self.loss_mask is None else [int(m) for m in self.loss_mask]


def _flat(x: Any) -> list:
    """A list from a list, a tuple, or a tensor/array of one row ([L] or [1, L])."""
    if hasattr(x, "tolist"):
        x = x.tolist()
    x = list(x)
    if len(x) == 1 and isinstance(x[0], (list, tuple)):
        x = list(x[0])
    return x


def from_sequence(input_ids: Sequence[int], loss_mask: Sequence[int], logprobs: Optional[Sequence[float]] = None,
                  versions: Optional[Sequence[int]] = None, reward: Optional[float] = None,
                  finish_reason: str = "stop", version: int = 0) -> Episode:
    """An Episode from one whole sequence, all fields aligned with `input_ids` (AReaL's layout:
    log-probs and versions sit at the token they belong to). The prompt ends before the first
    token with mask 1."""
    ids, mask = [int(t) for t in _flat(input_ids)], [int(m) for m in _flat(loss_mask)]
    lps = [float(v) for v in _flat(logprobs)] if logprobs is not None else [0.0] * len(ids)
    vers = [int(v) for v in _flat(versions)] if versions is not None else None
    if len(mask) != len(ids) or len(lps) != len(ids) or (vers is not None and len(vers) != len(ids)):
        raise EpisodeError(f"a sequence of {len(ids)} tokens has {len(mask)} loss-mask entries, {len(lps)} "
                           f"log-probs{'' if vers is None else f' and {len(vers)} versions'}")
    if 1 not in mask:
        raise EpisodeError(f"a sequence of {len(ids)} tokens has no trained token (loss mask all 0)")
    start = mask.index(1)
    return Episode(prompt_ids=ids[:start], completion_ids=ids[start:], logprobs=lps[start:], loss_mask=mask[start:],
                   versions=vers[start:] if vers is not None else None, reward=reward,
                   finish_reason=finish_reason, version=version)


def _token_versions(ep: Episode, mask: list[int]) -> list[int]:
    """One version per completion token: the trained tokens' own, the others the one before them."""
    if ep.versions is None:
        return [ep.version] * len(ep.completion_ids)
    trained = [int(v) for v, m in zip(ep.versions, mask) if m]
    last = min(trained) if trained else ep.version
    out = []
    for v, m in zip(ep.versions, mask):
        last = int(v) if m else last
        out.append(last)
    return out


def to_completion(ep: Episode, tokenizer: Any = None) -> Completion:
    n = len(ep.completion_ids)
    mask = ep.mask()
    if len(ep.logprobs) != n or len(mask) != n or (ep.versions is not None and len(ep.versions) != n):
        raise EpisodeError(f"an episode of {n} completion tokens has {len(ep.logprobs)} log-probs, {len(mask)} "
                           f"loss-mask entries{'' if ep.versions is None else f', {len(ep.versions)} versions'}")
    if n == 0 or 1 not in mask:
        raise EpisodeError("an episode has no token of the policy's to train on (empty, or loss mask all 0)")
    if not ep.prompt_ids:
        raise EpisodeError("an episode has an empty prompt")
    versions = _token_versions(ep, mask)
    trained = [v for v, m in zip(versions, mask) if m]
    text = ep.text or (tokenizer.decode(list(ep.completion_ids), skip_special_tokens=True) if tokenizer else "")
    return Completion(prompt_ids=[int(t) for t in ep.prompt_ids], completion_ids=[int(t) for t in ep.completion_ids],
                      logprobs=[float(v) if m else 0.0 for v, m in zip(ep.logprobs, mask)], policy_version=min(trained),
                      finish_reason=ep.finish_reason, text=text, loss_mask=None if all(mask) else mask,
                      reward=None if ep.reward is None else float(ep.reward),
                      versions=versions if len(set(trained)) > 1 else None)


def to_group(sample: Sample, episodes: Iterable[Optional[Episode]], tokenizer: Any = None) -> Group:
    """The group of `sample` from its episodes; None entries (rejected) are left out."""
    kept = [to_completion(e, tokenizer) for e in episodes if e is not None]
    if not kept:
        raise EpisodeError(f"every episode of sample {sample.index} was rejected (None)")
    return Group(sample=sample, completions=kept)
