"""A real Prometheus server for tests: Debian's `prometheus` package (`apt-get install -y prometheus`;
.ci/run installs it), on 127.0.0.1, its TSDB in a temporary folder, queried over its HTTP API."""
from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Optional

import yaml

from grpojob.local.processes import free_port

INSTALL_HINT = "apt-get install -y prometheus (CI's .ci/run installs it)"


def binary() -> Optional[str]:
    return shutil.which("prometheus")


class PrometheusError(RuntimeError):
    pass


class Prometheus:
    def __init__(self, exe: str, workdir: Path, scrape_configs: list[dict[str, Any]], scrape_interval: str = "1s"):
        self.exe, self.workdir = exe, workdir
        self.config = {"global": {"scrape_interval": scrape_interval, "scrape_timeout": scrape_interval,
                                  "evaluation_interval": scrape_interval},
                       "scrape_configs": scrape_configs}
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: Optional[subprocess.Popen] = None
        self.log_path = workdir / "prometheus.log"

    def start(self, timeout: float = 60) -> "Prometheus":
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "prometheus.yml"
        config.write_text(yaml.safe_dump(self.config, sort_keys=False))
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [self.exe, f"--config.file={config}", f"--storage.tsdb.path={self.workdir / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise PrometheusError(f"prometheus exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        raise PrometheusError(f"prometheus not ready after {timeout}s:\n{self.log_tail()}")

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def api(self, path: str, **params: Any) -> Any:
        """GET /api/v1/<path>; the `data` of a success, PrometheusError with its message otherwise."""
        query = urllib.parse.urlencode(params, doseq=True)
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=30) as r:
                body = json.load(r)
        except urllib.error.HTTPError as e:
            body = json.loads(e.read() or b"{}")
        if body.get("status") != "success":
            raise PrometheusError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query now: [{"metric": labels, "value": float}] (a vector result)."""
        data = self.api("query", query=expr)
        if data["resultType"] != "vector":
            raise PrometheusError(f"{expr}: a {data['resultType']}, not a vector")
        return [{"metric": r["metric"], "value": float(r["value"][1])} for r in data["result"]]

    def query_range(self, expr: str, start: float, end: float, step: float = 1.0) -> list[dict[str, Any]]:
        data = self.api("query_range", query=expr, start=start, end=end, step=step)
        return [{"metric": r["metric"], "values": [(float(t), float(v)) for t, v in r["values"]]}
                for r in data["result"]]

    def label_values(self, label: str, match: str) -> list[str]:
        return self.api(f"label/{label}/values", **{"match[]": match})

    def targets(self) -> list[dict[str, Any]]:
        return self.api("targets", state="active")["activeTargets"]
