"""Tinker's own wire on the trainer leader (spec.mode service), under /api/v1, behind the job's
token presented as Tinker's API key `tml-<token>` (X-API-Key): the routes the `tinker` SDK calls
(pinned in the `tinker` extra), each mapped onto a call of the training service (service.app), so
`tinker.ServiceClient(base_url=<trainer>, api_key="tml-" + token)` drives a GRPOJob unchanged.

Request bodies are parsed with the SDK's own types (tinker.types, and its protobuf module for
forward_backward: service.tinker_wire); training calls join the service's one queue, in the order
they arrive (the SDK sends a training client's calls one at a time, in order); results are fetched
through retrieve_future (service.tinker_futures). What a GRPOJob does not do is refused, at the call,
with a message that names it (docs/service.md has the porting table):

  - one policy per job: create_lora_training_client attaches to it (its base model and LoRA rank
    must be the job's spec.model.path and spec.model.lora.rank; a full fine-tuning job refuses it);
  - a sampling client samples from one policy version: the rollout servers serve one at a time,
    so a client whose version is no longer served is refused (make one from the current weights);
  - prompt logprobs come from the trainer's copy of the weights, so only while the trainer's
    version is the sampler's;
  - not served: custom losses run on the server, inflight sampling clients, top-k logprobs, image
    and audio chunks, checkpoint listing, publishing and export, the Dimuon optimizer.
"""
from __future__ import annotations

import concurrent.futures
import json
import logging
import os
import time
import uuid
from collections import OrderedDict
from pathlib import PurePosixPath
from typing import Any, Callable, Optional, Protocol

from pydantic import ValidationError

from grpojob.api.service import (AdamParams, Datum, ForwardBackwardInput, LoadStateRequest, ModelInput,
                                 OptimStepRequest, SampleRequest, SamplingParams, SaveStateRequest, SaveWeightsRequest)
from grpojob.leader.trajectories.wire import describe
from grpojob.plan import ENV_JOB, TINKER_PREFIX
from grpojob.service import tinker_wire as tw
from grpojob.service.tinker_futures import JSON, PROTO, Futures, as_json
from grpojob.service.wire import Limits, Refused, check_limits, tokens_of

log = logging.getLogger("grpojob.service.tinker")


class Service(Protocol):
    """What Tinker's wire uses of the training service (service.app.TrainingService, which makes
    the TinkerAPI: described here so that this module needs nothing of app.py)."""
    tr: Any  # the trainer: its spec, model and policy version
    board: Any  # the call counters of /status and /metrics, or None
    limits: Limits
    published: int  # the policy version the rollout servers hold

    def enqueue(self, route: str, req: Any) -> Any: ...  # a concurrent.futures.Future of the result

    def sample(self, req: SampleRequest) -> tuple[dict[str, Any], int]: ...

PREFIX = TINKER_PREFIX
# route -> the call it is, as /status and /metrics count them (the /service calls' names)
OPS = {"/forward_backward": "forward_backward", "/optim_step": "optim_step", "/save_weights": "save_state",
       "/load_weights": "load_state", "/save_weights_for_sampler": "save_weights_for_sampler", "/asample": "sample"}
SAMPLE_THREADS = 32
SAMPLERS = 4096
SDK_SERVED = "0.38"  # the tinker release whose wire is served (pyproject's tinker extra pins it)


class TinkerAPI:
    def __init__(self, service: Service):
        self.svc = service
        self.run_id = os.environ.get(ENV_JOB) or "grpojob"
        self.futures = Futures()
        # sampling session id -> the policy version it samples (the newest SAMPLERS; older ones are refused)
        self.samplers: "OrderedDict[str, int]" = OrderedDict()
        self.sampler_names: dict[str, int] = {}  # save_weights_for_sampler(name) -> policy version
        self.pool = concurrent.futures.ThreadPoolExecutor(SAMPLE_THREADS, thread_name_prefix="grpojob-tinker")

    def close(self) -> None:
        """The service stopped: samples still waiting are dropped (their clients get 503s next)."""
        self.pool.shutdown(wait=False, cancel_futures=True)

    # ---- dispatch ------------------------------------------------------------------------------
    def handle(self, method: str, path: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes, str]:
        route = path.split("?")[0].removeprefix(PREFIX)
        try:
            import tinker  # noqa: F401 - the SDK's types: the `tinker` extra in the trainer's image
        except ImportError:
            return 501, json.dumps({"error": "Tinker's wire needs the tinker package in the trainer's image "
                                             "(pip install 'grpojob[tinker]')"}).encode(), JSON
        t0 = time.perf_counter()
        try:
            ctype, out = self._route(method, route, {k.lower(): v for k, v in headers.items()}, body)
            return 200, out, ctype
        except Refused as e:
            code, doc = e.status, {"error": str(e), "reason": e.reason}
        except ValidationError as e:
            code, doc = 400, {"error": describe(e), "reason": "invalid"}
        except Exception as e:  # noqa: BLE001 - a call's failure is its answer
            log.exception("tinker %s failed", route)
            code, doc = 500, {"error": f"{type(e).__name__}: {e}", "reason": "failed"}
        if route in OPS:
            self._observe(OPS[route], "refused" if code < 500 else "failed", t0)
        return code, json.dumps(doc).encode(), JSON

    def _observe(self, op: str, result: str, t0: float, tokens: int = 0) -> None:
        """One call answered, in /status and /metrics (as the /service calls are)."""
        if self.svc.board is not None:
            self.svc.board.observe_call(op, result, time.perf_counter() - t0, tokens if result == "ok" else 0)

    def _outcome(self, error: Optional[BaseException]) -> str:
        if error is None:
            return "ok"
        return "refused" if isinstance(error, Refused) and error.status < 500 else "failed"

    def _route(self, method: str, route: str, headers: dict[str, str], body: bytes) -> tuple[str, bytes]:
        if method == "GET":
            if route == "/healthz":
                return as_json({"status": "ok"})
            if route == "/get_server_capabilities":
                return as_json(self._capabilities())
            if route.startswith("/samplers/"):
                return as_json(self._sampler_info(route.removeprefix("/samplers/")))
        elif route == "/forward_backward":
            return as_json(self._forward_backward(body, headers.get("content-encoding")))
        elif route == "/retrieve_future":
            from tinker import types
            return self.futures.retrieve(types.FutureRetrieveRequest.model_validate(self._json(body)).request_id)
        elif route.startswith("/sessions/") and route.endswith("/finish"):
            return as_json({})
        else:
            handler = self.POST.get(route)
            if handler is not None:
                return as_json(handler(self, self._json(body)))
        raise Refused(404, f"{method} {PREFIX}{route}: not served by a GRPOJob (docs/service.md lists Tinker's "
                      f"calls and which are served)", "not-found")

    @staticmethod
    def _json(body: bytes) -> dict:
        try:
            doc = json.loads(body or b"{}")
        except ValueError as e:
            raise Refused(400, f"body: not JSON ({e})") from None
        if not isinstance(doc, dict):
            raise Refused(400, "body: not a JSON object")
        return doc

    # ---- session ---------------------------------------------------------------------------------
    def _client_config(self, doc: dict) -> dict:
        """Feature flags the SDK reads at start: plain API keys, httpx, one request per
        forward_backward chunk in order, zstd bodies, custom losses and samples polled client-side.
        Another SDK release than the one served is refused here, before anything else."""
        sdk = str(doc.get("sdk_version") or "")
        if not sdk.startswith(SDK_SERVED + "."):
            raise Refused(400, f"tinker SDK {sdk or '(no version)'}: this GRPOJob serves the wire of tinker "
                          f"{SDK_SERVED}.x only (pip install 'grpojob[tinker]')", "sdk-version")
        return {"pjwt_auth_enabled": False, "credential_default_source": "api_key", "use_pyqwest_transport": False,
                "parallel_fwdbwd_chunks": False, "proto_compress_fwdbwd": True, "custom_loss_server_side": False,
                "sample_use_retrieve_futures": False, "sample_join_sampling_session": False}

    def _create_session(self, doc: dict) -> dict:
        return {"type": "create_session", "session_id": f"{self.run_id}-{uuid.uuid4().hex[:12]}",
                "info_message": f"GRPOJob {self.run_id}: one policy ({self.svc.tr.spec.model.path}); calls a GRPOJob "
                                "does not serve are refused with their name (docs/service.md)"}

    def _capabilities(self) -> dict:
        spec = self.svc.tr.spec
        return {"supported_models": [{"model_name": spec.model.path, "trainable": True, "sampleable": True,
                                      "max_context_length": spec.training.micro_batch_tokens}]}

    # ---- training --------------------------------------------------------------------------------
    def _check_model(self, base_model: Optional[str], rank: Optional[int]) -> None:
        spec = self.svc.tr.spec
        m = spec.model
        names = {m.path, PurePosixPath(m.path).name, m.tokenizer}
        if base_model is not None and base_model not in names:
            raise Refused(400, f"base_model '{base_model}': this GRPOJob trains {m.path} (spec.model.path); "
                          "ask for that model", "model")
        if rank is None:
            return
        if m.lora is None:
            raise Refused(400, f"create_lora_training_client(rank={rank}): this GRPOJob trains the full model "
                          "(spec.model.lora is unset); set spec.model.lora.rank to serve a LoRA client", "model")
        if rank != m.lora.rank:
            raise Refused(400, f"rank {rank}: this GRPOJob's adapter has spec.model.lora.rank {m.lora.rank}; "
                          f"ask for rank={m.lora.rank} (or change the job)", "model")

    def _create_model(self, doc: dict) -> dict:
        from tinker import types
        req = types.CreateModelRequest.model_validate(doc)
        if req.optimizer_config.type != "adamw":
            raise Refused(400, f"optimizer_config.type {req.optimizer_config.type}: a GRPOJob steps with AdamW only")
        if req.lora_config is None:
            raise Refused(400, "create_model without lora_config: not served (use create_lora_training_client)")
        if req.lora_config.seed is not None:
            raise Refused(400, "lora_config.seed: the adapter is the job's own (spec.model.lora); leave seed unset")
        self._check_model(req.base_model, req.lora_config.rank)
        model_id = f"{req.session_id}:train:{req.model_seq_id}"
        return {"request_id": self.futures.done({"model_id": model_id, "type": "create_model"}, as_json),
                "model_id": model_id}

    def _get_info(self, doc: dict) -> dict:
        m = self.svc.tr.spec.model
        name = m.path
        return {"type": "get_info", "model_id": doc.get("model_id"), "model_name": name, "is_lora": m.lora is not None,
                "lora_rank": m.lora.rank if m.lora else None,
                "model_data": {"model_name": name, "tokenizer_id": m.tokenizer or m.path,
                               "arch": getattr(self.svc.tr.model.config, "model_type", None)}}

    def _forward_backward(self, body: bytes, encoding: Optional[str]) -> dict:
        model_id, req, forward_only = tw.decode_forward_backward(body, encoding, self.svc.limits)
        route = "/forward" if forward_only else "/forward_backward"
        return self._queue(route, req, lambda r: (PROTO, tw.encode_forward_backward(r)), model_id)

    def _queue(self, route: str, req: Any, convert: Callable[[Any], tuple[str, bytes]],
               model_id: Optional[str] = None) -> dict:
        t0, future = time.perf_counter(), self.svc.enqueue(route, req)
        future.add_done_callback(lambda f: self._observe(route.strip("/"), self._outcome(f.exception()), t0,
                                                         tokens_of(req)))
        return {"request_id": self.futures.add(future, convert), "model_id": model_id}

    def _optim_step(self, doc: dict) -> dict:
        from tinker import types
        req = types.OptimStepRequest.model_validate(doc)
        p = req.optim_params
        if not isinstance(p, types.AdamParams):
            raise Refused(400, f"optim_params.type {getattr(p, 'type', '?')}: a GRPOJob steps with AdamW only")
        ours = OptimStepRequest(adam_params=AdamParams(learning_rate=p.learning_rate, beta1=p.beta1, beta2=p.beta2,
                                                       eps=p.eps, weight_decay=p.weight_decay,
                                                       grad_clip_norm=p.grad_clip_norm))
        return self._queue("/optim_step", ours, lambda r: as_json({"metrics": r["metrics"]}), req.model_id)

    def _save_weights(self, doc: dict) -> dict:
        from tinker import types
        req = types.SaveWeightsRequest.model_validate(doc)
        name = self._name(req.path)
        return self._queue("/save_state", SaveStateRequest(name=name),
                           lambda r: as_json({"path": self._path("weights", name), "type": "save_weights"}),
                           req.model_id)

    def _load_weights(self, doc: dict) -> dict:
        from tinker import types
        req = types.LoadWeightsRequest.model_validate(doc)
        name = self._parse_path(req.path, "weights")
        model_id = req.model_id
        if model_id is None:  # create_training_client_from_state[_with_optimizer]: a client on the loaded state
            self._check_model(req.base_model, None)
            model_id = f"{req.session_id}:train:{req.model_seq_id}"
        return self._queue("/load_state", LoadStateRequest(path=name, optimizer=req.optimizer),
                           lambda r: as_json({"path": req.path, "model_id": model_id, "type": "load_weights"}),
                           model_id)

    def _save_weights_for_sampler(self, doc: dict) -> dict:
        from tinker import types
        req = types.SaveWeightsForSamplerRequest.model_validate(doc)
        if req.kind != "snapshot":
            raise Refused(400, f"kind {req.kind}: only snapshot sampling clients are served (the rollout servers hold "
                          "one policy version at a time)")
        name = None if req.path is None else self._name(req.path)

        def convert(result: dict) -> tuple[str, bytes]:
            version = int(result["policy_version"])
            if name is not None:
                self.sampler_names[name] = version
                return as_json({"path": self._path("sampler_weights", name), "type": "save_weights_for_sampler"})
            return as_json({"sampling_session_id": self._sampler(version), "type": "save_weights_for_sampler"})
        return self._queue("/save_weights_for_sampler", SaveWeightsRequest(name=name), convert, req.model_id)

    # ---- sampling --------------------------------------------------------------------------------
    def _sampler(self, version: int) -> str:
        sid = f"{self.run_id}-sampler-{uuid.uuid4().hex[:12]}"
        self.samplers[sid] = version
        while len(self.samplers) > SAMPLERS:
            self.samplers.popitem(last=False)
        return sid

    def _create_sampling_session(self, doc: dict) -> dict:
        from tinker import types
        req = types.CreateSamplingSessionRequest.model_validate(doc)
        if req.model_path is not None:
            name = self._parse_path(req.model_path, "sampler_weights")
            if name not in self.sampler_names:
                raise Refused(404, f"model_path {req.model_path}: no sampler weights of that name (save_weights_for_"
                              f"sampler names them; there: {', '.join(self.sampler_names) or 'none'})", "not-found")
            version = self.sampler_names[name]
        else:
            self._check_model(req.base_model, None)
            version = 0  # the job's initial weights
        return {"type": "create_sampling_session", "sampling_session_id": self._sampler(version)}

    def _sampler_info(self, sid: str) -> dict:
        if sid not in self.samplers:
            raise Refused(404, f"sampler {sid}: not a sampler of this job", "not-found")
        return {"sampler_id": sid, "base_model": self.svc.tr.spec.model.path, "model_path": None}

    def _asample(self, doc: dict) -> dict:
        from tinker import types
        req = types.SampleRequest.model_validate(doc)
        for field, asked in (("topk_prompt_logprobs", req.topk_prompt_logprobs),
                             ("topk_sample_logprobs", req.topk_sample_logprobs),
                             ("target_prompt_logprobs", req.target_prompt_logprobs is not None),
                             ("prompt_alt_tokens_k", req.prompt_alt_tokens_k),
                             ("record_stability_info", req.record_stability_info)):
            if asked:
                raise Refused(400, f"{field}: not served by a GRPOJob (tokens, their logprobs and prompt logprobs "
                              "are)")
        version = self.samplers.get(req.sampling_session_id or "")
        if version is None:
            raise Refused(400, "sample: only this job's recent sampling clients are served (sampling_session_id "
                          f"{req.sampling_session_id} is not one: make one from the current weights)")
        tokens = []
        for j, chunk in enumerate(req.prompt.chunks):
            if chunk.type != "encoded_text":
                raise Refused(400, f"prompt.chunks[{j}]: {chunk.type} chunks are not supported (text tokens only)")
            tokens += list(chunk.tokens)
        sp = req.sampling_params
        stop = sp.stop if sp.stop is None or isinstance(sp.stop, str) else list(sp.stop)
        ours = SampleRequest(prompt=ModelInput.from_ints(tokens), num_samples=req.num_samples,
                             sampling_params=SamplingParams(max_tokens=sp.max_tokens, temperature=sp.temperature,
                                                            top_p=sp.top_p, top_k=sp.top_k, seed=sp.seed, stop=stop),
                             min_policy_version=version)
        check_limits(ours, self.svc.limits)
        future = self.pool.submit(self._sample, ours, version, bool(req.prompt_logprobs), req.prompt_logprobs_last_n)
        rid = self.futures.add(future, lambda body: (PROTO, body))
        return {"request_id": rid, "sample_sequence_ids": [f"{rid}-{i}" for i in range(req.num_samples)]}

    def _sample(self, req: SampleRequest, version: int, prompt_logprobs: bool, last_n: Optional[int]) -> bytes:
        t0 = time.perf_counter()
        try:
            body, tokens = self._sample_now(req, version, prompt_logprobs, last_n)
        except BaseException as e:
            self._observe("sample", self._outcome(e), t0)
            raise
        self._observe("sample", "ok", t0, tokens)
        return body

    def _sample_now(self, req: SampleRequest, version: int, prompt_logprobs: bool,
                    last_n: Optional[int]) -> tuple[bytes, int]:
        self._served(version)
        doc, _ = self.svc.sample(req)  # cut after its stop sequences there
        seqs = []
        for s in doc["sequences"]:
            if s["policy_version"] != version:
                raise Refused(409, f"the rollout servers moved to policy version {s['policy_version']} while sampling "
                              f"version {version}: make a sampling client from the current weights", "version")
            seqs.append((s["tokens"], s["logprobs"], s["stop_reason"]))
        lps = self._prompt_logprobs(req.prompt.to_ints(), version, last_n) if prompt_logprobs else None
        return tw.encode_sample(seqs, lps), req.prompt.length * len(seqs) + sum(len(t) for t, _, _ in seqs)

    def _served(self, version: int) -> None:
        if version != self.svc.published:
            raise Refused(409, f"this sampling client's weights (policy version {version}) are no longer served: the "
                          f"rollout servers hold version {self.svc.published} (one at a time); make a sampling client "
                          "from the current weights (save_weights_and_get_sampling_client)", "version")

    def _prompt_logprobs(self, tokens: list[int], version: int, last_n: Optional[int]) -> list[float]:
        """log p(token i | tokens before it) by the trainer's forward (NaN at position 0), while the
        trainer's weights are the sampler's."""
        def same() -> None:
            if self.svc.tr.version != version:
                raise Refused(409, f"prompt logprobs are computed by the trainer, whose weights (policy version "
                              f"{self.svc.tr.version}) are no longer this sampler's ({version})", "version")
        if len(tokens) < 2:
            return [float("nan")] * len(tokens)
        same()
        fwd = ForwardBackwardInput(data=[Datum(model_input=ModelInput.from_ints(tokens[:-1]),
                                               loss_fn_inputs={"target_tokens": tokens[1:]})], loss_fn="cross_entropy")
        out = self.svc.enqueue("/forward", fwd).result()
        same()
        return tw.with_last_n([float("nan")] + list(out["loss_fn_outputs"][0]["logprobs"]["data"]), last_n)

    # ---- paths -----------------------------------------------------------------------------------
    def _name(self, name: str) -> str:
        if not name or "/" in name or len(name) > 200:
            raise Refused(400, f"path '{name}': a checkpoint name is 1-200 characters without '/'")
        return name

    def _path(self, kind: str, name: str) -> str:
        return f"tinker://{self.run_id}/{kind}/{name}"

    def _parse_path(self, path: str, kind: str) -> str:
        parts = path.removeprefix("tinker://").split("/")
        if not path.startswith("tinker://") or len(parts) != 3 or parts[1] != kind:
            raise Refused(400, f"path '{path}': not a tinker://{self.run_id}/{kind}/<name> path")
        if parts[0] != self.run_id:
            raise Refused(400, f"path '{path}': a path of training run {parts[0]}, not of this GRPOJob "
                          f"({self.run_id})")
        return parts[2]

    POST: dict[str, Callable[["TinkerAPI", dict], Any]] = {
        "/client/config": _client_config, "/client/dynamic_config": lambda self, doc: {},
        "/create_session": _create_session, "/session_heartbeat": lambda self, doc: {"type": "session_heartbeat"},
        "/telemetry": lambda self, doc: {"status": "accepted"}, "/cancel_future": lambda self, doc: {},
        "/create_model": _create_model, "/get_info": _get_info, "/optim_step": _optim_step,
        "/save_weights": _save_weights, "/load_weights": _load_weights,
        "/save_weights_for_sampler": _save_weights_for_sampler, "/create_sampling_session": _create_sampling_session,
        "/asample": _asample,
    }
