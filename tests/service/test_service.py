"""The training service over HTTP (spec.mode service), served by the real trainer assembly (build,
LeaderServer, TrainingService) in this process with the in-process engine as its rollout side: a
call with a bad shape is refused with a 4xx naming what is wrong and the trainer keeps serving;
the calls of a training step round-trip through grpojob.client (sync and async); /status and
/metrics count them; suspension refuses what is queued, checkpoints and stops."""
from __future__ import annotations

import asyncio
import json
import threading
import urllib.error
import urllib.request

import pytest
from pydantic import ValidationError

from grpojob.auth import Auth
from grpojob.client import AdamParams, Datum, ModelInput, SamplingParams, ServiceClient, ServiceError
from grpojob.leader.build import build
from grpojob.leader.server import LeaderServer, StatusBoard
from grpojob.service.app import serve
from tests.trainer.conftest import make_job

TOKEN = "service-token"


@pytest.fixture(scope="module")
def service(tiny_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("service")
    job = make_job(tiny_dir, mode="service", training={"microBatchTokens": 64})
    board, suspend = StatusBoard(), threading.Event()
    board.suspend_requested = suspend
    server = LeaderServer(board, "127.0.0.1", 0, Auth(TOKEN)).start()
    run = build(job, rollouts="inprocess", checkpoint_dir=str(tmp / "ck"), run_dir=str(tmp), board=board,
                suspend=suspend)
    phase: dict = {}
    thread = threading.Thread(target=lambda: phase.update(end=serve(run, server)), daemon=True)
    thread.start()
    client = ServiceClient(f"http://127.0.0.1:{server.port}", TOKEN)
    client.wait_ready(timeout=60)
    yield run, client, server, board, suspend, thread, phase
    suspend.set()
    thread.join(60)
    client.close()
    server.stop()


def call(server, route, body, token=TOKEN, raw: bytes | None = None) -> tuple[int, dict]:
    data = raw if raw is not None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{server.port}/service{route}", data=data, method="POST",
                                 headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        body = e.read()
        return e.code, json.loads(body) if body.startswith(b"{") else {"error": body.decode()}


def datum(tokens, targets=None, **inputs) -> dict:
    tensors = {"target_tokens": {"data": targets or tokens[1:] + [7], "dtype": "int64"}}
    tensors.update({k: {"data": v, "dtype": "float32"} for k, v in inputs.items()})
    return {"model_input": {"chunks": [{"type": "encoded_text", "tokens": tokens}]}, "loss_fn_inputs": tensors}


GOOD = datum([5, 6, 7, 8], logprobs=[-1.0] * 4, advantages=[0.0, 0.0, 1.0, 1.0])


@pytest.mark.parametrize("route, body, status, words", [
    ("/forward_backward", {"data": [datum([5, 6, 7, 8], logprobs=[-1.0] * 4, advantages=[1.0] * 3)],
                           "loss_fn": "importance_sampling"},
     400, "data[0].loss_fn_inputs.advantages: 3 values for 4 model_input tokens"),
    ("/forward_backward", {"data": [datum([5, 6, 7, 8], logprobs=[-1.0] * 4)], "loss_fn": "importance_sampling"},
     400, "data[0].loss_fn_inputs: importance_sampling needs advantages"),
    ("/forward_backward", {"data": [GOOD, datum([5, 6, 9999, 8], logprobs=[0.0] * 4, advantages=[0.0] * 4)],
                           "loss_fn": "ppo"},
     400, "data[1].model_input[2]: 9999 is outside the vocabulary (512 tokens)"),
    ("/forward_backward", {"data": [datum(list(range(3, 80)))], "loss_fn": "cross_entropy"},
     400, "data[0].model_input: 77 tokens, more than training.microBatchTokens (64)"),
    ("/forward_backward", {"data": [GOOD], "loss_fn": "dpo"}, 400, "loss_fn: Input should be 'cross_entropy'"),
    ("/forward_backward", {"data": [GOOD], "loss_fn": "ppo", "loss_fn_config": {"clip_low_threshold": 1.5}},
     400, "loss_fn_config: clip thresholds [1.5, 1.2] must hold 1"),
    ("/forward_backward", {"data": [datum([5, 6], weights=[1.0, 1.0], advantages=[1.0, 1.0])],
                           "loss_fn": "cross_entropy"},
     400, "data[0].loss_fn_inputs.advantages: not an input of cross_entropy (it takes target_tokens, weights)"),
    ("/forward_backward", {"data": [], "loss_fn": "cross_entropy"}, 400, "data: List should have at least 1 item"),
    ("/forward_backward", {"data": [datum([5, 6], weights=[1.0, float("nan")])], "loss_fn": "cross_entropy"},
     400, "data[0].loss_fn_inputs.weights.data[1]: nan is not a finite number"),
    ("/optim_step", {"adam_params": {"learning_rate": -1}},
     400, "adam_params.learning_rate: Input should be greater than 0"),
    ("/sample", {"prompt": {"chunks": [{"tokens": [5, 6]}]}, "num_samples": 2,
                 "sampling_params": {"stop": []}}, 400, "sampling_params.stop: []: no stop at all (not even EOS)"),
    ("/sample", {"prompt": {"chunks": [{"tokens": list(range(3, 63))}]}, "sampling_params": {"max_tokens": 8}},
     400, "prompt (60 tokens) + sampling_params.max_tokens = 68, more than training.microBatchTokens (64)"),
    ("/sample", {"prompt": {"chunks": [{"tokens": [5]}]}, "min_policy_version": 99}, 409, "min_policy_version 99"),
    ("/load_state", {"path": "/etc"}, 400, "path: '/etc' is not a checkpoint of this job"),
    ("/nope", {}, 404, "no route /nope"),
])
def test_a_bad_call_is_refused_with_its_reason_and_the_trainer_keeps_serving(service, route, body, status, words):
    run, client, server, board, *_ = service
    step = run.trainer.step
    code, doc = call(server, route, body)
    assert (code, words) == (status, words) and words in doc["error"], doc
    # still serving: a good call right after
    code, doc = call(server, "/forward", {"data": [GOOD], "loss_fn": "importance_sampling"})
    assert code == 200 and len(doc["loss_fn_outputs"][0]["logprobs"]["data"]) == 4
    assert run.trainer.step == step


def test_not_json_no_token_and_nothing_to_step_with(service):
    run, client, server, *_ = service
    code, doc = call(server, "/forward_backward", None, raw=b"{not json")
    assert code == 400 and doc["error"].startswith("body: not JSON")
    assert call(server, "/info", {}, token="wrong")[0] == 401
    code, doc = call(server, "/optim_step", {"adam_params": {"learning_rate": 1e-3}})
    assert code == 409 and "call forward_backward first" in doc["error"]
    # the client checks the same rules before sending anything
    with pytest.raises(ValidationError, match="3 values for 4 model_input tokens"):
        Datum(model_input=ModelInput.from_ints([5, 6, 7, 8]), loss_fn_inputs={"weights": [1.0, 1.0, 1.0]})


def _datums(prompt: list[int], seqs) -> list[Datum]:
    out = []
    for s in seqs:
        full, pad = prompt + s.tokens, [0.0] * (len(prompt) - 1)
        out.append(Datum(model_input=ModelInput.from_ints(full[:-1]),
                         loss_fn_inputs={"target_tokens": full[1:], "logprobs": pad + s.logprobs,
                                         "advantages": pad + [1.0] * len(s.tokens)}))
    return out


def test_a_training_step_round_trips(service):
    run, client, server, board, *_ = service
    training = client.create_training_client()
    info = client.get_info()
    assert (info.vocab_size, info.max_sequence_tokens, info.ranks) == (512, 64, 1)
    prompt = [5, 6, 7]
    sampled = client.create_sampling_client().sample(ModelInput.from_ints(prompt), 4,
                                                     SamplingParams(max_tokens=3)).result()
    assert len(sampled.sequences) == 4 and all(1 <= len(s.tokens) <= 3 for s in sampled.sequences)
    data = _datums(prompt, sampled.sequences)
    stops = list(range(0, 512, 2))  # a completion is cut after its first stop token
    stopped = client.create_sampling_client().sample(ModelInput.from_ints(prompt), 16,
                                                     SamplingParams(max_tokens=3, stop=stops)).result()
    assert all(not set(s.tokens[:-1]) & set(stops) and len(s.logprobs) == len(s.tokens) for s in stopped.sequences)
    assert any(s.stop_reason == "stop" and s.tokens[-1] in stops and len(s.tokens) < 3 for s in stopped.sequences)

    before = training.forward(data, "importance_sampling").result()
    for s, out in zip(sampled.sequences, before.loss_fn_outputs):  # the trainer's log-probs are the sampler's
        assert out["logprobs"].data[len(prompt) - 1:] == pytest.approx(s.logprobs, abs=1e-4)
    version = info.policy_version
    fwd = training.forward_backward(data, "importance_sampling")  # queued together, run in order
    step = training.optim_step(AdamParams(learning_rate=1e-2, beta2=0.95, grad_clip_norm=0))
    assert fwd.result().metrics["loss:sum"] == pytest.approx(-sum(len(s.tokens) for s in sampled.sequences), rel=1e-3)
    assert step.result().metrics["policy_version"] == version + 1
    assert run.trainer.optimizer.param_groups[0]["betas"][1] == 0.95
    after = training.forward(data, "importance_sampling").result()
    assert after.metrics["loss:sum"] < before.metrics["loss:sum"]  # the sampled tokens became likelier

    sampler = training.save_weights_and_get_sampling_client(name="step-1")
    assert sampler.policy_version == version + 1
    again = sampler.sample(ModelInput.from_ints(prompt), 2).result()
    assert {s.policy_version for s in again.sequences} == {version + 1}

    saved = training.save_state("mid").result()
    assert saved.step == run.trainer.step and saved.path.endswith(f"step-{saved.step:06d}")
    training.forward_backward(data, "importance_sampling").result()
    training.optim_step(AdamParams(learning_rate=1e-2)).result()
    moved = training.forward(data, "importance_sampling").result()
    assert moved.metrics["loss:sum"] != pytest.approx(after.metrics["loss:sum"])
    loaded = training.load_state(saved.path).result()
    assert loaded.step == saved.step and loaded.policy_version == version + 3  # versions never repeat
    assert len(run.trainer.optimizer.state) == 0  # Tinker's load_state: the weights, a fresh optimizer
    training.load_state_with_optimizer(saved.path).result()
    assert len(run.trainer.optimizer.state) > 0
    restored = training.forward(data, "importance_sampling").result()
    assert restored.metrics["loss:sum"] == pytest.approx(after.metrics["loss:sum"], rel=1e-5)


def test_the_async_client(service):
    run, client, *_ = service
    training = client.create_training_client()
    data = [Datum(model_input=ModelInput.from_ints([5, 6, 7]), loss_fn_inputs={"target_tokens": [6, 7, 8]})]

    async def main():
        fut = await training.forward_async(data, "cross_entropy")
        out = await fut
        sampler = client.create_sampling_client()
        many = await asyncio.gather(*[(await sampler.sample_async(ModelInput.from_ints([5]), 2)).result_async()
                                      for _ in range(4)])
        return out, many

    out, many = asyncio.run(main())
    assert out.metrics["tokens:sum"] == 3 and [len(m.sequences) for m in many] == [2, 2, 2, 2]
    with pytest.raises(ServiceError) as e:
        client.create_sampling_client(model_path="grpojob://policy/1000").sample(ModelInput.from_ints([5])).result()
    assert e.value.status == 409


def test_status_and_metrics_show_the_calls(service):
    """Counts this test's own calls only (the module's other tests share the service and may run
    before, after or, under xdist, in another process)."""
    run, client, server, board, *_ = service

    def status() -> dict:
        req = urllib.request.Request(f"http://127.0.0.1:{server.port}/status",
                                     headers={"Authorization": f"Bearer {TOKEN}"})
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read())

    def count(doc: dict, op: str, key: str) -> float:
        return doc["service"]["ops"].get(op, {}).get(key, 0)

    before = status()
    assert call(server, "/forward_backward", {"data": [GOOD], "loss_fn": "dpo"})[0] == 400  # refused
    for _ in range(2):
        assert call(server, "/forward", {"data": [GOOD], "loss_fn": "importance_sampling"})[0] == 200
    assert call(server, "/forward_backward", {"data": [GOOD], "loss_fn": "importance_sampling"})[0] == 200
    assert call(server, "/optim_step", {"adam_params": {"learning_rate": 1e-3}})[0] == 200
    sampled = client.create_sampling_client().sample(ModelInput.from_ints([5, 6, 7]), 2,
                                                     SamplingParams(max_tokens=3)).result()
    after = status()
    assert after["phase"] == "running" and after["step"] == run.trainer.step
    assert count(after, "forward_backward", "refused") - count(before, "forward_backward", "refused") == 1
    assert count(after, "forward", "calls") - count(before, "forward", "calls") == 2
    assert count(after, "optim_step", "calls") - count(before, "optim_step", "calls") == 1
    tokens = 3 * 2 + sum(len(s.tokens) for s in sampled.sequences)  # the prompt once per sample, and each completion
    assert count(after, "sample", "tokens") - count(before, "sample", "tokens") == tokens
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=10) as r:
        text = r.read().decode()
    assert 'grpojob_service_requests_total{op="forward_backward",result="refused"}' in text
    assert 'grpojob_service_request_seconds_count{op="optim_step"}' in text
    assert 'grpojob_service_tokens_total{op="sample"}' in text and "grpojob_service_queued_requests 0.0" in text


def test_suspending_stops_serving_with_a_checkpoint(service):
    run, client, server, board, suspend, thread, phase = service
    suspend.set()
    thread.join(60)
    assert phase["end"] == "suspended" and run.checkpoints.last_step == run.trainer.step
    assert board.snapshot()["phase"] == "suspended"
    code, doc = call(server, "/forward", {"data": [GOOD], "loss_fn": "importance_sampling"})
    assert code == 503
