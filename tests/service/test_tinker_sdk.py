"""The real tinker SDK (PyPI `tinker`, pinned in the `tinker` extra) drives a GRPOJob in mode
service through Tinker's own wire (grpojob.service.tinker_api on the trainer leader, the job's
token as the API key `tml-<token>`): a loop written against Tinker learns the toy task, and every
call a Tinker loop makes is served or refused with its name. The job is a LoRA job on the tiny
model built here (nothing is downloaded), served by the real trainer assembly in this process."""
from __future__ import annotations

import math
import statistics
import threading
import time
import urllib.error
import urllib.request
from itertools import cycle, islice

import pytest
import tinker
from tinker import types

from grpojob.auth import Auth
from grpojob.data.builtin import toy as toy_rows
from grpojob.leader.build import build
from grpojob.leader.server import LeaderServer, StatusBoard
from grpojob.rewards.builtin import toy as toy_reward
from grpojob.service.app import serve
from tests.trainer.conftest import make_job

TOKEN = "tinker-token"
RANK = 8


@pytest.fixture
def job(tiny_sharp_dir, tmp_path):
    """A LoRA GRPOJob in mode service on 127.0.0.1, and a tinker.ServiceClient pointed at it."""
    spec = make_job(tiny_sharp_dir, mode="service", model={"lora": {"rank": RANK, "alpha": 16}},
                    training={"microBatchTokens": 2048, "gradClip": 1.0})
    board, suspend = StatusBoard(), threading.Event()
    board.suspend_requested = suspend
    server = LeaderServer(board, "127.0.0.1", 0, Auth(TOKEN)).start()
    run = build(spec, rollouts="inprocess", checkpoint_dir=str(tmp_path / "ck"), run_dir=str(tmp_path), board=board,
                suspend=suspend)
    thread = threading.Thread(target=lambda: serve(run, server), daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while server.handler.service is None:
        assert thread.is_alive() and time.monotonic() < deadline
        time.sleep(0.05)
    url = f"http://127.0.0.1:{server.port}"
    service = tinker.ServiceClient(base_url=url, api_key="tml-" + TOKEN)
    yield run, service, str(tiny_sharp_dir), url
    service.close("success")
    suspend.set()
    thread.join(60)
    server.stop()


def rl_datum(prompt: list[int], completion: list[int], logprobs: list[float], advantage: float) -> types.Datum:
    """Tinker's alignment: position i of the input predicts token i + 1 of prompt + completion."""
    full, pad = prompt + completion, len(prompt) - 1
    return types.Datum(model_input=types.ModelInput.from_ints(full[:-1]),
                       loss_fn_inputs={"target_tokens": full[1:], "logprobs": [0.0] * pad + list(logprobs),
                                       "advantages": [0.0] * pad + [advantage] * len(completion)})


def test_a_tinker_loop_learns_the_toy_task(job):
    run, service, model, _ = job
    training = service.create_lora_training_client(base_model=model, rank=RANK).result()
    tokenizer = training.get_tokenizer()
    sampler = training.save_weights_and_get_sampling_client().result()
    rows = cycle(list(toy_rows(size=64, seed=0)))
    params = types.SamplingParams(max_tokens=4, temperature=1.0)
    rewards: list[float] = []
    for step in range(1, 121):
        batch = list(islice(rows, 16))
        prompts = [tokenizer(r["prompt"])["input_ids"] for r in batch]
        futures = [sampler.sample(types.ModelInput.from_ints(p), 8, params) for p in prompts]
        groups = []
        for row, prompt, future in zip(batch, prompts, futures):
            seqs = future.result().sequences
            groups.append((prompt, seqs, [toy_reward(row["prompt"], tokenizer.decode(s.tokens), row["answer"])
                                          for s in seqs]))
        tokens = sum(len(s.tokens) for _, seqs, _ in groups for s in seqs)
        data = []
        for prompt, seqs, rs in groups:  # group-normalised advantages, a token mean over the step
            mean, std = statistics.fmean(rs), statistics.pstdev(rs)
            data += [rl_datum(prompt, s.tokens, s.logprobs, (r - mean) / (std + 1e-6) / tokens) for s, r in zip(seqs, rs)]
        fwd = training.forward_backward(data, "importance_sampling")
        step_done = training.optim_step(types.AdamParams(learning_rate=3e-3, grad_clip_norm=1.0))  # Tinker's betas, eps
        assert fwd.result().metrics["tokens:sum"] > 0
        assert step_done.result().metrics["policy_version"] == step
        sampler = training.save_weights_and_get_sampling_client().result()
        rewards.append(statistics.fmean(r for _, _, rs in groups for r in rs))
        if step >= 10 and statistics.fmean(rewards[-3:]) >= statistics.fmean(rewards[:3]) + 0.4:
            break
    first, last = statistics.fmean(rewards[:3]), statistics.fmean(rewards[-3:])
    print(f"tinker SDK loop: reward {first:.3f} -> {last:.3f} in {len(rewards)} steps")
    assert last >= first + 0.3, f"reward {first:.3f} -> {last:.3f} in {len(rewards)} steps"
    assert run.trainer.step == len(rewards)


def test_every_call_of_a_tinker_loop_is_served_or_refused_by_name(job):
    run, service, model, url = job
    with pytest.raises(Exception, match="spec.model.lora.rank 8"):
        service.create_lora_training_client(base_model=model, rank=32).result()
    with pytest.raises(Exception, match="this GRPOJob trains"):
        service.create_lora_training_client(base_model="Qwen/Qwen3-8B", rank=RANK).result()
    training = service.create_lora_training_client(base_model=model, rank=RANK).result()
    info = training.get_info()
    assert (info.is_lora, info.lora_rank, info.model_data.model_name) == (True, RANK, model)
    tokenizer = training.get_tokenizer()
    prompt = tokenizer("list animals :")["input_ids"]
    completion = tokenizer(" cat dog")["input_ids"]
    rl = rl_datum(prompt, completion, [-2.0] * len(completion), 1.0)
    full = prompt + completion
    ce = types.Datum(model_input=types.ModelInput.from_ints(full[:-1]), loss_fn_inputs={"target_tokens": full[1:]})

    # forward with every loss: the trainer's logprobs, each loss from grpojob.algorithms.losses
    base = training.forward([ce], "cross_entropy").result()
    logp = base.loss_fn_outputs[0]["logprobs"].to_numpy()
    assert len(logp) == len(full) - 1 and base.metrics["loss:sum"] == pytest.approx(-logp.sum(), rel=1e-4)
    for loss, config in (("importance_sampling", None), ("ppo", None), ("cispo", {"clip_high_threshold": 1.5}),
                         ("dro", {"beta": 0.1})):
        out = training.forward([rl], loss, config).result()
        assert out.loss_fn_outputs[0]["logprobs"].to_numpy() == pytest.approx(logp, abs=1e-5), loss
        assert math.isfinite(out.metrics["loss:sum"]), loss
    with pytest.raises(Exception, match="loss_fn: Input should be"):
        training.forward([rl], "gspo").result()

    # forward_backward_custom: -sum(logprobs) runs as cross_entropy with weights -dC/dlogp = 1
    custom = training.forward_backward_custom([ce], lambda data, lps: (-sum(lp.sum() for lp in lps), {})).result()
    assert custom.metrics["loss:sum"] == pytest.approx(-logp.sum(), rel=1e-4)
    stepped = training.optim_step(types.AdamParams(learning_rate=1e-3)).result()
    assert stepped.metrics["policy_version"] == 1 and stepped.metrics["learning_rate"] == 1e-3

    # sampling: stop token ids cut a completion after the first one, prompt logprobs are the trainer's
    sampler = training.save_weights_and_get_sampling_client().result()
    stops = list(range(0, 512, 2))
    got = sampler.sample(types.ModelInput.from_ints(prompt), 16, types.SamplingParams(max_tokens=4, stop=stops),
                         include_prompt_logprobs=True).result()
    assert len(got.sequences) == 16 and {s.sequence_id for s in got.sequences}.__len__() == 16
    cut = 0
    for s in got.sequences:
        assert not set(s.tokens[:-1]) & set(stops) and len(s.logprobs) == len(s.tokens) <= 4
        if s.tokens[-1] in stops:
            assert s.stop_reason == "stop"
            cut += len(s.tokens) < 4
    assert cut > 0
    now = training.forward([types.Datum(model_input=types.ModelInput.from_ints(prompt[:-1]),
                                        loss_fn_inputs={"target_tokens": prompt[1:]})], "cross_entropy").result()
    expect = now.loss_fn_outputs[0]["logprobs"].to_numpy()
    assert got.prompt_logprobs[0] is None and got.prompt_logprobs[1:] == pytest.approx(expect, abs=1e-5)
    assert sampler.compute_logprobs(types.ModelInput.from_ints(prompt)).result()[1:] == pytest.approx(expect, abs=1e-5)
    with pytest.raises(Exception, match="topk_prompt_logprobs: not served"):
        sampler.sample(types.ModelInput.from_ints(prompt), 1, types.SamplingParams(max_tokens=2),
                       include_prompt_logprobs=True, topk_prompt_logprobs=3).result()

    # save_state / load_state (weights only) / load_state_with_optimizer, tinker:// paths
    at_save = training.forward([ce], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_numpy()
    saved = training.save_state("mine").result()
    assert saved.path == "tinker://grpojob/weights/mine"
    training.forward_backward([ce], "cross_entropy").result()
    training.optim_step(types.AdamParams(learning_rate=5e-2)).result()
    moved = training.forward([ce], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_numpy()
    assert moved != pytest.approx(at_save, abs=1e-4)
    with pytest.warns(FutureWarning):
        training.load_state(saved.path).result()
    assert len(run.trainer.optimizer.state) == 0  # Tinker's load_state: the weights, a fresh optimizer
    back = training.forward([ce], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_numpy()
    assert back == pytest.approx(at_save, abs=1e-6)
    with pytest.warns(FutureWarning):
        training.load_state_with_optimizer(saved.path).result()
    assert len(run.trainer.optimizer.state) > 0
    resumed = service.create_training_client_from_state_with_optimizer(saved.path).result()
    assert resumed.get_info().lora_rank == RANK

    # the old sampler's version is no longer served once newer weights are; a named one is
    named = training.save_weights_for_sampler("snap").result()
    assert named.path == "tinker://grpojob/sampler_weights/snap"
    with pytest.raises(Exception, match="no longer served"):
        sampler.sample(types.ModelInput.from_ints(prompt), 1, types.SamplingParams(max_tokens=2)).result()
    fresh = service.create_sampling_client(model_path=named.path).result()
    assert len(fresh.sample(types.ModelInput.from_ints(prompt), 2, types.SamplingParams(max_tokens=2)
                            ).result().sequences) == 2

    # /status counts the calls as it counts the /service ones
    ops = run.loop.board.snapshot()["service"]["ops"]
    assert (ops["optim_step"]["calls"], ops["optim_step"]["refused"]) == (2, 0)
    assert ops["sample"]["refused"] == 2 and ops["sample"]["calls"] >= 5 and ops["sample"]["tokens"] > 0
    assert ops["forward_backward"]["refused"] == 1 and ops["forward"]["calls"] >= 8

    # RestClient: the job's one model; what a GRPOJob keeps elsewhere is refused by route
    rest = tinker.RestClient(base_url=url, api_key="tml-" + TOKEN)
    (only,) = rest.get_server_capabilities().result().supported_models
    assert (only.model_name, only.trainable, only.sampleable) == (model, True, True)
    with pytest.raises(Exception, match="not served by a GRPOJob"):
        rest.list_checkpoints(training.model_id).result()

    # another SDK release than the one served is refused before anything else
    refused = urllib.request.Request(url + "/api/v1/client/config", data=b'{"sdk_version": "0.22.7"}',
                                     headers={"X-API-Key": "tml-" + TOKEN, "Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(refused, timeout=10)
    assert e.value.code == 400 and "this GRPOJob serves the wire of tinker 0.38.x only" in e.value.read().decode()

    # the job's token is the API key; another key is refused
    with pytest.raises(tinker.AuthenticationError):
        tinker.ServiceClient(base_url=url, api_key="tml-wrong").create_lora_training_client(
            base_model=model, rank=RANK).result()
