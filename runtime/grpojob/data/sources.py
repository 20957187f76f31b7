"""A dataset path (local or URL, grpojob.api.data_url) opened with `datasets`, whole or streamed.

Object stores (s3://, gs://, az://, abfs://) go through obstore's fsspec adapter: it signs and
reads with its own Rust client, so the runtime needs no botocore (whose python-dateutil<3 pin
conflicts with the kubernetes client of the operator extra). https:// goes through fsspec's HTTP
filesystem, hf:// through huggingface_hub's HfFileSystem, a Hub dataset by name through
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

log = logging.getLogger("grpojob.data")

_BUILDERS = {"jsonl": "json", "json": "json", "csv": "csv", "parquet": "parquet"}  # datasets' own builders
_SUFFIXES = {".jsonl": "jsonl", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
_CREDENTIALS = {
    "s3": "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (AWS_ENDPOINT_URL for an S3-compatible store)",
    "gs": "GOOGLE_SERVICE_ACCOUNT (a key file's path) or GOOGLE_APPLICATION_CREDENTIALS",
    "az": "AZURE_STORAGE_ACCOUNT_NAME with AZURE_STORAGE_ACCOUNT_KEY or AZURE_STORAGE_SAS_KEY",
    "hf": "HF_TOKEN (a gated or private dataset)",
}
_registered = False


class SourceError(Exception):
    """What opening or reading a dataset's source found (grpojob.data turns it into a DatasetError)."""


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


_UNREACHABLE = ("couldn't reach", "connection refused", "connecterror", "name resolution", "name or service not known",
                "timed out", "offlinemode", "network is unreachable")
_MISSING = ("filenotfound", "notfound", "nosuchkey", "nosuchbucket", "unable to find", "404 not found",
            "data_files are invalid", "doesn't exist on the hub", "does not exist")
_DENIED = ("credential", "permission", "unauthenticated", "unauthorized", "forbidden", "accessdenied",
           "access denied", "401", "403", "gated", "api/token", "meta-data", "invalidaccesskeyid", "signature")


def explain(e: BaseException, path: str, where: str) -> SourceError:
    """The library's error, said with the field and what to check (a missing object, credentials);
    obstore's debug dump left out."""
    url = data_url.parse(path)
    scheme = {"abfs": "az", "abfss": "az"}.get(url.scheme, url.scheme) if url else None
    said = str(e).split("\n\nDebug source:")[0].strip()
    said = f"{type(e).__name__}: {said[:800]}{' ...' if len(said) > 800 else ''}"
    words = said.lower()
    if any(w in words for w in _UNREACHABLE):
        return SourceError(f"{where}.path: cannot reach '{path}': {said} -- check the trainer's network (and "
                           f"AWS_ENDPOINT_URL or HF_ENDPOINT, if set; HF_HUB_OFFLINE)")
    if any(w in words for w in _MISSING):
        return SourceError(f"{where}.path: '{path}' does not exist (no object or file matches, or its bucket is "
                           f"missing): {said}")
    text = f"{where}.path: cannot read '{path}': {said}"
    if scheme in _CREDENTIALS and any(w in words for w in _DENIED):
        text += (f" -- check the credentials: {_CREDENTIALS[scheme]} in the trainer's environment (on a cluster: "
                 f"{where}.credentialsSecret names a Secret holding them)")
    return SourceError(text)


def _files(path: str, where: str) -> list[str] | str:
    """A local path's files (a glob expanded here, so that a miss says so); a URL as it is (fsspec
    expands its globs)."""
    if data_url.is_url(path):
        return path
    files = sorted(glob.glob(path)) if glob.has_magic(path) else [path]
    if not files or not Path(files[0]).exists():
        raise SourceError(f"{where}.path: '{path}' does not exist{' (no file matches)' if not files else ''}")
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
