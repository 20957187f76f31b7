"""grpojob.integrations.art's parts without ART or a job: ART's per-call settings against a spec
(honoured or refused by name), ART trajectories (real `openai` Choice objects, as the rollout
servers answer through the backend's endpoint) to the trajectory API's groups with exact tokens
and masks, and the endpoint forwarding to a real HTTP server with what ART's own server would add.
The whole path with openpipe-art and a GRPOJob is tests/integrations/test_art_train.py."""
from __future__ import annotations

import asyncio
import json

import pytest

from grpojob.integrations import art_settings
from grpojob.integrations.art_endpoint import Forwarder, rewrite
from grpojob.integrations.art_groups import EpisodeError, group_doc, trajectory_episode

openai_chat = pytest.importorskip("openai.types.chat.chat_completion")
SPEC = {"training": {"learningRate": 0.003}, "algorithm": {"name": "grpo", "clipEpsLow": 0.2}}


# ---- settings ------------------------------------------------------------------------------------
def test_settings_the_job_has_are_honoured_when_they_agree_and_refused_by_name_otherwise():
    art_settings.check({"learning_rate": 0.003, "epsilon": 0.2, "ppo": True, "scale_rewards": True,
                        "importance_sampling_level": "token", "kl_penalty_coef": 0.0, "verbose": True}, SPEC)
    art_settings.check({}, SPEC)  # nothing passed: the job's values apply
    with pytest.raises(art_settings.SettingRefused) as e:
        art_settings.check({"learning_rate": 1e-5, "loss_fn": "cispo", "epsilon_high": 0.28}, SPEC)
    msg = str(e.value)
    assert "learning_rate=1e-05" in msg and "spec.training.learningRate = 0.003" in msg
    assert "loss_fn='cispo'" in msg and "no CISPO" in msg
    assert "epsilon_high=0.28" in msg and "spec.algorithm.clipEpsHigh = 0.2" in msg  # the spec's default


def test_settings_without_an_equivalent_are_refused_and_unknown_names_are_a_type_error():
    for key, value, words in [("kl_penalty_coef", 0.1, "spec.algorithm.klBeta"),
                              ("adam_params", {"lr": 1}, "the optimizer is the job's"),
                              ("allow_training_without_logprobs", True, "exact tokens"),
                              ("scale_rewards", False, "advantageNormalization = 'group'"),
                              ("importance_sampling_level", "sequence", "gspo")]:
        with pytest.raises(art_settings.SettingRefused, match=key) as e:
            art_settings.check({key: value}, SPEC)
        assert words in str(e.value)
    art_settings.check({"importance_sampling_level": "sequence"}, {"algorithm": {"name": "gspo"}})
    with pytest.raises(TypeError, match="learning_rat"):
        art_settings.check({"learning_rat": 0.003}, SPEC)


# ---- trajectories -> groups ------------------------------------------------------------------------
def choice(prompt, ids, lps, version=3, finish="stop", token_ids=True):
    """A chat Choice as the rollout server returns it with return_token_ids and return_tokens_as_token_ids."""
    doc = {"index": 0, "finish_reason": finish, "message": {"role": "assistant", "content": "x"},
           "logprobs": {"content": [{"token": f"token_id:{t}", "logprob": lp, "bytes": None, "top_logprobs": []}
                                    for t, lp in zip(ids, lps)]},
           "policy_version": version}
    if token_ids:
        doc.update(prompt_token_ids=prompt, token_ids=ids)
    return openai_chat.Choice.model_validate(doc)


class Traj:  # the attributes of art.Trajectory that are read (ART itself: test_art_train.py)
    def __init__(self, items, reward, metrics=None):
        self.messages_and_choices, self.reward, self.metrics = items, reward, metrics or {}
        self.additional_histories = []


USER = {"role": "user", "content": "list animals :"}


def test_a_two_turn_trajectory_is_one_sequence_with_the_context_masked():
    t = Traj([USER, choice([1, 2, 3], [10, 11], [-0.5, -0.25], version=4), {"role": "user", "content": "more"},
              choice([1, 2, 3, 10, 11, 7, 8], [12], [-1.0], version=5, finish="length")], 0.5)
    ep = trajectory_episode(t)
    assert ep.prompt_ids == [1, 2, 3] and ep.completion_ids == [10, 11, 7, 8, 12]
    assert ep.loss_mask == [1, 1, 0, 0, 1] and ep.logprobs == [-0.5, -0.25, 0.0, 0.0, -1.0]
    assert ep.versions == [4, 4, 4, 4, 5] and ep.finish_reason == "length" and ep.reward == 0.5


def test_a_rewritten_history_or_a_choice_without_tokens_is_refused_with_the_reason():
    bad = Traj([USER, choice([1, 2], [10], [-0.5]), choice([1, 2, 99, 7], [12], [-1.0])], 0.0)
    with pytest.raises(EpisodeError, match="does not continue"):
        trajectory_episode(bad)
    with pytest.raises(EpisodeError, match="model.openai_client"):
        trajectory_episode(Traj([USER, choice(None, [10], [-0.5], token_ids=False)], 0.0))
    with pytest.raises(EpisodeError, match="no trained turn"):
        trajectory_episode(Traj([USER, {"role": "assistant", "content": "hi"}], 0.0))


def test_a_group_shares_its_common_prompt_and_keeps_exact_tokens_log_probs_and_parts():
    a = Traj([USER, choice([1, 2, 3], [10, 11], [-0.5, -0.25])], 1.0, {"has_word": 1, "duration": 0.2, "completion_tokens": 2})
    b = Traj([USER, choice([1, 2, 4], [12], [-2.0], version=2)], 0.0, {"has_word": 0, "duration": 0.1, "completion_tokens": 1})
    doc = group_doc([a, b])
    assert doc["prompt_ids"] == [1, 2] and doc["rewards"] == [1.0, 0.0]
    first, second = doc["completions"]
    assert first["token_ids"] == [3, 10, 11] and first["loss_mask"] == [0, 1, 1]
    assert first["logprobs"] == [0.0, -0.5, -0.25] and first["policy_version"] == 3
    assert second["token_ids"] == [4, 12] and second["policy_version"] == 2
    assert doc["reward_parts"] == {"has_word": [1.0, 0.0]}  # durations and token counts are not reward parts
    same = group_doc([a, a])
    assert same["prompt_ids"] == [1, 2, 3] and same["completions"][0]["loss_mask"] is None  # all trained


# ---- the endpoint ------------------------------------------------------------------------------------
def test_rewrite_asks_for_what_arts_own_server_gives_and_the_jobs_sampling():
    s = {"temperature": 0.7, "top_p": 0.9, "top_k": -1, "max_tokens": 4}
    chat = rewrite("/chat/completions", {"messages": [], "temperature": 0.1}, s)
    assert chat["logprobs"] is True and chat["return_tokens_as_token_ids"] and chat["return_token_ids"]
    assert (chat["temperature"], chat["top_p"], chat["top_k"]) == (0.7, 0.9, -1) and "max_tokens" not in chat
    assert rewrite("/completions", {"prompt": "a", "logprobs": 3}, None)["logprobs"] == 3
    assert rewrite("/completions", {"prompt": "a"}, None)["logprobs"] == 1
    assert rewrite("/models", {"x": 1}, s) == {"x": 1}


def test_the_forwarder_passes_requests_on_with_the_clients_token_to_each_rollout_server():
    from aiohttp import web

    from grpojob.local.processes import free_port

    seen: list[tuple[str, dict, str]] = []

    def upstream(name):
        async def handle(request):
            body = await request.json()
            seen.append((name, body, request.headers.get("Authorization", "")))
            return web.json_response({"id": "c", "object": "chat.completion", "created": 0, "model": "m",
                                      "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None,
                                                   "message": {"role": "assistant", "content": name}}]})
        return handle

    async def main():
        runners, urls = [], []
        for name in ("a", "b"):
            app = web.Application()
            app.router.add_post("/v1/chat/completions", upstream(name))
            runner = web.AppRunner(app)
            await runner.setup()
            port = free_port()
            await web.TCPSite(runner, "127.0.0.1", port).start()
            runners.append(runner)
            urls.append(f"http://127.0.0.1:{port}/v1")
        fwd = Forwarder(urls, {"temperature": 1.0}).start()
        try:
            from openai import AsyncOpenAI

            client = AsyncOpenAI(base_url=fwd.base_url, api_key="the-token")
            texts = [(await client.chat.completions.create(model="p", messages=[USER], max_tokens=4))
                     .choices[0].message.content for _ in range(2)]
            await client.close()
        finally:
            fwd.close()
            for r in runners:
                await r.cleanup()
        return texts

    texts = asyncio.run(main())
    assert sorted(texts) == ["a", "b"]  # round-robin over the rollout servers
    for _, body, auth in seen:
        assert auth == "Bearer the-token" and body["logprobs"] is True and body["return_token_ids"] is True
        assert body["return_tokens_as_token_ids"] is True and body["max_tokens"] == 4
        assert json.dumps(body["messages"]) == json.dumps([USER])
