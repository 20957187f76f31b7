"""A small async layer over the official Kubernetes client (kubernetes.aio): create, patch, delete
any object by apiVersion/kind, with retries for conflicts and transient errors.

The typed API classes validate and re-serialise every body through their models; the operator
already holds plain manifests, so it sends them through the same ApiClient (config, auth, TLS)
with the generic request path instead.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import random
from typing import Any, Optional

from kubernetes.aio import client, config
from kubernetes.aio.client.exceptions import ApiException

from grpojob.api.spec import GROUP, PLURAL, VERSION

from . import names as n

log = logging.getLogger("grpojob.operator.kube")

MERGE_PATCH = "application/merge-patch+json"
# Plural resource names of the kinds the operator writes (no discovery round-trips needed).
PLURALS = {"ConfigMap": "configmaps", "Service": "services", "StatefulSet": "statefulsets",
           "Deployment": "deployments", "PodGroup": "podgroups", "PodMonitor": "podmonitors",
           "GRPOJob": PLURAL, "Pod": "pods", "Event": "events", "Secret": "secrets",
           "NetworkPolicy": "networkpolicies"}
RETRY_STATUSES = {409, 429, 500, 502, 503, 504}
REQUEST_TIMEOUT = 30.0
_PROXY_VARS = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")


class KubeError(RuntimeError):
    def __init__(self, status: int, reason: str, what: str, body: str = ""):
        self.status, self.reason, self.what = status, reason, what
        detail, self.details = body, None
        try:
            doc = json.loads(body)
            detail, self.details = doc.get("message", body), doc.get("details")
        except (ValueError, AttributeError):
            pass
        super().__init__(f"{what}: HTTP {status} {reason}" + (f": {detail}" if detail else ""))

    @property
    def unserved_kind(self) -> bool:
        """404 for the resource type itself (its CRD is not installed), not for a named object or
        a namespace: the API server's Status then names nothing."""
        return self.status == 404 and not (self.details or {}).get("name")


def path(api_version: str, kind: str, namespace: Optional[str], name: Optional[str] = None,
         subresource: Optional[str] = None) -> str:
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    out = base + (f"/namespaces/{namespace}" if namespace else "") + f"/{PLURALS[kind]}"
    if name:
        out += f"/{name}"
    if subresource:
        out += f"/{subresource}"
    return out


class Kube:
    def __init__(self, api: client.ApiClient, attempts: int = 5, backoff: float = 0.1):
        self.api, self.attempts, self.backoff = api, attempts, backoff

    @classmethod
    async def connect(cls, **kw: Any) -> "Kube":
        """In-cluster service account when running in a pod, else the kubeconfig (KUBECONFIG)."""
        cfg = client.Configuration()
        if os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config(client_configuration=cfg)
        else:  # read KUBECONFIG now: the client resolves its default path once, at import
            paths = os.environ.get("KUBECONFIG", "").split(os.pathsep)
            await config.load_kube_config(config_file=paths[0] or None, client_configuration=cfg)
        cfg.connection_pool_maxsize = max(cfg.connection_pool_maxsize or 0, 32)
        if not any(os.environ.get(v) for v in _PROXY_VARS):
            # trust_env costs two thread-pool hops per request (netrc, proxy lookup): skip them
            # when there is no proxy to find.
            cfg.client_session_kwargs = {**(cfg.client_session_kwargs or {}), "trust_env": False}
        return cls(client.ApiClient(cfg), **kw)

    async def close(self) -> None:
        await self.api.close()

    async def request(self, method: str, url: str, body: Any = None,
                      content_type: str = "application/json", what: str = "",
                      query: Optional[list[tuple[str, str]]] = None) -> dict[str, Any]:
        """One API call; 409/429/5xx and connection errors are retried with backoff."""
        what = what or f"{method} {url}"
        query = [*(query or []), *([("fieldManager", n.MANAGER)] if method in ("POST", "PATCH") else [])]
        for attempt in range(1, self.attempts + 1):
            try:
                params = await self.api.param_serialize(
                    method=method, resource_path=url, query_params=query or None,
                    header_params={"Content-Type": content_type, "Accept": "application/json"},
                    body=body, auth_settings=["BearerToken"])
                resp = await self.api.call_api(*params, _request_timeout=REQUEST_TIMEOUT)
                data = await resp.read()
                status = resp.status
                if 200 <= status < 300:
                    return json.loads(data) if data else {}
                err = KubeError(status, resp.reason or "", what, data.decode(errors="replace"))
            except ApiException as e:
                err = KubeError(e.status or 0, e.reason or "", what, e.body or "")
            except (OSError, asyncio.TimeoutError) as e:
                err = KubeError(0, type(e).__name__, what, str(e))
            # A create that conflicts means "already exists": the caller decides, no retry.
            retriable = err.status in RETRY_STATUSES or err.status == 0
            if not retriable or (method == "POST" and err.status == 409) or attempt == self.attempts:
                raise err
            delay = self.backoff * 2 ** (attempt - 1) * (0.5 + random.random())
            log.info("retrying %s after HTTP %s (attempt %d/%d)", what, err.status, attempt, self.attempts)
            await asyncio.sleep(delay)
        raise AssertionError("unreachable")

    async def get(self, api_version: str, kind: str, namespace: Optional[str], name: str) -> Optional[dict[str, Any]]:
        """The object, or None when there is none."""
        try:
            return await self.request("GET", path(api_version, kind, namespace, name),
                                      what=f"get {kind} {namespace}/{name}")
        except KubeError as e:
            if e.status == 404:
                return None
            raise

    async def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        """The pods matching a label selector, as the API server has them now."""
        out = await self.request("GET", path("v1", "Pod", namespace), query=[("labelSelector", selector)],
                                 what=f"list pods {namespace} ({selector})")
        return list(out.get("items") or [])

    async def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        m = obj["metadata"]
        return await self.request("POST", path(obj["apiVersion"], obj["kind"], m.get("namespace")), obj,
                                  what=f"create {obj['kind']} {m.get('namespace')}/{m['name']}")

    async def patch(self, api_version: str, kind: str, namespace: Optional[str], name: str,
                    body: dict[str, Any], subresource: Optional[str] = None) -> dict[str, Any]:
        # JSON merge patch: lists are replaced whole, so the result is exactly the manifest we send.
        return await self.request("PATCH", path(api_version, kind, namespace, name, subresource), body,
                                  content_type=MERGE_PATCH,
                                  what=f"patch {kind}{'/' + subresource if subresource else ''} {namespace}/{name}")

    async def delete(self, api_version: str, kind: str, namespace: Optional[str], name: str) -> None:
        try:
            await self.request("DELETE", path(api_version, kind, namespace, name),
                               {"propagationPolicy": "Background"}, what=f"delete {kind} {namespace}/{name}")
        except KubeError as e:
            if e.status != 404:
                raise

    async def apply(self, obj: dict[str, Any]) -> str:
        """Create the object, or bring an existing one to this manifest. Returns created|patched."""
        try:
            await self.create(obj)
            return "created"
        except KubeError as e:
            if e.status != 409:
                raise
        m = obj["metadata"]
        body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind")}
        await self.patch(obj["apiVersion"], obj["kind"], m.get("namespace"), m["name"], body)
        return "patched"

    async def patch_job_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        await self.patch(f"{GROUP}/{VERSION}", "GRPOJob", namespace, name, {"status": status}, "status")

    async def patch_job_annotations(self, namespace: str, name: str, annotations: dict[str, Any]) -> None:
        await self.patch(f"{GROUP}/{VERSION}", "GRPOJob", namespace, name, {"metadata": {"annotations": annotations}})

    async def delete_job(self, namespace: str, name: str) -> None:
        await self.delete(f"{GROUP}/{VERSION}", "GRPOJob", namespace, name)
