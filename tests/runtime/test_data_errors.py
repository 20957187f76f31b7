"""Every data failure says its field, its cause in plain words and what fixes it (issue 43, item 3),
against a real S3 API (moto's server on 127.0.0.1; a second one that checks credentials) and
obstore, the client the runtime reads with. The store's own words follow in brackets."""
from __future__ import annotations

import copy
import http.server
import socket
import threading

import pytest

from grpojob.api import parse
from grpojob.data import DatasetError, PromptSettings, load_samples
from grpojob.tiny import build_tokenizer
from tests.helpers import s3 as s3_helpers
from tests.helpers.s3 import jsonl, s3, s3_server  # noqa: F401 - fixtures

from ..api.test_spec import MINIMAL

ROWS = [{"prompt": f"list animals {i}", "answer": "animals"} for i in range(4)]
CREDENTIALS_FIX = "check the credentials: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(512)


def failure(tokenizer, **dataset) -> str:
    doc = copy.deepcopy(MINIMAL)
    doc["spec"]["dataset"] = dataset
    with pytest.raises(DatasetError) as e:
        load_samples(PromptSettings.of(parse(doc).spec), tokenizer)
    return str(e.value)


def said(message: str, cause: str, fix: str, field: str = "spec.dataset.path: ") -> bool:
    return message.startswith(field) and cause in message and fix in message


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("streaming", [False, True])
def test_what_the_store_holds_or_lacks_is_said_with_its_fix(s3, tokenizer, streaming):
    s3.put("d/train.jsonl", jsonl(ROWS))
    s3.put("d/empty.jsonl", b"")
    s3.put("d/prose.jsonl", b"not json\nat all\n")
    s3.put("d/train.txt", jsonl(ROWS))
    cases = [
        (f"s3://{s3.name}/d/missing.jsonl", "no object or file is at that key", "check the key in spec.dataset.path"),
        ("s3://no-such-bucket-here/d/train.jsonl", "its bucket does not exist",
         "check the bucket in spec.dataset.path and AWS_ENDPOINT_URL"),
        (f"s3://{s3.name}/d/none-*.jsonl", "no object matches the glob", "check the bucket and the pattern"),
        (f"s3://{s3.name}/d/empty.jsonl", "is empty (0 bytes): it holds no rows", "write the rows to it"),
        (f"s3://{s3.name}/d/train.txt", "cannot tell the format", "set spec.dataset.format"),
        (f"s3://{s3.name}/d/prose.jsonl", "does not parse as", "set spec.dataset.format to the file's format"),
    ]
    for path, cause, fix in cases:
        message = failure(tokenizer, path=path, streaming=streaming)
        assert said(message, cause, fix), message


def test_an_unreachable_endpoint_and_a_tls_failure_name_the_endpoint_variable(s3, tokenizer, monkeypatch):
    endpoint = s3.server.endpoint
    s3.put("d/train.jsonl", jsonl(ROWS))
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{_closed_port()}")
    message = failure(tokenizer, path=f"s3://{s3.name}/d/train.jsonl")
    assert said(message, "the store did not answer", "check the trainer's network and AWS_ENDPOINT_URL (now http://"), \
        message
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint.replace("http://", "https://"))  # TLS to a plain-http server
    message = failure(tokenizer, path=f"s3://{s3.name}/d/train.jsonl")
    assert said(message, "the TLS connection to the store failed", "check AWS_ENDPOINT_URL (http:// for a plain-http "
                "store)"), message
    # a web URL: fsspec says FileNotFoundError for either; its cause tells them apart
    message = failure(tokenizer, path=f"http://127.0.0.1:{_closed_port()}/train.jsonl")
    assert said(message, "the store did not answer", "check the trainer's network and the URL's host"), message
    message = failure(tokenizer, path=endpoint.replace("http://", "https://") + f"/{s3.name}/d/train.jsonl")
    assert said(message, "the TLS connection to the store failed", "check the URL's host (http://"), message


def test_credentials_the_store_refuses_are_said_with_the_variables_and_the_secret(tokenizer, tmp_path, monkeypatch):
    """A second moto server that checks credentials (INITIAL_NO_AUTH_ACTION_COUNT=0) refuses ours."""
    if s3_helpers.python() is None:
        pytest.skip(f"no moto server: {s3_helpers.MAKE_IT}")
    server = s3_helpers.start(tmp_path / "moto.log", {"INITIAL_NO_AUTH_ACTION_COUNT": "0"})
    try:
        for k, v in server.env().items():
            monkeypatch.setenv(k, v)
        message = failure(tokenizer, path="s3://some-bucket/d/train.jsonl")
    finally:
        server.stop()
    assert said(message, "the store refused the credentials", CREDENTIALS_FIX), message
    assert "spec.dataset.credentialsSecret names a Secret" in message


class _OtherRegion(http.server.BaseHTTPRequestHandler):
    """S3's answer to a request signed for another region than the bucket's: 301 with the bucket's
    region in a header and no Location (moto does not model regions)."""

    def _moved(self):
        self.send_response(301)
        self.send_header("x-amz-bucket-region", "eu-west-1")
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_HEAD = do_GET = _moved

    def log_message(self, *args):
        pass


def test_a_bucket_in_another_region_names_aws_region(tokenizer, monkeypatch):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _OtherRegion)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        for k, v in {"AWS_ACCESS_KEY_ID": "key", "AWS_SECRET_ACCESS_KEY": "secret", "AWS_REGION": "us-east-1",
                     "AWS_ENDPOINT_URL": f"http://127.0.0.1:{server.server_address[1]}"}.items():
            monkeypatch.setenv(k, v)
        message = failure(tokenizer, path="s3://bucket/d/train.jsonl")
    finally:
        server.shutdown()
    assert said(message, "the bucket is in another region", "set AWS_REGION to the bucket's region"), message


def test_local_files_that_are_missing_or_empty_say_so_with_the_fix(tmp_path, tokenizer):
    (tmp_path / "empty.jsonl").write_text("")
    for streaming in (False, True):
        message = failure(tokenizer, path=str(tmp_path / "empty.jsonl"), streaming=streaming)
        assert said(message, "holds no rows (an empty file)", "write the rows to it"), message
    message = failure(tokenizer, path=str(tmp_path / "none-*.jsonl"))
    assert said(message, "no file matches the glob", "it is read on the trainer's machine"), message


@pytest.mark.parametrize("path,variable", [("s3://b/d.jsonl", "AWS_ENDPOINT_URL"), ("gs://b/d.jsonl", "GOOGLE_BASE_URL"),
                                           ("az://c/d.jsonl", "AZURE_STORAGE_ENDPOINT")])
def test_a_plain_http_endpoint_of_any_store_is_allowed_and_said_once(path, variable, monkeypatch, caplog):
    """Each store's endpoint variable at http:// (MinIO, fake-gcs-server, Azurite): the client is
    told to allow it and one warning says the connection is unencrypted; https:// is left as it is."""
    from grpojob.api import data_url
    from grpojob.data import objects

    for name in (n for names in objects.ENDPOINTS.values() for n in names):
        monkeypatch.delenv(name, raising=False)
    url = data_url.parse(path)
    monkeypatch.setenv(variable, "https://store.example:9000")
    assert objects.storage_options(url) == {}
    monkeypatch.setenv(variable, f"http://store-{variable.lower()}.internal:9000")
    with caplog.at_level("WARNING", logger="grpojob.data"):
        assert objects.storage_options(url) == {"client_options": {"allow_http": True}}
        assert objects.storage_options(url) == {"client_options": {"allow_http": True}}
    warned = [r.getMessage() for r in caplog.records if "plain http" in r.getMessage()]
    assert len(warned) == 1 and f"{variable}=http://store-" in warned[0] and "unencrypted" in warned[0], warned
