# Environment libraries whose environments run unchanged in a GRPOJob (docs/environments.md): atroposlib
# (its BaseEnv and serve CLI), skyrl-gym (its envs) and renderers (verifiers' train client); verifiers 0.3
# and 0.4 in venvs of their own beside it. Their
# dependencies are unpinned and heavy (wandb, polars, nltk, gymnasium, math-verify...) but move
# nothing of ours: the set is ours as the newest set installs it, plus these under constraints
# that keep every version it chose.
install_environments() {
  python3 -m venv .venv-environments && . .venv-environments/bin/activate || return 1
  quiet "$OUT/environments-install.log" pip install torch==2.13.0 || return 1  # pinned and first: the CPU build
  quiet "$OUT/environments-install.log" pip install -e '.[runtime,operator,dev]' || return 1
  pip freeze --exclude-editable >"$OUT/environments-ours.txt"
  quiet "$OUT/environments-install.log" pip install -e '.[environments]' -c "$OUT/environments-ours.txt" || return 1
  # verifiers <= 0.3 (tests/integrations/test_verifiers_wire.py) beside it: its openai-agents pins a
  # websockets below the one atroposlib's uvicorn takes; the test finds it at <this venv>-verifiers
  python3 -m venv .venv-environments-verifiers \
    && quiet "$OUT/environments-install.log" .venv-environments-verifiers/bin/pip install 'verifiers==0.3.1' \
      'reasoning-gym==0.1.25' || return 1
  # verifiers 0.4 (v1; tests/integrations/test_verifiers_v1.py) in a third: it pins openai < 3 (ours take
  # the newest, 3.x) and mcp == 2.0.0; uv runs its rollouts (each a uv script: the first `uv sync`
  # fetches the script's packages from the index). No torch: the driver needs grpojob's source only.
  python3 -m venv .venv-environments-verifiers4 \
    && quiet "$OUT/environments-install.log" .venv-environments-verifiers4/bin/pip install 'verifiers==0.4.0' \
      'uv==0.13.9'
}
# test_atropos_launch and test_verifiers_v1: each cluster example's pip list against what the environment
# imports; test_environments' Atropos and verifiers tests: their environment pods in the pod sandbox
# (about 75-100 s; verifiers about 125 s: its pod's install-code init container takes PyPI's wheels, about 50 s)
TESTS_environments=(-m "not vllm" tests/integrations/test_atropos.py tests/integrations/test_atropos_launch.py
                   tests/integrations/test_skyrl_gym.py tests/integrations/test_environment_cluster_examples.py
                   tests/integrations/test_verifiers_wire.py
                   tests/integrations/test_verifiers_v1.py tests/rollout/test_token_api.py
                   tests/operator_k8s/test_environments.py::test_an_atropos_environment_trains_the_job_in_pods
                   tests/operator_k8s/test_environments.py::test_a_verifiers_environment_trains_the_job_in_pods)
EXTRA_SETS="$EXTRA_SETS environments"
