"""Checkpoints in an object store (spec.checkpoint.path s3://, gs://, az://): layout.py's layout
under a key prefix, with a commit marker where a directory has its rename and `latest` (object
stores rename nothing atomically).

    <url>/step-000010/state/            DCP: every rank's shards and .metadata (store_dcp)
    <url>/step-000010/trainer_state.pt  rank 0's, as in layout.py; hf/ and adapter/ too
    <url>/step-000010/COMMITTED         put last, by rank 0, once every object above is whole

A checkpoint counts only with its marker: a save cut off at any point (a kill, the store gone)
leaves the previous one whole and the newest marked. A save of step N first deletes whatever an
earlier run left of step N, marker first. After each commit keepLast deletes the older
checkpoints, and what unmarked saves left.

The store's credentials and endpoint come from the environment (AWS_*, GOOGLE_*, AZURE_*: the
Secret spec.checkpoint.credentialsSecret names), as for datasets (docs/data.md); an http://
endpoint (an in-cluster MinIO) is allowed and logged once."""
from __future__ import annotations

import logging
import os
import re
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any, Optional

from grpojob.api import data_url
from grpojob.api.operations import CHECKPOINT_STORES
from grpojob.checkpoint import layout
from grpojob.data import objects as data_objects

log = logging.getLogger("grpojob.checkpoint")
MARKER = "COMMITTED"
STEP = re.compile(r"^step-(\d+)$")
# A store that does not answer fails a request in about a minute, not after object_store's
# default of ten retries over minutes: the save is dropped and training goes on (manager).
CLIENT = {"connect_timeout": "5s", "timeout": "120s"}
RETRY = {"max_retries": 3, "retry_timeout": timedelta(seconds=60),
         "backoff": {"init_backoff": timedelta(milliseconds=200), "max_backoff": timedelta(seconds=5), "base": 2}}
_warned: set[str] = set()


def is_store(path: str | Path) -> bool:
    return isinstance(path, str) and data_url.is_url(path) and path.split("://", 1)[0].lower() in CHECKPOINT_STORES


def store_error(e: BaseException) -> bool:
    """An error of the store's client (unreachable, refused, credentials), not of our code."""
    try:
        from obstore.exceptions import BaseError
    except ImportError:  # pragma: no cover - obstore is a runtime dependency
        return False
    return isinstance(e, BaseError)


class Store:
    """The checkpoints under one URL; every call is one or a few requests to the store."""

    def __init__(self, url: str):
        from obstore.store import from_url

        self.url = url.rstrip("/")
        scheme = self.url.split("://", 1)[0].lower()
        options = dict(CLIENT)
        point = data_objects.endpoint(scheme)
        if point is not None and point[1].lower().startswith("http://"):
            options["allow_http"] = True
            if point[0] not in _warned:
                _warned.add(point[0])
                log.warning("checkpoints go to %s over plain http (%s=%s): unencrypted on the network path; "
                            "an https endpoint encrypts them", self.url, *point)
        self.store = from_url(self.url, client_options=options, retry_config=RETRY)

    # ---- names --------------------------------------------------------------------------------------
    def step_url(self, step: int) -> str:
        return f"{self.url}/{layout.step_dir('', step).name}"

    def name_of(self, url: str) -> str:
        """The checkpoint's key prefix in the store ("step-000010") from its URL."""
        return url.rstrip("/").rsplit("/", 1)[-1]

    # ---- reading ------------------------------------------------------------------------------------
    def _names(self) -> dict[str, set[str]]:
        """step-NNNNNN prefix -> the object names under it (relative)."""
        import obstore

        out: dict[str, set[str]] = {}
        for batch in obstore.list(self.store):
            for meta in batch:
                top, _, rest = meta["path"].partition("/")
                if STEP.match(top):
                    out.setdefault(top, set()).add(rest)
        return out

    def list_checkpoints(self) -> list[tuple[int, str]]:
        """Committed checkpoints (step, URL), oldest first."""
        return sorted((int(STEP.match(name).group(1)), f"{self.url}/{name}")
                      for name, objs in self._names().items() if MARKER in objs)

    def latest(self) -> Optional[str]:
        found = self.list_checkpoints()
        return found[-1][1] if found else None

    def is_complete(self, url: str) -> bool:
        import obstore

        try:
            obstore.head(self.store, f"{self.name_of(url)}/{MARKER}")
            return True
        except FileNotFoundError:
            return False

    def read(self, url: str, rel: str) -> bytes:
        import obstore

        return bytes(obstore.get(self.store, f"{self.name_of(url)}/{rel}").bytes())

    def download(self, url: str, local: Path, parts: tuple[str, ...]) -> None:
        """The objects under `parts` (hf, adapter...) of one checkpoint, into `local`."""
        import obstore

        name = self.name_of(url)
        for rel in sorted(self._names().get(name, ())):
            if rel.split("/", 1)[0] in parts:
                target = local / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(bytes(obstore.get(self.store, f"{name}/{rel}").bytes()))

    # ---- writing ------------------------------------------------------------------------------------
    def probe(self) -> None:
        """Put and delete a small object: bad credentials or endpoint fail here, at start."""
        import obstore

        key = f".probe-{uuid.uuid4().hex}"
        obstore.put(self.store, key, b"grpojob checkpoint probe\n")
        obstore.delete(self.store, key)

    def begin(self, step: int) -> str:
        """Room for a save of `step` (what an earlier run left of it deleted, marker first); its URL."""
        name = layout.step_dir("", step).name
        self._delete(name, self._names().get(name, set()))
        return f"{self.url}/{name}"

    def put_dir(self, local: Path, url: str) -> None:
        """Every file under `local` (rank 0's: trainer_state.pt, hf/, adapter/) into the checkpoint."""
        import obstore

        name = self.name_of(url)
        for f in sorted(p for p in local.rglob("*") if p.is_file()):
            with open(f, "rb") as src:
                obstore.put(self.store, f"{name}/{f.relative_to(local).as_posix()}", src)

    def commit(self, url: str, keep_last: int) -> None:
        import obstore

        obstore.put(self.store, f"{self.name_of(url)}/{MARKER}", b"")
        self.prune(keep_last)

    def prune(self, keep_last: int) -> list[str]:
        """Delete all but the newest keep_last committed checkpoints, and every unmarked save's
        objects (call it only when no save is in progress)."""
        names = self._names()
        committed = sorted((n for n, objs in names.items() if MARKER in objs), key=lambda n: int(STEP.match(n).group(1)))
        gone = (committed[:-keep_last] if keep_last > 0 else []) + [n for n, objs in names.items() if MARKER not in objs]
        for name in gone:
            self._delete(name, names[name])
        return [f"{self.url}/{n}" for n in gone]

    def drop(self, url: str) -> None:
        """What a failed save wrote (best effort: the store may be the reason it failed)."""
        name = self.name_of(url)
        try:
            self._delete(name, self._names().get(name, set()))
        except Exception as e:  # noqa: BLE001 - the next commit's prune removes what stays
            log.warning("could not delete the failed save %s/%s: %s", self.url, name, e)

    def _delete(self, name: str, objs: set[str]) -> None:
        import obstore

        if MARKER in objs:  # the checkpoint stops counting before any of its objects goes
            obstore.delete(self.store, f"{name}/{MARKER}")
        rest = [f"{name}/{o}" for o in sorted(objs - {MARKER})]
        for i in range(0, len(rest), 1000):  # a batched DeleteObjects holds at most 1000 keys
            obstore.delete(self.store, rest[i:i + 1000])


def local_scratch(root: Optional[str] = None) -> Path:
    """A local directory for rank 0's files before they go to the store."""
    import tempfile

    return Path(tempfile.mkdtemp(prefix="grpojob-ckpt-", dir=root or os.environ.get("TMPDIR")))


def committed(root: str | Path) -> list[tuple[int, str | Path]]:
    """The complete checkpoints under a directory or a store's URL, oldest first."""
    if is_store(str(root)) and not isinstance(root, Path):
        return list(Store(str(root)).list_checkpoints())
    return list(layout.list_checkpoints(root))
