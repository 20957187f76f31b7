"""Run in a venv with verifiers <= 0.3 (its own ReasoningGymEnv, env.generate, unchanged) against a
rollout server: argv = base_url token; prints each trajectory step's tokens as verifiers read them."""
import asyncio
import json
import os
import sys

from verifiers.envs.integrations.reasoninggym_env import ReasoningGymEnv
from verifiers.types import ClientConfig

env = ReasoningGymEnv(gym="basic_arithmetic", num_train_examples=2, num_eval_examples=1)
os.environ["GRPOJOB_TEST_KEY"] = sys.argv[2]
client = ClientConfig(api_base_url=sys.argv[1], api_key_var="GRPOJOB_TEST_KEY", max_retries=0)
out = asyncio.run(env.generate(env.get_dataset(n=1), client=client, model="tiny", on_progress=lambda *a: None,
                               state_columns=["trajectory"],
                               sampling_args={"max_tokens": 4, "temperature": 1.0, "logprobs": True,
                                              "extra_body": {"return_token_ids": True}}))
print(json.dumps([step["tokens"] for o in out["outputs"] for step in o.get("trajectory") or [None]]))
print([o.get("error") for o in out["outputs"]], file=sys.stderr)
