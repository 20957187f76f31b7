"""The kopf handlers: thin wrappers that hand a job and its indexed pods and children to the
Controller. `register` puts them into a registry, so tests and `grpojob operator` each get their
own operator instance; `grpojob_operator.standalone` registers them for `kopf run`. All are async:
kopf runs sync handlers through a thread pool."""
from __future__ import annotations

import logging
from typing import Any, Mapping

import kopf

from grpojob.api.spec import GROUP, PLURAL, VERSION

from . import names as n
from .config import OperatorConfig
from .controller import Controller
from .kube import KubeError
from .views import CONTENT_CHECKED, child_view, pod_view

log = logging.getLogger("grpojob.operator")

MANAGED = {n.LABEL_MANAGED_BY: n.MANAGER}
# Watched kinds besides GRPOJobs: (group, version, plural, kind).
# NetworkPolicies too: one edited or deleted by anyone is put back at the next look.
CHILD_RESOURCES = (("", "v1", "configmaps", "ConfigMap"), ("", "v1", "services", "Service"),
                   ("apps", "v1", "statefulsets", "StatefulSet"), ("apps", "v1", "deployments", "Deployment"),
                   ("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy"))


def plain(x: Any) -> Any:
    """kopf's body views as plain dicts and lists."""
    if isinstance(x, Mapping):
        return {k: plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [plain(v) for v in x]
    return x


def configure(settings: kopf.OperatorSettings, cfg: OperatorConfig) -> None:
    # Keep kopf's bookkeeping in annotations: our CRD's structural schema would prune status.kopf.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration")
    # kopf puts a finalizer on jobs with timers (to stop them before the job goes); name it ours.
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    settings.posting.level = logging.WARNING  # our own transition Events, not kopf's handler chatter
    selector = f"{n.LABEL_MANAGED_BY}={n.MANAGER}"  # server-side: only our pods and children
    settings.watching.label_selectors["", "v1", "pods"] = selector
    for group, version, plural, _ in CHILD_RESOURCES:
        settings.watching.label_selectors[group, version, plural] = selector
    if cfg.batch_window is not None:
        settings.batching.batch_window = cfg.batch_window


def register(registry: kopf.OperatorRegistry, ctl: Controller) -> None:
    cfg = ctl.cfg

    @kopf.on.startup(id="startup", registry=registry)
    async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        configure(settings, cfg)
        try:
            await ctl.start()
        except Exception as e:  # no credentials or no port: stop with the reason, not a retry loop
            raise kopf.PermanentError(f"grpojob operator cannot start: {type(e).__name__}: {e}") from e

    @kopf.on.cleanup(id="cleanup", registry=registry)
    async def cleanup(**_: Any) -> None:
        await ctl.stop()

    @kopf.on.login(id="login", registry=registry)
    def login(**kwargs: Any) -> Any:
        return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)

    @kopf.index("", "v1", "pods", labels=MANAGED, id="grpojob_pods", registry=registry)
    async def grpojob_pods(meta: Mapping[str, Any], spec: Mapping[str, Any], status: Mapping[str, Any],
                           **_: Any) -> Any:
        entry = pod_view(plain(meta), plain(status), plain(spec))
        return None if entry is None else {entry[0]: entry[1]}

    def child_indexer(kind: str) -> Any:
        async def index(meta: Mapping[str, Any], body: Mapping[str, Any], **_: Any) -> Any:
            entry = child_view(kind, plain(meta), plain(body.get("data")) if kind == "ConfigMap" else None,
                               plain(body) if kind in CONTENT_CHECKED else None)
            return None if entry is None else {entry[0]: entry[1]}
        return index

    child_ids = []
    for group, version, plural, kind in CHILD_RESOURCES:
        hid = f"grpojob_{plural}"
        kopf.index(group, version, plural, labels=MANAGED, id=hid, registry=registry)(
            child_indexer(kind))
        child_ids.append(hid)

    async def run(body: Mapping[str, Any], name: str, namespace: str, kwargs: Mapping[str, Any]) -> None:
        key = (namespace, name)
        pods = list(kwargs["grpojob_pods"].get(key, ()))
        kids = [k for hid in child_ids for k in kwargs[hid].get(key, ())]
        try:
            await ctl.reconcile(body=plain(body), pods=pods, kids=kids)
        except KubeError as e:
            raise kopf.TemporaryError(str(e), delay=cfg.retry_delay) from e

    @kopf.on.resume(GROUP, VERSION, PLURAL, id="reconcile", registry=registry)
    @kopf.on.create(GROUP, VERSION, PLURAL, id="reconcile", registry=registry)
    @kopf.on.update(GROUP, VERSION, PLURAL, field="spec", id="reconcile", registry=registry)
    async def spec_changed(body: kopf.Body, name: str, namespace: str, **kwargs: Any) -> None:
        await run(body, name, namespace, kwargs)

    @kopf.timer(GROUP, VERSION, PLURAL, interval=cfg.interval, backoff=cfg.retry_delay, id="observe",
                registry=registry)
    async def observe(body: kopf.Body, name: str, namespace: str, **kwargs: Any) -> None:
        await run(body, name, namespace, kwargs)

    @kopf.on.event(GROUP, VERSION, PLURAL, id="forget", registry=registry,
                   when=lambda type, **_: type == "DELETED")
    async def gone(body: kopf.Body, name: str, namespace: str, **_: Any) -> None:
        ctl.forget(body.get("metadata", {}).get("uid", ""), namespace, name)
