"""A checkpoint directory the trainer cannot write is found at its start by a probe write, each
cause with its own fix (issue #56): real errors from real syscalls. Permission denied is a write
by a non-root process (a child as `nobody` when the tests run as root) into a root-owned
directory; read-only and full are small real filesystems (tests/helpers/disk.py)."""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
import pytest

from grpojob.checkpoint import storage
from grpojob.checkpoint.storage import StorageRefused
from grpojob.leader.build import build

from tests.helpers.disk import remount_read_only, small_disk

from .conftest import make_job

NOBODY = 65534


def _probe_as(uid: int, gid: int, root) -> str:
    """storage.probe(root) in a forked child running as uid/gid (no exec: the interpreter's own
    directory may be closed to that uid); what it refused, or "" if it wrote."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop to uid, probe, report, leave at once
        code = 0
        try:
            os.close(read)
            if os.getuid() != uid:
                os.setgroups([])
                os.setgid(gid)
                os.setuid(uid)
            storage.probe(root)
        except StorageRefused as e:
            os.write(write, str(e).encode())
            code = 3
        except BaseException:  # noqa: BLE001 - any other outcome fails the test by its exit code
            code = 4
        os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        said = f.read().decode()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == (3 if said else 0), status
    return said


@pytest.fixture
def volume(tmp_path):
    """A directory the tests' uid owns, that every uid may look into (pytest's tmp_path is not)."""
    path = Path(tempfile.mkdtemp(prefix="grpojob-volume-"))
    yield path
    path.chmod(0o755)
    shutil.rmtree(path)


def test_permission_denied_names_the_trainers_uid_the_volumes_owner_and_fsGroup(volume):
    if os.getuid() == 0:  # root writes anywhere: the trainer runs as another uid, as in a pod
        volume.chmod(0o755)
        uid, gid = NOBODY, NOBODY
    else:
        volume.chmod(0o555)
        uid, gid = os.getuid(), os.getgid()
    said = _probe_as(uid, gid, volume / "ck")
    assert said.startswith(f"spec.checkpoint.path: the trainer cannot write checkpoints under {volume / 'ck'}: "
                           f"Permission denied ({volume / 'ck'})"), said
    st = volume.stat()
    assert f"the trainer runs as uid {uid} gid {gid}" in said, said
    assert f"{volume} is owned by uid {st.st_uid} gid {st.st_gid}, mode {st.st_mode & 0o777:o}" in said, said
    assert "spec.trainer.podSecurityContext.fsGroup" in said and "free space" not in said
    if os.getuid() == 0:
        assert _probe_as(0, 0, volume / "ck") == ""  # the owner writes there: the probe leaves nothing behind
        assert list((volume / "ck").iterdir()) == []


def test_a_file_where_the_directory_should_be_is_missing_storage(tmp_path):
    (tmp_path / "ck").write_text("not a directory")
    with pytest.raises(StorageRefused) as e:
        storage.probe(tmp_path / "ck" / "run")
    assert "Not a directory" in str(e.value) and "mount the checkpoint volume at spec.checkpoint.path" in str(e.value)


def test_a_full_volume_says_how_much_is_free_and_how_to_get_room(tmp_path):
    with small_disk(tmp_path / "disk", 64) as disk:
        with pytest.raises(OSError):
            with open(disk / "filler", "wb") as f:
                while True:
                    f.write(b"x" * 4096)
                    f.flush()
        with pytest.raises(StorageRefused) as e:
            storage.probe(disk / "ck")
    said = str(e.value)
    assert "No space left on device" in said and "(0.0 MiB free of 0.1 MiB)" in said, said
    assert "spec.checkpoint.keepLast" in said and "spec.checkpoint.size" in said


def test_a_read_only_volume_refuses_the_trainer_at_start_before_any_step(tiny_dir, tmp_path):
    with small_disk(tmp_path / "disk", 1024) as disk:
        remount_read_only(disk)
        job = make_job(tiny_dir, training={"steps": 2})
        with pytest.raises(StorageRefused) as e:
            build(job, checkpoint_dir=str(disk / "ck"), run_dir=str(tmp_path / "run"))
    said = str(e.value)
    assert "Read-only file system" in said and "mounted read-only" in said and "free space" not in said, said
    assert not (tmp_path / "run" / "metrics.jsonl").exists()  # nothing trained
