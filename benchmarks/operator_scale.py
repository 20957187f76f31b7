"""Operator scale: N GRPOJobs created at once against the kmock API emulator.

For each N, two runs side by side on a fresh emulator each:
  baseline  a plain client (the same official kubernetes.aio client the operator uses) creates the
            same N x 8 child objects directly (the job's Secret and two NetworkPolicies included):
            the cost of the API calls alone;
  operator  `grpojob operator` as a real process (kopf, watches, indexes, status) reconciles the N
            jobs created at once.
Prints the time until every job has all its children (and the ratio to the baseline), the time
until every job reports Created, reconciles per second (burst, and steady at the given timer
interval), the operator's CPU seconds and its peak RSS (VmHWM). No pods are made (children only).

    python benchmarks/operator_scale.py --jobs 10 100 500
"""
from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the kmock shim lives with the operator tests

import aiohttp  # noqa: E402
import kmock  # noqa: E402
import yaml  # noqa: E402

from grpojob.api import parse  # noqa: E402
from grpojob_operator import children  # noqa: E402
from grpojob_operator import names as n  # noqa: E402
from grpojob_operator.kube import Kube  # noqa: E402
from tests.operator_k8s.conftest import job_manifest, job_path  # noqa: E402
from tests.operator_k8s.kmock_shim import (CONFIGMAPS, DEPLOYMENTS, GRPOJOBS, NETWORKPOLICIES,  # noqa: E402
                                           SECRETS, SERVICES, STATEFULSETS, Emulator)

NS = "bench"
KINDS = (SECRETS, NETWORKPOLICIES, CONFIGMAPS, SERVICES, STATEFULSETS, DEPLOYMENTS)
PER_JOB = 8  # Secret, 2 NetworkPolicies, ConfigMap, 2 Services, StatefulSet, Deployment


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kubeconfig(emu: Emulator, work: Path) -> str:
    path = work / f"kubeconfig-{emu.url.port}"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "kmock",
        "clusters": [{"name": "kmock", "cluster": {"server": str(emu.url).rstrip("/")}}],
        "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "bench"}}],
        "users": [{"name": "bench", "user": {"token": "bench"}}]}))
    return str(path)


def children_done(emu: Emulator, count: int) -> bool:
    return sum(len(emu.live(res, NS)) for res in KINDS) >= PER_JOB * count


def created_done(emu: Emulator, names: list[str]) -> bool:
    for name in names:
        st = (emu.get_obj(GRPOJOBS, NS, name) or {}).get("status") or {}
        if not any(c["type"] == "Created" and c["status"] == "True" for c in st.get("conditions", [])):
            return False
    return True


async def wait_for(check, timeout: float, what: str, period: float = 0.1) -> float:
    t0 = time.monotonic()
    while not check():
        if time.monotonic() - t0 > timeout:
            raise SystemExit(f"timed out after {timeout:.0f}s waiting for {what}")
        await asyncio.sleep(period)
    return time.monotonic()


async def baseline(count: int, work: Path) -> float:
    """Seconds for a plain client to create N jobs' children, 16 requests in flight."""
    async with Emulator() as emu, kmock.Server(emu):
        os.environ["KUBECONFIG"] = kubeconfig(emu, work)
        kube = await Kube.connect()
        objs = [o for i in range(count) for o in (
            children.token_secret(f"job-{i:03d}", NS, None, "t"),
            *children.build(parse(job_manifest(f"job-{i:03d}", ns=NS)), namespace=NS))]
        gate = asyncio.Semaphore(16)

        async def create(obj: dict) -> None:
            async with gate:
                await kube.create(obj)
        t0 = time.monotonic()
        await asyncio.gather(*(create(o) for o in objs))
        seconds = time.monotonic() - t0
        await kube.close()
        assert children_done(emu, count)
        return seconds


async def reconciles(port: int) -> float:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{port}/metrics") as resp:
            text = await resp.text()
    return sum(float(v) for v in re.findall(r'^grpojob_operator_reconciles_total\{[^}]*\} (\S+)$', text, re.M))


def proc_stats(pid: int) -> tuple[float, float]:
    """(peak RSS in MiB, CPU seconds) of a live process."""
    status = Path(f"/proc/{pid}/status").read_text()
    hwm = int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) / 1024
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return hwm, cpu


async def operator_run(count: int, work: Path, interval: float, steady: float) -> dict:
    async with Emulator() as emu, kmock.Server(emu):
        port = free_port()
        env = {**os.environ, "KUBECONFIG": kubeconfig(emu, work), "GRPOJOB_OPERATOR_INTERVAL": str(interval),
               # No trainer runs: point the status look at a closed port (no pods ever run anyway).
               n.TRAINER_URL_ENV: f"http://127.0.0.1:{free_port()}"}
        log = open(work / f"operator-{count}.log", "wb")
        proc = subprocess.Popen([sys.executable, "-m", "grpojob", "operator", "--metrics-port", str(port),
                                 "--liveness", ""], env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            await wait_for(lambda: _up(port), 60, "the operator's metrics port")
            names = [f"job-{i:03d}" for i in range(count)]
            t0 = time.monotonic()
            await asyncio.gather(*(_create(emu, name) for name in names))
            t_children = await wait_for(lambda: children_done(emu, count), 600, "all children") - t0
            t_created = await wait_for(lambda: created_done(emu, names), 600, "all Created", 0.25) - t0
            burst = await reconciles(port)
            r0, s0 = burst, time.monotonic()
            await asyncio.sleep(steady)
            r1 = await reconciles(port)
            steady_rate = (r1 - r0) / (time.monotonic() - s0)
            rss, cpu = proc_stats(proc.pid)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.to_thread(proc.wait, 30)
            except subprocess.TimeoutExpired:
                proc.kill()
            log.close()
        return {"children": t_children, "created": t_created, "burst_rate": burst / t_created,
                "steady_rate": steady_rate, "rss": rss, "cpu": cpu}


def _up(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


async def _create(emu: Emulator, name: str) -> None:
    async with emu.post(job_path(NS), json=job_manifest(name, ns=NS)) as resp:
        assert resp.status < 300, await resp.text()


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, nargs="+", default=[10, 100, 500])
    p.add_argument("--interval", type=float, default=10.0, help="operator status timer (the default)")
    p.add_argument("--steady", type=float, default=20.0, help="seconds to measure steady reconciles")
    p.add_argument("--logs", type=Path, help="keep the operator logs (and kubeconfigs) in this directory")
    a = p.parse_args()
    print(f"{'jobs':>5} {'baseline s':>10} {'children s':>10} {'ratio':>6} {'Created s':>9} "
          f"{'burst rec/s':>11} {'steady rec/s':>12} {'expected':>8} {'cpu s':>6} {'peak RSS':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        work = a.logs or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        for count in a.jobs:
            base = await baseline(count, work)
            r = await operator_run(count, work, a.interval, a.steady)
            print(f"{count:>5} {base:>10.2f} {r['children']:>10.2f} {r['children'] / base:>6.1f} "
                  f"{r['created']:>9.2f} {r['burst_rate']:>11.1f} {r['steady_rate']:>12.1f} "
                  f"{count / a.interval:>8.1f} {r['cpu']:>6.1f} {r['rss']:>7.0f}Mi", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
