"""Kubernetes NetworkPolicy ingress semantics, acted out (no cluster, no CNI here): which pod may
open a TCP connection to which port of which pod, given the policies of the destination's
namespace. It follows the API reference (networking.k8s.io/v1):

- a pod selected by no policy with policyType Ingress accepts everything; a selected pod accepts
  a connection only if some selecting policy has an ingress rule that allows it (policies add up);
- a rule allows it when one of its `from` peers matches the source (no `from`: every source) and
  one of its `ports` matches (no `ports`: every port); a numbered port matches that number, a named
  port the destination container's port of that name; protocol TCP by default;
- a peer with only a podSelector means pods of the policy's own namespace; only a
  namespaceSelector, every pod of matching namespaces; both in one peer, pods matching both;
- label selectors: matchLabels and matchExpressions (In, NotIn, Exists, DoesNotExist) ANDed; an
  empty selector matches everything.
Not acted out: ipBlock (unused), endPort, egress, and traffic from the pod's own node (kubelet
probes), which a real cluster always lets through.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable


@dataclass(frozen=True)
class Pod:
    namespace: str
    labels: dict[str, str]
    ports: dict[str, int] = field(default_factory=dict)  # container port name -> number
    name: str = ""


def matches(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    if selector is None:
        return False
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e["key"], e["operator"], e.get("values") or []
        ok = {"In": key in labels and labels[key] in values,
              "NotIn": key not in labels or labels[key] not in values,
              "Exists": key in labels, "DoesNotExist": key not in labels}[op]
        if not ok:
            return False
    return True


def _peer(peer: dict[str, Any], policy_ns: str, src: Pod, ns_labels: dict[str, dict[str, str]]) -> bool:
    if "ipBlock" in peer:
        raise NotImplementedError("ipBlock peers are not acted out")
    pod_sel, ns_sel = peer.get("podSelector"), peer.get("namespaceSelector")
    if ns_sel is not None:
        ns_ok = matches(ns_sel, ns_labels.get(src.namespace, {"kubernetes.io/metadata.name": src.namespace}))
    else:
        ns_ok = src.namespace == policy_ns
    return ns_ok and (pod_sel is None or matches(pod_sel, src.labels))


def _port(rule_port: dict[str, Any], dst: Pod, port: int) -> bool:
    if rule_port.get("protocol", "TCP") != "TCP":
        return False
    want = rule_port.get("port")
    if want is None:
        return True
    return want == port if isinstance(want, int) else dst.ports.get(want) == port


def allowed(policies: Iterable[dict[str, Any]], src: Pod, dst: Pod, port: int,
            ns_labels: dict[str, dict[str, str]] | None = None) -> bool:
    """May `src` connect to `dst` on TCP `port`?"""
    ns_labels = ns_labels or {}
    selecting = [p for p in policies if p["metadata"].get("namespace", "default") == dst.namespace
                 and "Ingress" in (p["spec"].get("policyTypes") or ["Ingress"])
                 and matches(p["spec"]["podSelector"], dst.labels)]
    if not selecting:
        return True
    for p in selecting:
        ns = p["metadata"].get("namespace", "default")
        for rule in p["spec"].get("ingress") or []:
            peers = rule.get("from")
            ports = rule.get("ports")
            if (not peers or any(_peer(peer, ns, src, ns_labels) for peer in peers)) and \
                    (not ports or any(_port(rp, dst, port) for rp in ports)):
                return True
    return False
