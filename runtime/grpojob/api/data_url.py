"""Where a dataset lives (spec.dataset.path): a local path or a URL, parsed without any I/O so that
`grpojob validate` and the operator (no fsspec, no torch) refuse a malformed one with its field path.

    s3://bucket/key.parquet              Amazon S3 or any S3-compatible store (AWS_* variables)
    gs://bucket/dir/*.jsonl              Google Cloud Storage (GOOGLE_* variables)
    az://container/file.csv              Azure Blob Storage (AZURE_STORAGE_* variables); abfs:// and abfss:// too
    https://host/file.parquet            a file on a web server (http:// too)
    hf://datasets/org/name[@rev]/path    files of a Hugging Face Hub dataset repository (HF_TOKEN)
    hf://datasets/org/name[@rev]         a Hub dataset by name: datasets.load_dataset(name, config, split, revision)

The runtime reads them through fsspec and `datasets` (grpojob.data.sources)."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional
from urllib.parse import urlsplit

OBJECT_STORES = ("s3", "gs", "az", "abfs", "abfss")  # read through obstore's fsspec adapter
WEB = ("https", "http")  # fsspec's HTTP filesystem
HUB = "hf"  # huggingface_hub's HfFileSystem (files) and datasets.load_dataset (by name)
SCHEMES = OBJECT_STORES + WEB + (HUB,)
FORMS = "s3://, gs://, az://, abfs://, abfss://, https://, http://, hf://datasets/<org>/<name>[/<file or glob>]"

BUCKET = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]*$")  # also abfs' container@account.dfs.core.windows.net
_HUB_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")  # an org or repository name on the Hub


@dataclass(frozen=True)
class DataUrl:
    scheme: str
    url: str  # as written
    repo: Optional[str] = None  # hf: "org/name"
    revision: Optional[str] = None  # hf: the @revision, if any
    file: Optional[str] = None  # hf: the path (or glob) inside the repository; None: the dataset by name

    @property
    def by_name(self) -> bool:
        """A Hub dataset by name (its configs and splits), not files."""
        return self.scheme == HUB and not self.file

    @property
    def suffix_path(self) -> str:
        """The part whose extension tells the format."""
        return self.file if self.scheme == HUB and self.file else urlsplit(self.url).path


def is_url(path: str) -> bool:
    return "://" in path


def parse(path: str) -> Optional[DataUrl]:
    """The URL `path` (None: a local path); ValueError saying what is wrong with a malformed one."""
    if not is_url(path):
        return None
    scheme = path.split("://", 1)[0].lower()
    if scheme not in SCHEMES:
        raise ValueError(f"'{scheme}://' is not a dataset location grpojob reads: use a local path or one of {FORMS}")
    if any(c.isspace() for c in path):
        raise ValueError(f"'{path}' holds white space (a URL encodes it as %20)")
    if scheme == HUB:
        return _hub(path)
    parts = urlsplit(path)
    if not parts.netloc:
        what = "host" if scheme in WEB else "bucket" if scheme in ("s3", "gs") else "container"
        raise ValueError(f"'{path}' names no {what} ({scheme}://<{what}>/<path>)")
    if scheme not in WEB and not BUCKET.match(parts.netloc):
        raise ValueError(f"'{parts.netloc}' is not a valid bucket or container name")
    if not parts.path.strip("/"):
        raise ValueError(f"'{path}' names no file: add the object's key (or a glob such as /data/*.parquet)")
    if scheme not in WEB and (parts.query or parts.fragment):
        raise ValueError(f"'{path}' has a query or fragment ('?', '#'): an object key is a plain path")
    return DataUrl(scheme, path)


def _hub(path: str) -> DataUrl:
    rest = path.split("://", 1)[1]
    kind, _, rest = rest.partition("/")
    if kind != "datasets":
        raise ValueError(f"'{path}': hf:// reads dataset repositories only: hf://datasets/<org>/<name>"
                         f"[@revision][/<file or glob>]")
    pieces = rest.split("/", 2)
    if len(pieces) < 2 or not pieces[1]:
        raise ValueError(f"'{path}' names no repository: hf://datasets/<org>/<name> (e.g. hf://datasets/openai/gsm8k)")
    org, name = pieces[0], pieces[1]
    name, at, revision = name.partition("@")
    for part in (org, name):
        if not _HUB_PART.match(part) or ".." in part or len(part) > 96:
            raise ValueError(f"'{part}' in '{path}' is not a Hub name (letters, digits, '-', '_', '.')")
    if at and not revision:
        raise ValueError(f"'{path}': '@' needs a revision after it (a branch, tag or commit)")
    file = pieces[2].strip("/") if len(pieces) == 3 else ""
    return DataUrl(HUB, path, repo=f"{org}/{name}", revision=revision or None, file=file or None)
