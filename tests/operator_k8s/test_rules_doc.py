"""docs/real-cluster-rules.md, the one list of real-cluster rules these tests act out, names tests
that exist: a renamed or deleted test shows here instead of leaving a rule unguarded on paper."""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "real-cluster-rules.md"


def _rows() -> list[str]:
    lines = DOC.read_text().splitlines()
    return [line for line in lines if line.startswith("| **")]


def _named_tests(cell: str) -> list[tuple[str, str]]:
    """(file, test) for every `tests/x.py::test` and each following `::test` of that file."""
    out, path = [], None
    for m in re.finditer(r"`(tests/[\w/]+\.py)?::(\w+)`", cell):
        path = m.group(1) or path
        out.append((path, m.group(2)))
    return out


def _tests_in(path: str) -> set[str]:
    tree = ast.parse((ROOT / path).read_text())
    return {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def test_every_rule_names_its_source_and_existing_tests():
    rows = _rows()
    assert len(rows) >= 7
    for row in rows:
        rule, source, acted, tests = [c.strip() for c in row.strip("|").split("|")]
        assert "https://" in source or "`" in source, f"no source: {rule}"
        named = _named_tests(tests)
        assert named, f"no test: {rule}"
        for path, name in named:
            assert name in _tests_in(path), f"{path}::{name} (named for {rule[:40]}...) does not exist"
