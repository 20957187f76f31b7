"""Chaos: what each fault costs a `grpojob run` of the tiny job (issue 42; docs/fault-tolerance.md).

Each fault is injected into one real process mid-run by tests/local/chaos.py (the scenarios the
chaos tests assert on), beside a baseline run of the same job with no fault. One row per fault:

  recover_s   seconds from the fault to the first step recorded past the last one before it
  x_step      recover_s over the baseline's median step time (so a loaded machine compares too)
  steps_lost  steps trained again after the fault (a trainer resumed from its last checkpoint)
  rollouts_lost  prompts of the run's steps that no final step trained
  twice       prompts trained twice (should be 0)

    python benchmarks/chaos.py                   # every fault
    python benchmarks/chaos.py --faults trainer  # those whose name contains "trainer"
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the scenarios live with the chaos tests

from tests.local import chaos  # noqa: E402
from tests.local.test_run import processes_of  # noqa: E402

FAULTS = {
    "kill -9 rollout-1 of 2": (lambda d: chaos.kill9(chaos.rollout_server(d, 1)), ("rollout.replicas=2",), {}),
    "kill -9 trainer rank 0": (lambda d: chaos.kill9(chaos.trainer_rank(d, 0)), ("algorithm.maxStaleness=1",),
                               {"after": 4, "need_checkpoint": True}),
    "SIGSTOP rollout-1 of 2": (lambda d: chaos.freeze(chaos.rollout_server(d, 1)),
                               ("rollout.replicas=2", "weightSync.timeoutSeconds=30"), {}),
}


def _clean(workdir: Path) -> None:
    import os
    import signal
    for pid in processes_of(workdir / "run"):
        os.kill(pid, signal.SIGKILL)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--faults", default="", help="only the faults whose name contains this")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "baseline"
        base.mkdir()
        try:
            o = chaos.run_with_fault(base, "none (baseline)", lambda d: None)
        finally:
            _clean(base)
        step = statistics.median(r["step_seconds"] for r in o.before + o.after)
        rows.append(o)
        for name, (inject, sets, kw) in FAULTS.items():
            if args.faults not in name:
                continue
            work = Path(tmp) / name.replace(" ", "-").replace("/", "")
            work.mkdir()
            try:
                rows.append(chaos.run_with_fault(work, name, inject, *sets, **kw))
            finally:
                _clean(work)
    print(f"baseline median step: {step:.2f} s")
    print(f"{'fault':<26} {'exit':>4} {'recover_s':>9} {'x_step':>7} {'steps_lost':>10} {'rollouts_lost':>13} {'twice':>5}")
    for o in rows:
        rec = "-" if o.recovery_seconds is None else f"{o.recovery_seconds:.1f}"
        ratio = "-" if o.recovery_seconds is None else f"{o.recovery_seconds / step:.1f}"
        print(f"{o.fault:<26} {o.returncode:>4} {rec:>9} {ratio:>7} {o.steps_lost:>10} {o.rollouts_lost:>13} "
              f"{o.trained_twice:>5}")


if __name__ == "__main__":
    main()
