"""Clients of a GRPOJob in mode service, shaped after Tinker's ServiceClient / TrainingClient /
SamplingClient (docs/service.md):

    service = ServiceClient.from_run_dir("runs/my-job")        # or ServiceClient(url, token=...)
    training = service.create_training_client()
    out = training.forward_backward(data, "importance_sampling").result()
    training.optim_step(AdamParams(learning_rate=1e-5)).result()
    sampler = training.save_weights_and_get_sampling_client()
    seqs = sampler.sample(ModelInput.from_ints(ids), 8, SamplingParams(max_tokens=64)).result()

Every call returns an APIFuture at once: `.result()` blocks, `await` it in async code (each method
also has an `_async` twin returning the same future, as Tinker's do). A training client's calls
reach the trainer in the order they were made (one sender thread), where they run one at a time;
samples run concurrently. Errors: ServiceError with the HTTP status and the trainer's reason.
Standard library and pydantic only (no torch).
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Generic, Optional, TypeVar, Union

from pydantic import BaseModel

from grpojob.plan import SERVICE_PREFIX
from grpojob.api.service import (AdamParams, Datum, ForwardBackwardInput, ForwardBackwardOutput, LoadStateRequest,
                    LoadStateResponse, ModelInput, OptimStepRequest, OptimStepResponse, SampleRequest,
                    SampleResponse, SamplingParams, SaveStateRequest, SaveStateResponse, SaveWeightsForSamplerResponse,
                    SaveWeightsRequest, ServiceInfo, policy_version_of)

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)


class ServiceError(RuntimeError):
    """The trainer refused or failed a call: `status` (HTTP) and `reason` (its message)."""

    def __init__(self, status: int, reason: str, path: str):
        super().__init__(f"{path}: HTTP {status}: {reason}")
        self.status, self.reason = status, reason


class APIFuture(Generic[T]):
    """A call in flight: result() in sync code, await (or result_async()) in async code."""

    def __init__(self, future: "concurrent.futures.Future[T]"):
        self._future = future

    def result(self, timeout: Optional[float] = None) -> T:
        return self._future.result(timeout)

    async def result_async(self, timeout: Optional[float] = None) -> T:
        return await asyncio.wait_for(asyncio.wrap_future(self._future), timeout)

    def future(self) -> "concurrent.futures.Future[T]":
        return self._future

    def __await__(self):
        return self.result_async().__await__()


class _HTTP:
    def __init__(self, base_url: str, token: str, timeout: float):
        self.base = base_url.rstrip("/") + SERVICE_PREFIX
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        self.timeout = timeout

    def call(self, route: str, body: Optional[BaseModel], out: type[M]) -> M:
        # what the caller set, None included (AdamParams: None keeps the optimizer's own); the rest
        # takes the same defaults on the service's side
        data = body.model_dump_json(exclude_unset=True).encode() if body is not None else None
        req = urllib.request.Request(self.base + route, data=data, headers=self.headers,
                                     method="POST" if body is not None else "GET")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                return out.model_validate_json(r.read())
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                reason = json.loads(raw).get("error") or raw.decode(errors="replace")
            except (ValueError, AttributeError):
                reason = raw.decode(errors="replace") or e.reason
            raise ServiceError(e.code, str(reason), SERVICE_PREFIX + route) from None


class ServiceClient:
    """The entry point: one GRPOJob's training service (its trainer leader's URL and token)."""

    def __init__(self, base_url: str, token: str, *, timeout: float = 3600.0, sample_concurrency: int = 64):
        self._http = _HTTP(base_url, token, timeout)
        self._samplers = concurrent.futures.ThreadPoolExecutor(sample_concurrency, thread_name_prefix="grpojob-sample")
        self._training: list[TrainingClient] = []

    @classmethod
    def from_run_dir(cls, run_dir: Union[str, Path], **kw: Any) -> "ServiceClient":
        """A local run (`grpojob run`): the trainer's URL from its endpoints.json, its token file."""
        from grpojob.auth import read_file
        from grpojob.local.runner import ENDPOINTS_FILE, token_path

        run_dir = Path(run_dir)
        endpoints = json.loads((run_dir / ENDPOINTS_FILE).read_text())
        return cls(endpoints["trainer-0"], read_file(token_path(run_dir)), **kw)

    def get_info(self) -> ServiceInfo:
        return self._http.call("/info", None, ServiceInfo)

    def wait_ready(self, timeout: float = 600.0, poll: float = 0.5) -> ServiceInfo:
        """get_info once the trainer serves (it answers 503, or not at all, while it starts)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.get_info()
            except ServiceError as e:
                if e.status != 503:
                    raise
                last = str(e)
            except OSError as e:  # not listening yet
                last = f"{type(e).__name__}: {e}"
            if time.monotonic() > deadline:
                raise TimeoutError(f"the training service did not answer within {timeout:.0f} s ({last})")
            time.sleep(poll)

    def create_training_client(self) -> "TrainingClient":
        """The job's policy (one per job: spec.model)."""
        client = TrainingClient(self._http, self._samplers)
        self._training.append(client)
        return client

    def create_sampling_client(self, model_path: Optional[str] = None) -> "SamplingClient":
        """Samples from the rollout servers; with `model_path` (a save_weights_for_sampler path)
        only from servers holding that policy version or newer."""
        version = policy_version_of(model_path) if model_path is not None else None
        return SamplingClient(self._http, self._samplers, version)

    def close(self) -> None:
        for t in self._training:
            t._sender.shutdown(wait=True)
        self._samplers.shutdown(wait=True)

    def __enter__(self) -> "ServiceClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class TrainingClient:
    def __init__(self, http: _HTTP, samplers: concurrent.futures.Executor):
        self._http, self._samplers = http, samplers
        self._sender = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="grpojob-train")  # in order

    def _submit(self, route: str, body: Optional[BaseModel], out: type[M]) -> APIFuture[M]:
        return APIFuture(self._sender.submit(self._http.call, route, body, out))

    def forward_backward(self, data: list[Datum], loss_fn: str,
                         loss_fn_config: Optional[dict[str, float]] = None) -> APIFuture[ForwardBackwardOutput]:
        """Loss and gradients of `data` (accumulated until optim_step), per-datum log-probs."""
        body = ForwardBackwardInput(data=data, loss_fn=loss_fn, loss_fn_config=loss_fn_config)
        return self._submit("/forward_backward", body, ForwardBackwardOutput)

    def forward(self, data: list[Datum], loss_fn: str,
                loss_fn_config: Optional[dict[str, float]] = None) -> APIFuture[ForwardBackwardOutput]:
        """The same without gradients: the trainer's log-probs and the loss."""
        body = ForwardBackwardInput(data=data, loss_fn=loss_fn, loss_fn_config=loss_fn_config)
        return self._submit("/forward", body, ForwardBackwardOutput)

    def optim_step(self, adam_params: AdamParams) -> APIFuture[OptimStepResponse]:
        return self._submit("/optim_step", OptimStepRequest(adam_params=adam_params), OptimStepResponse)

    def save_weights_for_sampler(self, name: Optional[str] = None) -> APIFuture[SaveWeightsForSamplerResponse]:
        """Push the current weights to the rollout servers (a new policy version)."""
        return self._submit("/save_weights_for_sampler", SaveWeightsRequest(name=name), SaveWeightsForSamplerResponse)

    def save_weights_and_get_sampling_client(self, name: Optional[str] = None) -> "SamplingClient":
        saved = self.save_weights_for_sampler(name).result()
        return SamplingClient(self._http, self._samplers, saved.policy_version)

    def save_state(self, name: Optional[str] = None) -> APIFuture[SaveStateResponse]:
        """A checkpoint of weights, optimizer and step (the trainer's checkpoint directory)."""
        return self._submit("/save_state", SaveStateRequest(name=name), SaveStateResponse)

    def load_state(self, path: str) -> APIFuture[LoadStateResponse]:
        """The weights of a save_state path; the optimizer's state starts afresh (Tinker's load_state)."""
        return self._submit("/load_state", LoadStateRequest(path=path, optimizer=False), LoadStateResponse)

    def load_state_with_optimizer(self, path: str) -> APIFuture[LoadStateResponse]:
        """The weights and the optimizer's state of a save_state path."""
        return self._submit("/load_state", LoadStateRequest(path=path), LoadStateResponse)

    def get_info(self) -> ServiceInfo:
        return self._http.call("/info", None, ServiceInfo)

    async def forward_backward_async(self, data, loss_fn, loss_fn_config=None) -> APIFuture[ForwardBackwardOutput]:
        return self.forward_backward(data, loss_fn, loss_fn_config)

    async def forward_async(self, data, loss_fn, loss_fn_config=None) -> APIFuture[ForwardBackwardOutput]:
        return self.forward(data, loss_fn, loss_fn_config)

    async def optim_step_async(self, adam_params: AdamParams) -> APIFuture[OptimStepResponse]:
        return self.optim_step(adam_params)

    async def save_weights_for_sampler_async(self, name=None) -> APIFuture[SaveWeightsForSamplerResponse]:
        return self.save_weights_for_sampler(name)

    async def save_weights_and_get_sampling_client_async(self, name=None) -> "SamplingClient":
        saved = await self.save_weights_for_sampler(name)
        return SamplingClient(self._http, self._samplers, saved.policy_version)

    async def save_state_async(self, name=None) -> APIFuture[SaveStateResponse]:
        return self.save_state(name)

    async def load_state_async(self, path: str) -> APIFuture[LoadStateResponse]:
        return self.load_state(path)

    async def load_state_with_optimizer_async(self, path: str) -> APIFuture[LoadStateResponse]:
        return self.load_state_with_optimizer(path)


class SamplingClient:
    """Samples through the job's rollout servers, from policy version `policy_version` or newer."""

    def __init__(self, http: _HTTP, pool: concurrent.futures.Executor, policy_version: Optional[int]):
        self._http, self._pool, self.policy_version = http, pool, policy_version

    def sample(self, prompt: ModelInput, num_samples: int = 1,
               sampling_params: Optional[SamplingParams] = None) -> APIFuture[SampleResponse]:
        body = SampleRequest(prompt=prompt, num_samples=num_samples,
                             sampling_params=sampling_params or SamplingParams(),
                             min_policy_version=self.policy_version)
        return APIFuture(self._pool.submit(self._http.call, "/sample", body, SampleResponse))

    async def sample_async(self, prompt: ModelInput, num_samples: int = 1,
                           sampling_params: Optional[SamplingParams] = None) -> APIFuture[SampleResponse]:
        return self.sample(prompt, num_samples, sampling_params)
