"""Import boundaries: the CLI is a leaf (nothing imports it back, so no cycle hides behind a lazy
import), the API imports nothing else of grpojob, and the operator uses only the API, the plan,
the metric names and the job's token (grpojob.auth, torch-free) of the runtime package."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNTIME = ROOT / "runtime" / "grpojob"
OPERATOR = ROOT / "operator" / "grpojob_operator"


def imports(path: Path, package: str) -> set[str]:
    """Absolute names of the modules a file imports (relative imports resolved), including the
    imports inside functions."""
    parts = package.split(".")
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = parts[: len(parts) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names)  # `from . import plan`
    return out


def package_of(path: Path, top: Path, name: str) -> str:
    rel = path.relative_to(top).with_suffix("")
    parts = [name, *rel.parts]
    return ".".join(parts if path.name == "__init__.py" else parts[:-1]).removesuffix(".__init__")


def modules(top: Path, name: str) -> dict[str, set[str]]:
    return {str(p.relative_to(ROOT)): imports(p, package_of(p, top, name)) for p in sorted(top.rglob("*.py"))}


def test_nothing_imports_the_cli_back():
    offenders = {f: sorted(m for m in mods if m == "grpojob.cli" or m.startswith("grpojob.cli."))
                 for f, mods in {**modules(RUNTIME, "grpojob"), **modules(OPERATOR, "grpojob_operator")}.items()
                 if not f.endswith(("grpojob/__main__.py", "grpojob/cli.py"))}
    assert {f: m for f, m in offenders.items() if m} == {}


def test_the_cli_resolves_no_modules_by_name():
    assert "importlib" not in (RUNTIME / "cli.py").read_text()


# below the API: the plug-in contracts (their old api/ paths forward to them) and the forwarding helper
UNDER_API = ("grpojob.api", "grpojob.contracts", "grpojob.deprecation")


def test_the_api_imports_nothing_else_of_grpojob():
    for f, mods in modules(RUNTIME / "api", "grpojob.api").items():
        outside = sorted(m for m in mods if m.startswith("grpojob") and not m.startswith(UNDER_API))
        assert outside == [], f"{f} imports {outside}"


def test_the_contracts_import_nothing_else_of_grpojob():
    for f, mods in modules(RUNTIME / "contracts", "grpojob.contracts").items():
        outside = sorted(m for m in mods if m.split(".")[0] in ("grpojob", "torch")
                         and not m.startswith("grpojob.contracts"))
        assert outside == [], f"{f} imports {outside}"


ALLOWED = ("grpojob.api", "grpojob.plan", "grpojob.metrics_names", "grpojob.prom", "grpojob.auth")


def test_the_operator_uses_only_api_plan_and_metric_names_of_the_runtime():
    for f, mods in modules(OPERATOR, "grpojob_operator").items():
        runtime = sorted(m for m in mods if (m == "grpojob" or m.startswith("grpojob."))
                         and not any(m == a or m.startswith(a + ".") for a in ALLOWED)
                         and m not in {f"grpojob.{a.split('.')[1]}" for a in ALLOWED})
        # `from grpojob import plan` shows up as both "grpojob" and "grpojob.plan".
        assert [m for m in runtime if m != "grpojob"] == [], f"{f} imports {runtime}"


def test_the_token_module_needs_neither_torch_nor_the_rest_of_the_runtime():
    """grpojob.auth is shared by the operator image (no torch) and every runtime process."""
    mods = imports(RUNTIME / "auth.py", "grpojob")
    assert not [m for m in mods if m.split(".")[0] in ("torch", "transformers", "vllm", "grpojob")]
