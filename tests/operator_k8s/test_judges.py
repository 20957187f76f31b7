"""spec.judges on a cluster: a Deployment + Service per judge, rendered from the plan's judge role,
owned by the GRPOJob, with probes, in the gang and behind a NetworkPolicy that lets only the
trainer pods (and monitoring) reach it; the trainer is told the judge's Service; every child passes
kubernetes-validate --strict; a job without judges renders exactly as before."""
from __future__ import annotations

import json

from grpojob import plan
from grpojob_operator import gang, judges
from grpojob_operator import names as n
from tests.helpers.k8s_schema import validate_all

from .conftest import job_manifest
from .test_children import OWNER, build, container, env_of

JUDGES = [{"name": "words", "model": "/models/rm", "volumeClaim": "rm", "replicas": 2, "gpus": 1,
           "cpu": "2", "memory": "8Gi", "port": 8111, "engine": "vllm"}]


def judge_job(**over):
    return job_manifest("j", rewards=[{"judge": "words"}], judges=JUDGES, **over)


def test_a_judge_gets_a_deployment_and_a_service_owned_by_the_job():
    kids = build(judge_job())
    assert list(kids)[-2:] == [("Service", "j-judge-words"), ("Deployment", "j-judge-words")]
    assert ("NetworkPolicy", "j-judge") in kids
    assert validate_all(kids.values()) == len(kids)  # kubernetes-validate --strict, every child
    dep, svc = kids[("Deployment", "j-judge-words")], kids[("Service", "j-judge-words")]
    assert dep["metadata"]["ownerReferences"] == [OWNER] == svc["metadata"]["ownerReferences"]
    assert dep["spec"]["replicas"] == 2
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"] == {
        n.LABEL_JOB: "j", n.LABEL_ROLE: "judge", judges.LABEL_JUDGE: "words"}
    assert svc["spec"]["ports"] == [{"name": "http", "port": 8111, "targetPort": "http", "protocol": "TCP"}]
    c = container(dep)
    assert c["command"] == ["grpojob", "judge"]
    env = env_of(c)
    assert env[plan.ENV_JUDGE] == "words" and env[plan.ENV_JUDGE_PORT] == "8111"
    assert plan.ENV_SYNC_ADDR not in env  # frozen: never in weight sync
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz" and c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["resources"] == {"requests": {"cpu": "2", "memory": "8Gi", "nvidia.com/gpu": "1"},
                              "limits": {"cpu": "2", "memory": "8Gi", "nvidia.com/gpu": "1"}}
    claims = [v for v in dep["spec"]["template"]["spec"]["volumes"] if "persistentVolumeClaim" in v]
    assert [v["persistentVolumeClaim"] for v in claims] == [{"claimName": "rm", "readOnly": True}]
    trainer = env_of(container(kids[("StatefulSet", "j-trainer")]))
    assert json.loads(trainer[plan.ENV_JUDGE_URLS]) == {"words": ["http://j-judge-words.ml.svc:8111"]}


def test_only_the_trainer_and_monitoring_reach_a_judge():
    policy = build(judge_job())[("NetworkPolicy", "j-judge")]
    assert policy["spec"]["podSelector"] == {"matchLabels": {n.LABEL_JOB: "j", n.LABEL_ROLE: "judge"}}
    first, *rest = policy["spec"]["ingress"]
    assert first == {"from": [{"podSelector": {"matchLabels": {n.LABEL_JOB: "j", n.LABEL_ROLE: "trainer"}}}],
                     "ports": [{"port": 8111, "protocol": "TCP"}]}
    assert all("namespaceSelector" in peer for r in rest for peer in r["from"])


def test_judges_are_in_the_gang_and_stop_with_the_trainer():
    kids = build(judge_job(scheduling={"gang": "kueue", "queueName": "q"}))
    total = kids[("StatefulSet", "j-trainer")]["spec"]["template"]["metadata"]["annotations"][gang.KUEUE_TOTAL]
    meta = kids[("Deployment", "j-judge-words")]["spec"]["template"]["metadata"]
    spec = judge_job()["spec"]
    without = spec["trainer"].get("replicas", 1) + spec["rollout"].get("replicas", 1)
    assert meta["labels"][gang.KUEUE_GROUP] == "j" and meta["annotations"][gang.KUEUE_TOTAL] == total == str(without + 2)
    from grpojob_operator.children import Scale

    suspended = build(judge_job(), scale=Scale(0, 0))
    assert suspended[("Deployment", "j-judge-words")]["spec"]["replicas"] == 0


def test_a_job_without_judges_renders_what_it_did():
    kids = build(job_manifest("j"))
    assert not any("judge" in name for _, name in kids)
    assert plan.ENV_JUDGE_URLS not in env_of(container(kids[("StatefulSet", "j-trainer")]))


def test_judge_ready_says_whether_every_judge_pod_serves_its_model():
    from grpojob.api import parse
    from grpojob_operator.status import Observation, PodView, decide, initial_status

    from .test_status import T0, TRAINING, cond, pods

    def judge_pods(ready: int) -> list[PodView]:
        return [PodView(name=f"j-judge-words-{i}", uid=f"judge-{i}", role="judge", phase="Running", ready=i < ready)
                for i in range(2)]

    j = parse(judge_job())
    st = initial_status(T0)
    for ready, status, message in ((1, "False", "1/2 judge pods ready"), (2, "True", "2/2 judge pods ready")):
        obs = Observation(now=T0, trainer_pods=pods("trainer", 2), rollout_pods=pods("rollout", 2), trainer=TRAINING,
                          judge_pods=judge_pods(ready))
        st = decide(j, st, obs, generation=1).status
        c = cond(st, "JudgeReady")
        assert (c.status, c.message) == (status, message)
    plain = decide(parse(job_manifest("j")), initial_status(T0), Observation(now=T0), generation=1).status
    assert all(c.type != "JudgeReady" for c in plain.conditions)  # a job without judges has no such condition
