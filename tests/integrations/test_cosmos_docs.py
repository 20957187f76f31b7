"""cosmos-rl's documented custom dataset and reward, verbatim (code/cosmos_gsm8k_docs.py: the docs'
GSM8kDataset with setup(config, tokenizer), __len__, __getitem__, get_reference_answer, and
`from cosmos_rl.dispatcher.algo.reward import gsm8k_reward_fn`), in a GRPOJob: `grpojob validate`
accepts it, and a short run trains on its prompts (its own system prompt through the tokenizer it
was given, its GSM8K from `datasets`), scored by cosmos-rl's gsm8k_reward_fn against its reference
answers. The Hub is out of reach: `datasets` reads "openai/gsm8k" from an offline cache of our rows."""
import asyncio
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from grpojob.api.validate import check_plugins
from grpojob.contracts.rollout import Completion, Group

from ..trainer.conftest import make_job
from .conftest import STUBS, framework, learn
from .hub_cache import hub_cache, offline

ROOT = Path(__file__).resolve().parents[2]
CODE = Path(__file__).parent / "code"
ROWS = [{"question": f"what is {a} plus {b} ?", "answer": f"{a} + {b} = {a + b}\n#### {a + b}"}
        for a, b in [(2, 2), (3, 4), (5, 1), (1, 7), (6, 3), (4, 4), (2, 9), (8, 1)]]
SPEC = {"dataset": {"factory": None, "class": "cosmos_gsm8k_docs.py:GSM8kDataset", "maxPromptLength": 160},
        "rewards": [{"name": "cosmos_rl.dispatcher.algo.reward:gsm8k_reward_fn"}]}


@pytest.fixture
def gsm8k(tmp_path, monkeypatch):
    """cosmos-rl importable (conftest's stand-in for its CUDA torchvision import where needed), the
    docs' file on the code path, and "openai/gsm8k" in an offline `datasets` cache."""
    framework("cosmos_rl.dispatcher.algo.reward")
    monkeypatch.setenv("GRPOJOB_CODE_DIR", str(CODE))
    offline(monkeypatch, hub_cache(tmp_path / "hf", "openai/gsm8k", "main", ROWS))
    yield
    sys.modules.pop("cosmos_spy", None)


def validate(tiny_dir, tmp_path) -> subprocess.CompletedProcess:
    """`grpojob validate` (the CLI, a process of its own) on a manifest naming the docs' file by path
    in spec.code.localPath, as a user's job would."""
    import yaml
    manifest = {"apiVersion": "grpojob.io/v1alpha1", "kind": "GRPOJob", "metadata": {"name": "cosmos-docs"},
                "spec": make_job(tiny_dir, **SPEC).spec.model_dump(by_alias=True, exclude_none=True, mode="json")}
    manifest["spec"]["code"] = {"localPath": str(CODE)}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(manifest))
    path = [str(ROOT / "runtime"), *([str(STUBS)] if str(STUBS) in sys.path else [])]
    return subprocess.run([sys.executable, "-m", "grpojob", "validate", str(tmp_path / "job.yaml")],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(path)},
                          timeout=600)


@pytest.mark.slow  # the CLI imports cosmos-rl afresh: 20-70 s
def test_grpojob_validate_accepts_cosmos_rls_documented_dataset_and_reward(gsm8k, tiny_dir, tmp_path):
    r = validate(tiny_dir, tmp_path)
    assert r.returncode == 0 and "valid GRPOJob 'cosmos-docs'" in r.stdout, r.stdout + r.stderr[-3000:]


def test_without_cosmos_rl_grpojob_validate_names_the_field_and_how_to_install_it(tiny_dir, tmp_path):
    if importlib.util.find_spec("cosmos_rl") is not None:
        pytest.skip("cosmos-rl is installed here")
    r = validate(tiny_dir, tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    lines = [x for x in r.stderr.splitlines() if "spec." in x]
    assert {x.strip().split(": ")[0] for x in lines} == {"spec.dataset.class", "spec.rewards[0].name"}, r.stderr
    assert all("pip install --no-deps cosmos-rl==0.4.7" in x and "'grpojob[runtime,cosmos-rl]'" in x for x in lines), \
        r.stderr
    assert "Traceback" not in r.stderr


def test_its_samples_are_the_classs_and_gsm8k_reward_fn_scores_our_completions(gsm8k, tiny_dir, tokenizer):
    job = make_job(tiny_dir, **SPEC)
    assert check_plugins(job) == []
    from grpojob.data import PromptSettings, load_samples
    from grpojob.rewards import RewardScorer
    samples = load_samples(PromptSettings.of(job.spec), tokenizer)
    assert [s.row["answer"] for s in samples] == [r["answer"] for r in ROWS]  # get_reference_answer(i)
    assert SYSTEM in samples[1].prompt and ROWS[1]["question"] in samples[1].prompt
    g = Group(samples[1], [Completion(prompt_ids=[1], completion_ids=[2], logprobs=[0.0], policy_version=0, text=t)
                           for t in ["so it is #### 7", "#### 8", "7"]])
    asyncio.run(RewardScorer(job.spec, tokenizer).score_group(g))
    assert g.rewards == [1.0, 0.0, 0.0]  # cosmos-rl's strict "#### N" match against the reference


@pytest.mark.slow
def test_the_tiny_model_trains_on_the_documented_dataset_with_gsm8k_reward_fn(gsm8k, tiny_dir, tokenizer, tmp_path,
                                                                               monkeypatch):
    """The run: the class's prompts, gsm8k_reward_fn against its references, and the built-in format
    reward (`####` anywhere) that the tiny random model can learn in a few steps: the strict
    `#### N` of gsm8k_reward_fn is out of its reach in a CI-sized run (measured: 25-40 steps even
    with a second shaping reward, and not reliably)."""
    monkeypatch.syspath_prepend(str(CODE))
    spec = dict(SPEC, rewards=SPEC["rewards"] + [{"name": "format", "args": {"pattern": "####"}},
                                                 {"name": "cosmos_spy:spy", "weight": 0.0}])
    job = make_job(tiny_dir, **spec, rollout={"backend": "hf", "sampling": {"maxTokens": 6}},
                   training={"steps": 30, "promptsPerStep": 16, "learningRate": 1e-2, "microBatchTokens": 2048})
    assert check_plugins(job) == []
    import cosmos_spy
    from cosmos_rl.dispatcher.algo.reward import gsm8k_reward_fn
    records = learn(job, tmp_path, lambda r: r["rewards"]["format"] > 0.5)
    first, last = records[0]["rewards"]["format"], [r["rewards"]["format"] for r in records[-3:]]
    assert first < 0.2 and min(last) > 0.5, f"format {first:.3f} -> {last} after {len(records)} steps"
    # Every prompt is the class's own: its system prompt and a GSM8K question of the cache, through the
    # tokenizer's chat template (setup got the job's tokenizer); every reference is its
    # get_reference_answer for that question (the cache's `answer`).
    answers = {r["question"]: r["answer"] for r in ROWS}
    calls = cosmos_spy.CALLS
    assert len(calls) >= sum(int(r["completions"]) for r in records)  # and the groups of a step not taken
    for c in calls:
        (question,) = [q for q in answers if q in c["prompt"]]
        assert c["prompt"] == tokenizer.apply_chat_template(
            [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}], tokenize=False,
            add_generation_prompt=True)
        assert c["reference"] == answers[question]
    # gsm8k_reward_fn is one of the rewards: each step's mean is its score of that step's completions
    # (strictly on-policy: a step's groups are scored before the next step's are generated)
    at = 0
    for r in records:
        n = int(r["completions"])
        scores = [float(gsm8k_reward_fn(c["completion"], c["reference"])) for c in calls[at:at + n]]
        assert r["rewards"]["gsm8k_reward_fn"] == pytest.approx(sum(scores) / n)
        at += n


SYSTEM = """You are an AI math expert, you will be given a question and required to answer.
Final answer should be like
```
#### [ANS]
``` where [ANS] is your answer"""
