"""Tinker's wire as the training service reads it (grpojob.service.tinker_wire, the tinker SDK's own
protobuf module): a forward_backward request the SDK encodes (zstd or not) becomes the service's
call; what a GRPOJob cannot take is refused by name; stop sequences cut a completion where
stopping would have; the cispo and dro losses are Tinker's formulas; the token is Tinker's key."""
from __future__ import annotations

import concurrent.futures
import json
import math

import pytest
import torch
from pydantic import ValidationError
import zstandard
from tinker import types
from tinker.proto.request_conv import forward_backward_request_to_proto
from tinker.proto.response_conv import deserialize_forward_backward_output, deserialize_sample_response

from grpojob.algorithms import losses
from grpojob.auth import Auth
from grpojob.api.service import ModelInput, SampleRequest, SamplingParams
from grpojob.service import tinker_wire as tw
from grpojob.service.stops import cut_at_stop
from grpojob.service.tinker_futures import JSON, RETRIEVED, Futures, as_json
from grpojob.service.wire import Limits, Refused

LIMITS = Limits(vocab_size=512, max_sequence_tokens=64, max_tokens=8)


def request(data, loss_fn="importance_sampling", config=None, forward_only=False) -> bytes:
    msg = forward_backward_request_to_proto(types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(data=data, loss_fn=loss_fn, loss_fn_config=config),
        model_id="m", seq_id=1))
    msg.forward_only = forward_only
    return msg.SerializeToString()


def rl(tokens, advantages=None) -> types.Datum:
    n = len(tokens)
    return types.Datum(model_input=types.ModelInput.from_ints(tokens),
                       loss_fn_inputs={"target_tokens": tokens[1:] + [7], "logprobs": [-1.0] * n,
                                       "advantages": advantages or [0.5] * n})


@pytest.mark.parametrize("zstd", [False, True])
def test_an_sdk_request_becomes_the_services_call(zstd):
    body = request([rl([5, 6, 7])], "cispo", {"clip_high_threshold": 1.5}, forward_only=True)
    if zstd:
        body = zstandard.ZstdCompressor().compress(body)
    model_id, req, forward_only = tw.decode_forward_backward(body, "zstd" if zstd else None, LIMITS)
    assert (model_id, forward_only, req.loss_fn, req.config("clip_high_threshold")) == ("m", True, "cispo", 1.5)
    assert req.data[0].model_input.to_ints() == [5, 6, 7] and req.data[0].inputs("target_tokens") == [6, 7, 7]
    assert req.data[0].inputs("advantages") == [0.5, 0.5, 0.5]


@pytest.mark.parametrize("data, loss_fn, words", [
    ([rl([5, 6, 7], [1.0, 1.0])], "importance_sampling", "data[0].loss_fn_inputs.advantages: 2 values for 3"),
    ([rl([5, 6, 9999])], "importance_sampling", "data[0].model_input[2]: 9999 is outside the vocabulary"),
    ([rl([5, 6, 7])], "gspo", "loss_fn: Input should be"),
    ([types.Datum(model_input=types.ModelInput.from_ints([5, 6]),
                  loss_fn_inputs={"target_tokens": [[6, 1], [7, 1]]})], "cross_entropy",
     "data[0].loss_fn_inputs.target_tokens.shape: [2, 2]: only 1-D tensors"),
])
def test_what_a_grpojob_cannot_take_is_refused_by_name(data, loss_fn, words):
    with pytest.raises(Refused, match=words.replace("[", r"\[").replace("]", r"\]")):
        tw.decode_forward_backward(request(data, loss_fn), None, LIMITS)
    with pytest.raises(Refused, match="not zstd"):
        tw.decode_forward_backward(b"not zstd", "zstd", LIMITS)


def test_answers_decode_with_the_sdks_own_readers():
    out = deserialize_forward_backward_output(tw.encode_forward_backward(
        {"loss_fn_outputs": [{"logprobs": {"data": [-1.0, -2.0]}}, {"logprobs": {"data": [-3.0]}}],
         "metrics": {"loss:sum": 6.0}}))
    assert [o["logprobs"].tolist() for o in out.loss_fn_outputs] == [[-1.0, -2.0], [-3.0]]
    assert out.metrics == {"loss:sum": 6.0}
    sample = deserialize_sample_response(tw.encode_sample([([4, 5], [-0.5, -0.25], "stop"), ([6], [-1.0], "length")],
                                                          [math.nan, -2.0, -3.0]))
    assert [(s.tokens, s.logprobs, s.stop_reason) for s in sample.sequences] == [
        ([4, 5], [-0.5, -0.25], "stop"), ([6], [-1.0], "length")]
    assert sample.prompt_logprobs == [None, -2.0, -3.0]


def test_a_stop_cuts_the_completion_after_it():
    text = {1: "a", 2: "b\n", 3: "c"}

    def decode(ids):
        return "".join(text[i] for i in ids)
    assert cut_at_stop([1, 2, 3], [-1.0, -2.0, -3.0], "length", "\n", decode) == ([1, 2], [-1.0, -2.0], "stop")
    assert cut_at_stop([1, 2, 3], [-1.0, -2.0, -3.0], "length", [3], decode) == ([1, 2, 3], [-1.0, -2.0, -3.0],
                                                                                       "stop")
    assert cut_at_stop([1, 3], [-1.0, -3.0], "length", ["\n"], decode) == ([1, 3], [-1.0, -3.0], "length")
    assert cut_at_stop([1, 3], [-1.0, -3.0], "stop", None, decode) == ([1, 3], [-1.0, -3.0], "stop")
    with pytest.raises(ValidationError, match=r"sampling_params.stop\n  Value error, \[\]: no stop at all \(not even EOS\)"):
        SampleRequest(prompt=ModelInput.from_ints([5]), sampling_params={"stop": []})
    assert SamplingParams(stop=[7, 8]).stop == [7, 8] and SamplingParams(stop="\n").stop == "\n"
    last_two = tw.with_last_n([math.nan, -1.0, -2.0, -3.0], 2)  # prompt_logprobs_last_n
    assert math.isnan(last_two[1]) and last_two[2:] == [-2.0, -3.0]


def test_cispo_and_dro_are_tinkers_formulas():
    logp = torch.tensor([-0.2, -1.0, -3.0], requires_grad=True)
    q, adv = torch.tensor([-1.0, -1.0, -1.0]), torch.tensor([1.0, -2.0, 0.5])
    loss, clipped = losses.cispo_loss(logp, logp - q, adv, 0.8, 1.2)
    loss.sum().backward()
    weight = torch.exp(logp.detach() - q).clamp(0.8, 1.2)
    assert torch.allclose(logp.grad, -(weight * adv)) and clipped.tolist() == [1.0, 0.0, 1.0]
    logp.grad = None
    dro = losses.dro_loss(logp, logp - q, adv, 0.05)
    assert torch.allclose(dro, -(logp * adv - 0.5 * 0.05 * (logp - q) ** 2))
    dro.sum().backward()
    assert torch.allclose(logp.grad, -(adv - 0.05 * (logp.detach() - q)))


def test_the_token_is_tinkers_api_key_with_its_prefix():
    auth = Auth("secret")
    assert auth.accepts_api_key("tml-secret") and not auth.accepts_api_key("secret")
    assert not auth.accepts_api_key("tml-other") and not auth.accepts_api_key(None)


def test_futures_say_try_again_then_answer_and_keep_the_last_answers():
    pending = concurrent.futures.Future()
    futures = Futures()
    rid = futures.add(pending, as_json)
    assert json.loads(futures.retrieve(rid, wait=0.01)[1]) == {"type": "try_again", "request_id": rid,
                                                               "queue_state": "active"}
    pending.set_result({"metrics": {"step": 1.0}})
    assert futures.retrieve(rid) == futures.retrieve(rid) == (JSON, b'{"metrics": {"step": 1.0}}')  # again
    refused = concurrent.futures.Future()
    refused.set_exception(Refused(409, "no gradients to step with"))
    failed = concurrent.futures.Future()
    failed.set_exception(RuntimeError("boom"))
    assert json.loads(futures.retrieve(futures.add(refused, as_json))[1]) == {
        "error": "no gradients to step with", "category": "user"}
    assert json.loads(futures.retrieve(futures.add(failed, as_json))[1])["category"] == "server"
    for _ in range(RETRIEVED + 1):
        futures.retrieve(futures.done({}, as_json))
    with pytest.raises(Refused, match=f"request_id {rid}: no such request"):
        futures.retrieve(rid)
