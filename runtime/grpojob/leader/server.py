"""The trainer leader's HTTP endpoint (rank 0, port GRPOJOB_TRAINER_PORT):
GET /healthz, GET /status (TrainerStatus JSON), GET /metrics (Prometheus text of the TRAINER
metrics), POST /suspend (finish the step, checkpoint, stop with phase `suspended`), and the
trajectory API under /trajectories (grpojob.leader.trajectories.api, mounted once the rollout side is
built; 503 before), and in spec.mode service the training API under /service
(grpojob.service.app, mounted when the trainer starts serving; 503 before).

Every path but /healthz (and /metrics, unless the job's Auth says otherwise) needs the job's
bearer token (grpojob.auth); an unknown path is refused like a known one before it is looked up."""
from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Optional

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from grpojob import auth as authmod
from grpojob import prom
from grpojob.api.status import EvaluationStatus, RolloutLag, ServiceCalls, ServiceStatus, TrainerStatus
from grpojob.leader.trajectories.api import Request
from grpojob.leader.trajectories.atropos import ATROPOS_PREFIX
from grpojob.metrics_names import TRAINER
from grpojob.plan import SERVICE_PREFIX, TINKER_PREFIX, TRAJECTORY_PREFIX

ATROPOS_PATH = f"{TRAJECTORY_PREFIX}{ATROPOS_PREFIX}/"  # + <the job's token>/<run-api route>
from grpojob.rewards import judge_watch

log = logging.getLogger("grpojob.leader.server")

STAGES = ("generate", "score", "train", "sync", "checkpoint")


class StatusBoard:
    """Thread-safe trainer status and Prometheus metrics, shared by the loop and the server.

    Gauges follow grpojob.prom's rule: no sample until known. Step, version and total steps mirror
    /status (`update`); the per-step numbers come from the step record (`observe`, each metric's
    MetricDef.record); the rollout-server count and lag are read from the weight-sync membership
    when /metrics is scraped (`watch_rollouts`), so they change when membership does. The judges'
    series (grpojob.rewards.judge_watch) are served with them."""

    def __init__(self, total_steps: int = 0):
        self._lock = threading.Lock()
        self._scrape = threading.Lock()
        self.status = TrainerStatus(total_steps=total_steps)
        self.metrics = prom.build(TRAINER)
        # spec.judges as this process's scorers see them (one registry per process: judge_watch)
        self.metrics["_registry"].register(prom.Included(judge_watch.REGISTRY))
        self._mirror(self.status.model_dump())
        self._servers: Optional[Callable[[], list[dict[str, Any]]]] = None
        self.suspend_requested = threading.Event()

    def update(self, **fields: Any) -> None:
        if "rollouts" in fields:  # the loop's plain dicts, as the model holds them
            fields["rollouts"] = [RolloutLag.model_validate(r) for r in fields["rollouts"]]
        with self._lock:
            self.status = self.status.model_copy(update=fields)
        self._mirror(fields)

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return self.status.dump()

    def _mirror(self, fields: dict[str, Any]) -> None:
        for field, metric in _STATUS_GAUGES.items():
            if field in fields:
                self.metrics[metric].set(fields[field])

    def observe(self, record: dict[str, Any]) -> None:
        """Set the metrics from one step record. A gauge whose field is missing or null has no
        sample (e.g. grpojob_kl with klBeta 0), not the previous step's value."""
        m = self.metrics
        for d in _FROM_RECORD:
            value = record.get(d.record)
            if d.kind == "gauge":
                m[d.name].set(value)
            elif value:
                m[d.name].inc(value)
        for metric, key, parts in (("grpojob_reward_mean", "reward_mean", "rewards"),
                                   ("grpojob_reward_std", "reward_std", "rewards_std")):
            values = {**(record.get(parts) or {}), "total": record.get(key)}
            for name, value in values.items():
                if value is None:
                    _remove(m[metric], name)
                else:
                    m[metric].labels(reward=name).set(value)
        for stage, seconds in (record.get("stage_seconds") or {}).items():
            m["grpojob_stage_seconds"].labels(stage=stage).observe(seconds)
        for metric, key in (("grpojob_stage_host_memory_peak_bytes", "stage_host_peak_bytes"),
                            ("grpojob_stage_device_memory_peak_bytes", "stage_device_peak_bytes")):
            m[metric].clear()  # a stage the step did not measure has no sample
            for stage, peak in (record.get(key) or {}).items():
                m[metric].labels(stage=stage).set(peak)
        if record.get("step_seconds") is not None:
            m["grpojob_step_seconds"].observe(record["step_seconds"])
        if record.get("published"):
            m["grpojob_weight_sync_seconds"].observe((record.get("stage_seconds") or {}).get("sync", 0.0))

    def observe_call(self, op: str, result: str, seconds: float, tokens: int = 0) -> None:
        """One training-service call answered (mode service): result ok, refused (4xx) or failed (5xx)."""
        m = self.metrics
        m["grpojob_service_requests_total"].labels(op=op, result=result).inc()
        m["grpojob_service_request_seconds"].labels(op=op).observe(seconds)
        if tokens:
            m["grpojob_service_tokens_total"].labels(op=op).inc(tokens)
        with self._lock:
            svc = self.status.service or ServiceStatus()
            c = svc.ops.get(op) or ServiceCalls()
            c = c.model_copy(update={"calls": c.calls + 1, "seconds": round(c.seconds + seconds, 6),
                                     "tokens": c.tokens + tokens, "refused": c.refused + (result == "refused"),
                                     "failed": c.failed + (result == "failed")})
            self.status = self.status.model_copy(update={"service": svc.model_copy(update={"ops": {**svc.ops, op: c}})})

    def set_queued(self, n: int) -> None:
        """Training-service calls waiting for the trainer."""
        self.metrics["grpojob_service_queued_requests"].set(n)
        with self._lock:
            svc = self.status.service or ServiceStatus()
            self.status = self.status.model_copy(update={"service": svc.model_copy(update={"queued": n})})
    def observe_evaluation(self, record: Any) -> None:
        """The last evaluation (grpojob.leader.evaluation.EvalRecord): /status `evaluation` and the eval gauges."""
        self.update(evaluation=EvaluationStatus(**record.status_fields()))
        m = self.metrics
        m["grpojob_eval_step"].set(record.step)
        m["grpojob_eval_seconds"].set(record.seconds)
        rewards = {**record.rewards, "total": record.reward_mean}
        for gauge, label, values in (("grpojob_eval_reward_mean", "reward", rewards),
                                     ("grpojob_eval_pass_at_k", "k", record.pass_at)):
            m[gauge].clear()  # labels of an earlier evaluation that this one lacks go
            for name, value in values.items():
                if value is not None:
                    m[gauge].labels(**{label: name}).set(value)

    def watch_rollouts(self, servers: Callable[[], list[dict[str, Any]]]) -> None:
        """Report the weight-sync group: `servers()` lists its members as dicts with `replica` and
        `version` (WeightPublisher.servers). Read at every scrape."""
        self._servers = servers

    def _refresh_rollouts(self) -> None:
        if self._servers is None:
            return
        lag = self.metrics["grpojob_rollout_server_lag"]
        lag.clear()
        try:
            members = self._servers()
        except Exception as e:  # noqa: BLE001 - a failing read must not fail the scrape
            log.warning("cannot read the rollout servers for /metrics: %s", e)
            self.metrics["grpojob_rollout_servers"].clear()
            return
        self.metrics["grpojob_rollout_servers"].set(len(members))
        current = self.status.policy_version
        for s in members:
            if s.get("version") is not None:
                lag.labels(replica=s["replica"]).set(max(0, current - int(s["version"])))

    def prometheus_text(self) -> bytes:
        with self._scrape:
            self._refresh_rollouts()
            return generate_latest(self.metrics["_registry"])


def _remove(metric: Any, *labels: str) -> None:
    try:
        metric.remove(*labels)
    except KeyError:
        pass


# TrainerStatus field -> the gauge that mirrors it.
_STATUS_GAUGES = {"step": "grpojob_trainer_step", "policy_version": "grpojob_policy_version",
                  "total_steps": "grpojob_trainer_total_steps"}
_FROM_RECORD = tuple(d for d in TRAINER if d.record)


class _Handler(BaseHTTPRequestHandler):
    board: StatusBoard
    auth: authmod.Auth
    on_suspend: Optional[Callable[[], None]] = None
    trajectories: Optional[Any] = None  # grpojob.leader.trajectories.api.TrajectoryAPI, once mounted
    service: Optional[Any] = None  # grpojob.service.app.TrainingService, once serving

    def _allowed(self, path: str) -> bool:
        if path.startswith(ATROPOS_PATH):  # Atropos sends no header: the job's token is the path's next part
            if self.auth.accepts("Bearer " + path[len(ATROPOS_PATH):].partition("/")[0]):
                return True
        return not self.auth.protects(path) or authmod.authorize_handler(self)

    def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _trajectories(self) -> None:
        # any method: Atropos sends a JSON body on GET /status-env
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.trajectories is None:
            code, doc = 503, {"error": "the trainer is still loading: the trajectory API opens once its rollout "
                                       "side is built; retry", "reason": "starting"}
        else:
            code, doc = self.trajectories.handle(Request(self.command, self.path, dict(self.headers), body))
        self._send(code, json.dumps(doc).encode())

    def _service(self) -> None:
        if self.service is None:
            code, doc = 503, {"error": "the training service is not serving: the trainer is still loading (retry), "
                                       "or the job's spec.mode is not service", "reason": "not-serving"}
        else:
            n = int(self.headers.get("Content-Length") or 0)
            if n > self.service.max_body_bytes:
                code, doc = 413, {"error": f"body of {n} bytes, more than {self.service.max_body_bytes}: send fewer "
                                           "datums per call", "reason": "too-large"}
                self.close_connection = True  # the unread body stays on the socket
            else:
                body = self.rfile.read(n) if self.command == "POST" else b""
                code, doc = self.service.handle(Request(self.command, self.path, dict(self.headers), body))
        self._send(code, json.dumps(doc).encode())

    def _tinker(self) -> None:
        """Tinker's wire (grpojob.service.tinker_api): its bodies are protobuf or JSON."""
        n = int(self.headers.get("Content-Length") or 0)
        if self.service is None:
            code, body, ctype = 503, json.dumps({"error": "the training service is not serving: the trainer is still "
                                                          "loading (retry), or the job's spec.mode is not service",
                                                 "reason": "not-serving"}).encode(), "application/json"
        elif n > self.service.max_body_bytes:
            code, body, ctype = 413, json.dumps({"error": f"body of {n} bytes, more than "
                                                          f"{self.service.max_body_bytes}", "reason": "too-large"}
                                                ).encode(), "application/json"
            self.close_connection = True
        else:
            data = self.rfile.read(n) if self.command == "POST" else b""
            code, body, ctype = self.service.tinker.handle(self.command, self.path, dict(self.headers), data)
        self._send(code, body, ctype)

    def _api(self, path: str) -> bool:
        """The APIs under a prefix (trajectories, the training service, Tinker's wire), for any
        method; False when `path` is under none of them."""
        for prefix, handle in ((TRAJECTORY_PREFIX, self._trajectories), (SERVICE_PREFIX, self._service),
                               (TINKER_PREFIX, self._tinker)):
            if path.startswith(prefix + "/"):
                handle()
                return True
        return False

    def do_GET(self) -> None:  # noqa: N802 (http.server API)
        path = self.path.split("?")[0]
        if not self._allowed(path) or self._api(path):
            return
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
        if not self._allowed(path) or self._api(path):
            return
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


class _HTTPServer(ThreadingHTTPServer):
    # http.server's listen backlog is 5: the training service's callers open many connections at
    # once (a step's samples), and an overflowing backlog resets them.
    request_queue_size = 256


class LeaderServer:
    """Serves a StatusBoard from a daemon thread; `auth` is the job's token (grpojob.auth)."""

    def __init__(self, board: StatusBoard, host: str, port: int, auth: authmod.Auth):
        handler = self.handler = type("Handler", (_Handler,), {"board": board, "auth": auth})
        try:
            self.httpd = _HTTPServer((host, port), handler)
        except OSError as e:
            raise OSError(f"trainer leader endpoint: cannot listen on {host}:{port} "
                          f"(GRPOJOB_TRAINER_PORT): {e}") from e
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="grpojob-leader-http", daemon=True)

    def mount_trajectories(self, api: Any) -> None:
        """Serve the trajectory API (grpojob.leader.trajectories.api.TrajectoryAPI) from now on."""
        self.handler.trajectories = api

    def mount_service(self, service: Any) -> None:
        """Serve the training API (grpojob.service.app.TrainingService) from now on; None: stop."""
        self.handler.service = service

    def start(self) -> "LeaderServer":
        self.thread.start()
        log.info("trainer endpoint listening", extra={"port": self.port})
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
