"""Start an Atropos environment (atroposlib 0.4, a BaseEnv and its own CLI, unchanged) pointed at the job:

    python -m grpojob.integrations.atropos my_env.py serve [your own flags]

as a `spec.environments[].command`. It runs `python my_env.py serve ...` with the flags that point
Atropos at the job, computed from what every environment process gets (docs/environments.md):

- `--env.rollout_server_url`: the trainer leader's run-api routes, `$GRPOJOB_TRAJECTORY_URL/atropos/<token>`
  (Atropos sends no Authorization header, so the job's token is in the path: it is on the
  environment's command line and in Atropos's request logs, where whoever reads them could call
  the job's trajectory and OpenAI APIs; keep environment pods' logs as private as the job's Secret);
- `--openai.server_type vllm`, `--openai.base_url <rollout servers>/vllm/v1`, `--openai.api_key`:
  the rollout servers' vLLM `/generate` (exact tokens and log-probs);
- `--env.tokenizer_name` and `--openai.tokenizer_name`: Atropos applies the chat template itself,
  so it needs the tokenizer files: `model.tokenizer` or `model.path` where this process has them
  (`grpojob run`, an image that holds the model), else the rollout servers' own
  (`GET <rollout>/vllm/tokenizer`, written to a temporary directory): an environment pod has no
  model volume, and a model from a claim, a GGUF or an object store is the rollout servers' anyway;
- `--env.group_size` (algorithm.groupSize), `--env.total_steps` (training.steps), `--env.use_wandb false`,
  `--env.wandb_name $GRPOJOB_ENVIRONMENT` (it registers as `atropos-<name>`).

Flags given on the command line win. A configuration that cannot work is refused with its fix:
`--openai.server_type` other than vllm (no tokens or log-probs), or no tokenizer files to read
(none here and none from the rollout servers).
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Mapping, Optional

__all__ = ["command", "fetch_tokenizer", "local_tokenizer", "main"]

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


class ConfigError(SystemExit):
    pass


def _flag(argv: list[str], name: str) -> Optional[str]:
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


def _spec(environ: Mapping[str, str]) -> dict:
    cfg_path = environ.get("GRPOJOB_CONFIG")
    return json.loads(Path(cfg_path).read_text()).get("spec", {}) if cfg_path and Path(cfg_path).is_file() else {}


def local_tokenizer(argv: list[str], environ: Mapping[str, str] = os.environ) -> Optional[str]:
    """--env.tokenizer_name as given, else the job's model.tokenizer or model.path where this process
    holds tokenizer files; None where it holds none."""
    given = _flag(argv, "--env.tokenizer_name")
    if given:
        return given
    model = _spec(environ).get("model") or {}
    for d in (model.get("tokenizer"), model.get("path")):
        if d and any((Path(d) / f).is_file() for f in TOKENIZER_FILES):
            return d
    return None


def _check(argv: list[str], environ: Mapping[str, str]) -> None:
    if not argv:
        raise ConfigError("usage: python -m grpojob.integrations.atropos ENV.py serve [flags]")
    server_type = _flag(argv, "--openai.server_type")
    if server_type not in (None, "vllm"):
        raise ConfigError(f"--openai.server_type {server_type}: only vllm gives the trainer the exact tokens and "
                          "log-probs it trains on; drop the flag (this launcher sets vllm)")
    if not (environ.get("GRPOJOB_TOKEN_FILE") and environ.get("GRPOJOB_TRAJECTORY_URL")
            and environ.get("OPENAI_BASE_URL")):
        raise ConfigError("GRPOJOB_TOKEN_FILE, GRPOJOB_TRAJECTORY_URL and OPENAI_BASE_URL are not all set: run it as "
                          "a spec.environments command (grpojob run or the operator sets them)")


def _no_tokenizer(environ: Mapping[str, str], why: str = "") -> ConfigError:
    model = (_spec(environ).get("model") or {}).get("path", "")
    return ConfigError(f"no tokenizer files at the job's model path '{model}' in this process{why}: Atropos applies "
                       "the chat template in the environment; give --env.tokenizer_name a path (or hub id) it can "
                       "read, or bring the tokenizer files with spec.code")


def command(argv: list[str], environ: Mapping[str, str] = os.environ, tokenizer: Optional[str] = None) -> list[str]:
    """The environment's command line, with the job's flags added; `tokenizer`: where the tokenizer
    files are when this process holds none of the job's (fetch_tokenizer)."""
    _check(argv, environ)
    token = Path(environ["GRPOJOB_TOKEN_FILE"]).read_text().strip()
    trajectories, base = environ["GRPOJOB_TRAJECTORY_URL"], environ["OPENAI_BASE_URL"]
    spec = _spec(environ)
    tokenizer = local_tokenizer(argv, environ) or tokenizer
    if tokenizer is None:
        raise _no_tokenizer(environ)
    vllm = base.rstrip("/").removesuffix("/v1") + "/vllm/v1"
    ours = {"--env.rollout_server_url": f"{trajectories.rstrip('/')}/atropos/{token}",
            "--openai.server_type": "vllm", "--openai.base_url": vllm, "--openai.api_key": token,
            "--openai.model_name": "policy", "--openai.tokenizer_name": tokenizer,
            "--env.tokenizer_name": tokenizer, "--env.use_wandb": "false",
            # registers as atropos-<name> (the trainer's metrics and status name it so)
            "--env.wandb_name": environ.get("GRPOJOB_ENVIRONMENT", "env")}
    algorithm, training = spec.get("algorithm") or {}, spec.get("training") or {}
    if algorithm.get("groupSize"):
        ours["--env.group_size"] = str(algorithm["groupSize"])
    if training.get("steps"):
        ours["--env.total_steps"] = str(training["steps"])
    extra = [x for k, v in ours.items() if _flag(argv, k) is None for x in (k, v)]
    return [sys.executable, *argv, *extra]


def wait_for_trainer(environ: Mapping[str, str] = os.environ, timeout: float = 1800.0) -> None:
    """Until the trajectory API answers that the trainer has started: Atropos gives up registering
    after 3 tries (about 20 s), and a trainer loads for longer than that."""
    import time
    import urllib.error
    import urllib.request

    token = Path(environ["GRPOJOB_TOKEN_FILE"]).read_text().strip()
    url = environ["GRPOJOB_TRAJECTORY_URL"].rstrip("/") + "/status"
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
            with urllib.request.urlopen(req, timeout=10) as r:
                if json.loads(r.read()).get("started"):
                    return
        except (OSError, ValueError):
            pass  # not up yet (connection refused, 503 while it loads)
        time.sleep(2)
    raise ConfigError(f"the trainer's trajectory API ({url}) did not start within {timeout:.0f} s")


def fetch_tokenizer(environ: Mapping[str, str] = os.environ, dest: Optional[Path] = None,
                    timeout: float = 120.0) -> str:
    """The rollout servers' tokenizer files (GET <rollout>/vllm/tokenizer) written to `dest` (a new
    temporary directory by default); ConfigError naming the fix when they cannot be had."""
    import base64
    import tempfile
    import time
    import urllib.request

    token = Path(environ["GRPOJOB_TOKEN_FILE"]).read_text().strip()
    url = environ["OPENAI_BASE_URL"].rstrip("/").removesuffix("/v1") + "/vllm/tokenizer"
    end, last = time.monotonic() + timeout, ""
    while True:
        try:
            req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
            with urllib.request.urlopen(req, timeout=60) as r:
                files = json.loads(r.read())["files"]
            break
        except (OSError, ValueError, KeyError) as e:  # a server still loading answers 503: try again
            last = f"{type(e).__name__}: {e}"
        if time.monotonic() > end:
            raise _no_tokenizer(environ, f", and {url} did not give them ({last})")
        time.sleep(2)
    dest = Path(dest) if dest is not None else Path(tempfile.mkdtemp(prefix="grpojob-tokenizer-"))
    dest.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        if Path(name).name != name:
            raise ConfigError(f"{url} named a file {name!r} outside its directory")
        (dest / name).write_bytes(base64.b64decode(data))
    if not any((dest / f).is_file() for f in TOKENIZER_FILES):
        raise _no_tokenizer(environ, f", and {url} gave no tokenizer files ({sorted(files)})")
    return str(dest)


def main(argv: Optional[list[str]] = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    _check(argv, os.environ)
    wait_for_trainer()  # the rollout servers are up once the trainer has started
    tokenizer = local_tokenizer(argv)
    if tokenizer is None:
        tokenizer = fetch_tokenizer()
        print(f"grpojob.integrations.atropos: the rollout servers' tokenizer files in {tokenizer}", file=sys.stderr,
              flush=True)
    cmd = command(argv, tokenizer=tokenizer)
    os.execv(cmd[0], cmd)


if __name__ == "__main__":
    main()
