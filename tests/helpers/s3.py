"""A real S3 API on 127.0.0.1 for the dataset-URL tests: moto's server mode, in its own process.

moto (through botocore) needs python-dateutil<3 and the kubernetes client of the operator extra
needs >=3, so the server runs from an interpreter of its own: GRPOJOB_TEST_S3_PYTHON, else
.venv-s3/bin/python at the repository root (.ci/run makes it), else this interpreter if it has
moto. Without one the tests skip and say how to make it (in CI they fail: CI makes it).

Objects are written with obstore (the client the runtime reads with), each test in a bucket of its
own, so no test depends on another's objects or order."""
from __future__ import annotations

import importlib.util
import io
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENV_PYTHON = "GRPOJOB_TEST_S3_PYTHON"
VENV = ROOT / ".venv-s3"
MAKE_IT = (f"python3 -m venv {VENV.name} && {VENV.name}/bin/pip install 'moto[server]>=5.1,<6' "
           f"(or set {ENV_PYTHON} to a python that has moto[server])")
REGION = "us-east-1"
KEY, SECRET = "testing-key", "testing-secret"  # moto accepts any; the runtime must send some


def python() -> Optional[str]:
    """The interpreter that runs the server (None: none found)."""
    named = os.environ.get(ENV_PYTHON)
    if named:
        return named
    if (VENV / "bin" / "python").exists():
        return str(VENV / "bin" / "python")
    if importlib.util.find_spec("moto") is not None and importlib.util.find_spec("flask") is not None:
        return sys.executable
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class S3Server:
    endpoint: str
    proc: subprocess.Popen

    def env(self) -> dict[str, str]:
        """The variables a reader of this server needs (obstore reads them, like any AWS SDK)."""
        return {"AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_ENDPOINT_URL": self.endpoint,
                "AWS_REGION": REGION, "AWS_DEFAULT_REGION": REGION, "AWS_ALLOW_HTTP": "true"}

    def bucket(self) -> "Bucket":
        """A new, empty bucket (CreateBucket is a plain PUT of the bucket's path)."""
        name = f"grpojob-{uuid.uuid4().hex[:12]}"
        urllib.request.urlopen(urllib.request.Request(f"{self.endpoint}/{name}", method="PUT"), timeout=30)
        return Bucket(self, name)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@dataclass
class Bucket:
    server: S3Server
    name: str

    def store(self) -> Any:
        from obstore.store import S3Store

        return S3Store(self.name, config={"access_key_id": KEY, "secret_access_key": SECRET, "region": REGION,
                                          "endpoint": self.server.endpoint, "allow_http": True})

    def put(self, key: str, data: bytes) -> str:
        import obstore

        obstore.put(self.store(), key, data)
        return f"s3://{self.name}/{key}"


def start(log_path: Path, env: Optional[dict[str, str]] = None) -> S3Server:
    """`env`: the server's own settings (INITIAL_NO_AUTH_ACTION_COUNT=0: it checks credentials)."""
    exe = python()
    if exe is None:
        raise RuntimeError(f"no moto server: {MAKE_IT}")
    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    log = open(log_path, "wb")
    proc = subprocess.Popen([exe, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], stdout=log,
                            stderr=subprocess.STDOUT, env={k: v for k, v in os.environ.items()
                                                           if not k.startswith("AWS_")} | (env or {}))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the moto server exited ({proc.returncode}): {log_path.read_text()[-2000:]}")
        try:
            urllib.request.urlopen(f"{endpoint}/", timeout=2)
            return S3Server(endpoint, proc)
        except urllib.error.HTTPError:  # it answers (refusing an unsigned request, when it checks credentials)
            return S3Server(endpoint, proc)
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"the moto server did not answer on {endpoint} within 60 s: {log_path.read_text()[-2000:]}")


def parquet(rows: list[dict[str, Any]], row_group_size: int = 16) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buf, row_group_size=row_group_size)
    return buf.getvalue()


def jsonl(rows: list[dict[str, Any]]) -> bytes:
    import json

    return "".join(json.dumps(r) + "\n" for r in rows).encode()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory) -> Iterator[S3Server]:
    """One moto S3 server for the session (each test makes its own bucket)."""
    if python() is None:
        if os.environ.get("CI"):
            pytest.fail(f"CI makes .venv-s3 for the S3 tests and it is missing: {MAKE_IT}")
        pytest.skip(f"no moto server for the S3 tests: {MAKE_IT}")
    server = start(tmp_path_factory.mktemp("s3") / "moto.log")
    yield server
    server.stop()


@pytest.fixture
def s3(s3_server, monkeypatch) -> Bucket:
    """A fresh bucket, and this process's environment pointing at the server (as a user's would)."""
    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    return s3_server.bucket()
