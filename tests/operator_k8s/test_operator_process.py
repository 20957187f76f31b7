"""`grpojob operator` and `kopf run -m grpojob_operator.standalone` as real processes against the
emulator: they start, reconcile a job, serve metrics and liveness, and stop cleanly on SIGTERM."""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest
from grpojob.local.processes import free_port
from grpojob_operator import names as n

from .cluster import eventually
from .conftest import NS, job_manifest, job_path
from .kmock_shim import GRPOJOBS


@pytest.mark.parametrize("how", ["grpojob", "kopf"])
async def test_operator_process_reconciles_serves_metrics_and_stops_on_sigterm(
        how, emulator, cluster, kubeconfig, trainer, tmp_path: Path):
    metrics, live = free_port(), free_port()
    env = {**os.environ, "KUBECONFIG": kubeconfig, "GRPOJOB_OPERATOR_INTERVAL": "0.3",
           n.TRAINER_URL_ENV: trainer.url_template, "GRPOJOB_METRICS_PORT": str(metrics)}
    bin_dir = Path(sys.executable).parent
    if how == "grpojob":
        argv = [sys.executable, "-m", "grpojob", "operator", "--metrics-port", str(metrics),
                "--liveness", f"http://127.0.0.1:{live}/healthz"]
    else:
        argv = [str(bin_dir / "kopf"), "run", "--standalone", "-A", "-m", "grpojob_operator.standalone",
                "--liveness", f"http://127.0.0.1:{live}/healthz"]
    log = open(tmp_path / "operator.log", "wb")
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        await cluster.create(job_path(), job_manifest("proc"))
        await eventually(lambda: (emulator.get_obj(GRPOJOBS, NS, "proc") or {}).get("status", {}).get("phase")
                         == "Initializing", timeout=60, what=f"{how} operator reconciles")
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{metrics}/metrics") as resp:
                assert 'grpojob_operator_jobs{phase="Initializing"} 1.0' in await resp.text()
            async with http.get(f"http://127.0.0.1:{live}/healthz") as resp:
                assert resp.status == 200
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(proc.wait, 30)
        assert code == 0, (tmp_path / "operator.log").read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()


async def test_kill9_of_the_operator_process_mid_reconcile_a_new_one_converges_without_duplicates(
        emulator, cluster, kubeconfig, trainer, tmp_path: Path):
    """Issue #42: the operator killed (SIGKILL, no shutdown of its own) while its StatefulSet create
    has reached the API server but not answered; the next operator process finds what is there and
    creates the rest, each child once, and the job's status converges."""
    from grpojob.api import parse
    from grpojob_operator import children

    from .kmock_shim import STATEFULSETS
    from .test_operator import CHILD_RESOURCES, cond, hold_first_statefulset_create, kids

    held = hold_first_statefulset_create(emulator)
    env = {**os.environ, "KUBECONFIG": kubeconfig, "GRPOJOB_OPERATOR_INTERVAL": "0.3",
           n.TRAINER_URL_ENV: trainer.url_template}

    def start(name: str) -> subprocess.Popen:
        log = open(tmp_path / f"{name}.log", "wb")
        return subprocess.Popen([sys.executable, "-m", "grpojob", "operator", "--metrics-port", str(free_port())],
                                env=env, stdout=log, stderr=subprocess.STDOUT)

    first = start("first")
    second = None
    try:
        await cluster.create(job_path(), job_manifest("k9"))
        await eventually(lambda: held, timeout=60, what="StatefulSet create in flight")
        first.kill()  # SIGKILL mid-reconcile
        assert await asyncio.to_thread(first.wait, 10) == -signal.SIGKILL
        assert emulator.get_obj(STATEFULSETS, NS, n.trainer_name("k9")) is not None
        second = start("second")
        await eventually(lambda: cond(emulator, "k9", "Created").get("status") == "True", timeout=60,
                         what="the second operator converges")
    finally:
        for p in (first, second):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
    assert sorted(kids(emulator, "k9")) == sorted(children.key(o) for o in children.build(
        parse(job_manifest("k9")), namespace=NS))
    for res in CHILD_RESOURCES:  # every child created once: nothing re-posted, nothing duplicated
        names = [r.data["metadata"]["name"] for r in emulator.requests_for(res, "create") if r not in held]
        assert len(names) == len(set(names)), f"{res.plural} created twice: {names}"
