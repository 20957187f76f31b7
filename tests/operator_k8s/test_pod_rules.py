"""The operator's InvalidSpec condition applies the rules `grpojob validate` applies (the same
grpojob.api.check): a GRPOJob whose pods the API server would refuse (pod validation of its
tolerations, resources, affinity...) is InvalidSpec with every field path at once and gets no
children, on kmock too, which applies neither the CRD's schema nor its CEL rules."""
from __future__ import annotations

from .cluster import eventually
from .conftest import NS, job_manifest, job_path
from .test_operator import cond, kids, status

NODE_TERM = "spec.rollout.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0]"


async def test_pod_validation_rules_make_InvalidSpec_with_every_path(emulator, cluster, operator, trainer):
    bad = job_manifest("pods", trainer={"tolerations": [{"key": "gpu", "operator": "Bogus", "effect": "Whatever"}],
                                        "resources": {"requests": {"memory": "2Gi"}, "limits": {"memory": "1Gi"}}},
                       rollout={"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                           "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In"}]}]}}}})
    await cluster.create(job_path(), bad)
    await eventually(lambda: cond(emulator, "pods", "InvalidSpec").get("status") == "True", what="InvalidSpec")
    message = cond(emulator, "pods", "InvalidSpec")["message"]
    for said in ("spec.trainer.tolerations[0].operator: 'Bogus' is not supported",
                 "spec.trainer.tolerations[0].effect: 'Whatever' is not supported",
                 "spec.trainer.resources.requests[memory]: 2Gi must be less than or equal to the memory limit of 1Gi",
                 f"{NODE_TERM}.matchExpressions[0].values: required when operator is In"):
        assert said in message, message
    assert status(emulator, "pods")["phase"] == "Failed"
    assert not kids(emulator, "pods", NS)
