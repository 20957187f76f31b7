"""The public surface (CHANGELOG.md, version policy) is pinned: names and signatures of the modules
users import, against tests/plugins/public_surface.json; the examples import nothing else of
grpojob, and import with grpojob's deprecations as errors."""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tools import public_surface as ps

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").rglob("*.py"))
# a framework's own names (examples/plugins/areal/remax_areal.py imports AReaL) load where the frameworks
# set installs it (.ci/sets/frameworks.sh)
FRAMEWORKS = ("areal", "cosmos_rl", "verl", "art")


def _absent_framework(path: Path) -> bool:
    import importlib.util
    tops = {a.name.split(".")[0] for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Import)
            for a in n.names} | {(n.module or "").split(".")[0] for n in ast.walk(ast.parse(path.read_text()))
                                  if isinstance(n, ast.ImportFrom)}
    return any(t in FRAMEWORKS and importlib.util.find_spec(t) is None for t in tops)


PLUGIN_EXAMPLES = sorted(p for p in (ROOT / "examples" / "plugins").rglob("*.py") if not _absent_framework(p))
HOW = ("\nIf the change is deliberate: `python -m tools.public_surface --write`, a CHANGELOG.md line, and a "
       "forwarding path for what was removed or renamed (grpojob.deprecation.forward).")


def test_the_public_surface_matches_its_snapshot():
    diff = ps.differences(json.loads(ps.SNAPSHOT.read_text()), ps.surface())
    assert diff == [], "the public surface changed:\n" + "\n".join(diff) + HOW


def test_a_removed_renamed_or_changed_public_name_fails_the_check(monkeypatch):
    import grpojob.plugins

    snapshot = json.loads(ps.SNAPSHOT.read_text())
    # removed: a name taken out of __all__ (what `del` or a rename in the module does to the surface)
    monkeypatch.setattr(grpojob.plugins, "__all__", [n for n in grpojob.plugins.__all__ if n != "Group"])
    # changed: a hook's signature
    monkeypatch.setattr(grpojob.plugins.GRPOTrainer, "loss_fn", lambda self, logp: None)
    diff = ps.differences(snapshot, ps.surface())
    assert "removed: grpojob.plugins.Group" in diff
    assert any(line.startswith("changed: grpojob.plugins.GRPOTrainer:") and "loss_fn" in line for line in diff)


def _grpojob_imports(path: Path) -> list[tuple[str, list[str]]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names if a.name.split(".")[0] == "grpojob"]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "grpojob":
            out.append((node.module, [a.name for a in node.names]))
    return out


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: str(p.relative_to(ROOT)))
def test_examples_import_only_the_public_surface(path):
    snapshot = json.loads(ps.SNAPSHOT.read_text())
    for module, names in _grpojob_imports(path):
        assert module in ps.MODULES, f"{path.name} imports {module}: examples import only {', '.join(ps.MODULES)}"
        unknown = [n for n in names if n not in snapshot[module]]
        assert unknown == [], f"{path.name} imports {unknown} from {module}, not public names"


def test_every_example_plugin_imports_with_deprecation_warnings_as_errors():
    load = ("import importlib.util, sys\n"
            "for i, p in enumerate(sys.argv[1:]):\n"
            "    spec = importlib.util.spec_from_file_location(f'example_{i}', p)\n"
            "    sys.modules[spec.name] = module = importlib.util.module_from_spec(spec)\n"
            "    spec.loader.exec_module(module)\n")
    r = subprocess.run([sys.executable, "-W", "error::DeprecationWarning", "-c", load, *map(str, PLUGIN_EXAMPLES)],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr


def test_torch_free_public_names_do_not_import_torch():
    """A reward function or a Tinker-style client loop takes names from grpojob.plugins in an
    environment without torch: only the names that need it import it."""
    probe = ("import sys\n"
             "from grpojob.plugins import (Callback, Completion, Group, SamplingParams, TOY_CATEGORIES, builtin_dataset,\n"
             "                             builtin_reward)\n"
             "assert builtin_reward('toy')('p', 'cat dog', answer='animals') > 0\n"
             "assert 'torch' not in sys.modules, 'torch imported'\n"
             "from grpojob.plugins import GRPOTrainer\n"
             "assert 'torch' in sys.modules\n")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr
