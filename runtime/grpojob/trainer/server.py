"""The trainer leader's HTTP endpoint (rank 0, port GRPOJOB_TRAINER_PORT):
GET /healthz, GET /status (TrainerStatus JSON), GET /metrics (Prometheus text of the TRAINER
metrics), POST /suspend (finish the step, checkpoint, stop with phase `suspended`)."""
from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Optional

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from .. import prom
from ..api.status import TrainerStatus
from ..metrics_names import TRAINER

log = logging.getLogger("grpojob.trainer.server")

STAGES = ("generate", "score", "train", "sync", "checkpoint")


class StatusBoard:
    """Thread-safe trainer status and Prometheus metrics, shared by the loop and the server."""

    def __init__(self, total_steps: int = 0):
        self._lock = threading.Lock()
        self.status = TrainerStatus(total_steps=total_steps)
        self.metrics = prom.build(TRAINER)
        self.metrics["grpojob_trainer_total_steps"].set(total_steps)
        self.suspend_requested = threading.Event()

    def update(self, **fields: Any) -> None:
        with self._lock:
            self.status = self.status.model_copy(update=fields)

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return self.status.dump()

    def observe(self, record: dict[str, Any]) -> None:
        """Set the gauges and histograms from one step record."""
        m = self.metrics
        gauges = {
            "grpojob_trainer_step": "step", "grpojob_policy_version": "policy_version",
            "grpojob_advantage_mean": "advantage_mean", "grpojob_advantage_std": "advantage_std",
            "grpojob_loss": "loss", "grpojob_kl": "kl", "grpojob_entropy": "entropy",
            "grpojob_clip_fraction": "clip_fraction", "grpojob_importance_weight_mean": "importance_weight_mean",
            "grpojob_importance_weight_max": "importance_weight_max",
            "grpojob_completion_length_mean": "completion_length_mean",
            "grpojob_truncated_fraction": "truncated_fraction",
            "grpojob_zero_std_group_fraction": "zero_std_group_fraction", "grpojob_grad_norm": "grad_norm",
            "grpojob_learning_rate": "learning_rate", "grpojob_tokens_per_second": "tokens_per_second",
            "grpojob_policy_staleness": "policy_staleness",
        }
        for metric, key in gauges.items():
            if record.get(key) is not None:
                m[metric].set(record[key])
        if record.get("reward_mean") is not None:
            m["grpojob_reward_mean"].labels(reward="total").set(record["reward_mean"])
            m["grpojob_reward_std"].labels(reward="total").set(record["reward_std"])
        for name, mean in (record.get("rewards") or {}).items():
            m["grpojob_reward_mean"].labels(reward=name).set(mean)
        for name, std in (record.get("rewards_std") or {}).items():
            m["grpojob_reward_std"].labels(reward=name).set(std)
        for stage, seconds in (record.get("stage_seconds") or {}).items():
            m["grpojob_stage_seconds"].labels(stage=stage).observe(seconds)
        if record.get("step_seconds") is not None:
            m["grpojob_step_seconds"].observe(record["step_seconds"])
        if record.get("published"):
            m["grpojob_weight_sync_seconds"].observe((record.get("stage_seconds") or {}).get("sync", 0.0))

    def prometheus_text(self) -> bytes:
        return generate_latest(self.metrics["_registry"])


class _Handler(BaseHTTPRequestHandler):
    board: StatusBoard
    on_suspend: Optional[Callable[[], None]] = None

    def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 (http.server API)
        path = self.path.split("?")[0]
        if path == "/healthz":
            self._send(200, b'{"ok": true}')
        elif path == "/status":
            self._send(200, json.dumps(self.board.snapshot()).encode())
        elif path == "/metrics":
            self._send(200, self.board.prometheus_text(), CONTENT_TYPE_LATEST)
        else:
            self._send(404, json.dumps({"error": f"no route {path}"}).encode())

    def do_POST(self) -> None:  # noqa: N802
        path = self.path.split("?")[0]
        if path == "/suspend":
            log.info("suspend requested over HTTP")
            self.board.suspend_requested.set()
            if self.on_suspend:
                self.on_suspend()
            self._send(202, json.dumps({"suspending": True}).encode())
        else:
            self._send(404, json.dumps({"error": f"no route {path}"}).encode())

    def log_message(self, fmt: str, *args: Any) -> None:  # route through logging, quietly
        log.debug("http %s", fmt % args)


class LeaderServer:
    """Serves a StatusBoard from a daemon thread."""

    def __init__(self, board: StatusBoard, host: str, port: int):
        handler = type("Handler", (_Handler,), {"board": board})
        try:
            self.httpd = ThreadingHTTPServer((host, port), handler)
        except OSError as e:
            raise OSError(f"trainer leader endpoint: cannot listen on {host}:{port} "
                          f"(GRPOJOB_TRAINER_PORT): {e}") from e
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="grpojob-leader-http", daemon=True)

    def start(self) -> "LeaderServer":
        self.thread.start()
        log.info("trainer endpoint listening", extra={"port": self.port})
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
