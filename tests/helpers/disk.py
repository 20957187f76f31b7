"""A small real filesystem for tests of a full disk: a tmpfs of a given size, mounted for the test.

Mounting needs CAP_SYS_ADMIN (root on this machine and in CI); where it is refused the test is
skipped and says why. Writes past its size fail with ENOSPC, as on a full volume."""
from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path
from typing import Iterator

import pytest


def remount_read_only(path: Path) -> None:
    """A mounted small_disk, read-only from now on (writes fail with EROFS)."""
    subprocess.run(["mount", "-o", "remount,ro", str(path)], check=True, capture_output=True)


@contextlib.contextmanager
def small_disk(path: Path, size_kib: int) -> Iterator[Path]:
    path.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kib}k", "tmpfs", str(path)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a {size_kib} KiB tmpfs to fill (needs root): {proc.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)
