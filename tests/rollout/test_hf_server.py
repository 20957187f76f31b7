"""The hf rollout server as a real process: readiness, weight pushes, /generate, OpenAI endpoints,
metrics, bad input."""
from __future__ import annotations

import openai
import pytest
import torch

from grpojob.sync.publisher import WeightPublisher

from .harness import (PROMPTS, TOKEN, RolloutProcess, free_port, greedy, http, load_model, make_job, perturb,
                      write_config)

pytestmark = pytest.mark.contract  # what we use of transformers: every CI dependency set runs it

MAX_TOKENS = 12


@pytest.fixture(scope="module", params=["untied", "tied"])
def synced(request, tmp_path_factory, tiny_dir, tiny_tied_dir):
    """One hf server per model, started BEFORE its trainer's store exists, then joined to it."""
    model_dir = tiny_dir if request.param == "untied" else tiny_tied_dir
    tmp = tmp_path_factory.mktemp(f"hf-{request.param}")
    job = make_job(model_dir)
    port = free_port()
    srv = RolloutProcess(write_config(job, tmp / "job.json"), tmp, replica=f"hf-{request.param}",
                         sync_addr=f"127.0.0.1:{port}").start()
    pub = None
    try:
        srv.wait_healthy()
        # Observed before the trainer exists: serving version 0, but not ready.
        from .harness import wait_for
        wait_for(lambda: srv.status("/info")[1].get("engine") == "up", 60, "engine up", proc=srv.proc)
        before = {"readyz": srv.status("/readyz"), "generate": srv.generate([5, 6, 7], temperature=0, max_tokens=3)}
        pub = WeightPublisher(job.spec.weight_sync, host="127.0.0.1", port=port, device="cpu", heartbeat_timeout=5,
                              token=TOKEN)
        srv.wait_ready()
        yield {"pub": pub, "srv": srv, "model_dir": model_dir, "before": before, "job": job}
    finally:
        srv.stop()
        if pub:
            pub.close()


def test_ready_only_once_the_trainer_confirms_its_version(synced):
    status, body = synced["before"]["readyz"]
    assert status == 503 and "waiting for the trainer's weight-sync store" in body["reason"]
    assert synced["before"]["generate"]["policy_version"] == 0  # initial weights serve meanwhile
    assert synced["pub"].rollout_addresses() == [synced["srv"].url]


def test_push_then_greedy_equals_the_trainers_model(synced, tokenizer):
    pub, srv, model_dir = synced["pub"], synced["srv"], synced["model_dir"]
    prompts = [tokenizer.encode(p) for p in PROMPTS]
    before = [srv.generate(p, temperature=0, max_tokens=MAX_TOKENS)["completions"][0]["completion_ids"]
              for p in prompts]
    for version, seed in ((1, 11), (2, 12)):  # two pushes: the second reuses the group
        trainer = perturb(load_model(model_dir), seed=seed)
        stats = pub.push(trainer.state_dict().items(), version=version)
        assert stats["servers"] == 1 and stats["dropped"] == [] and stats["version"] == version
        assert stats["paths"] == {"gloo": [srv.replica]}  # both ends pinned to the CPU
        after = []
        for p in prompts:
            out = srv.generate(p, temperature=0, max_tokens=MAX_TOKENS)
            ref_ids, ref_lp = greedy(trainer, tokenizer, p, MAX_TOKENS)
            c = out["completions"][0]
            assert c["completion_ids"] == ref_ids
            assert c["logprobs"] == pytest.approx(ref_lp, abs=1e-4)
            assert c["policy_version"] == out["policy_version"] == version
            after.append(c["completion_ids"])
        assert after != before  # the weights really changed what the server generates
        before = after
    assert srv.status("/readyz")[0] == 200


def test_openai_endpoints_answer_the_openai_client(synced, tokenizer):
    if synced["srv"].replica != "hf-untied":
        pytest.skip("one model is enough for the API shape")
    srv = synced["srv"]
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key=TOKEN, max_retries=0)
    assert [m.id for m in client.models.list().data] == [synced["model_dir"].name]
    prompt = PROMPTS[1]
    ref = srv.generate(tokenizer.encode(prompt), temperature=0, max_tokens=6)["completions"][0]
    resp = client.completions.create(model="tiny", prompt=prompt, max_tokens=6, temperature=0, n=2, logprobs=1,
                                      extra_body={"return_token_ids": True})
    assert len(resp.choices) == 2
    for ch in resp.choices:
        assert ch.text == ref["text"]
        assert ch.model_extra["token_ids"] == ref["completion_ids"]
        assert ch.logprobs.token_logprobs == pytest.approx(ref["logprobs"], abs=1e-5)
    assert resp.usage.completion_tokens == 2 * len(ref["completion_ids"])
    assert resp.model_extra["policy_version"] == srv.status("/info")[1]["policy_version"]

    messages = [{"role": "user", "content": "count: 3 4"}]
    chat = client.chat.completions.create(model="tiny", messages=messages, max_tokens=5, temperature=0, logprobs=True)
    chat_ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    chat_ids = list(chat_ids["input_ids"] if hasattr(chat_ids, "keys") else chat_ids)
    ref = srv.generate(chat_ids, temperature=0, max_tokens=5)["completions"][0]
    assert chat.choices[0].message.role == "assistant"
    assert chat.choices[0].message.content == ref["text"]
    assert [t.logprob for t in chat.choices[0].logprobs.content] == pytest.approx(ref["logprobs"], abs=1e-5)

    with pytest.raises(openai.BadRequestError, match="echo"):
        client.completions.create(model="tiny", prompt=prompt, max_tokens=3, echo=True)


def test_stop_strings_cut_the_text(synced, tokenizer):
    if synced["srv"].replica != "hf-untied":
        pytest.skip("one model is enough")
    srv = synced["srv"]
    full = http(srv.url + "/v1/completions", {"prompt": PROMPTS[0], "max_tokens": 12, "temperature": 0})[1]
    text = full["choices"][0]["text"]
    stop = text[len(text) // 2:len(text) // 2 + 2]
    assert stop, text
    cut = http(srv.url + "/v1/completions", {"prompt": PROMPTS[0], "max_tokens": 12, "temperature": 0,
                                             "stop": [stop]})[1]["choices"][0]
    assert cut["text"] == text[:text.index(stop)] and cut["finish_reason"] == "stop"


def test_bad_requests_name_the_field(synced):
    srv = synced["srv"]
    status, body = http(srv.url + "/generate", {"prompt_ids": [1, 2], "n": 0})
    assert status == 400 and body["error"].startswith("n:")
    status, body = http(srv.url + "/generate", {"prompt_ids": [10 ** 6], "n": 1})
    assert status == 400 and "outside the vocabulary" in body["error"]
    status, body = http(srv.url + "/generate", {"prompt_ids": [1], "sampling": {"temprature": 1}})
    assert status == 400 and "sampling.temprature" in body["error"]
    status, body = http(srv.url + "/generate", {"prompt_ids": [1, 2], "sampling": {"max_tokens": 10 ** 6}})
    assert status == 400 and "context length" in body["error"]
    version = srv.status("/info")[1]["policy_version"]
    status, body = http(srv.url + "/generate", {"prompt_ids": [1, 2], "min_version": version + 1})
    assert status == 409 and body["policy_version"] == version


def test_sleep_and_wake_over_http_report_the_engines_numbers(synced):
    """The turn-taking endpoints (spec.placement colocated), with the job's token like the rest."""
    srv = synced["srv"]
    assert http(srv.url + "/sleep", {"level": 1}, token=None)[0] == 401
    status, body = http(srv.url + "/sleep", {"level": 2})
    assert status == 400 and "level 1 only" in body["error"]
    status, slept = http(srv.url + "/sleep", {"level": 1})
    assert status == 200 and slept["asleep"] and slept["freed_bytes"] > 0 and slept["host_peak_bytes"] > 0
    status, woke = http(srv.url + "/wake_up", {})
    assert status == 200 and not woke["asleep"] and woke["decode_steps"] == slept["decode_steps"]
    status, marked = http(srv.url + "/memory", {"phase": "sync"})
    assert status == 200 and marked["host_peak_bytes"] > 0
    assert srv.generate([5, 6, 7], temperature=0, max_tokens=3)["completions"]  # generating again


def test_generate_without_sampling_takes_the_jobs_rollout_sampling(synced):
    """No `sampling` in the request: the job's rollout.sampling (maxTokens 12 here), not the request
    model's defaults (256 tokens, more than this 128-token context holds)."""
    srv = synced["srv"]
    status, body = http(srv.url + "/generate", {"prompt_ids": [5, 6, 7], "n": 4})
    assert status == 200, body
    lengths = [len(c["completion_ids"]) for c in body["completions"]]
    assert len(lengths) == 4 and max(lengths) <= synced["job"].spec.rollout.sampling.max_tokens


def test_metrics_report_generation_and_version(synced):
    srv, pub = synced["srv"], synced["pub"]
    version = srv.status("/info")[1]["policy_version"] + 1
    pub.push(perturb(load_model(synced["model_dir"]), seed=version).state_dict().items(), version=version)
    srv.generate([5, 6, 7], n=3, temperature=1.0, max_tokens=4)
    import urllib.request
    text = urllib.request.urlopen(srv.url + "/metrics", timeout=10).read().decode()
    values = {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
              if line and not line.startswith("#")}
    assert values["grpojob_rollout_weight_version"] == version
    assert values["grpojob_rollout_generated_tokens_total"] >= 3
    assert values['grpojob_rollout_requests_total{result="ok"}'] >= 1
    assert values["grpojob_rollout_tokens_per_second"] > 0
    assert "grpojob_rollout_queue_depth" in values and "grpojob_rollout_running_requests" in values
    assert values["grpojob_rollout_last_sync_seconds"] > 0


def _greedy_as_the_trainer(srv, trainer, tokenizer, version: int) -> list[list[int]]:
    """The server's greedy completion of each prompt, checked equal to the trainer's and tagged `version`."""
    outs = []
    for text in PROMPTS:
        p = tokenizer.encode(text)
        out = srv.generate(p, temperature=0, max_tokens=MAX_TOKENS)
        assert out["completions"][0]["completion_ids"] == greedy(trainer, tokenizer, p, MAX_TOKENS)[0]
        assert out["policy_version"] == version
        outs.append(out["completions"][0]["completion_ids"])
    return outs


def test_checkpoint_backend_serves_the_pushed_weights(tmp_path, tiny_dir, tokenizer):
    """weightSync.backend checkpoint: the weights go through a shared directory, not a collective."""
    job = make_job(tiny_dir, weightSync={"backend": "checkpoint"})
    shared = tmp_path / "checkpoints"
    pub = WeightPublisher(job.spec.weight_sync, host="127.0.0.1", port=0, device="cpu", checkpoint_dir=str(shared),
                          heartbeat_timeout=5, token=TOKEN)
    srv = RolloutProcess(write_config(job, tmp_path / "job.json"), tmp_path, replica="hf-ckpt",
                         sync_addr=f"127.0.0.1:{pub.port}", checkpoint_dir=str(shared)).start()
    try:
        srv.wait_ready()
        trainer = perturb(load_model(tiny_dir), seed=3)
        stats = pub.push(trainer.state_dict().items(), version=1)
        assert stats["servers"] == 1 and stats["backend"] == "checkpoint"
        assert (shared / "rollout-weights" / "v000000001" / "model.safetensors").exists()
        before = _greedy_as_the_trainer(srv, trainer, tokenizer, version=1)
        # One tensor changes (the final norm, negated: every logit flips): the hf engine declares
        # delta_files, so version 2 is written as a delta of that tensor alone and applied in place.
        with torch.no_grad():
            trainer.model.norm.weight.neg_()
        stats = pub.push(trainer.state_dict().items(), version=2)
        assert stats["servers"] == 1 and stats["delta"]["sent_values"] == trainer.model.norm.weight.numel()
        assert (shared / "rollout-weights" / "v000000002-delta").is_dir()
        assert not (shared / "rollout-weights" / "v000000002").exists()
        after = _greedy_as_the_trainer(srv, trainer, tokenizer, version=2)
        assert after != before  # the delta reached what generates
    finally:
        srv.stop()
        pub.close()
