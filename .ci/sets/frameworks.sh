# The frameworks set: cosmos-rl, verl and AReaL, whose own code (rewards, dataset classes, loss functions,
# rollout workflows) runs unchanged in a GRPOJob (docs/plugins.md#frameworks). Each pins torch/transformers below ours, so each is
# installed --no-deps beside our runtime, plus the light packages its imports need (pyproject's extras
# verl, cosmos-rl and areal, bounded as tested):
#   verl 0.9.1       ray, tensordict 0.10, omegaconf, fastapi, uvicorn; its agent loops also codetiming
#   cosmos-rl 0.4.7  nvidia-ml-py (pynvml), diffusers, strenum, redis, boto3, math-verify, torchao; its
#                    qwen-vl-utils needs a CUDA torchvision: a stand-in in tests/integrations/stubs.
#   areal 1.0.4      colorlog, tenacity, flask, torchdata, uvloop, hydra-core (omegaconf 2.3), numba, einops,
#                    aiofiles (ray and the others above too)
# Measured on a shared 2-core machine under load (2026-12-01): install 638 s from a fresh venv (pip cache
# warm), quick pass 55 s, slow pass 47 s. Again 2026-12-02 (load average 5-6 on 2 cores): install 996 s;
# tests/integrations/test_areal_agent.py's learning run about 6-8 min there, the ReMax test 60 s.
install_frameworks() {
  python3 -m venv .venv-frameworks && . .venv-frameworks/bin/activate || return 1
  quiet "$OUT/frameworks-install.log" pip install torch==2.13.0 || return 1  # pinned and first: the CPU build
  # the frameworks' extras (pyproject): the light packages their imports need, as a user installs them
  quiet "$OUT/frameworks-install.log" pip install -e '.[runtime,dev,verl,cosmos-rl,areal]' torch==2.13.0 || return 1
  quiet "$OUT/frameworks-install.log" pip install --no-deps verl==0.9.1 cosmos-rl==0.4.7 areal==1.0.4
}
TESTS_frameworks=(-m "not vllm" tests/integrations/test_cosmos.py tests/integrations/test_cosmos_docs.py tests/integrations/test_areal.py
                  tests/integrations/test_frameworks_code.py tests/integrations/test_episodes.py
                  tests/integrations/test_verl_agent_loop.py tests/integrations/test_areal_agent.py)
EXTRA_SETS="$EXTRA_SETS frameworks"
