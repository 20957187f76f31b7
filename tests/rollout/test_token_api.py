"""Other libraries' token-in wire on a real hf rollout server (tiny model): vLLM's
`return_tokens_as_token_ids` and top-level `prompt_token_ids`, prime-rl's `/inference/v1/generate`
through the `renderers` client verifiers trains with, and vLLM's `/generate` + `/health` under
`/vllm` for Atropos. Tokens and log-probs are checked against transformers' own greedy decoding."""
from __future__ import annotations

import asyncio

import openai
import pytest

from .harness import TOKEN, RolloutProcess, greedy, http, load_model, make_job, write_config

MAX_TOKENS = 8
MESSAGES = [{"role": "user", "content": "count: 3 4"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_dir):
    tmp = tmp_path_factory.mktemp("token-api")
    srv = RolloutProcess(write_config(make_job(tiny_dir), tmp / "job.json"), tmp, replica="tokens").start()
    try:
        yield srv.wait_ready()
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def reference(tiny_dir, tokenizer):
    """(prompt ids, greedy ids, their log-probs) of MESSAGES under the model the server serves."""
    prompt = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    prompt_ids = list(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    ids, lps = greedy(load_model(tiny_dir), tokenizer, prompt_ids, MAX_TOKENS)
    return prompt_ids, ids, lps


def test_return_tokens_as_token_ids_and_top_level_prompt_ids(server, reference):
    prompt_ids, ids, lps = reference
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=TOKEN, max_retries=0)
    chat = client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0, logprobs=True,
        extra_body={"return_tokens_as_token_ids": True, "return_token_ids": True})
    assert chat.model_extra["prompt_token_ids"] == prompt_ids  # where vLLM (and verifiers <= 0.3) has it
    content = chat.choices[0].logprobs.content
    assert [int(t.token.removeprefix("token_id:")) for t in content] == ids
    assert all(t.token.startswith("token_id:") for t in content)
    assert [t.logprob for t in content] == pytest.approx(lps, abs=1e-4)
    status, rec = http(server.url + "/vllm/versions", {"sequences": [prompt_ids + ids, prompt_ids + ids[:1]]})
    assert status == 200 and rec["versions"] == [[0] * len(ids), None]  # served with return_token_ids: recorded

    text = client.completions.create(model="tiny", prompt=prompt_ids, max_tokens=MAX_TOKENS, temperature=0,
                                     logprobs=1, extra_body={"return_tokens_as_token_ids": True})
    assert text.choices[0].logprobs.tokens == [f"token_id:{t}" for t in ids]
    plain = client.completions.create(model="tiny", prompt=prompt_ids, max_tokens=MAX_TOKENS, temperature=0,
                                      logprobs=1)
    assert not any(t.startswith("token_id:") for t in plain.choices[0].logprobs.tokens)  # only when asked


def test_prime_rl_generate_through_the_renderers_client(server, reference, tiny_dir):
    renderers_client = pytest.importorskip("renderers.client", reason="renderers (verifiers' train client)")
    from renderers.base import create_renderer
    from transformers import AutoTokenizer

    prompt_ids, ids, lps = reference
    client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=TOKEN, max_retries=0)
    renderer = create_renderer(AutoTokenizer.from_pretrained(str(tiny_dir)))
    out = asyncio.run(renderers_client.generate(
        client=client, renderer=renderer, messages=MESSAGES, model="tiny",
        sampling_params={"temperature": 0.0, "max_tokens": MAX_TOKENS}))
    assert out["prompt_ids"] == prompt_ids
    # renderers stops at the template's end-of-turn token; greedy runs to EOS or the limit
    assert out["completion_ids"] == ids[:len(out["completion_ids"])] and out["completion_ids"]
    assert out["completion_logprobs"] == pytest.approx(lps[:len(out["completion_ids"])], abs=1e-4)

    status, raw = http(server.url + "/inference/v1/generate",
                       {"model": "tiny", "token_ids": prompt_ids, "sampling_params": {
                           "temperature": 0, "max_tokens": MAX_TOKENS, "logprobs": 1, "n": 2,
                           "stop_token_ids": [ids[1]], "repetition_penalty": 1.0}})
    assert status == 200, raw
    assert [c["token_ids"] for c in raw["choices"]] == [ids[:2], ids[:2]]  # cut after the stop token, kept
    assert raw["choices"][0]["finish_reason"] == "stop" and raw["choices"][0]["policy_version"] == 0
    status, bad = http(server.url + "/inference/v1/generate", {"model": "tiny", "token_ids": []})
    assert status == 400 and "token_ids" in bad["error"]["message"]


def test_vllm_generate_and_health_under_a_prefix(server, reference):
    prompt_ids, ids, lps = reference
    assert http(server.url + "/vllm/health")[0] == 200
    assert http(server.url + "/vllm/health", token=None)[0] == 401  # the job's token, as every path
    status, out = http(server.url + "/vllm/generate", {
        "prompt": {"prompt_token_ids": prompt_ids}, "logprobs": 0, "n": 2, "max_tokens": MAX_TOKENS,
        "temperature": 0})
    assert status == 200, out
    # Atropos's reading of it: logprobs[choice][k][0] = {"<id>": lp}
    for choice in out["logprobs"]:
        assert [int(next(iter(e[0]))) for e in choice] == ids
        assert [next(iter(e[0].values())) for e in choice] == pytest.approx(lps, abs=1e-4)
    assert out["token_ids"] == [ids, ids] and out["prompt_token_ids"] == prompt_ids
    assert len(out["finish_reasons"]) == 2 and out["policy_versions"] == [0, 0]
    # the OpenAI endpoints under the same prefix: an Atropos base_url .../vllm/v1 reaches both
    client = openai.OpenAI(base_url=server.url + "/vllm/v1", api_key=TOKEN, max_retries=0)
    assert client.models.list().data[0].model_extra["max_model_len"] > 0


def test_an_environment_without_tokenizer_files_gets_the_servers(server, tokenizer, tmp_path):
    """GET /vllm/tokenizer and the Atropos launcher's use of it (an environment pod has no model
    volume): the files it writes give the same chat template and token ids as the model's own."""
    from transformers import AutoTokenizer

    from grpojob.integrations.atropos import command, fetch_tokenizer

    assert http(server.url + "/vllm/tokenizer", token=None)[0] == 401
    (tmp_path / "token").write_text(TOKEN)
    environ = {"GRPOJOB_TOKEN_FILE": str(tmp_path / "token"), "OPENAI_BASE_URL": server.url + "/v1",
               "GRPOJOB_TRAJECTORY_URL": "http://trainer:8080/trajectories"}
    got = fetch_tokenizer(environ, tmp_path / "tok")
    fetched = AutoTokenizer.from_pretrained(got)
    text = fetched.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    assert text == tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    assert fetched(text)["input_ids"] == tokenizer(text)["input_ids"] and len(fetched) == len(tokenizer)
    cmd = command(["env.py", "serve"], environ, tokenizer=got)  # no model files here (no GRPOJOB_CONFIG)
    flags = dict(zip(cmd[3::2], cmd[4::2]))
    assert flags["--env.tokenizer_name"] == flags["--openai.tokenizer_name"] == got
