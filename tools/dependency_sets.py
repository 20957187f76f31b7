"""The dependency sets CI installs, from their one source each: the README's first command (what a
newcomer installs) and pyproject.toml's lower bounds (the lowest set's constraints).

    python -m tools.dependency_sets readme-install   # the README's command up to `grpojob run`
    python -m tools.dependency_sets readme-run       # its last step, the `grpojob run`
    python -m tools.dependency_sets lowest EXTRA...  # `name==lower` for the core and those extras

Both refuse to guess: a README whose first command is not `... && grpojob run FILE`, or a
requirement without a lower bound, is an error (a dependency CI cannot pin low is untested).
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUN = "grpojob run "


def readme_command(readme: Path = ROOT / "README.md") -> str:
    """The first indented command of the README (the local run of the embedded default)."""
    for line in readme.read_text().splitlines():
        if line.startswith("    ") and line.strip():
            command = line.strip()
            if RUN not in command:
                raise ValueError(f"{readme}: the first command does not run a GRPOJob: {command!r}")
            return command
    raise ValueError(f"{readme}: no indented command")


def _readme_steps(readme: Path) -> tuple[list[str], str]:
    """The README's first command split at `&&`: (its install steps, its final `grpojob run FILE`)."""
    steps = [s.strip() for s in readme_command(readme).split("&&")]
    if not steps[-1].startswith(RUN):
        raise ValueError(f"{readme}: the first command should end with `{RUN}FILE`")
    return steps[:-1], steps[-1]


def readme_install(readme: Path = ROOT / "README.md") -> str:
    """The README's first command without its final `grpojob run` step: what it installs."""
    return " && ".join(_readme_steps(readme)[0])


def readme_run(readme: Path = ROOT / "README.md") -> str:
    """The README's first command's last step: the `grpojob run FILE` it ends with."""
    return _readme_steps(readme)[1]


_REQ = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*(.*)$")


def _tomllib():
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    return tomllib


def lower_bounds(extras: list[str], pyproject: Path = ROOT / "pyproject.toml") -> dict[str, str]:
    """{distribution: lowest version} over the core dependencies and `extras`."""
    project = _tomllib().loads(pyproject.read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in extras:
        reqs += project["optional-dependencies"][extra]
    out: dict[str, str] = {}
    for req in reqs:
        m = _REQ.match(req)
        if not m:
            raise ValueError(f"cannot read requirement {req!r}")
        name, spec = m.group(1).lower(), m.group(3)
        low = re.search(r">=\s*([0-9][^,;\s]*)", spec)
        if not low:
            raise ValueError(f"{req!r} has no lower bound: CI cannot install its lowest version")
        if out.get(name, low.group(1)) != low.group(1):
            raise ValueError(f"{name} has two lower bounds: {out[name]} and {low.group(1)}")
        out[name] = low.group(1)
    return out


# Lower bounds CI cannot install, and the version its lowest set runs instead, with where the lower
# bound itself is run. CI reaches a CPU build of torch 2.13 only (any other release on PyPI is the
# multi-GB CUDA build); torch 2.11 is what the lent GPU machines carry, and tools/gpu_check.py runs
# the GPU tests, the README's job and the benchmarks there, stating the torch it ran.
RUN_ELSEWHERE = {"torch": ("2.13.0", "torch 2.11 runs in tools/gpu_check.py on the GPU machines")}


def lowest(extras: list[str]) -> dict[str, str]:
    """The lowest set's pins: the lower bounds, but where CI cannot install one (RUN_ELSEWHERE)."""
    pins = lower_bounds(extras)
    for name, (version, _) in RUN_ELSEWHERE.items():
        if name in pins:
            pins[name] = version
    return pins


def main(argv: list[str]) -> int:
    if argv[:1] == ["readme-install"]:
        print(readme_install())
    elif argv[:1] == ["readme-run"]:
        print(readme_run())
    elif argv[:1] == ["readme-command"]:
        print(readme_command())
    elif argv[:1] == ["lowest"]:
        for name, version in sorted(lowest(argv[1:]).items()):
            print(f"{name}=={version}")
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
