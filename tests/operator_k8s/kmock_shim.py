"""kmock's Kubernetes API emulator, completed into enough of an API server for kopf and the operator.

kmock (PyPI, by kopf's author) keeps objects in memory and serves list/watch/get/create/patch/delete.
It lacks, and this shim adds: metadata.uid / resourceVersion / creationTimestamp / generation (kopf's
patches need a resourceVersion; the operator's owner references need uids), generateName (kopf's
Events use it), the path of the namespaces resource (it crashed kopf's `-n`), the core group's discovery groupVersion ("v1", not "/v1"), kind and apiVersion on
list responses, and our CRD registered for discovery. It also takes test hooks that run before a
request is applied: to hold it (an operator stopped mid-reconcile) or answer an error (a conflict).

kmock matches each request against its reactions by re-filtering the whole request history, which
is quadratic (hundreds of ms per request after a few thousand); the shim answers that membership
test directly for plain filters (same result, constant time).

Still not emulated (the tests act these out, see cluster.py): controllers, kubelets, garbage
collection, schema validation, strategic merge. Patches are JSON merge patches, as the operator sends.
"""
from __future__ import annotations

import copy
import datetime
import itertools
import random
import string
import uuid
from typing import Any, Awaitable, Callable

import attrs
import kmock
from kmock._internal import dicts, dsl, enums, parsing, references, rendering

from grpojob.api.spec import GROUP, KIND, PLURAL, SHORT_NAMES, SINGULAR, VERSION

GRPOJOBS = kmock.resource(GROUP, VERSION, PLURAL)
PODS = kmock.resource("", "v1", "pods")
STATEFULSETS = kmock.resource("apps", "v1", "statefulsets")
DEPLOYMENTS = kmock.resource("apps", "v1", "deployments")
SERVICES = kmock.resource("", "v1", "services")
CONFIGMAPS = kmock.resource("", "v1", "configmaps")
EVENTS = kmock.resource("", "v1", "events")
SECRETS = kmock.resource("", "v1", "secrets")
NETWORKPOLICIES = kmock.resource("networking.k8s.io", "v1", "networkpolicies")
PVCS = kmock.resource("", "v1", "persistentvolumeclaims")

Hook = Callable[[rendering.Request], Awaitable[None]]

_history_contains = dsl.View.__contains__


def _contains(view: dsl.View, item: Any) -> bool:
    """`request in view` without replaying the history through every filter."""
    if isinstance(item, rendering.Request):
        if type(view) is dsl.Filter:
            return bool(view.criteria(item)) and _contains(view._source, item)
        if type(view) in (dsl.Priority, dsl.Chained):
            return _contains(view._source, item)
        if isinstance(view, dsl.Root):
            return any(r is item for r in reversed(view._requests))
    return _history_contains(view, item)


dsl.View.__contains__ = _contains  # type: ignore[method-assign]

_parse_path = parsing.parse_path


def _parse_namespaces_too(path: str) -> parsing.ParsedPath:
    """kmock reads /api/v1/namespaces[/NAME] as a namespaced path missing its namespace and crashes
    (kopf lists namespaces when told to watch some): it is the cluster-wide namespaces resource."""
    parts = path.strip("/").split("/")
    if parts[:3] == ["api", "v1", "namespaces"] and len(parts) <= 4:
        return parsing.ParsedPath("", "v1", "namespaces", None, parts[3] if len(parts) == 4 else None, None)
    return _parse_path(path)


parsing.parse_path = _parse_namespaces_too


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@attrs.define(kw_only=True)
class Emulator(kmock.KubernetesEmulator):
    hooks: list[Hook] = attrs.field(factory=list)
    _rv: Any = attrs.field(factory=lambda: itertools.count(1))
    _last_rv: int = 0

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.resources.load_bundled()
        self.resources[GRPOJOBS] = references.ResourceInfo(
            kind=KIND, singular=SINGULAR, namespaced=True, shortnames=set(SHORT_NAMES),
            verbs={"get", "list", "watch", "create", "patch", "delete"}, subresources={"status"})

    def next_rv(self) -> str:
        self._last_rv = next(self._rv)
        return str(self._last_rv)

    async def _handle(self, request: rendering.Request) -> Any:
        if request.resource is not None:
            for hook in list(self.hooks):
                await hook(request)
            self._stamp(request)
        return await super()._handle(request)

    def _stamp(self, request: rendering.Request) -> None:
        data = request.data
        if not isinstance(data, dict):
            return
        if request.action == enums.action.CREATE:
            meta = data.setdefault("metadata", {})
            if request.namespace and not meta.get("namespace"):
                meta["namespace"] = request.namespace
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = meta["generateName"] + "".join(random.choices(string.ascii_lowercase, k=6))
            meta["uid"] = str(uuid.uuid4())
            meta["resourceVersion"] = self.next_rv()
            meta["creationTimestamp"] = _now()
            meta["generation"] = 1
        elif request.action == enums.action.UPDATE:
            key = (request.resource, request.namespace, request.name)
            current = self.objects[key] if key in self.objects else None
            meta = data.setdefault("metadata", {})
            meta["resourceVersion"] = self.next_rv()
            if current is not None and not current.deleted and request.subresource is None and "spec" in data:
                old = current.raw
                new = dicts.patch_dict(copy.deepcopy(old), {"spec": data["spec"]})
                if new.get("spec") != old.get("spec"):
                    meta["generation"] = int(old.get("metadata", {}).get("generation", 1)) + 1

    async def _serve_version(self, request: rendering.Request) -> Any:
        out = await super()._serve_version(request)
        if request.resource is not None and request.resource.group == "":
            out["groupVersion"] = request.resource.version
        return out

    async def _serve_list(self, request: rendering.Request) -> Any:
        out = await super()._serve_list(request)
        res = request.resource
        info = self.resources[res] if res is not None else None
        if res is not None and info is not None and info.kind:
            out["kind"] = f"{info.kind}List"
            out["apiVersion"] = res.version if res.group == "" else f"{res.group}/{res.version}"
        out["metadata"] = {"resourceVersion": str(self._last_rv)}
        return out

    # -- reading the state, for the tests -------------------------------------------------------

    def live(self, resource: Any, namespace: str | None = None) -> list[dict[str, Any]]:
        """Current (not deleted) objects of a resource, optionally in one namespace."""
        out = []
        for (res, ns, _), obj in list(self.objects.items()):
            if res == resource and (namespace is None or ns == namespace) and not obj.deleted:
                out.append(obj.raw)
        return out

    def get_obj(self, resource: Any, namespace: str, name: str) -> dict[str, Any] | None:
        key = (resource, namespace, name)
        if key not in self.objects or self.objects[key].deleted:
            return None
        return self.objects[key].raw

    def requests_for(self, resource: Any, action: str | None = None) -> list[rendering.Request]:
        return [r for r in list(self._requests) if r.resource == resource and
                (action is None or r.action == enums.action(action))]


def fail_next(emulator: Emulator, action: str, resource: Any, status: int = 409, times: int = 1,
              name: str | None = None) -> list[rendering.Request]:
    """Answer the next `times` matching requests with an API error before they apply (a real
    conflict: nothing changes). Returns the list the refused requests are appended to."""
    refused: list[rendering.Request] = []

    async def hook(request: rendering.Request) -> None:
        if len(refused) < times and request.resource == resource and request.action == enums.action(action) \
                and (name is None or request.name == name or (request.data or {}).get("metadata", {}).get("name") == name):
            refused.append(request)
            raise kmock.KubernetesError(status=status, reason="Conflict" if status == 409 else "Error",
                                        message=f"injected by the test: {status}")
    emulator.hooks.append(hook)
    return refused
