"""What a real cluster would do around the operator, acted out by the tests (kmock has no
controllers): the StatefulSet and Deployment controllers (pods for the wanted replicas, and new
pods when the pod template changes: a new revision; a StatefulSet's claims from its
volumeClaimTemplates, tests/helpers/statefulset.py), the kubelet (pods Running / Ready / restarted
/ Failed, on the test's command; a container that exits is restarted, whatever its exit code, as
restartPolicy Always says), and the garbage collector (objects whose owner is gone are
deleted). Every change goes through the emulator's HTTP
API, so kopf sees it on its watches exactly as it would see a real cluster's."""
from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import random
import string
from typing import Any, Callable, Optional

from grpojob_operator import names as n
from tests.helpers import statefulset

from .kmock_shim import DEPLOYMENTS, PODS, PVCS, STATEFULSETS, Emulator

log = logging.getLogger("tests.cluster")


def _owner_uid(obj: dict[str, Any]) -> Optional[str]:
    refs = obj.get("metadata", {}).get("ownerReferences") or []
    return refs[0]["uid"] if refs else None


REVISION_LABEL = "controller-revision-hash"  # what the StatefulSet controller stamps (pod-template-hash for a ReplicaSet)


def revision(owner: dict[str, Any]) -> str:
    """A workload's revision: its pod template (a change rolls its pods)."""
    return hashlib.sha256(json.dumps(owner["spec"]["template"], sort_keys=True).encode()).hexdigest()[:10]


def pod_path(ns: str, name: str = "") -> str:
    return f"/api/v1/namespaces/{ns}/pods" + (f"/{name}" if name else "")


class Cluster:
    def __init__(self, emu: Emulator, period: float = 0.05):
        self.emu = emu
        self.period = period
        self.make_pods = True  # act out the workload controllers (off: children only)
        self._task: Optional[asyncio.Task] = None

    async def _call(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        async with self.emu.request(method, path, json=body) as resp:
            data = await resp.json(content_type=None)
            assert resp.status < 300, f"{method} {path}: {resp.status} {data}"
            return data

    # -- controllers ---------------------------------------------------------------------------

    async def __aenter__(self) -> "Cluster":
        self._task = asyncio.create_task(self._loop())
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    async def _loop(self) -> None:
        while True:
            try:
                await self.step()
            except Exception:  # a test's own assertion will report what is missing
                log.exception("acted-out controllers failed")
            await asyncio.sleep(self.period)

    async def step(self) -> None:
        """One pass of every acted-out controller."""
        await self._garbage_collect()
        if not self.make_pods:
            return
        pods = self.emu.live(PODS)
        # Each workload on its own, as the real controllers are: a pod refused by admission (its
        # StatefulSet reports FailedCreate) holds back no other workload.
        work = [(self._statefulset, sts) for sts in self.emu.live(STATEFULSETS)]
        work += [(self._deployment, dep) for dep in self.emu.live(DEPLOYMENTS)]
        for controller, owner in work:
            try:
                await controller(owner, [p for p in pods if _owner_uid(p) == owner["metadata"]["uid"]])
            except AssertionError as e:
                log.debug("%s %s: %s", owner["kind"] if "kind" in owner else "", owner["metadata"]["name"], e)

    def _pod(self, owner: dict[str, Any], kind: str, name: str, extra_labels: dict[str, str],
             spec: Optional[dict[str, Any]] = None) -> dict[str, Any]:
        template = owner["spec"]["template"]
        meta = owner["metadata"]
        return {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": meta["namespace"],
                         "labels": {**template["metadata"].get("labels", {}), **extra_labels,
                                    REVISION_LABEL: revision(owner)},
                         "annotations": dict(template["metadata"].get("annotations", {})),
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": kind, "name": meta["name"],
                                              "uid": meta["uid"], "controller": True}]},
            "spec": spec if spec is not None else template["spec"],
            "status": {"phase": "Pending"},
        }

    async def _roll(self, owner: dict[str, Any], pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """A pod of an older revision is replaced (the default RollingUpdate, all at once here)."""
        current = revision(owner)
        stale = [p for p in pods if p["metadata"].get("labels", {}).get(REVISION_LABEL) != current]
        for p in stale:
            await self._call("DELETE", pod_path(p["metadata"]["namespace"], p["metadata"]["name"]))
        return [p for p in pods if p not in stale]

    async def _statefulset(self, sts: dict[str, Any], pods: list[dict[str, Any]]) -> None:
        name, ns = sts["metadata"]["name"], sts["metadata"]["namespace"]
        want = int(sts["spec"].get("replicas", 1))
        pods = await self._roll(sts, pods)
        have = {p["metadata"]["name"]: p for p in pods}
        for i in range(want):  # parallel pod management: all at once
            pod = f"{name}-{i}"
            for claim in statefulset.claims(sts, i):  # made once, before the pod; kept when it goes
                if self.emu.get_obj(PVCS, ns, claim["metadata"]["name"]) is None:
                    await self._call("POST", f"/api/v1/namespaces/{ns}/persistentvolumeclaims", claim)
            if pod not in have:
                await self._call("POST", pod_path(ns), self._pod(sts, "StatefulSet", pod, {n.POD_INDEX_LABEL: str(i)},
                                                                 statefulset.pod_spec(sts, i)))
        for pod in have:
            if int(pod.rsplit("-", 1)[1]) >= want:
                await self._call("DELETE", pod_path(ns, pod))

    async def _deployment(self, dep: dict[str, Any], pods: list[dict[str, Any]]) -> None:
        ns = dep["metadata"]["namespace"]
        want = int(dep["spec"].get("replicas", 1))
        pods = await self._roll(dep, pods)
        for _ in range(want - len(pods)):
            suffix = "".join(random.choices(string.ascii_lowercase + string.digits, k=5))
            await self._call("POST", pod_path(ns), self._pod(dep, "ReplicaSet", f"{dep['metadata']['name']}-{suffix}", {}))
        for pod in sorted(pods, key=lambda p: p["metadata"]["name"])[want:] if len(pods) > want else []:
            await self._call("DELETE", pod_path(ns, pod["metadata"]["name"]))

    async def _garbage_collect(self) -> None:
        """The garbage collector: an object whose owner references all name objects that are gone
        (by uid) is deleted, in the background; one with an owner left stays
        (https://kubernetes.io/docs/concepts/architecture/garbage-collection/#owners-dependents;
        kubernetes/kubernetes pkg/controller/garbagecollector/garbagecollector.go, attemptToDeleteItem:
        an item with a "solid" owner is kept). Dependents of dependents go pass after pass."""
        live_uids = {o["metadata"].get("uid") for (_, _, _), obj in list(self.emu.objects.items())
                     if not obj.deleted for o in [obj.raw]}
        for (res, ns, name), obj in list(self.emu.objects.items()):
            if obj.deleted:
                continue
            owners = [ref.get("uid") for ref in obj.raw.get("metadata", {}).get("ownerReferences") or []]
            if owners and not any(uid in live_uids for uid in owners):
                path = (f"/api/{res.version}" if res.group == "" else f"/apis/{res.group}/{res.version}") + \
                    f"/namespaces/{ns}/{res.plural}/{name}"
                await self._call("DELETE", path)

    # -- kubelet -------------------------------------------------------------------------------

    def pods(self, ns: str, job: str, role: Optional[str] = None) -> list[dict[str, Any]]:
        return sorted((p for p in self.emu.live(PODS, ns)
                       if p["metadata"].get("labels", {}).get(n.LABEL_JOB) == job
                       and (role is None or p["metadata"]["labels"].get(n.LABEL_ROLE) == role)),
                      key=lambda p: p["metadata"]["name"])

    async def set_pod(self, ns: str, name: str, *, phase: str = "Running", ready: bool = True,
                      restarts: int = 0, last_exit: Optional[dict[str, Any]] = None) -> None:
        container: dict[str, Any] = {"name": "main", "ready": ready, "restartCount": restarts,
                                     "state": {"running": {}} if phase == "Running" else {"terminated": {"exitCode": 1}}}
        if last_exit:
            container["lastState"] = {"terminated": last_exit}
        status = {"phase": phase, "containerStatuses": [container],
                  "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
        await self._call("PATCH", pod_path(ns, name) + "/status", {"status": status})

    async def container_exited(self, ns: str, name: str, exit_code: int, message: str = "") -> None:
        """Kubelet: the pod's container ended with `exit_code` (and a termination message). A
        StatefulSet's or Deployment's pod has restartPolicy Always, so the kubelet restarts it
        whatever the exit code, 0 included, after a back-off: the container is first seen
        terminated, then running again with restartCount + 1 and the ended run as its lastState
        (https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#restart-policy,
        https://kubernetes.io/docs/concepts/workloads/controllers/statefulset/#pod-template).
        Acted out: the kmock emulator has no kubelet."""
        pod = next(p for p in self.emu.live(PODS, ns) if p["metadata"]["name"] == name)
        (old,) = pod["status"]["containerStatuses"]
        ended = {"exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error",
                 **({"message": message} if message else {})}
        restarts = int(old.get("restartCount", 0))
        await self._patch_container(ns, name, {**old, "ready": False, "state": {"terminated": ended}}, ready=False)
        await asyncio.sleep(self.period * 4)  # the back-off: the operator may look meanwhile
        if not any(p["metadata"]["name"] == name for p in self.emu.live(PODS, ns)):
            return  # deleted meanwhile (scaled down): nothing to restart
        await self._patch_container(ns, name, {**old, "ready": True, "restartCount": restarts + 1,
                                               "state": {"running": {}}, "lastState": {"terminated": ended}})

    async def _patch_container(self, ns: str, name: str, container: dict[str, Any], ready: bool = True) -> None:
        status = {"phase": "Running", "containerStatuses": [container],
                  "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
        await self._call("PATCH", pod_path(ns, name) + "/status", {"status": status})

    async def run_pods(self, ns: str, job: str, role: Optional[str] = None) -> list[str]:
        """Kubelet: every pod of the job (or role) Running and Ready."""
        names = [p["metadata"]["name"] for p in self.pods(ns, job, role)]
        for name in names:
            await self.set_pod(ns, name)
        return names

    async def delete_pod(self, ns: str, name: str) -> None:
        await self._call("DELETE", pod_path(ns, name))

    async def delete(self, path: str) -> None:
        await self._call("DELETE", path)

    async def patch(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return await self._call("PATCH", path, body)

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return await self._call("POST", path, body)


async def eventually(check: Callable[[], Any], timeout: float = 15.0, what: str = "", period: float = 0.05) -> Any:
    """Poll until check() is truthy (returns it) or fail after `timeout` naming what was awaited."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last: Any = None
    while True:
        try:
            last = check()
            if last:
                return last
        except (KeyError, IndexError, TypeError, AssertionError) as e:
            last = e
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or check}: last {last!r}")
        await asyncio.sleep(period)
