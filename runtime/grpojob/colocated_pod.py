"""The one container of a colocated trainer pod with GPUs: the trainer (torchrun) and its rollout
engine as two processes of one container.

Why one container: a device plugin (nvidia.com/gpu and the like) gives a GPU to the one container
whose limits name it, so an engine in a second container would not see the trainer's GPUs. On a
CPU-only pod the engine stays a container of its own (docs/colocated.md).

What the kubelet did for two containers, this does for two processes:
- both start at once, each in its own process group; their logs are the container's log;
- the trainer's termination message is the container's (its completion, a plug-in failure);
- SIGTERM (the pod stopping) goes to both, which then get the pod's grace period;
- the trainer ending ends the container with its exit code, once the engine has stopped;
- the engine ending is the container's failure: its termination message (plugins.ENGINE_FAILED,
  written here when the engine left none) becomes the container's, the trainer is stopped, and the
  kubelet restarts the container; the trainer resumes from its last checkpoint and the new engine
  is brought to the current version by the weight-sync store, as after any restart.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import sys
import tempfile
from pathlib import Path

from grpojob import failures, plan
from grpojob.api import plugins
from grpojob.local.processes import Child, stop_all, wait_any
from grpojob.logs import setup as setup_logging

log = logging.getLogger("grpojob.colocated_pod")

# Inside the trainer pod's grace period, so that the kubelet's SIGKILL comes after ours: the trainer
# may be saving a checkpoint.
STOP_GRACE_SECONDS = plan.TRAINER_GRACE_SECONDS - 20.0


def _children() -> tuple[Child, Child]:
    doc = json.loads(os.environ[plan.ENV_COLOCATED_ENGINE])
    scratch = Path(tempfile.mkdtemp(prefix="grpojob-colocated-"))
    engine = Child("rollout", list(doc["command"]), {**os.environ, **doc["env"]}, None,
                   termination_path=scratch / "engine.termination")
    # The trainer's termination message (its completion, a plug-in failure) is the container's.
    trainer = Child("trainer", plan.trainer_command(), dict(os.environ), None)
    return trainer, engine


def main(args=None) -> int:
    setup_logging(os.environ.get(plan.ENV_LOG_FORMAT, "text"))
    if not os.environ.get(plan.ENV_COLOCATED_ENGINE):
        print(f"grpojob colocated-pod: {plan.ENV_COLOCATED_ENGINE} is not set (the operator sets it in "
              "a colocated trainer pod with GPUs)", file=sys.stderr)
        return 2
    trainer, engine = _children()
    stopping: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: stopping.append(signum))
    engine.start()
    trainer.start()
    log.info("colocated pod: trainer (pid %d) and engine (pid %d) started", trainer.pid, engine.pid)
    while True:
        ended = wait_any([trainer, engine], timeout=0.5)
        if stopping:
            log.info("colocated pod: signal %d, stopping the trainer and the engine", stopping[0])
            stop_all([trainer, engine], STOP_GRACE_SECONDS)
            return trainer.poll() or 0
        if ended is trainer:
            code = trainer.poll()
            log.info("colocated pod: the trainer exited with code %s; stopping the engine", code)
            stop_all([engine], STOP_GRACE_SECONDS)
            return code
        if ended is engine:
            return _engine_ended(trainer, engine)


def _engine_ended(trainer: Child, engine: Child) -> int:
    """The engine is gone: its reason becomes the container's, then the trainer stops (the kubelet
    restarts the container, as it restarted a separate engine container)."""
    code = engine.poll()
    said = engine.termination()  # plugins.ENGINE_FAILED, or a plug-in that does not load (the job's failure)
    if said is None:
        failures.report(plugins.ENGINE_FAILED, [f"the colocated engine exited with code {code} "
                                                "(its log is above, in this container's)"])
    else:
        failures.write_termination_message(engine.termination_path.read_text(errors="replace"))
        log.error("colocated pod: the engine ended with code %s: %s: %s", code, *said)
    stop_all([trainer], STOP_GRACE_SECONDS)
    return 1
