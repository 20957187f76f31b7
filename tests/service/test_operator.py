"""What spec.mode service changes on a cluster: the trainer's HTTP port (the training API) admits
the user's loop from spec.network.agentNamespaces (NetworkPolicies acted out by tests/helpers/netpol.py),
and a serving trainer is never "completed": it has no last step (its pod exiting cleanly past
training.steps, e.g. drained, is a restart, not success)."""
from __future__ import annotations

from grpojob.api import TrainerStatus
from tests.helpers.netpol import Pod, allowed
from tests.operator_k8s.test_network_policy import pod_of, render
from tests.operator_k8s.test_status import job, pods, running_status, step


def _trainer_http_from_agents(**spec) -> bool:
    objs = render(network={"agentNamespaces": ["agents"]}, **spec)
    trainer = pod_of(objs, "StatefulSet")
    policies = [o for o in objs if o["kind"] == "NetworkPolicy"]
    agent, stranger = Pod("agents", {"app": "loop"}), Pod("tenant-b", {"app": "loop"})
    http = trainer.ports["http"]
    assert not allowed(policies, stranger, trainer, http)
    assert not allowed(policies, agent, trainer, 29600)  # never the weight-sync store
    return allowed(policies, agent, trainer, http)


def test_the_training_api_admits_the_agent_namespaces_in_mode_service_only():
    assert _trainer_http_from_agents(mode="service")
    assert not _trainer_http_from_agents()


def test_a_serving_trainer_never_completes():
    for spec, phase in (({"mode": "service"}, "Running"), ({}, "Succeeded")):
        j = job(**spec)
        d = running_status(j)
        exited = pods("trainer", 2)
        exited[0] = exited[0].__class__(**{**exited[0].__dict__, "restarts": 1, "clean_exit": True})
        past = j.spec.training.steps + 5
        seen = step(j, d.status, tp=pods("trainer", 2), rp=pods("rollout", 2), ledger=d.ledger,
                    trainer=TrainerStatus(phase="running", step=past))
        after = step(j, seen.status, tp=exited, rp=pods("rollout", 2), ledger=seen.ledger,
                     trainer=TrainerStatus(phase="running", step=past))
        assert after.status.phase == phase, (spec, after.status.message)
