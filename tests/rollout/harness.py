"""Test helpers for rollout servers and weight sync: jobs, server processes, reference models."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Optional

import torch
from grpojob.auth import ENV_TOKEN_FILE
from grpojob.devices import ENV_DEVICE
from grpojob.local.processes import free_port  # noqa: F401 - re-exported for the tests
from grpojob.plan import (
    ENV_ADVERTISE_HOST,
    ENV_BACKEND,
    ENV_CHECKPOINT_DIR,
    ENV_CONFIG,
    ENV_LOG_FORMAT,
    ENV_REPLICA_ID,
    ENV_ROLLOUT_PORT,
    ENV_SYNC_ADDR,
    render_config,
)

from tests.helpers.jobs import job_from

REPO = Path(__file__).resolve().parents[2]
TOKEN = "the-jobs-token-for-the-rollout-tests"  # every server of these tests holds it (grpojob.auth)

BASE = {
    "model": {"path": None},
    "dataset": {"factory": "toy", "maxPromptLength": 32},
    "rewards": [{"name": "exact_match"}],
    "algorithm": {"groupSize": 4},
    "training": {"microBatchTokens": 256, "promptsPerStep": 4},
    "rollout": {"backend": "hf", "sampling": {"maxTokens": 12}, "maxModelLen": 128,
                "gpuMemoryUtilization": 0.1, "enforceEager": True},
    "weightSync": {"timeoutSeconds": 20, "bucketSizeMb": 1},
}


def make_job(model_dir, **over):
    return job_from(BASE, model_dir, **over)


def write_config(job, path: Path) -> Path:
    path.write_text(render_config(job))
    return path


def http(url: str, body: Optional[dict] = None, timeout: float = 60.0,
         token: Optional[str] = TOKEN) -> tuple[int, dict]:
    """(status, JSON body) of a GET, or a POST when body is given, with the job's token (None:
    without one). A body that is not JSON (the 401's "unauthorized") comes back as {"text": ...}."""
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, _json(r.read())
    except urllib.error.HTTPError as e:
        return e.code, _json(e.read())


def _json(raw: bytes) -> dict:
    try:
        return json.loads(raw)
    except ValueError:
        return {"text": raw.decode(errors="replace")}


def token_file(directory: Path, token: str = TOKEN) -> Path:
    """The job's token as the plan hands it to a process: a 0600 file."""
    path = directory / "token"
    if not path.exists():
        path.touch(mode=0o600)
        path.write_text(token + "\n")
    return path


def wait_for(pred, timeout: float, what: str, interval: float = 0.1, proc=None):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = pred()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"{what}: process exited with {proc.returncode}\n{proc_tail(proc)}")
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}"
                         + (f"\n{proc_tail(proc)}" if proc is not None else ""))


def proc_tail(proc, n: int = 4000) -> str:
    path = getattr(proc, "log_path", None)
    return Path(path).read_text(errors="replace")[-n:] if path and Path(path).exists() else ""


class RolloutProcess:
    """A real `grpojob rollout` process (killed on stop), computing on `device` (the tests compare
    it with references computed on that device)."""

    def __init__(self, config: Path, log_dir: Path, *, replica: str, backend: str = "hf",
                 sync_addr: Optional[str] = None, port: Optional[int] = None,
                 checkpoint_dir: Optional[str] = None, device: str = "cpu", env: Optional[dict] = None):
        self.config, self.replica, self.backend, self.device = config, replica, backend, device
        self.sync_addr, self.checkpoint_dir = sync_addr, checkpoint_dir
        self.extra_env = dict(env or {})
        self.port = port or free_port()
        self.token = TOKEN
        self.token_file = token_file(log_dir)
        self.log_path = log_dir / f"{replica}.log"
        self.proc: Optional[subprocess.Popen] = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "RolloutProcess":
        env = {**os.environ, ENV_CONFIG: str(self.config), ENV_ROLLOUT_PORT: str(self.port),
               ENV_REPLICA_ID: self.replica, ENV_BACKEND: self.backend, ENV_ADVERTISE_HOST: "127.0.0.1",
               ENV_LOG_FORMAT: "text", ENV_DEVICE: self.device, ENV_TOKEN_FILE: str(self.token_file),
               "PYTHONUNBUFFERED": "1"}
        env.pop(ENV_SYNC_ADDR, None)
        if self.sync_addr:
            env[ENV_SYNC_ADDR] = self.sync_addr
        if self.checkpoint_dir:
            env[ENV_CHECKPOINT_DIR] = self.checkpoint_dir
        env.update(self.extra_env)
        log = open(self.log_path, "a")
        self.proc = subprocess.Popen([sys.executable, "-m", "grpojob", "rollout"], env=env, cwd=REPO,
                                     stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.proc.log_path = self.log_path
        log.close()
        return self

    def status(self, path: str) -> tuple[int, dict]:
        try:
            return http(self.url + path, timeout=5)
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return 0, {}

    def wait_healthy(self, timeout: float = 60) -> "RolloutProcess":
        wait_for(lambda: self.status("/healthz")[0] == 200, timeout, f"{self.replica} /healthz", proc=self.proc)
        return self

    def wait_ready(self, timeout: float = 120) -> "RolloutProcess":
        wait_for(lambda: self.status("/readyz")[0] == 200, timeout, f"{self.replica} /readyz", proc=self.proc)
        return self

    def generate(self, prompt_ids, n=1, **sampling) -> dict:
        status, body = http(self.url + "/generate", {"prompt_ids": list(prompt_ids), "n": n, "sampling": sampling})
        assert status == 200, body
        return body

    def kill(self, sig=signal.SIGKILL) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            if sig in (signal.SIGKILL, signal.SIGTERM):
                self.proc.wait(30)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)

    def tail(self) -> str:
        return proc_tail(self.proc) if self.proc else ""


def load_model(model_dir):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()


def perturb(model, seed: int, scale: float = 0.5):
    """Change every weight (the trainer after some steps), deterministically."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale * p.float().std().clamp_min(1e-3))
    return model


def greedy(model, tokenizer, prompt_ids, max_tokens: int) -> tuple[list[int], list[float]]:
    """The trainer-side reference: transformers' own greedy `generate` (independent of the hf
    engine's decoder), cut after EOS, with the log-probs of its tokens."""
    ids = torch.tensor([list(prompt_ids)], device=next(model.parameters()).device)
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=max_tokens, eos_token_id=tokenizer.eos_token_id,
                             pad_token_id=tokenizer.pad_token_id, output_logits=True, return_dict_in_generate=True)
    new = out.sequences[0, ids.shape[1]:]
    lp = torch.log_softmax(torch.stack(out.logits, 1)[0].float(), -1).gather(-1, new[:, None]).squeeze(-1)
    toks = new.tolist()
    stop = toks.index(tokenizer.eos_token_id) + 1 if tokenizer.eos_token_id in toks else len(toks)
    return toks[:stop], lp[:stop].tolist()


PROMPTS = ["1 + 1 =", "the cat sat on", "count: 3 4 5", "hello world and"]
