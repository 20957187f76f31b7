"""The judge server process: `grpojob judge` (one per judge pod / local replica).

Reads the job from GRPOJOB_CONFIG and its judge's name from GRPOJOB_JUDGE (spec.judges[].name), its
port from GRPOJOB_JUDGE_PORT (default: the judge's port), GRPOJOB_ADVERTISE_HOST (loopback: listen
on 127.0.0.1, else every interface). Loads the model while /healthz answers, turns ready, serves
until SIGTERM/SIGINT or its parent's death (exit 0). A model that cannot load is the same at every
start: the process writes StartRefused and the error as its termination message and exits 1.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import sys
from typing import Optional

from aiohttp import web

from grpojob import config as job_config
from grpojob import failures, lifeline, logs
from grpojob.api import plugins
from grpojob.api.judge import JudgeSpec
from grpojob.auth import Auth, TokenError
from grpojob.judge import engine as engines
from grpojob.judge.server import Server
from grpojob.plan import ENV_ADVERTISE_HOST, ENV_JUDGE, ENV_JUDGE_PORT, ENV_LOG_FORMAT, ENV_REPLICA_ID, bind_host

log = logging.getLogger("grpojob.judge")
SHUTDOWN_SECONDS = 10.0


async def serve(spec: JudgeSpec, *, port: int, advertise: str, replica: str, auth: Auth) -> int:
    server = Server(spec, auth, replica)
    runner = web.AppRunner(server.app(), access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    await web.TCPSite(runner, bind_host(advertise), port).start()
    log.info("judge %s (%s, %s) listening on %s:%d", replica, spec.name, spec.engine, advertise, port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    lifeline.watch_parent(lambda: loop.call_soon_threadsafe(stop.set), grace=SHUTDOWN_SECONDS)
    code = 0
    try:
        loading = asyncio.ensure_future(asyncio.to_thread(engines.build, spec))
        stopping = asyncio.ensure_future(stop.wait())
        await asyncio.wait([loading, stopping], return_when=asyncio.FIRST_COMPLETED)
        if loading.done():
            if (e := loading.exception()) is not None:
                server.start_error = f"{type(e).__name__}: {e}"
                log.error("judge %s: the model failed to load", replica, exc_info=e)
                failures.report(plugins.START_REFUSED, [f"judge {replica}: {server.start_error}"])
                code = 1
            else:
                server.loaded(loading.result())
                log.info("judge %s: ready", replica)
                await stop.wait()
        stopping.cancel()
    finally:
        lifeline.exit_within(SHUTDOWN_SECONDS, code)
        if server.batcher:
            await server.batcher.close()
        await runner.cleanup()
    return code


def main(args: Optional[argparse.Namespace] = None) -> int:
    logs.setup(os.environ.get(ENV_LOG_FORMAT, "text"))
    try:
        job = job_config.load(resolve_plugins=False)
    except failures.PluginError as e:
        failures.report(e.reason, e.errors)
        return 1
    name = os.environ.get(ENV_JUDGE, "")
    spec = next((j for j in job.spec.judges if j.name == name), None)
    if spec is None:
        print(f"grpojob judge: {ENV_JUDGE}={name!r} names no entry of spec.judges "
              f"({', '.join(j.name for j in job.spec.judges) or 'none'})", file=sys.stderr)
        return 2
    port = os.environ.get(ENV_JUDGE_PORT) or str(spec.port)
    if not port.isdigit():
        print(f"grpojob judge: {ENV_JUDGE_PORT}={port!r} is not a port number", file=sys.stderr)
        return 2
    try:
        auth = Auth.from_env()
    except TokenError as e:
        print(f"grpojob judge: {e}", file=sys.stderr)
        return 2
    replica = os.environ.get(ENV_REPLICA_ID) or f"judge-{name}-{socket.gethostname()}"
    return asyncio.run(serve(spec, port=int(port), advertise=os.environ.get(ENV_ADVERTISE_HOST) or "127.0.0.1",
                             replica=replica, auth=auth))


if __name__ == "__main__":
    sys.exit(main())
