"""spec.mode service: the trainer runs no loop of its own; it serves a training API on the trainer
leader's HTTP port under /service, behind the job's token (docs/service.md; client: grpojob.client):

    POST /service/forward_backward   {data, loss_fn, loss_fn_config}  -> per-datum logprobs, metrics
    POST /service/forward            the same without gradients
    POST /service/optim_step         {adam_params}                    -> metrics (step, policy version)
    POST /service/save_weights_for_sampler                            -> {path, policy_version}
    POST /service/sample             {prompt, num_samples, sampling_params, min_policy_version}
    POST /service/save_state         -> {path, step}       POST /service/load_state {path}
    GET  /service/info               the model, its vocabulary, limits, step and policy version

Rank 0's HTTP threads validate every call (service_wire: a bad one gets a 4xx naming what is wrong
and never reaches the trainer) and queue the training calls; the trainer's main thread on every
rank takes them in order, one at a time: rank 0 broadcasts each call (broadcast_object_list) and
every rank computes it (service_ops), so torchrun's ranks serve as one trainer. `sample` and `info`
touch no training state: they are answered in their HTTP thread at once, concurrently with
training (sample through the rollout servers, on the rollout manager's loop).

The same calls are served in Tinker's own wire under /api/v1 for the `tinker` SDK
(service.tinker_api, the token as the API key `tml-<token>`): they join the same queue.

Suspension (POST /suspend, SIGTERM) ends serving: queued calls get 503, the trainer checkpoints
and exits with phase suspended; a restart resumes from that checkpoint.
"""
from __future__ import annotations

import concurrent.futures
import json
import logging
import os
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from pydantic import BaseModel

from grpojob import checkpoint
from grpojob.api.service import (LOSS_INPUTS, POLICY_PATH, ForwardBackwardOutput, LoadStateRequest, SampledSequence,
                            SampleRequest, ServiceInfo, TensorData)
from grpojob.plan import SERVICE_PREFIX
from grpojob.leader.rollout_client import RolloutError
from grpojob.contracts.rollout import SamplingParams
from grpojob.learner import dist
from grpojob.service.ops import ServiceOps
from grpojob.service.stops import cut_at_stop
from grpojob.service.tinker_api import TinkerAPI
from grpojob.service.wire import ROUTES, Limits, Refused, parse, tokens_of
from grpojob.service.versions import IssuedVersions

if TYPE_CHECKING:
    from grpojob.leader.trajectories.api import Request
    from grpojob.leader.build import TrainerRun
    from grpojob.leader.server import LeaderServer

log = logging.getLogger("grpojob.service.app")

IDLE_SECONDS = 1.0  # an idle rank 0 tells the others so this often: their broadcast waits never time out
MAX_BODY_BYTES = 512 << 20


@dataclass
class _Call:
    route: str
    request: Optional[BaseModel]
    answer: "concurrent.futures.Future[dict]"


class TrainingService:
    max_body_bytes = MAX_BODY_BYTES

    def __init__(self, run: "TrainerRun"):
        self.run, self.tr = run, run.trainer
        self.env, self.board, self.suspend = run.trainer.env, run.loop.board, run.loop.suspend
        self.versions = IssuedVersions(run.checkpoints.root, self.env)
        self.ops = ServiceOps(run.trainer, issue=self.versions.issue)
        spec = self.tr.spec
        self.limits = Limits(vocab_size=self.tr.model.get_input_embeddings().num_embeddings,
                             max_sequence_tokens=spec.training.micro_batch_tokens,
                             max_tokens=spec.rollout.sampling.max_tokens)
        self.calls: "queue.Queue[_Call]" = queue.Queue()
        self._lock = threading.Lock()
        self._current: Optional[_Call] = None
        self.stopping = False
        self.published = self.tr.version  # the version the rollout servers were given (set in serve)
        self.tinker = TinkerAPI(self)  # Tinker's own wire under /api/v1 (service.tinker_api)

    # ---- rank 0: HTTP threads -------------------------------------------------------------------------
    def handle(self, request: "Request") -> tuple[int, dict[str, Any]]:
        t0 = time.perf_counter()
        route = request.path.split("?")[0].removeprefix(SERVICE_PREFIX)
        op = route.strip("/") if route in ROUTES else "unknown"
        tokens, result = 0, "ok"
        try:
            req = parse(route, request.method, request.body, self.limits)
            tokens = tokens_of(req)
            if route == "/info":
                code, doc = 200, self.info()
            elif route == "/sample":
                code, (doc, tokens) = 200, self.sample(req)
            else:
                code, doc = 200, self.submit(route, req)
        except Refused as e:
            code, doc, result = e.status, e.doc(), "refused" if e.status < 500 else "failed"
        except Exception as e:  # noqa: BLE001 - a call's failure is its answer, never the trainer's end
            log.exception("training service %s failed", route)
            code, doc, result = 500, {"error": f"{type(e).__name__}: {e}", "reason": "failed"}, "failed"
        if self.board is not None:
            self.board.observe_call(op, result, time.perf_counter() - t0, tokens if result == "ok" else 0)
        return code, doc

    def submit(self, route: str, req: Optional[BaseModel]) -> dict[str, Any]:
        """Queue a training call and wait for its answer (Refused when it was refused)."""
        return self.enqueue(route, req).result()

    def enqueue(self, route: str, req: Optional[BaseModel]) -> "concurrent.futures.Future[dict]":
        """Queue a training call (calls run in the order they were queued); its answer's future."""
        if isinstance(req, LoadStateRequest):
            req = req.model_copy(update={"path": str(self._checkpoint(req.path))})
        call = _Call(route, req, concurrent.futures.Future())
        with self._lock:
            if self.stopping:
                raise Refused(503, "the trainer is stopping (suspend or SIGTERM): it checkpoints and exits; "
                              "a restart resumes from that checkpoint", "stopping")
            self.calls.put(call)
        self._queued()
        return call.answer

    def _checkpoint(self, path: str) -> Path:
        """A checkpoint of this job: a path save_state returned, its directory name, or the name
        it was saved under."""
        root = self.run.checkpoints.root
        path = _names(root).get(path, path)
        found = {p.resolve(): p for _, p in checkpoint.list_checkpoints(root)}
        want = Path(path) if Path(path).is_absolute() else root / path
        if want.resolve() not in found:
            names = ", ".join(p.name for p in found.values()) or "none yet"
            raise Refused(400, f"path: '{path}' is not a checkpoint of this job under {root} (there: {names})")
        return found[want.resolve()]

    def info(self) -> dict[str, Any]:
        tr, spec = self.tr, self.tr.spec
        return ServiceInfo(model_path=spec.model.path, tokenizer_path=spec.model.tokenizer or spec.model.path,
                           vocab_size=self.limits.vocab_size, max_sequence_tokens=self.limits.max_sequence_tokens,
                           step=tr.step, policy_version=tr.version, ranks=self.env.world, loss_fns=list(LOSS_INPUTS),
                           sampling=spec.rollout.sampling.model_dump()).model_dump()

    def sample(self, req: SampleRequest) -> tuple[dict[str, Any], int]:
        """Completions from the rollout servers (not queued: no training state is touched)."""
        if req.min_policy_version is not None and req.min_policy_version > self.published:
            raise Refused(409, f"min_policy_version {req.min_policy_version}: the rollout servers were given policy "
                          f"version {self.published}; save_weights_for_sampler first", "version")
        sp, spec = req.sampling_params, self.tr.spec
        params = SamplingParams(temperature=sp.temperature, top_p=sp.top_p, top_k=sp.top_k,
                                max_tokens=sp.max_tokens or self.limits.max_tokens, seed=sp.seed)
        prompt = req.prompt.to_ints()
        try:
            done = self.run.rollouts.sample(prompt, req.num_samples, params, min_version=req.min_policy_version,
                                            timeout=float(spec.weight_sync.timeout_seconds) * 3)
        except RolloutError as e:
            raise Refused(502, f"the rollout servers did not answer: {e}", "rollout") from None
        seqs = []
        for c in done:  # cut after a stop sequence (service.stops): the engines stop at EOS only
            ids, lps, reason = cut_at_stop(c.completion_ids, c.logprobs, "length" if c.truncated else "stop",
                                           sp.stop, self._decode)
            text = c.text if len(ids) == len(c.completion_ids) else self.tr.tokenizer.decode(
                ids, skip_special_tokens=True)
            seqs.append(SampledSequence(stop_reason=reason, tokens=ids, logprobs=lps, policy_version=c.policy_version,
                                        text=text))
        tokens = len(prompt) * len(seqs) + sum(len(s.tokens) for s in seqs)
        return {"sequences": [s.model_dump() for s in seqs]}, tokens

    def _decode(self, ids: list[int]) -> str:
        return self.tr.tokenizer.decode(ids, skip_special_tokens=False)

    def _queued(self) -> None:
        if self.board is not None:
            self.board.set_queued(self.calls.qsize())

    # ---- every rank: the trainer's main thread -------------------------------------------------------
    def serve(self, server: Optional["LeaderServer"]) -> str:
        """Serve until suspended; returns the final phase. Collective."""
        tr = self.tr
        tr.version = self.versions.resumed(tr.version)  # past any version issued after the checkpoint
        if tr.version > 0:  # resumed: the rollouts must serve the resumed policy first
            self.run.loop.publish()
        self.published = tr.version
        self._status(phase="running", step=tr.step, policy_version=tr.version,
                     last_checkpoint_step=self.run.checkpoints.last_step,
                     message="serving the training API (spec.mode service)")
        self._queued()
        if server is not None:
            server.mount_service(self)
        log.info("training service up", extra={"step": tr.step, "policy_version": tr.version})
        try:
            while True:
                cmd = dist.broadcast_object(self._next() if self.env.is_leader else None, self.env)
                if cmd[0] == "stop":
                    break
                if cmd[0] != "idle":
                    self._answer(*cmd)
        finally:
            if server is not None:
                server.mount_service(None)  # 503 from now on: the rollout side closes after this
            self.tinker.close()
        return self._stop()

    def _next(self) -> tuple:
        """Rank 0: the next command for every rank: ("stop",), ("idle",) or (route, request)."""
        if self.suspend.is_set():
            with self._lock:
                self.stopping = True
            while not self.calls.empty():
                self.calls.get().answer.set_exception(Refused(503, "the trainer is stopping (suspend or SIGTERM)",
                                                              "stopping"))
            self._queued()
            return ("stop",)
        try:
            call = self.calls.get(timeout=IDLE_SECONDS)
        except queue.Empty:
            return ("idle",)
        self._current = call
        self._queued()
        return (call.route, call.request)

    def _answer(self, route: str, req: Optional[BaseModel]) -> None:
        error: Optional[Refused] = None
        try:
            result = self._execute(route, req)
        except Refused as e:
            error = e
        except Exception as e:  # noqa: BLE001 - the caller gets the failure; the trainer keeps serving
            log.exception("training service %s failed", route)
            error = Refused(500, f"{type(e).__name__}: {e}", "failed")
        if self.env.is_leader:
            call, self._current = self._current, None
            if error is not None:
                call.answer.set_exception(error)
            else:
                call.answer.set_result(result)

    def _execute(self, route: str, req: Any) -> Optional[dict[str, Any]]:
        """One training call, on every rank (the answer matters on rank 0)."""
        tr, run = self.tr, self.run
        if route in ("/forward_backward", "/forward"):
            logprobs, metrics = self.ops.forward_backward(req, backward=route == "/forward_backward")
            outputs = [{"logprobs": TensorData.from_list(lp, "float32")} for lp in logprobs or []]
            return ForwardBackwardOutput(loss_fn_outputs=outputs, metrics=metrics).model_dump()
        if route == "/optim_step":
            metrics = self.ops.optim_step(req.adam_params)
            self._status(step=tr.step, policy_version=tr.version)
            return {"metrics": metrics}
        if route == "/save_weights_for_sampler":
            if self.published != tr.version:
                run.loop.publish()  # the normal weight-sync path (collective gather; rank 0 pushes)
                self.published = tr.version
            log.info("weights for sampling", extra={"policy_version": tr.version, "label": req.name})
            return {"path": f"{POLICY_PATH}{tr.version}", "policy_version": tr.version}
        if route == "/save_state":
            self._status(phase="checkpointing")
            run.checkpoints.save()  # collective, written in the background: the call answers once committed
            run.checkpoints.wait()
            path = checkpoint.step_dir(run.checkpoints.root, tr.step)
            self._status(phase="running", last_checkpoint_step=tr.step)
            log.info("state saved", extra={"path": str(path), "step": tr.step, "label": req.name})
            if req.name and self.env.is_leader:
                _name(run.checkpoints.root, req.name, path.name)
            return {"path": str(path), "step": tr.step, "name": req.name}
        if route == "/load_state":
            before = tr.version
            run.checkpoints.load(Path(req.path))
            tr.optimizer.zero_grad(set_to_none=True)
            if not req.optimizer:  # the weights only: Adam's moments start afresh
                tr.optimizer.state.clear()
            self.ops.pending = 0
            if tr.version <= before:  # a version names one set of weights: never hand one out twice
                tr.version = self.versions.issue(before)
            self._status(step=tr.step, policy_version=tr.version)
            return {"path": req.path, "step": tr.step, "policy_version": tr.version}
        raise Refused(404, f"no training call {route}", "not-found")

    def _stop(self) -> str:
        tr, run = self.tr, self.run
        self._status(phase="checkpointing", message="suspending")
        if not run.checkpoints.covers(tr.step):
            run.checkpoints.save()
        run.checkpoints.wait()
        self._status(phase="suspended", last_checkpoint_step=run.checkpoints.last_step,
                     message=f"training service stopped after step {tr.step}")
        log.info("training service stopped", extra={"step": tr.step})
        return "suspended"

    def _status(self, **fields: Any) -> None:
        if self.board is not None:
            self.board.update(**fields)


NAMES_FILE = "state-names.json"  # save_state(name): name -> the checkpoint's directory name


def _names(root: Path) -> dict[str, str]:
    try:
        return json.loads((root / NAMES_FILE).read_text())
    except (OSError, ValueError):
        return {}


def _name(root: Path, name: str, directory: str) -> None:
    """Record `name` for a checkpoint directory (atomically; the newest save of a name wins)."""
    names = {**_names(root), name: directory}
    tmp = root / f".{NAMES_FILE}.tmp"
    tmp.write_text(json.dumps(names, indent=1))
    os.replace(tmp, root / NAMES_FILE)


def serve(run: "TrainerRun", server: "Optional[LeaderServer]" = None) -> str:
    """spec.mode service: serve the training API (rank 0 answers HTTP on `server`, the LeaderServer)
    until suspended, instead of running the loop; the run is closed either way."""
    return run.closing(lambda: TrainingService(run).serve(server))
