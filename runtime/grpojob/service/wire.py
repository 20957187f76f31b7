"""The training service's requests as the trainer takes them: the wire models of
grpojob.api.service (the same rules the client checks before sending), then the job's own limits
(the vocabulary, training.microBatchTokens). Every refusal names what is wrong, e.g.
`data[2].loss_fn_inputs.advantages: 5 values for 6 model_input tokens`. No torch here."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from pydantic import BaseModel, ValidationError

from grpojob.api.service import (ForwardBackwardInput, LoadStateRequest, OptimStepRequest, SampleRequest,
                            SaveStateRequest, SaveWeightsRequest)
from grpojob.leader.trajectories.wire import describe

# route -> (method, request model or None for GET)
ROUTES: dict[str, tuple[str, Optional[type[BaseModel]]]] = {
    "/info": ("GET", None),
    "/forward_backward": ("POST", ForwardBackwardInput),
    "/forward": ("POST", ForwardBackwardInput),
    "/optim_step": ("POST", OptimStepRequest),
    "/save_weights_for_sampler": ("POST", SaveWeightsRequest),
    "/sample": ("POST", SampleRequest),
    "/save_state": ("POST", SaveStateRequest),
    "/load_state": ("POST", LoadStateRequest),
}


class Refused(Exception):
    """A call the trainer does not run (or could not finish): its HTTP status and why."""

    def __init__(self, status: int, message: str, reason: str = "invalid"):
        super().__init__(message)
        self.status, self.reason = status, reason

    def doc(self) -> dict[str, Any]:
        return {"error": str(self), "reason": self.reason}


@dataclass(frozen=True)
class Limits:
    vocab_size: int  # the policy's embedding rows
    max_sequence_tokens: int  # training.microBatchTokens: one datum, or a prompt and its completion
    max_tokens: int  # rollout.sampling.maxTokens: a sample's default length


def parse(route: str, method: str, body: bytes, limits: Limits) -> Optional[BaseModel]:
    """The request of `route` (None for a GET), validated; Refused (404, 405, 400) otherwise."""
    if route not in ROUTES:
        raise Refused(404, f"no route {route}: use {', '.join(ROUTES)}", "not-found")
    want, model = ROUTES[route]
    if method != want:
        raise Refused(405, f"{route} takes {want}", "method")
    if model is None:
        return None
    try:
        req = model.model_validate_json(body or b"{}")
    except ValidationError as e:
        raise Refused(400, describe(e)) from None
    check_limits(req, limits)
    return req


def _vocab(ids: list[int], vocab: int, where: str) -> None:
    for i, t in enumerate(ids):
        if not 0 <= t < vocab:
            raise Refused(400, f"{where}[{i}]: {t} is outside the vocabulary ({vocab} tokens)")


def check_limits(req: BaseModel, lim: Limits) -> None:
    """The job's own limits (the vocabulary, training.microBatchTokens) on a validated request."""
    if isinstance(req, ForwardBackwardInput):
        for i, d in enumerate(req.data):
            ids = d.model_input.to_ints()
            if len(ids) > lim.max_sequence_tokens:
                raise Refused(400, f"data[{i}].model_input: {len(ids)} tokens, more than training.microBatchTokens "
                              f"({lim.max_sequence_tokens})")
            _vocab(ids, lim.vocab_size, f"data[{i}].model_input")
            _vocab(d.inputs("target_tokens"), lim.vocab_size, f"data[{i}].loss_fn_inputs.target_tokens")
    elif isinstance(req, SampleRequest):
        ids = req.prompt.to_ints()
        _vocab(ids, lim.vocab_size, "prompt")
        longest = len(ids) + (req.sampling_params.max_tokens or lim.max_tokens)
        if longest > lim.max_sequence_tokens:
            raise Refused(400, f"prompt ({len(ids)} tokens) + sampling_params.max_tokens = {longest}, more than "
                          f"training.microBatchTokens ({lim.max_sequence_tokens}): the sample could not be trained on")


def tokens_of(req: Optional[BaseModel]) -> int:
    """The tokens a call carries in (for the service's metrics)."""
    if isinstance(req, ForwardBackwardInput):
        return sum(d.model_input.length for d in req.data)
    if isinstance(req, SampleRequest):
        return req.prompt.length * req.num_samples
    return 0
