"""A dataset path (local or URL, grpojob.api.data_url) opened with `datasets`, whole or streamed.

Object stores (s3://, gs://, az://, abfs://) and web URLs are listed and read through fsspec
directly (grpojob.data.objects: never subject to the Hub's offline switch); object stores through
obstore's fsspec adapter: it signs and reads with its own Rust client, so the runtime needs no botocore (whose python-dateutil<3 pin
conflicts with the kubernetes client of the operator extra). hf:// through huggingface_hub's HfFileSystem, a Hub dataset by name through
datasets.load_dataset. Credentials are each library's usual environment variables (AWS_*,
GOOGLE_*, AZURE_STORAGE_*, HF_TOKEN); on a cluster spec.dataset.credentialsSecret puts a Secret's
keys into the trainer pods' environment. Nothing here holds a credential."""
from __future__ import annotations

import glob
import logging
from pathlib import Path
from typing import Any

from grpojob.api import data_url
from grpojob.api.data import DatasetSpec
from grpojob.data import objects
from grpojob.data.errors import SourceError, explain  # noqa: F401 - grpojob.data says them

log = logging.getLogger("grpojob.data")

_BUILDERS = {"jsonl": "json", "json": "json", "csv": "csv", "parquet": "parquet"}  # datasets' own builders
_SUFFIXES = {".jsonl": "jsonl", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
_registered = False


def register_filesystems() -> None:
    """obstore's fsspec adapter for the object-store schemes (replacing s3fs/gcsfs/adlfs, if installed)."""
    global _registered
    if not _registered:
        from obstore.fsspec import register

        register(list(data_url.OBJECT_STORES))
        _registered = True


def file_format(spec: DatasetSpec, path: str, where: str) -> str:
    """jsonl, json, csv, parquet or disk: spec.format, else by extension (a local directory: disk)."""
    if spec.format != "auto":
        return spec.format
    url = data_url.parse(path)
    if url is None and Path(path).is_dir():
        return "disk"
    suffix = Path(url.suffix_path if url else path).suffix.lower()
    if suffix in _SUFFIXES:
        return _SUFFIXES[suffix]
    raise SourceError(f"{where}.path: cannot tell the format of '{path}' from its extension; set {where}.format "
                      f"(jsonl, json, csv, parquet or disk)")


def _files(path: str, where: str) -> list[str] | str:
    """A local path's files (a glob expanded here, so that a miss says so); a URL as it is (fsspec
    expands its globs)."""
    if data_url.is_url(path):
        return path
    files = sorted(glob.glob(path)) if glob.has_magic(path) else [path]
    if not files or not Path(files[0]).exists():
        raise SourceError(f"{where}.path: '{path}' does not exist{': no file matches the glob' if not files else ''} "
                          f"-- check {where}.path: it is read on the trainer's machine (on a cluster, from a volume "
                          f"the trainer pods mount, or use an s3://, gs://, az:// or https:// URL)")
    return files


def open_dataset(spec: DatasetSpec, where: str, *, streaming: bool) -> Any:
    """A `datasets.Dataset` (streaming False) or `datasets.IterableDataset` of the path's rows."""
    import datasets

    path = spec.path
    assert path is not None
    url = data_url.parse(path)
    if url is not None and url.scheme in data_url.OBJECT_STORES:
        register_filesystems()
    try:
        if url is not None and url.by_name:
            return datasets.load_dataset(url.repo, spec.config, split=spec.split or "train", revision=url.revision,
                                         streaming=streaming)
        if url is not None and url.scheme != data_url.HUB:
            return _open_remote(spec, url, where, streaming=streaming)
        files = _files(path, where)
        fmt = file_format(spec, path if isinstance(files, str) else files[0], where)
        if fmt == "disk":
            ds = datasets.load_from_disk(files if isinstance(files, str) else files[0])
            if isinstance(ds, datasets.DatasetDict):
                ds = ds["train"] if "train" in ds else next(iter(ds.values()))
            return ds.to_iterable_dataset() if streaming else ds
        return datasets.load_dataset(_BUILDERS[fmt], data_files=files, split="train", streaming=streaming)
    except SourceError:
        raise
    except Exception as e:  # noqa: BLE001 - every library's error, said with the field
        raise explain(e, path, where) from e


def _open_remote(spec: DatasetSpec, url: data_url.DataUrl, where: str, *, streaming: bool) -> Any:
    """An object store's or web server's files, listed through fsspec (never the Hub's offline
    switch), streamed from the store or read whole from a copy of their current version."""
    import datasets

    options = objects.storage_options(url)
    if spec.format == "disk":  # a save_to_disk directory in the store, as `datasets` reads it
        ds = datasets.load_from_disk(url.url, storage_options=options or None)
        if isinstance(ds, datasets.DatasetDict):
            ds = ds["train"] if "train" in ds else next(iter(ds.values()))
        return ds.to_iterable_dataset() if streaming else ds
    fs = objects.filesystem(url)
    try:
        remotes = objects.listing(url, fs)
    except objects.ObjectError as e:
        raise SourceError(f"{where}.path: '{url.url}' does not exist: {e} -- check the bucket and the pattern "
                          f"(keys are case-sensitive)") from None
    empty = next((r.url for r in remotes if r.size == 0), None)
    if empty is not None:
        raise SourceError(f"{where}.path: '{empty}' is empty (0 bytes): it holds no rows -- write the rows to it, or "
                          f"point {where}.path at the objects that hold them")
    fmt = file_format(spec, remotes[0].url, where)
    if streaming:
        return datasets.load_dataset(_BUILDERS[fmt], data_files=[r.url for r in remotes], split="train",
                                     streaming=True, storage_options={url.scheme: options} if options else None)
    files = [str(objects.local_copy(r, fs)) for r in remotes]
    return datasets.load_dataset(_BUILDERS[fmt], data_files=files, split="train")
