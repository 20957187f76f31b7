"""Each framework a plug-in may import has a grpojob extra with the light packages its imports need,
the install hint names it, and CI's set for that framework installs grpojob through that extra (so
the extra is what the set's tests ran on), then the framework itself without its dependencies."""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

from grpojob.api.plugins import FRAMEWORK_EXTRAS, FRAMEWORKS, framework_hint

ROOT = Path(__file__).resolve().parents[2]
EXTRAS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
SETS = {"cosmos_rl": "frameworks", "verl": "frameworks", "areal": "frameworks", "art": "art"}


def test_every_framework_has_an_extra_its_ci_set_installs_before_the_package_itself():
    assert set(FRAMEWORK_EXTRAS) == set(FRAMEWORKS) == set(SETS)
    for top, extra in FRAMEWORK_EXTRAS.items():
        assert EXTRAS.get(extra), f"pyproject has no extra {extra} for {top}"
        script = (ROOT / ".ci" / "sets" / f"{SETS[top]}.sh").read_text()
        installs = [set(m.group(1).split(",")) for m in re.finditer(r"pip install -e '\.\[([^]]+)\]'", script)]
        assert any(extra in x for x in installs), f".ci/sets/{SETS[top]}.sh installs no grpojob[{extra}]"
        no_deps = re.search(r"pip install --no-deps ([^\n|]+)", script)
        assert no_deps and FRAMEWORKS[top] in no_deps.group(1), f"{SETS[top]}.sh: {FRAMEWORKS[top]} --no-deps"


def test_the_install_hint_names_the_extra_and_the_pinned_package():
    e = ModuleNotFoundError("No module named 'verl'", name="verl")
    hint = framework_hint(e)
    assert "pip install 'grpojob[runtime,verl]'" in hint and "pip install --no-deps verl==0.9.1" in hint
    assert framework_hint(ModuleNotFoundError("x", name="numpyy")) == ""
