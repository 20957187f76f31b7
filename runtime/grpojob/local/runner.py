"""`grpojob run FILE`: the processes the operator puts in pods, started on this machine.

Everything comes from `grpojob.plan.roles`, like on the cluster; the only local decisions are
where files go (the run directory, which holds the job's token in `token`, mode 0600, made once
and kept when the run resumes) and which ports are free.

A child that dies is restarted with back-off, as its pod would be (local.restarts), and the run
stops with its error and last log lines once it died too often in a row; a child whose
termination message says it will fail the same way every time (a plug-in that does not import)
stops the run at once. Killing `grpojob run`, even with SIGKILL, stops every child (lifeline).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Optional

from grpojob import auth
from grpojob.api import GRPOJob, InvalidSpec, plugins
from grpojob.plan import (CONFIG_FILE, ENV_JUDGE_PORT, ENV_OPENAI_API_KEY, ENV_ROLE, ENV_ROLLOUT_PORT, ENV_RUN_DIR, ENV_TRAINER_PORT, ENVIRONMENT_ROLE,
                    REPLICA_HOST, REPLICA_INDEX, REPLICA_NAME, SERVICE_PREFIX, THREAD_ENV, Placement, Role,
                    roles, trajectory_url)
from grpojob.local.autoscaler import LocalAutoscaler
from grpojob.local import judges
from grpojob.local.completion import TrainerCompletion
from grpojob.local.processes import Child, free_port, signal_all, stop_all, wait_any
from grpojob.local.prepare import BUILD_TINY, SITE_DIR, RunError, prepare, token_path  # noqa: F401 (public here)
from grpojob.local.progress import Progress, newest_checkpoint, plot, read_evaluations, read_records
from grpojob.local.restarts import RestartPolicy, Restarts, resumes_from, what_happened

log = logging.getLogger("grpojob.local")

# {"trainer-0": "http://127.0.0.1:PORT", "rollout-0": ..., "trajectories": ...}: /metrics, and with the
# run's token /status and the trajectory API (environments started by hand register there)
ENDPOINTS_FILE = "endpoints.json"
EXIT_INTERRUPTED = 130
ENVIRONMENT_GRACE_S = 5.0  # an environment's time to end by itself once training completed


def _children(job: GRPOJob, run_dir: Path, backend: Optional[str]) -> list[Child]:
    host = "127.0.0.1"
    rollout_ports = [free_port() for _ in range(job.spec.rollout.replicas)]  # replicas share this host
    judge_ports = judges.ports(job)
    where = Placement(trainer_host=host, config_path=str(run_dir / CONFIG_FILE),
                      checkpoint_dir=job.spec.checkpoint.path, run_dir=str(run_dir),
                      rendezvous_port=free_port(), sync_port=free_port(), trainer_port=free_port(),
                      rollout_urls=tuple(f"http://{host}:{p}" for p in rollout_ports),
                      code_dir=job.spec.code.local_path, site_dir=str(run_dir / SITE_DIR),
                      token_file=str(token_path(run_dir)), judge_urls=judges.urls(judge_ports))
    bin_dir = str(Path(sys.executable).parent)
    base_env = {**os.environ, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", "")}
    # As in the pods: an environment's OpenAI API key is the job's token unless the user set one.
    api_key = auth.read_file(auth.ensure_file(token_path(run_dir))) if job.spec.environments else None
    out: list[Child] = []
    for role in roles(job, where):
        for i in range(role.replicas):
            # every process of the run carries its run directory (judges' pods need none): how the
            # run's processes are found (tests, `ps e`), whatever their role
            env = {**base_env, ENV_RUN_DIR: str(run_dir), **role.env, **_per_replica(role, i, host)}
            env.update({k: os.environ[k] for k in THREAD_ENV if k in os.environ})  # the caller's own wins
            if role.environment is not None:
                env[ENV_OPENAI_API_KEY] = api_key
                env.update(_user_env(job, role.environment))
            if "PYTHONPATH" in role.env and os.environ.get("PYTHONPATH"):  # spec.code first, then the caller's
                env["PYTHONPATH"] = role.env["PYTHONPATH"] + os.pathsep + os.environ["PYTHONPATH"]
            if role.judge is not None:
                env[ENV_JUDGE_PORT] = str(judge_ports[role.judge][i])
            if role.name == "rollout":
                env[ENV_ROLLOUT_PORT] = str(rollout_ports[i])
                if backend:
                    env["GRPOJOB_ROLLOUT_BACKEND"] = backend
            exe = shutil.which(role.command[0], path=env["PATH"])
            if not exe:
                raise RunError(f"'{role.command[0]}' is not installed in this environment")
            out.append(Child(f"{role.name}-{i}", [exe, *role.command[1:]], env,
                             run_dir / "logs" / f"{role.name}-{i}.log"))
    return out


def _endpoints(children: list[Child]) -> dict[str, str]:
    """Base URL of each process's HTTP endpoint: the trainer leader's and every rollout server's,
    and the trajectory API's."""
    port_env = {"trainer-0": ENV_TRAINER_PORT}
    out = {c.name: f"http://127.0.0.1:{c.env[port_env.get(c.name, ENV_ROLLOUT_PORT)]}" for c in children
           if c.name in port_env or c.name.startswith("rollout-")}
    trainer = next(c for c in children if c.name == "trainer-0")
    out["trajectories"] = trajectory_url("127.0.0.1", int(trainer.env[ENV_TRAINER_PORT]))
    return out


def _user_env(job: GRPOJob, environment: str) -> dict[str, str]:
    """spec.environments[i].env as local values (a valueFrom names a cluster object: refused)."""
    i, spec = next((i, e) for i, e in enumerate(job.spec.environments) if e.name == environment)
    out = {}
    for j, var in enumerate(spec.env):
        if "valueFrom" in var:
            raise RunError(f"spec.environments[{i}].env[{j}] ({var['name']}): valueFrom reads the cluster; "
                           "`grpojob run` needs a value")
        out[var["name"]] = str(var.get("value", ""))
    return out


def _per_replica(role: Role, index: int, host: str) -> dict[str, str]:
    values = {REPLICA_INDEX: str(index), REPLICA_HOST: host, REPLICA_NAME: f"{role.name}-{index}"}
    return {env: values[kind] for env, kind in role.per_replica_env.items()}


class Run:
    def __init__(self, job: GRPOJob, run_dir: Path, backend: Optional[str], progress: bool, out=sys.stderr,
                 restarts: RestartPolicy = RestartPolicy()):
        self.job, self.run_dir, self.out = job, run_dir, out
        self.children = _children(job, run_dir, backend)
        self.trainers = [c for c in self.children if c.name.startswith("trainer")]
        self.environments = {c.name for c in self.children if c.env.get(ENV_ROLE) == ENVIRONMENT_ROLE}
        self.progress = Progress(run_dir / "metrics.jsonl", job.spec.training.steps, enabled=progress, out=out)
        self.restarts = Restarts(restarts)
        self.interrupted: Optional[int] = None
        self.completion = TrainerCompletion(_endpoints(self.children)["trainer-0"], token_path(run_dir))
        auto = job.spec.rollout.autoscale  # refused with placement colocated
        self.scaler = LocalAutoscaler(auto, run_dir, [c for c in self.children if c.name.startswith("rollout-")],
                                      note=self.progress.note) if auto else None
        self._plotter: Optional[threading.Thread] = None

    def _on_signal(self, signum, _frame) -> None:
        if self.interrupted is not None:  # second Ctrl-C: no more patience
            for c in self.children:
                c.kill()
        self.interrupted = signum

    def run(self) -> int:
        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            endpoints = _endpoints(self.children)
            (self.run_dir / ENDPOINTS_FILE).write_text(json.dumps(endpoints, indent=1))
            if self.job.spec.mode == "service":
                print(f"training service at {endpoints['trainer-0']}{SERVICE_PREFIX} (bearer token in "
                      f"{token_path(self.run_dir)}): grpojob.client.ServiceClient.from_run_dir('{self.run_dir}'); "
                      f"Ctrl-C checkpoints and stops it", file=self.out)
            for c in self.children:
                c.start()
            return self._watch()
        finally:
            self._start_plot()  # drawn while the children stop
            stop_all(self.children, grace=5, now=_now)
            for s, h in old.items():
                signal.signal(s, h)
            self.progress.close()
            self._plotter.join()

    def _watch(self) -> int:
        live = list(self.children)
        while True:
            self.progress.update()
            if self.interrupted is not None:
                return self._interrupt()
            if self.completion.completed():
                return self._stop_completed()
            for c in self.restarts.ready():
                c.start()
                live.append(c)
            if self.scaler is not None:
                self._autoscale(live)
            dead = wait_any(live, timeout=0.5)
            if dead is None:
                continue
            live.remove(dead)
            if self._exited(dead):
                self.progress.update()
                return 0

    def _autoscale(self, live: list[Child]) -> None:
        """spec.rollout.autoscale: servers started join the watch; those stopped leave it (their exit is no failure)."""
        started, stopped = self.scaler.poll()
        self.children += started
        live += started
        for c in stopped:
            if c in live:
                live.remove(c)
            self.restarts.due.pop(c.name, None)

    def _exited(self, dead: Child) -> bool:
        """Decide about a child that exited: True when the run is done; restarts it later, or
        raises RunError with why and its last log lines."""
        code = dead.poll()
        if dead.name in self.environments and code == 0:  # an environment may finish its own work
            self.progress.note(f"{dead.name} exited (code 0); the trainer goes on with the other sources")
            return False
        if dead in self.trainers and code == 0:  # completed (or other trainer replicas are finishing)
            return all(t.poll() == 0 for t in self.trainers)
        why, said = dead.termination(), what_happened(dead)
        if why and why[0] in plugins.FAILURE_REASONS:  # it would fail the same way at every start
            raise RunError(f"{said} (log: {dead.log_path})")
        delay = self.restarts.schedule(dead)
        if delay is None:
            raise RunError(f"{said}\nit was restarted {self.restarts.policy.max_restarts} times in a row "
                           f"(--max-restarts); log: {dead.log_path}; last lines:\n" + _indent(dead.tail()))
        resume = resumes_from(_checkpoints(self.job)) if dead in self.trainers else ""
        self.progress.note(f"{said}\n  restarting it in {delay:.0f} s (restart {self.restarts.count[dead.name]} of "
                           f"{self.restarts.policy.max_restarts}; log: {dead.log_path}){resume}")
        return False

    def _stop_completed(self) -> int:
        """Training completed: the trainer stays up until asked to stop (as in a pod, where the
        operator scales it down); ask it (it exits at once, nothing left to save), SIGTERM if it
        does not answer."""
        envs = [c for c in self.children if c.name in self.environments]
        signal_all([c for c in self.children if c not in self.trainers and c not in envs], _now)
        self._start_plot()
        # An environment that drives its own loop (an ART or verifiers script) returns from its last
        # train() call now and may still log, print or save: it gets a few seconds to end by itself
        # while the trainer still answers (stop 58's CI: SIGTERM cut an ART script's last line).
        _wait_exit(envs, ENVIRONMENT_GRACE_S)
        released = self.completion.release()
        # nothing else is needed now: the other processes and the plot go on while the trainer exits
        signal_all(envs)
        if released:
            _wait_exit(self.trainers, 30)
        for t in self.trainers:  # those still running
            t.signal(signal.SIGTERM)
        _wait_exit(self.trainers, 30)
        self.progress.update()
        return 0

    def _interrupt(self) -> int:
        print("\ninterrupted: asking the trainer to checkpoint and stop (Ctrl-C again: stop at once) ...",
              file=self.out)
        for t in self.trainers:
            t.signal(signal.SIGTERM)
        others = [c for c in self.children if c not in self.trainers]
        answered = False
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and any(t.poll() is None for t in self.trainers):
            phase = self.completion.phase(timeout=1) if others else None
            answered = answered or phase is not None
            if others and (phase in ("suspended", "completed", "failed") or (answered and phase is None)):
                for c in others:  # checkpointed (its endpoint closes last): the rest stops while it exits
                    c.signal(signal.SIGINT if c.name.startswith("rollout-") else signal.SIGTERM)  # no drain
                others = []
            time.sleep(0.2)
        ckpt = newest_checkpoint(_checkpoints(self.job))
        where = f"checkpoint {ckpt}" if ckpt else "no checkpoint was written"
        print(f"stopped: {where}; run the same command again to resume", file=self.out)
        return EXIT_INTERRUPTED

    def _start_plot(self) -> None:
        if self._plotter is None:
            self._plotter = threading.Thread(target=self._plot, name="plot", daemon=True)
            self._plotter.start()

    def _plot(self) -> None:
        records = read_records(self.run_dir / "metrics.jsonl")
        if records:
            plot(records, self.run_dir / "reward.png", read_evaluations(self.run_dir / "metrics.jsonl"))


def _now(c: Child) -> bool:
    """A rollout server stops at once at the end of a run (SIGINT: no drain; that is for a scale-down)."""
    return c.name.startswith("rollout-")


def _wait_exit(children: list[Child], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(c.poll() is None for c in children):
        time.sleep(0.1)


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())


def main(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING)
    out = sys.stderr
    try:
        job, run_dir = prepare(args.file, args.set, args.run_dir, args.backend, out)
        done = len(read_records(run_dir / "metrics.jsonl"))
        t = job.spec.trainer
        where = f"{job.spec.rollout.replicas} x {job.spec.rollout.backend} rollout, trainer {t.replicas} x " \
            f"{t.processes_per_replica}" if job.spec.placement == "separate" else \
            f"{job.spec.rollout.backend} engine colocated with trainer {t.replicas} x {t.processes_per_replica}, taking turns"
        print(f"grpojob run: {job.metadata.name} in {run_dir} ({where}"
              + "".join(f", environment {e.name} x {e.replicas}" for e in job.spec.environments) + ")"
              + (f", resuming after step {done}" if done else ""),
              file=out)
        code = Run(job, run_dir, args.backend, progress=not args.no_progress, out=out,
                   restarts=RestartPolicy(max_restarts=args.max_restarts)).run()
    except InvalidSpec as e:
        print(f"{args.file}: invalid GRPOJob", file=out)
        for err in e.errors:
            print(f"  {err}", file=out)
        return 1
    except RunError as e:
        print(f"grpojob run failed: {e}", file=out)
        return 1
    if code == 0:
        _summary(run_dir, out)
    return code


def _summary(run_dir: Path, out) -> None:
    records = read_records(run_dir / "metrics.jsonl")
    if not records:
        print("done (no steps recorded)", file=out)
        return
    first, last = records[0], records[-1]
    evals = [e for e in read_evaluations(run_dir / "metrics.jsonl") if e.get("reward_mean") is not None]
    print(f"done: {last.get('step')} steps; reward {first.get('reward_mean', float('nan')):.3f} -> "
          f"{last.get('reward_mean', float('nan')):.3f}"
          + (f"; evaluation reward {evals[0]['reward_mean']:.3f} (step {evals[0]['step']}) -> "
             f"{evals[-1]['reward_mean']:.3f} (step {evals[-1]['step']})" if evals else "")
          + f"; final model {run_dir / 'final-model'}; "
          f"curves {run_dir / 'reward.png'}; metrics {run_dir / 'metrics.jsonl'}", file=out)


def _checkpoints(job: GRPOJob) -> str | Path:
    """spec.checkpoint.path: the run's directory, or an object store's URL as written."""
    return job.spec.checkpoint.path if job.spec.checkpoint.in_store else Path(job.spec.checkpoint.path)
