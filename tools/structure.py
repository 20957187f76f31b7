"""Counts that describe the runtime package's shape (issue 32's before/after figures).

python -m tools.structure [--unit-depth N]
  units         top-level modules and folders of grpojob (a folder is one unit)
  arrows        distinct unit -> unit imports (module level and function level)
  cycles        unit pairs importing each other
  file cycles   module pairs importing each other (at module level or in a function)
  typed file cycles  the same, counting type-only imports (under TYPE_CHECKING) too
  local imports function-level `import grpojob...` statements
  largest       the longest module, in lines
  whole-spec    functions with a parameter annotated GRPOJob
"""
from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "runtime" / "grpojob"
if "--root" in sys.argv:  # another checkout's package (the figures before a change)
    ROOT = Path(sys.argv[sys.argv.index("--root") + 1]).resolve()


def unit_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "grpojob"
    child = parts[1]
    return child if (ROOT / child).is_dir() else child


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported(node: ast.AST, module: str, is_pkg: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom):
        if node.level:
            base = module.split(".")
            base = base if is_pkg else base[:-1]
            base = base[: len(base) - (node.level - 1)]
            target = ".".join(base + ([node.module] if node.module else []))
        else:
            target = node.module or ""
        return [target] + [f"{target}.{a.name}" for a in node.names]
    return []


def main() -> None:
    arrows: set[tuple[str, str]] = set()
    mod_arrows: set[tuple[str, str]] = set()
    typed_arrows: set[tuple[str, str]] = set()  # mod_arrows plus the type-only imports
    local = 0
    largest = (0, "")
    whole_spec = []
    modules = 0
    for path in sorted(ROOT.rglob("*.py")):
        modules += 1
        text = path.read_text()
        lines = len(text.splitlines())
        largest = max(largest, (lines, str(path.relative_to(ROOT))))
        tree = ast.parse(text)
        mod = module_name(path)
        src = unit_of(mod)
        top = set(id(n) for n in tree.body)
        for node in ast.walk(tree):
            names = imported(node, mod, path.name == "__init__.py")
            names = [n for n in names if n.startswith("grpojob.") or n == "grpojob"]
            if not names:
                continue
            in_func = id(node) not in top and not _in_type_checking(tree, node)
            if in_func:
                local += 1
            subs = [n for n in names[1:] if _is_module(n)]
            typed_arrows.update((mod, n) for n in (subs or names[:1]))
            if _in_type_checking(tree, node):
                continue  # no runtime dependency (import-linter's exclude_type_checking_imports too)
            mod_arrows.update((mod, n) for n in (subs or names[:1]))
            for n in names[:1]:
                dst = unit_of(n)
                if dst != src and dst != "grpojob":
                    arrows.add((src, dst))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for arg in node.args.args + node.args.kwonlyargs:
                    if arg.annotation is not None and "GRPOJob" in ast.unparse(arg.annotation):
                        whole_spec.append(f"{path.relative_to(ROOT)}:{node.name}")
                        break
    units = {u for a in arrows for u in a}
    cycles = sorted({tuple(sorted(a)) for a in arrows if (a[1], a[0]) in arrows})
    print(f"modules {modules}")
    print(f"units {len(units)}")
    print(f"arrows {len(arrows)}")
    print(f"cycles {len(cycles)}: " + ", ".join("<->".join(c) for c in cycles))
    for label, edges in (("file cycles", mod_arrows), ("typed file cycles", typed_arrows)):
        found = sorted({tuple(sorted(a)) for a in edges if (a[1], a[0]) in edges and a[0] != a[1]
                        and not any(x.endswith(".__init__") for x in a)})
        print(f"{label} {len(found)}: " + ", ".join("<->".join(c) for c in found))
    print(f"local imports {local}")
    print(f"largest {largest[1]} {largest[0]} lines")
    print(f"whole-spec functions {len(whole_spec)} in {len({w.split(':')[0] for w in whole_spec})} files")
    if "-v" in sys.argv:
        for w in whole_spec:
            print("  ", w)
        for a in sorted(arrows):
            print("  ", " -> ".join(a))


def _is_module(name: str) -> bool:
    rel = Path(*name.split(".")[1:])
    return (ROOT / rel).with_suffix(".py").is_file() or (ROOT / rel / "__init__.py").is_file()


def _in_type_checking(tree: ast.Module, target: ast.AST) -> bool:
    for node in tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            if any(n is target for n in ast.walk(node)):
                return True
    return False


if __name__ == "__main__":
    main()
