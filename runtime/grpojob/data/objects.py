"""Datasets in object stores and on web servers (s3://, gs://, az://, abfs://, https://, http://),
read through fsspec directly: obstore's adapter for the clouds, fsspec's HTTP filesystem for the web.

Not through `datasets`' downloader, because that one obeys the Hub's offline switch
(HF_HUB_OFFLINE, HF_DATASETS_OFFLINE, TRANSFORMERS_OFFLINE) for every URL: it refused an air-gapped
cluster's own MinIO, or, when it had read the URL before, served its cached copy without asking the
store. Here the store is always asked: the files are listed (a glob expanded) with their ETag,
last-modified time and size, and

- a dataset read whole is copied to `<HF_DATASETS_CACHE>/grpojob-objects/<url hash>/<version hash>/`
  once per version of the object; a changed object gets a new copy (the old one is deleted) and,
  being a new local file, new Arrow files from `datasets`. An object whose store says neither ETag
  nor last-modified is copied anew at every start;
- a streamed dataset is read from the store as it is iterated (`datasets` streaming, given the
  listed URLs): nothing is cached.

A plain-http endpoint (AWS_ENDPOINT_URL=http://..., an in-cluster MinIO) is read, with one warning
that the connection is unencrypted: the URL's `http://` is already the operator's explicit choice,
and the request signatures never carry the secret key (docs/data.md)."""
from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from grpojob.api import data_url

log = logging.getLogger("grpojob.data")

# The variables that point each store at another endpoint (obstore reads them; read here only to
# allow an http:// one and say so).
ENDPOINTS = {"s3": ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ENDPOINT"),
             "gs": ("GOOGLE_BASE_URL",),
             "az": ("AZURE_STORAGE_ENDPOINT", "AZURE_ENDPOINT")}
_warned: set[str] = set()


class ObjectError(Exception):
    """A listing that found nothing (the caller adds the field path)."""


@dataclass(frozen=True)
class Remote:
    url: str
    version: Optional[str]  # ETag, last-modified and size as the store said them; None: it said neither
    size: Optional[int] = None


def store_of(scheme: str) -> str:
    """s3, gs or az (abfs and abfss are Azure)."""
    return {"abfs": "az", "abfss": "az"}.get(scheme, scheme)


def endpoint(scheme: str) -> Optional[tuple[str, str]]:
    """(variable, value) of the endpoint the store is pointed at, if any."""
    for name in ENDPOINTS.get(store_of(scheme), ()):
        if os.environ.get(name):
            return name, os.environ[name]
    return None


def plain_http(url: data_url.DataUrl) -> Optional[str]:
    """Where the dataset is read over plain http (the variable or the URL), logged once; None: TLS."""
    if url.scheme == "http":
        said = f"the dataset URL {url.url}"
    else:
        point = endpoint(url.scheme)
        if point is None or not point[1].lower().startswith("http://"):
            return None
        said = f"{point[0]}={point[1]}"
    if said not in _warned:
        _warned.add(said)
        log.warning("reading the dataset over plain http (%s): the connection is unencrypted, so the rows can be "
                    "read on the network path (request signatures never hold the secret key); use an https "
                    "endpoint to encrypt it (docs/data.md)", said)
    return said


def storage_options(url: data_url.DataUrl) -> dict[str, Any]:
    """The filesystem's options: plain http allowed where the endpoint is http://."""
    if url.scheme in data_url.OBJECT_STORES and plain_http(url):
        return {"client_options": {"allow_http": True}}
    if url.scheme in data_url.WEB:
        plain_http(url)
    return {}


def filesystem(url: data_url.DataUrl) -> Any:
    """A fresh fsspec filesystem for the URL (fresh: credentials and endpoints as the environment says now)."""
    if url.scheme in data_url.WEB:
        from fsspec.implementations.http import HTTPFileSystem

        return HTTPFileSystem(skip_instance_cache=True, client_kwargs={"trust_env": True})
    from obstore.fsspec import FsspecStore

    return FsspecStore(url.scheme, skip_instance_cache=True, **storage_options(url))


def _version(info: dict[str, Any]) -> Optional[str]:
    tag = info.get("e_tag") or info.get("ETag")
    modified = info.get("last_modified") or info.get("Last-Modified")
    if not tag and not modified:
        return None
    return f"{tag}|{modified}|{info.get('size')}"


def listing(url: data_url.DataUrl, fs: Any) -> list[Remote]:
    """The URL's files (a glob expanded, in name order) with their versions; ObjectError when none."""
    import fsspec

    if url.scheme in data_url.WEB:  # a web server lists nothing: the URL is the file
        return [_remote(url.url, fs.info(url.url))]
    if fsspec.core.has_magic(url.url):
        # listed under the pattern's fixed prefix and matched here (obstore's adapter globs nothing)
        pattern = url.url.split("://", 1)[1]
        prefix = pattern[:min(pattern.find(c) for c in "*?[" if c in pattern)].rsplit("/", 1)[0]
        match = re.compile(fsspec.utils.glob_translate(pattern))
        found = fs.find(f"{url.scheme}://{prefix}/", detail=True)
        files = sorted((f"{url.scheme}://{name}", info) for name, info in found.items()
                       if info.get("type") != "directory" and match.match(name))
        if not files:
            raise ObjectError("no object matches the glob")
        return [_remote(name, info) for name, info in files]
    return [_remote(url.url, fs.info(url.url))]


def _remote(url: str, info: dict[str, Any]) -> Remote:
    return Remote(url, _version(info), info.get("size"))


def cache_root() -> Path:
    import datasets

    return Path(datasets.config.HF_DATASETS_CACHE) / "grpojob-objects"


def local_copy(remote: Remote, fs: Any, root: Optional[Path] = None) -> Path:
    """The object as a local file of its version: reused while the store says the same version,
    copied again (the older copies deleted) when it changed."""
    root = root or cache_root()
    at = root / hashlib.sha256(remote.url.encode()).hexdigest()[:24]
    version = hashlib.sha256(remote.version.encode()).hexdigest()[:24] if remote.version else uuid.uuid4().hex
    target = at / version / (remote.url.rstrip("/").rsplit("/", 1)[-1] or "data")
    if remote.version and target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_name(f".{target.name}.{uuid.uuid4().hex}.part")
    try:
        fs.get_file(remote.url, str(part))
        os.replace(part, target)
    finally:
        part.unlink(missing_ok=True)
    for old in at.iterdir():  # earlier versions: a changed object's stale copies go
        if old.name != version:
            shutil.rmtree(old, ignore_errors=True)
    return target
