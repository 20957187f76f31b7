"""`grpojob torchrun` stopped by SIGTERM while torch is still being imported: it stops there and
starts no rank. CI found a colocated pod whose engine died 1 s after start: the pod's SIGTERM to the
launcher came during `import torch`, inside an import's own try/except, which swallowed what the
handler raised, and the trainer trained on for a minute."""
from __future__ import annotations

import subprocess
import sys

# The launcher in a process of its own; the SIGTERM is delivered inside a `try/except Exception` of
# the import (as optional imports guard themselves), and torchrun is replaced by a marker.
SCRIPT = r"""
import builtins, os, signal, sys, time
real = builtins.__import__
sent = []

def importing(name, *args, **kwargs):
    if name == "torch.distributed.run" and not sent:
        sent.append(1)
        try:  # an optional import's guard
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)
        except Exception:
            pass
        module = real(name, *args, **kwargs)
        module.main = lambda argv: print("RANKS STARTED", flush=True)
        return module
    return real(name, *args, **kwargs)

builtins.__import__ = importing
from grpojob.trainer import launch
sys.exit(launch.main())
"""


def test_a_sigterm_while_torch_imports_stops_the_launcher_before_any_rank():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert "RANKS STARTED" not in out.stdout, out.stdout + out.stderr
    assert out.returncode != 0 and "SignalException" in out.stderr, out.stderr[-2000:]
