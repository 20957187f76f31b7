"""A generative judge (kind generative): the declared parser's cases, the hf engine's real generation
with the model's chat template, and the server and the trainer's scorer through it, unparseable
answers included. Its model is the tiny chat model of grpojob.judge.tiny, taught the rubric there:
"score: 9" for a category word, "score: 1" for another token, "I cannot tell" for "??"."""
from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
import torch

from grpojob.api import check
from grpojob.api.judge import JudgeScore
from grpojob.auth import ENV_TOKEN_FILE, Auth
from grpojob.judge import tiny
from grpojob.judge.engine import build
from grpojob.judge.generative import HFGenerative, parse, render
from grpojob.judge.server import Server
from grpojob.plan import ENV_JUDGE_URLS
from grpojob.rewards import RewardError, RewardScorer
from grpojob.rewards.judges import GroupSkipped

from .test_server import _group
from .test_spec import _doc

TOKEN = "g" * 43
NINE = 1.0
ONE = 1 / 9  # "score: 1" on the declared 0..9 scale


def _job(model, **judge):
    job, errors = check(_doc([{"judge": "rubric"}], [{
        "name": "rubric", "kind": "generative", "model": str(model), "system": tiny.RUBRIC_SYSTEM,
        "template": tiny.RUBRIC_TEMPLATE, "maxTokens": 8,
        "score": {"pattern": tiny.RUBRIC_PATTERN, "min": tiny.RUBRIC_RANGE[0], "max": tiny.RUBRIC_RANGE[1]}, **judge}]))
    assert not errors, errors
    return job


@pytest.mark.parametrize("answer, pattern, low, high, expected", [
    ("score: 7", r"score: (\d+)", 0, 10, 0.7),
    ("Score: 7/10. Then score: 2", r"(?i)score: (\d+)", 0, 10, 0.7),  # the first match
    ("rating 3.5 of 5", r"rating (-?[\d.]+)", 1, 5, 0.625),
    ("rating -1", r"rating (-?\d+)", -1, 1, 0.0),  # the bounds are inside the scale
    ("rating 1", r"rating (-?\d+)", -1, 1, 1.0),
    ("score: 11", r"score: (\d+)", 0, 10, None),  # outside the scale: not clamped
    ("score: -", r"score: (\S+)", 0, 10, None),  # not a number
    ("score: nan", r"score: (\S+)", 0, 10, None),  # a number, but not a finite one
    ("I cannot tell", r"score: (\d+)", 0, 10, None),  # no match
    ("score:", r"score:( \d+)?", 0, 10, None),  # the group did not take part in the match
])
def test_the_parser(answer, pattern, low, high, expected):
    got = parse(answer, JudgeScore(pattern=pattern, min=low, max=high))
    assert got == (None if expected is None else pytest.approx(expected))


@pytest.fixture(scope="module")
def hf_judge(generative_judge) -> HFGenerative:
    judge = build(_job(generative_judge).spec.judges[0])
    assert isinstance(judge, HFGenerative)
    return judge


def test_the_hf_engine_generates_with_the_chat_template_and_parses_the_answers(hf_judge):
    chat = hf_judge.render("list animals :", " dog")
    assert chat == [{"role": "system", "content": tiny.RUBRIC_SYSTEM}, {"role": "user", "content": "Rate:  dog"}]
    text = render(hf_judge.tokenizer, chat)
    assert text == ("<|im_start|>system\nRate the word.<|im_end|>\n<|im_start|>user\nRate:  dog<|im_end|>\n"
                    "<|im_start|>assistant\n")  # the model's own (ChatML) template, its turn opened
    items = [" dog", " red", "xq", "ing", " " + tiny.UNREADABLE, " cat"]
    chats = [hf_judge.render("p", c) for c in items]
    answers = hf_judge.answer(chats)
    assert answers == ["score: 9", "score: 9", "score: 1", "score: 1", "I cannot tell", "score: 9"]
    assert hf_judge.score(chats) == pytest.approx([NINE, NINE, ONE, ONE, None, NINE])
    # batched generation (left padding) answers as one at a time does, greedy by default
    assert [hf_judge.answer([c])[0] for c in chats] == answers


def test_temperature_samples_and_zero_is_greedy(hf_judge, generative_judge):
    chats = [hf_judge.render("p", " dog")] * 16
    assert set(hf_judge.answer(chats)) == {"score: 9"}  # greedy: one answer, whatever the batch
    hot = build(_job(generative_judge, temperature=5.0).spec.judges[0])
    torch.manual_seed(0)
    assert len(set(hot.answer(chats))) > 1  # sampled: a hot judge says different things


def test_a_long_completion_keeps_its_end_within_max_length(generative_judge):
    judge = build(_job(generative_judge, maxLength=48).spec.judges[0])

    def length(chat):
        return len(judge.tokenizer(render(judge.tokenizer, chat), add_special_tokens=False)["input_ids"])

    rubric = length(judge.render("p", ""))  # the system message, the template and the chat's markers
    assert rubric < 40
    long = " red" * 40 + " dog"
    chat = judge.render("p", long)
    assert 40 < length(chat) <= 48 and chat[1]["content"].endswith(" red red dog")  # cut from the left
    assert chat[1]["content"].startswith("Rate: ") and len(chat[1]["content"]) < len("Rate: " + long)
    assert judge.render("p", " dog")[1]["content"] == "Rate:  dog"  # a short one is untouched


@pytest.fixture
async def judge_url(hf_judge, generative_judge):
    server = Server(_job(generative_judge, maxBatchSize=4).spec.judges[0], Auth(TOKEN), "judge-rubric-0")
    runner = aiohttp.web.AppRunner(server.app())
    await runner.setup()
    site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    server.loaded(hf_judge)
    yield f"http://127.0.0.1:{runner.addresses[0][1]}", server
    await server.batcher.close()
    await runner.cleanup()


async def _metrics(url: str) -> str:
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{url}/metrics") as r:
            return await r.text()


async def test_the_server_scores_through_real_generation_and_counts_unparseable_answers(judge_url):
    url, _ = judge_url
    items = [{"prompt": "p", "completion": c} for c in (" dog", "xq", " ??", " cat", " ??", "ing")]
    async with aiohttp.ClientSession(headers=Auth(TOKEN).headers()) as s:
        async with s.post(f"{url}/score", json={"items": items}) as r:
            assert r.status == 200
            scores = (await r.json())["scores"]
    assert scores[2] is None and scores[4] is None  # null on the wire: no guessed reward
    assert [scores[i] for i in (0, 1, 3, 5)] == pytest.approx([NINE, ONE, NINE, ONE])
    text = await _metrics(url)
    assert "grpojob_judge_unparsed_total 2.0" in text and 'grpojob_judge_requests_total{result="ok"} 1.0' in text
    assert "grpojob_judge_scored_total 6.0" in text and "grpojob_judge_batch_size_count 2.0" in text  # 4 + 2


def _scorer(job, monkeypatch, tmp_path, url) -> RewardScorer:
    (tmp_path / "token").write_text(TOKEN)
    (tmp_path / "token").chmod(0o600)
    monkeypatch.setenv(ENV_TOKEN_FILE, str(tmp_path / "token"))
    monkeypatch.setenv(ENV_JUDGE_URLS, json.dumps({"rubric": [url]}))
    return RewardScorer(job.spec, tokenizer=None)


@pytest.mark.parametrize("policy", ["skip", "zero", "fail"])
async def test_the_trainer_applies_on_failure_to_a_group_with_an_unparseable_answer(
        policy, judge_url, generative_judge, monkeypatch, tmp_path):
    url, _ = judge_url
    scorer = _scorer(_job(generative_judge, onFailure=policy, retries=2), monkeypatch, tmp_path, url)
    group = _group([" dog", "xq"])
    await scorer.score_group(group)  # every answer read: the judge's scores are the rewards
    assert group.rewards == pytest.approx([NINE, ONE]) and group.reward_parts["rubric"] == group.rewards
    group = _group([" dog", " ??", "xq"])
    if policy == "skip":  # dropped: its prompt is generated again
        with pytest.raises(GroupSkipped, match=r"could not read a score in 1 of 3 answers \(completions \[1\]"):
            await scorer.score_group(group)
    elif policy == "zero":  # the whole group, as when the judge is down: no advantage, no gradient
        await scorer.score_group(group)
        assert group.rewards == [0.0, 0.0, 0.0]
    else:
        with pytest.raises(RewardError, match=r"judge 'rubric', onFailure fail\).*1 of 3 answers"):
            await scorer.score_group(group)
    client = scorer.judges["rubric"]
    assert (client.failures, client.unparsed) == (1, 1)
    text = await _metrics(url)
    assert 'grpojob_judge_requests_total{result="ok"} 2.0' in text  # not retried: greedy answers the same
    await client.close()
