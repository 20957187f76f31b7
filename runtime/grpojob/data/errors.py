"""What reading a dataset's source can fail with, said the way a user fixes it: the field, the cause
in plain words, and the variable or field that fixes it (docs/data.md, "Errors"). The libraries
(obstore, fsspec, `datasets`, huggingface_hub) say the cause in their own words; those are kept, at
the end, for a search."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Optional

from grpojob.api import data_url

_CREDENTIALS = {
    "s3": "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (AWS_ENDPOINT_URL for an S3-compatible store)",
    "gs": "GOOGLE_SERVICE_ACCOUNT (a key file's path) or GOOGLE_APPLICATION_CREDENTIALS",
    "az": "AZURE_STORAGE_ACCOUNT_NAME with AZURE_STORAGE_ACCOUNT_KEY or AZURE_STORAGE_SAS_KEY",
    "hf": "HF_TOKEN (a gated or private dataset)",
}
_ENDPOINT = {"s3": "AWS_ENDPOINT_URL", "gs": "GOOGLE_BASE_URL", "az": "AZURE_STORAGE_ENDPOINT", "hf": "HF_ENDPOINT",
             "https": "the URL's host", "http": "the URL's host"}
_ALLOW_HTTP = {"s3": "AWS_ALLOW_HTTP", "gs": "GOOGLE_ALLOW_HTTP", "az": "AZURE_ALLOW_HTTP"}


class SourceError(Exception):
    """What opening or reading a dataset's source found (grpojob.data turns it into a DatasetError)."""


@dataclass(frozen=True)
class _Rule:
    words: tuple[str, ...]  # any of them in the library's error (lower case)
    head: str  # what happened to the path
    cause: str
    fix: str
    schemes: Optional[tuple[str, ...]] = None  # None: any location
    deep: bool = False  # also in obstore's debug dump (the only place that tells a TLS failure)

    def matches(self, words: str) -> bool:
        # an HTTP status as a whole number only (a port such as 40312 is no 403)
        return any(re.search(rf"(?<!\d){w}(?!\d)", words) if w.isdigit() else w in words for w in self.words)


# In order: the first rule whose words the error holds says it (an offline switch or a TLS failure
# also reads as "cannot reach"; a wrong region also reads as "not found" or "denied").
_RULES = (
    _Rule(("offlinemode", "offline mode"), "cannot reach '{path}'",
          "the Hub is switched off in the trainer's environment (HF_HUB_OFFLINE, HF_DATASETS_OFFLINE or "
          "TRANSFORMERS_OFFLINE is set)",
          "unset them to read from the Hub, or copy the dataset to your own store (s3://, gs://, az://, https://) "
          "or the trainer's disk, which are read with the Hub switched off (docs/data.md, air-gapped clusters)"),
    _Rule(("builder error", "url scheme is not allowed", "scheme is not allowed"), "cannot reach '{path}'",
          "the store's endpoint is plain http, which the client refuses unless allowed",
          "set {allow_http}=true (the connection is then unencrypted) or give {endpoint} an https:// URL "
          "(docs/data.md, plain-http stores)"),
    # (not a bare "ssl": aiohttp's connection errors say "ssl:default" whatever failed)
    _Rule(("certificate", "handshake", "unknownissuer", "invalid peer", "invalidcontenttype", "invalidmessage",
           "sslerror", "ssl error", "wrong version number", "wrong_version_number", "tls error"), "cannot reach '{path}'",
          "the TLS connection to the store failed: its certificate is not trusted, or the endpoint does not speak "
          "https",
          "check {endpoint} (http:// for a plain-http store) and that the store's certificate is signed by a CA "
          "the trainer image trusts", deep=True),
    _Rule(("authorizationheadermalformed", "permanentredirect", "illegallocationconstraint", "wrong region",
           "region is wrong", "incorrectly configured region", "redirect without location"), "cannot read '{path}'",
          "the bucket is in another region than the one the request was signed for",
          "set AWS_REGION to the bucket's region", ("s3",)),
    _Rule(("invalidaccesskeyid", "signaturedoesnotmatch", "accessdenied", "access denied", "forbidden", "403",
           "invalidtoken", "expiredtoken", "authorizationfailure", "permission"), "cannot read '{path}'",
          "the store refused the credentials (unknown, wrong or without read access to the object)",
          "check the credentials: {credentials} in the trainer's environment (on a cluster: {where}.credentialsSecret "
          "names a Secret holding them)"),
    # api/token, meta-data: the instance metadata service, asked when no credentials are set
    _Rule(("credential", "unauthenticated", "unauthorized", "401", "gated", "api/token", "meta-data"),
          "cannot read '{path}'", "no credentials were found for the store",
          "check the credentials: {credentials} in the trainer's environment (on a cluster: {where}.credentialsSecret "
          "names a Secret holding them)"),
    _Rule(("couldn't reach", "connection refused", "connecterror", "connect error", "name resolution",
           "name or service not known", "dns error", "timed out", "network is unreachable",
           "error sending request", "cannot connect", "tcp connect error"), "cannot reach '{path}'",
          "the store did not answer (connection refused, no such host, or a timeout)",
          "check the trainer's network and {endpoint}{endpoint_value}"),
    _Rule(("nosuchbucket", "bucket does not exist", "specified bucket does not exist", "containernotfound"),
          "'{path}' does not exist", "its bucket does not exist on this store",
          "check the bucket in {where}.path and {endpoint}{endpoint_value}"),
    _Rule(("filenotfound", "notfound", "nosuchkey", "unable to find", "404", "data_files are invalid",
           "doesn't exist on the hub", "does not exist"), "'{path}' does not exist",
          "no object or file is at that key, or no object matches the pattern",
          "check the key in {where}.path (keys are case-sensitive)"),
    _Rule(("arrowinvalid", "jsondecodeerror", "json parse", "parse error", "parquet magic bytes", "invalid json",
           "datasetgenerationerror", "couldn't cast", "unicodedecodeerror", "parquet file size is 0",
           # streamed jsonl that is not JSON: `datasets` retries it as one JSON document, opened with an
           # encoding obstore's adapter does not take
           "configuration key: 'encoding' is not valid",
           # datasets 4.x reads a JSON file that pyarrow refused through pandas' ujson decoder
           "unexpected character found when decoding"),
          "cannot read '{path}'", "its content does not parse as {fmt}",
          "set {where}.format to the file's format (jsonl, json, csv, parquet), or fix the file"),
)


def scheme_of(path: str) -> Optional[str]:
    try:
        url = data_url.parse(path)
    except ValueError:
        return None
    return {"abfs": "az", "abfss": "az"}.get(url.scheme, url.scheme) if url else None


def explain(e: BaseException, path: str, where: str, fmt: str = "the format its extension names") -> SourceError:
    """The library's error `e` while reading `path`, said with the field, its cause and its fix
    (obstore's debug dump left out)."""
    scheme = scheme_of(path)
    said = str(e).split("\n\nDebug source:")[0].strip()
    said = f"{type(e).__name__}: {said[:800]}{' ...' if len(said) > 800 else ''}"
    cause = e.__cause__  # fsspec's HTTP filesystem says FileNotFoundError for a refused connection too
    if cause is not None and str(cause) and str(cause) not in said:
        said += f" (from {type(cause).__name__}: {str(cause)[:400]})"
    words, deep = said.lower(), f"{said} {e}".lower()
    endpoint = _ENDPOINT.get(scheme or "", "the trainer's network")
    values = {"path": path, "where": where, "fmt": fmt, "endpoint": endpoint,
              "endpoint_value": f" (now {os.environ[endpoint]})" if endpoint in os.environ else
              " (unset: the store's default endpoint)" if endpoint.isupper() else "",
              "credentials": _CREDENTIALS.get(scheme or "", "the store's credentials"),
              "allow_http": _ALLOW_HTTP.get(scheme or "", "AWS_ALLOW_HTTP")}
    for rule in _RULES:
        if (rule.schemes is None or scheme in rule.schemes) and rule.matches(deep if rule.deep else words):
            if "{credentials}" in rule.fix and scheme not in _CREDENTIALS:
                continue  # a local file has no credentials
            return SourceError(f"{where}.path: {rule.head.format(**values)}: {rule.cause.format(**values)} "
                               f"-- {rule.fix.format(**values)} [{said}]")
    return SourceError(f"{where}.path: cannot read '{path}': {said}")
