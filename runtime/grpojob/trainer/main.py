"""`grpojob trainer`: one rank under torchrun (or a lone process). Reads the job from
GRPOJOB_CONFIG, joins the process group, serves the leader endpoint on rank 0, trains, and exits
0 when suspended (POST /suspend, SIGTERM, or its parent's death: grpojob.lifeline), non-zero on
failure. A suspend does not wait for a stalled generation: the step waiting for its groups is
given up and the last finished step is checkpointed.

A completed trainer does not exit on its own: it stays up, /status saying "completed", until
SIGTERM (or POST /suspend), then exits 0 at once. In a pod the StatefulSet would restart a
container that exits, even with code 0 (restartPolicy Always), so the operator, which scales the
job down once it reads "completed", is the one to end it; `grpojob run` does the same. A
completed trainer that is restarted anyway resumes from its final checkpoint, trains nothing,
and says "completed" again."""
from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
from typing import Optional

from transformers.utils import logging as hf_logging

from grpojob import config, failures, gguf_model, lifeline, logs
from grpojob.auth import Auth, TokenError
from grpojob.checkpoint.storage import StorageRefused
from grpojob.data import DatasetError
from grpojob.devices import DeviceError
from grpojob.leader.build import build
from grpojob.leader.server import LeaderServer, StatusBoard
from grpojob.learner import dist
from grpojob.learner.trainer import TrainerError
from grpojob.service.app import serve
from grpojob.plan import ENV_LOG_FORMAT, ENV_TRAINER_PORT, bind_host

log = logging.getLogger("grpojob.trainer")

PET_MASTER_ADDR = "PET_MASTER_ADDR"  # torchrun's rendezvous host, set by the plan
# After its parent (torchrun) died, a rank checkpoints and stops, and is ended this long after anyway.
PARENT_GONE_GRACE_SECONDS = 30.0
EXIT_SECONDS = 30.0  # the process ends this long after its work ended, whatever is still running


def setup_logging(rank: int) -> None:
    logs.setup(os.environ.get(ENV_LOG_FORMAT, "text"), tag=f"[rank {rank}]", logger="grpojob")


def _listen_host() -> str:
    # Peers reach us at the rendezvous host: loopback locally, the pod's Service on a cluster.
    return bind_host(os.environ.get(PET_MASTER_ADDR, "127.0.0.1"))


# The plan always gives the trainer rollout servers; generating inside the trainer process is for
# running the trainer alone (its own tests, debugging).
ENV_ROLLOUT_SOURCE = "GRPOJOB_ROLLOUT_SOURCE"  # remote (default) | inprocess


def main(args: Optional[argparse.Namespace] = None) -> int:

    rank = int(os.environ.get("RANK", "0"))
    setup_logging(rank)
    hf_logging.disable_progress_bar()  # no tqdm bars in pod logs
    suspend = threading.Event()

    def on_sigterm(signum, frame) -> None:
        log.info("SIGTERM: finishing the step, then checkpoint and stop (at once when completed)")
        suspend.set()

    signal.signal(signal.SIGTERM, on_sigterm)
    lifeline.watch_parent(suspend.set, grace=PARENT_GONE_GRACE_SECONDS)

    # What a trainer refuses before it trains fails the same way at every start: the spec (its
    # fields checked against the model, the dataset, the device), a missing file or package.
    refusals = (TrainerError, DatasetError, ValueError, ImportError, FileNotFoundError, NotADirectoryError,
                DeviceError, TokenError)
    board: Optional[StatusBoard] = None
    server: Optional[LeaderServer] = None
    env = None
    clean = False
    training = False  # past the start: a failure now is worth a restart (it resumes)
    try:
        job = config.load(resolve_plugins=False)
        auth = Auth.from_env()  # before anything starts: a missing token is a clear error
        env = dist.init(timeout_seconds=max(1800, job.spec.weight_sync.timeout_seconds))
        if env.is_leader:
            board = StatusBoard(job.spec.training.steps)
            board.suspend_requested = suspend
            port = int(os.environ.get(ENV_TRAINER_PORT) or job.spec.trainer.port)
            server = LeaderServer(board, _listen_host(), port, auth).start()
        config.load_plugins(job)  # after the leader endpoint is up: /status can tell what failed
        gguf_model.resolve(job)  # a GGUF spec.model.path: its model folder (converted once, under a lock)
        run = build(job, env=env, rollouts=os.environ.get(ENV_ROLLOUT_SOURCE, "remote"),
                    listen_host=_listen_host(), board=board, suspend=suspend, auth=auth)
        if server is not None:
            server.mount_trajectories(run.trajectory_api(auth))
        training = True
        phase = serve(run, server) if job.spec.mode == "service" else run.run(hold=True)
        log.info("trainer %s", phase, extra={"step": run.trainer.step})
        clean = True
        return 0
    except failures.PluginError as e:
        msg = failures.report(e.reason, e.errors) if rank == 0 else str(e)
        if board is not None:
            board.update(phase="failed", message=msg)
        return 1
    except BaseException as e:  # noqa: BLE001 - report every failure in /status and the exit code
        if isinstance(e, KeyboardInterrupt):
            msg = "interrupted"
        elif isinstance(e, SystemExit):
            msg = str(e.code)
        else:
            msg = f"{type(e).__name__}: {e}"
        expected = isinstance(e, (SystemExit, KeyboardInterrupt, TrainerError, TokenError))  # already says what/where
        log.error("trainer failed: %s", msg, exc_info=not expected)
        if isinstance(e, Exception):  # its own error where the user looks: the CLI, the pod's status
            # storage the trainer cannot write stays so however often it restarts (checkpoint.storage)
            permanent = isinstance(e, StorageRefused) or (not training and isinstance(e, refusals))
            failures.report_exception(e, permanent=permanent, rank=rank)
        if board is not None:
            board.update(phase="failed", message=msg)
        return 1
    finally:
        lifeline.exit_within(EXIT_SECONDS, 0 if clean else 1)  # whatever hangs below (a peer gone mid-collective)
        if env is not None:
            dist.shutdown(env, clean=clean)
        if server is not None:
            server.stop()


def process(args: Optional[argparse.Namespace] = None) -> int:
    """`grpojob trainer` as a whole process: main(), then the process ends at once with its code
    (lifeline.exit_now: a normal interpreter exit can abort a rank that finished cleanly)."""
    lifeline.exit_now(main(args))
    return 1  # not reached
