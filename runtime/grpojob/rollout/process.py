"""The rollout server process: `grpojob rollout` (one per rollout pod / local replica).

Reads everything from the environment (see `grpojob.plan`): GRPOJOB_CONFIG (the job),
GRPOJOB_ROLLOUT_PORT, GRPOJOB_ROLLOUT_BACKEND (hf|vllm; overrides spec.rollout.backend),
GRPOJOB_SYNC_ADDR (the trainer's weight-sync store), GRPOJOB_ADVERTISE_HOST (registered address,
default 127.0.0.1; the server binds 127.0.0.1 for a loopback address, else 0.0.0.0),
GRPOJOB_REPLICA_ID (name in logs and errors), GRPOJOB_CHECKPOINT_DIR (backend checkpoint).

Its life: load the engine (the HTTP API answers meanwhile, grpojob.rollout.server), join weight
sync, serve. It stops, exit 0, on SIGTERM/SIGINT or when its parent dies (grpojob.lifeline); on
SIGTERM it drains first (`drain`: scaled down, a pod deleted; SIGINT stops at once, as `grpojob run`
does at the end of a run, when nobody waits for the answers): it takes no new requests (503, which
the trainer's client sends to another server) and finishes those in flight for up to DRAIN_SECONDS;
only what is still running then is cut off and generated again elsewhere. When
the engine breaks (at start or later) it turns not ready (/readyz 503 with the engine's error),
writes plugins.ENGINE_FAILED and that error as its termination message (grpojob.failures; on a
cluster the kubelet restarts the pod and the operator records the message in an Event, `grpojob
run` restarts the process and shows the message) and exits 1. Stopping is bounded: each step has
a time limit and the process ends SHUTDOWN_SECONDS after it began to exit, whatever still runs.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import sys
import time
from typing import Optional

from aiohttp import web

from grpojob import config as job_config
from grpojob import failures, gguf_model, lifeline, logs
from grpojob.api import plugins
from grpojob.api.spec import GRPOJobSpec
from grpojob.auth import Auth, TokenError
from grpojob.plan import (ENV_ADVERTISE_HOST, ENV_BACKEND, ENV_CHECKPOINT_DIR, ENV_LOG_FORMAT, ENV_REPLICA_ID,
                    ENV_ROLLOUT_PORT, ENV_SYNC_ADDR, ENV_TRAJECTORY_URL, bind_host)
from grpojob.rollout import engine as engines
from grpojob.rollout.server import Server
from grpojob.sync.agent import SyncAgent

log = logging.getLogger("grpojob.rollout")


def setup_logging(fmt: str = "text") -> None:
    logs.setup(fmt)  # the root logger: vLLM's own logs come out in the same format


ENGINE_CHECK_SECONDS = 0.5  # how often the server looks at its engine's health
# After the engine broke: not ready, answering 503 with the engine's error (what the trainer logs),
# for this long before the port closes.
FAILED_LINGER_SECONDS = 1.0
HTTP_DRAIN_SECONDS = 1.0  # requests in flight at shutdown get this long, then are cancelled
SHUTDOWN_SECONDS = 15.0  # the process ends this long after it began to exit, whatever still runs
# On SIGTERM the requests in flight get this long to finish before the shutdown above begins; the
# rollout pod's terminationGracePeriodSeconds (grpojob_operator.children.ROLLOUT_GRACE_SECONDS, 30)
# covers both.
DRAIN_SECONDS = 10.0
DRAIN_POLL_SECONDS = 0.05


async def serve(spec: GRPOJobSpec, *, backend: str, port: int, advertise: str, replica: str,
                sync_addr: Optional[str], checkpoint_dir: Optional[str], auth: Auth,
                trajectory_url: Optional[str] = None) -> int:
    """Serve until SIGTERM/SIGINT, the parent's death (exit 0) or the engine's failure (exit 1,
    with plugins.ENGINE_FAILED and the engine's error as the termination message)."""
    engine = engines.build(backend, spec)
    server = Server(engine, model_path=spec.model.path, sampling=spec.rollout.sampling, replica=replica, auth=auth,
                    trajectory_url=trajectory_url)
    runner = web.AppRunner(server.app(), access_log=None, shutdown_timeout=HTTP_DRAIN_SECONDS)
    await runner.setup()
    site = web.TCPSite(runner, bind_host(advertise), port)
    await site.start()
    if port == 0:  # an ephemeral port (tests): advertise the one the OS picked
        port = runner.addresses[0][1]
    url = f"http://{advertise}:{port}"
    log.info("rollout server %s (%s) listening on %s", replica, backend, url)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    signalled: list[str] = []

    def stop_for(why: str, by_signal: bool = False) -> None:
        if not stop.is_set():
            log.info("rollout server %s: stopping (%s)", replica, why)
            if by_signal:
                signalled.append(why)
            stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop_for, signal.Signals(sig).name, True)
    lifeline.watch_parent(lambda: loop.call_soon_threadsafe(stop_for, "the parent process is gone"),
                          grace=SHUTDOWN_SECONDS)
    code = 1
    try:
        code = await _run(server, stop, sync_addr=sync_addr, url=url, checkpoint_dir=checkpoint_dir)
        if code == 0 and server.started and signalled == ["SIGTERM"]:  # scaled down, deleted: finish what it has
            await drain(server, DRAIN_SECONDS)
    finally:
        lifeline.exit_within(SHUTDOWN_SECONDS, code)
        await _shut_down(server, runner)
    log.info("rollout server %s stopped (exit code %d)", replica, code)
    return code


async def _run(server: Server, stop: asyncio.Event, *, sync_addr: Optional[str], url: str,
               checkpoint_dir: Optional[str]) -> int:
    engine, replica = server.engine, server.replica
    starting = asyncio.ensure_future(engine.start())
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait([starting, stopping], return_when=asyncio.FIRST_COMPLETED)
    if not starting.done():  # stopped while loading (minutes for a large model)
        starting.cancel()
        return 0
    stopping.cancel()
    if (e := starting.exception()) is not None:
        server.start_error = f"{type(e).__name__}: {e}"
        log.error("rollout server %s: the %s engine failed to start", replica, engine.backend, exc_info=e)
        # a missing package, model or tokenizer file, a model the engine cannot run: the same at
        # every start, so the run (the job) stops at once; a device error (RuntimeError) is retried
        reason = plugins.START_REFUSED if isinstance(e, (ImportError, OSError, ValueError)) else plugins.ENGINE_FAILED
        failures.report(reason, [f"rollout server {replica}: the {engine.backend} engine failed to start: "
                                 f"{server.start_error}"])
        return 1
    server.started = True
    if sync_addr:
        server.agent = SyncAgent(engine, sync_addr, replica=replica, url=url, model_dir=server.model_path,
                                 checkpoint_dir=checkpoint_dir, token=server.auth.token,
                                 delta_files=engines.applies_file_deltas(type(engine))).start()
    log.info("rollout server %s: engine up (policy version %d)", replica, engine.version)
    while not stop.is_set():
        dead = server.broken()
        if dead:
            failures.report(plugins.ENGINE_FAILED, [f"rollout server {replica}: {dead}"])
            log.error("rollout server %s: exiting in %.0f s (not ready meanwhile)", replica, FAILED_LINGER_SECONDS)
            await asyncio.sleep(FAILED_LINGER_SECONDS)
            return 1
        try:
            await asyncio.wait_for(stop.wait(), ENGINE_CHECK_SECONDS)
        except asyncio.TimeoutError:
            pass
    return 0


async def drain(server: Server, seconds: float) -> tuple[int, int]:
    """Take no new requests (they get 503 `draining`, /readyz turns unready), leave the weight-sync
    group (no push waits for this server, the trainer's client stops picking it) and wait up to
    `seconds` for the requests in flight; log what was finished and what is cut off. (finished, cut off)."""
    server.draining = True
    t0, at_start = time.monotonic(), server.inflight
    if server.agent is not None:
        await asyncio.to_thread(server.agent.leave, "stopping: it finishes the requests it has")
    if not at_start:
        log.info("rollout server %s: nothing in flight to drain", server.replica)
        return 0, 0
    log.info("rollout server %s: draining %d requests in flight (up to %.0f s); new ones go to the other "
             "servers", server.replica, at_start, seconds)
    while server.inflight and time.monotonic() - t0 < seconds:
        await asyncio.sleep(DRAIN_POLL_SECONDS)
    (finished, tokens), cut = server.drained, server.inflight
    log.info("rollout server %s: drained in %.2f s: %d requests finished (%d completion tokens), %d cut off "
             "(generated again on another server)", server.replica, time.monotonic() - t0, finished, tokens, cut)
    return finished, cut


async def _shut_down(server: Server, runner: web.AppRunner) -> None:
    """The weight-sync agent, the HTTP server and the engine stop side by side (closing the engine
    answers the requests in flight, which lets the HTTP server drain), each within its own time
    limit; one that overruns is logged and left behind (the exit deadline ends the process)."""
    steps = [("the HTTP server", runner.cleanup(), HTTP_DRAIN_SECONDS + 3.0),
             ("the engine", server.engine.close(), 5.0),
             ("the agent sessions' client", server.sessions.close(), 3.0)]
    if server.agent:
        steps.append(("the weight-sync agent", asyncio.to_thread(server.agent.stop, 2.0), 3.0))

    async def bounded(what: str, step, seconds: float) -> None:
        try:
            await asyncio.wait_for(step, seconds)
        except asyncio.TimeoutError:
            log.warning("rollout server %s: stopping %s took over %.0f s; going on", server.replica, what, seconds)
        except Exception:  # noqa: BLE001 - the other steps still run
            log.exception("rollout server %s: stopping %s failed", server.replica, what)

    await asyncio.gather(*(bounded(*step) for step in steps))


def main(args: Optional[argparse.Namespace] = None) -> int:
    setup_logging(os.environ.get(ENV_LOG_FORMAT, "text"))
    try:
        job = job_config.load()
    except failures.PluginError as e:
        failures.report(e.reason, e.errors)
        return 1
    try:
        gguf_model.resolve(job)  # a GGUF spec.model.path: its model folder (converted once, under a lock)
    except (FileNotFoundError, gguf_model.ConversionError) as e:
        failures.report(plugins.START_REFUSED, [str(e)])  # the same at every restart: the job's failure
        return 1
    spec = job.spec
    backend = os.environ.get(ENV_BACKEND) or spec.rollout.backend
    err = plugins.check_name("engine", backend)
    if err:
        print(f"grpojob rollout: {ENV_BACKEND}={backend!r}: {err}", file=sys.stderr)
        return 2
    port_text = os.environ.get(ENV_ROLLOUT_PORT) or str(spec.rollout.port)
    if not port_text.isdecimal():
        print(f"grpojob rollout: {ENV_ROLLOUT_PORT}={port_text!r} is not a port number", file=sys.stderr)
        return 2
    replica = os.environ.get(ENV_REPLICA_ID) or f"rollout-{socket.gethostname()}-{os.getpid()}"
    try:
        auth = Auth.from_env()
    except TokenError as e:
        print(f"grpojob rollout: {e}", file=sys.stderr)
        return 2
    return asyncio.run(serve(spec, backend=backend, port=int(port_text), auth=auth,
                             advertise=os.environ.get(ENV_ADVERTISE_HOST) or "127.0.0.1", replica=replica,
                             sync_addr=os.environ.get(ENV_SYNC_ADDR) or None,
                             checkpoint_dir=os.environ.get(ENV_CHECKPOINT_DIR) or None,
                             trajectory_url=os.environ.get(ENV_TRAJECTORY_URL) or None))


if __name__ == "__main__":
    sys.exit(main())
