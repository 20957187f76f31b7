"""What a checkpoint's storage refused, and the fix for each cause: a probe write at the trainer's
start finds a directory it cannot write before any step is trained, not three saves later. No
torch here.

- permission denied: the uid the trainer runs as against the volume's owner, and fsGroup;
- a read-only filesystem: the mount or the claim's access mode;
- a missing directory (or a file in its place): the mount at spec.checkpoint.path;
- no space (or a quota): free space, keepLast, a larger volume.

Permission, read-only and missing fail the same way at every start: StorageRefused (the job stops
with StartRefused, the pod is not restarted into the same error)."""
from __future__ import annotations

import errno
import os
import shutil
import uuid
from pathlib import Path
from typing import Optional

from grpojob.learner.errors import TrainerError

FIELD = "spec.checkpoint.path"
PERMISSION = (errno.EACCES, errno.EPERM)
READ_ONLY = (errno.EROFS,)
MISSING = (errno.ENOENT, errno.ENOTDIR, errno.EEXIST)  # EEXIST: a file where the directory goes
FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
# What a restart would find the same (a full disk may get space back: saves go on meanwhile).
DETERMINISTIC = PERMISSION + READ_ONLY + MISSING


class StorageRefused(TrainerError):
    """Checkpoint storage the trainer cannot write, the same at every start: not restarted."""


def _existing(path: Path) -> Path:
    """`path`, or its nearest ancestor this process can see (whose owner and mode refused the
    write); os.path.exists: a path it may not look into counts as absent."""
    while not os.path.exists(path) and path != path.parent:
        path = path.parent
    return path


def _ownership(path: Path) -> str:
    uid, gid, groups = os.getuid(), os.getgid(), sorted(set(os.getgroups()) - {os.getgid()})
    runs = f"the trainer runs as uid {uid} gid {gid}" + (f" (groups {', '.join(map(str, groups))})" if groups else "")
    try:
        st = _existing(path).stat()
    except OSError:
        return runs
    return (f"{runs}; {_existing(path)} is owned by uid {st.st_uid} gid {st.st_gid}, mode "
            f"{st.st_mode & 0o7777:o}")


def advice(e: OSError, root: Path) -> str:
    """What `e` (a write under the checkpoint directory `root`) means, and its fix."""
    where = Path(e.filename) if e.filename else root
    what = f"{e.strerror or e} ({where})"
    if e.errno in PERMISSION:
        return (f"{what}: {_ownership(where)}. Give the pods write access to the checkpoint volume: "
                f"spec.trainer.podSecurityContext.fsGroup set to the volume's group makes the kubelet hand the "
                f"volume over (drivers that ignore fsGroup, hostPath and many NFS exports, need the volume "
                f"chowned to the trainer's uid), or runAsUser set to the volume's owner")
    if e.errno in READ_ONLY:
        return (f"{what}: the checkpoint volume is mounted read-only; mount a writable volume at {FIELD} "
                f"(no readOnly on the mount, a ReadWriteOnce or ReadWriteMany claim)")
    if e.errno in MISSING:
        return (f"{what}: the checkpoint directory is missing or a file stands in its place; mount the "
                f"checkpoint volume at {FIELD}, or set {FIELD} to a directory the trainer can create")
    if e.errno in FULL:
        free = ""
        try:
            usage = shutil.disk_usage(_existing(root))
            free = f" ({_size(usage.free)} free of {_size(usage.total)})"
        except OSError:
            pass
        return (f"{what}{free}: free space under {root}, lower spec.checkpoint.keepLast, or give the checkpoints "
                f"a larger volume (spec.checkpoint.size or a larger claim)")
    return what


def store_advice(e: BaseException) -> str:
    """An object store's refusal (or silence), and what to check."""
    what = " ".join(str(e).split("Debug source:", 1)[0].split())[:600]  # not obstore's Rust debug dump
    return (f"{type(e).__name__}: {what}: check the store's endpoint (AWS_ENDPOINT_URL and the like), the "
            f"credentials (the Secret spec.checkpoint.credentialsSecret names) and that the bucket exists")


def _size(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def probe(root: Path, name: Optional[str] = None) -> None:
    """Create `root` and write, sync and delete a small file in it, as each rank's shards will be;
    StorageRefused with the cause's fix if the storage refuses."""
    test = root / (name or f".probe-{uuid.uuid4().hex}")
    try:
        root.mkdir(parents=True, exist_ok=True)
        with open(test, "wb") as f:
            f.write(b"grpojob checkpoint probe\n")
            f.flush()
            os.fsync(f.fileno())
        test.unlink()
    except OSError as e:
        raise StorageRefused(f"{FIELD}: the trainer cannot write checkpoints under {root}: {advice(e, root)}") from e
