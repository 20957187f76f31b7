"""verifiers <= 0.3's own client (ReasoningGymEnv, env.generate, unchanged; in a venv of its own:
its openai-agents pins what atroposlib's set has) reads exact tokens from the rollout servers' chat
endpoint: the top-level `prompt_token_ids` vLLM gives, the choice's token ids and log-probs."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.rollout.harness import TOKEN, RolloutProcess, http, make_job, write_config
from tests.trajectories.test_sessions_server import stack  # noqa: F401 - a rollout server + the trajectory API

# CI's environments set makes it beside its own venv (.ci/sets/environments.sh)
PYTHON = os.environ.get("GRPOJOB_TEST_VERIFIERS_PYTHON", f"{sys.prefix}-verifiers/bin/python")
SCRIPT = Path(__file__).parent / "code" / "verifiers_generate.py"
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not Path(PYTHON).exists(),
                                 reason=f"no verifiers 0.3 venv at {PYTHON} (GRPOJOB_TEST_VERIFIERS_PYTHON)")]


def test_verifiers_reads_the_tokens_it_was_served(tmp_path, tiny_dir):
    srv = RolloutProcess(write_config(make_job(tiny_dir, rollout={"maxModelLen": 512}), tmp_path / "job.json"),
                         tmp_path, replica="verifiers").start()
    try:
        srv.wait_ready()
        proc = subprocess.run([PYTHON, str(SCRIPT), srv.url + "/v1", TOKEN], capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        steps = json.loads(proc.stdout.strip().splitlines()[-1])
        assert steps and all(s is not None for s in steps)  # <= 0.3 found prompt_token_ids at the top level
        for s in steps:
            assert len(s["completion_logprobs"]) == len(s["completion_ids"]) > 0
            status, out = http(srv.url + "/vllm/versions", {"sequences": [s["prompt_ids"] + s["completion_ids"]]})
            assert status == 200 and out["versions"] == [[0] * len(s["completion_ids"])]  # exactly what it served
    finally:
        srv.stop()


def test_verifiers_rollouts_become_exact_groups(stack, tmp_path):  # noqa: F811
    """python -m grpojob.integrations.verifiers (in verifiers' venv) over the rollout server and the
    trainer leader's trajectory API: the group holds the tokens verifiers read, versions looked up."""
    srv, manager = stack["srv"], stack["manager"]
    (tmp_path / "token").write_text(TOKEN)
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root / "runtime"), "OPENAI_BASE_URL": srv.url + "/v1",
           "GRPOJOB_TRAJECTORY_URL": stack["api"], "GRPOJOB_TOKEN_FILE": str(tmp_path / "token"),
           "GRPOJOB_ENVIRONMENT": "vf-arith"}
    env.pop("GRPOJOB_CONFIG", None)
    args = {"gym": "basic_arithmetic", "num_train_examples": 2, "num_eval_examples": 1,
            "system_prompt": "answer in <answer> </answer> ."}
    proc = subprocess.run([PYTHON, "-m", "grpojob.integrations.verifiers", "--env",
                           "verifiers.envs.integrations.reasoninggym_env:ReasoningGymEnv", "--env-args",
                           json.dumps(args), "--group-size", "2", "--groups", "1"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (group,) = manager.next_step().groups
    assert group.sample.row["environment"] == "vf-arith" and len(group.completions) == 2
    for c in group.completions:
        status, out = http(srv.url + "/vllm/versions", {"sequences": [c.prompt_ids + c.completion_ids]})
        assert status == 200 and out["versions"] == [[0] * len(c.completion_ids)]  # exactly as served
        assert c.policy_version == 0 and len(c.logprobs) == len(c.completion_ids)
