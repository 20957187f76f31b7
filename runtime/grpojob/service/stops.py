"""Stop sequences of the training service's samples (SamplingParams.stop, in both wires): the
rollout servers stop at EOS or max_tokens only, so a completion is cut here after its first stop.
Generation runs left to right, so the kept prefix, its tokens and their logprobs, is exactly what
stopping there would have sampled; only the compute past it is spent in vain."""
from __future__ import annotations

from typing import Callable, Sequence, Union

Stop = Union[None, str, Sequence[str], Sequence[int]]


def cut_at_stop(tokens: list[int], logprobs: list[float], reason: str, stop: Stop,
                decode: Callable[[list[int]], str]) -> tuple[list[int], list[float], str]:
    """A completion cut after its first stop: a stop token id (kept, as the engines keep EOS), or
    the token that completes a stop string (decoded text); its stop reason is then "stop"."""
    if stop is None:
        return tokens, logprobs, reason
    items = [stop] if isinstance(stop, str) else list(stop)
    ids = {s for s in items if isinstance(s, int)}
    strings = [s for s in items if isinstance(s, str)]
    for k, t in enumerate(tokens):
        if t in ids or (strings and any(s in decode(tokens[:k + 1]) for s in strings)):
            return tokens[:k + 1], logprobs[:k + 1], "stop"
    return tokens, logprobs, reason
