"""The package layers (pyproject's [tool.importlinter], docs/architecture.md): each process's
package imports only the packages below it, no two siblings import each other, the operator never
reaches past the spec and the plan; and no module grows past 400 lines."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINT = Path(sys.executable).with_name("lint-imports")
MAX_LINES = 400


def lint(pythonpath: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    return subprocess.run([str(LINT), "--no-cache", "--no-logo", str(ROOT / "pyproject.toml")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def test_the_import_contracts_hold():
    out = lint()
    assert out.returncode == 0, out.stdout + out.stderr
    assert "4 kept, 0 broken" in out.stdout


def test_a_deliberate_violation_breaks_the_layers(tmp_path):
    """The same contracts over a copy of the packages in which the spec imports the trainer's loop:
    lint-imports fails and names the import (so the contract is not vacuous)."""
    shutil.copytree(ROOT / "runtime" / "grpojob", tmp_path / "grpojob")
    shutil.copytree(ROOT / "operator" / "grpojob_operator", tmp_path / "grpojob_operator")
    base = tmp_path / "grpojob" / "api" / "base.py"
    base.write_text(base.read_text() + "\nimport grpojob.leader.loop  # deliberate: the spec may not know the loop\n")
    out = lint(tmp_path)
    assert out.returncode != 0, out.stdout
    assert "grpojob.api is not allowed to import grpojob.leader" in out.stdout
    assert "grpojob.api.base -> grpojob.leader.loop" in out.stdout


def test_no_module_is_over_400_lines():
    long = {str(p.relative_to(ROOT)): n for top in ("runtime/grpojob", "operator/grpojob_operator")
            for p in (ROOT / top).rglob("*.py") if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}
