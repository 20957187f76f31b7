"""devices.release_cpu_threads: a thread that is about to wait hands its OpenMP worker threads
back, so that the thread that computes next (an in-process engine, the trainer) keeps spinning
between its parallel regions (GNU OpenMP throttles every team once all teams' threads outnumber
the cores). Measured in a process of its own: the test counts the process's threads."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import json, os, threading
    import torch
    from grpojob import devices

    def tasks():
        return len(os.listdir("/proc/self/task"))

    def parallel_op():  # large enough for torch to run it on its intra-op team
        torch.ones(1 << 22).add_(1)

    torch.set_num_threads(2)
    parallel_op()  # the main thread's team: its worker stays
    seen = {"main": tasks()}

    def other():
        torch.set_num_threads(2)
        parallel_op()
        seen["other with its team"] = tasks()
        seen["released"] = devices.release_cpu_threads()
        seen["other after release"] = tasks()
        parallel_op()  # the team comes back for the next op
        seen["other after another op"] = tasks()
        devices.release_cpu_threads()

    t = threading.Thread(target=other)
    t.start()
    t.join()
    parallel_op()  # the main thread's worker was not released with the other thread's
    seen["main after"] = tasks()
    print(json.dumps(seen))
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts threads in /proc/self/task")
def test_a_thread_that_waits_releases_its_own_openmp_workers_and_no_others():
    import json

    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, check=True)
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    if not seen["released"]:
        pytest.skip("torch runs on an OpenMP runtime other than GNU's: release_cpu_threads does nothing there")
    base = seen["main"]
    assert seen["other with its team"] == base + 2  # the thread and its team's worker
    assert seen["other after release"] == base + 1  # the worker is gone, the thread is not
    assert seen["other after another op"] == base + 2
    assert seen["main after"] == base  # the main thread's worker survived: no new one was needed
