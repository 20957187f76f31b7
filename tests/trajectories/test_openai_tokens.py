"""What an environment reads back from the OpenAI endpoints to build a group: the exact token ids,
their log-probs and the policy version(s), aligned, also when a stop string cuts the text."""
from __future__ import annotations

from grpojob.rollout import openai_api as oai
from grpojob.contracts.rollout import Completion


def test_completions_return_tokens_logprobs_and_versions_aligned(tokenizer):
    prompt = tokenizer.encode("question : what is 3 + 4 ? answer :")
    ids = tokenizer.encode(" 7 . #### 7")
    text = tokenizer.decode(ids)
    lps = [-0.5 * (i + 1) for i in range(len(ids))]
    versions = [3] * 2 + [4] * (len(ids) - 2)  # a weight push landed after two tokens
    c = Completion(prompt, ids, lps, policy_version=3, text=text, versions=versions)
    req = oai.CompletionRequest(prompt="x", n=1, logprobs=1, return_token_ids=True, stop=[" ####"])
    choice = oai.completion_response(req, [prompt], [[c]], tokenizer, "m")["choices"][0]
    assert choice["text"] == " 7 ." and choice["finish_reason"] == "stop"
    assert choice["prompt_token_ids"] == prompt
    # cut at the token where the stop string begins; log-probs and versions cut alike
    k = next(k for k in range(1, len(ids) + 1) if len(tokenizer.decode(ids[:k])) > text.find(" ####"))
    assert 2 < k < len(ids) and choice["token_ids"] == ids[:k]
    assert choice["logprobs"]["token_logprobs"] == lps[:k]
    assert choice["token_versions"] == versions[:k] and choice["policy_version"] == 3

    plain = oai.CompletionRequest(prompt="x", n=1)
    choice = oai.completion_response(plain, [prompt], [[Completion(prompt, ids, lps, 5)]], tokenizer, "m")
    assert choice["choices"][0]["policy_version"] == 5 and choice["policy_version"] == 5
    assert "token_ids" not in choice["choices"][0] and "token_versions" not in choice["choices"][0]


def test_chat_returns_the_same(tokenizer):
    ids = tokenizer.encode(" 7")
    lps = [-0.25] * len(ids)
    req = oai.ChatRequest(messages=[{"role": "user", "content": "3 + 4"}], logprobs=True, return_token_ids=True)
    prompt = req.prompt_ids(tokenizer)
    out = oai.chat_response(req, prompt, [Completion(prompt, ids, lps, 2, text=" 7")], tokenizer, "m")
    choice = out["choices"][0]
    assert choice["prompt_token_ids"] == prompt and choice["token_ids"] == ids
    assert [t["logprob"] for t in choice["logprobs"]["content"]] == lps
    assert choice["policy_version"] == out["policy_version"] == 2 and "token_versions" not in choice
