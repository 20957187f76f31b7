"""spec.judges with the real kopf operator against the kmock emulator: a GRPOJob with judges gets
exactly its judge Deployments, Services and NetworkPolicy (owned by the job, as rendered, each
through kubernetes-validate --strict); JudgeReady follows the judge pods as the kubelet (acted out
by the test's Cluster) makes them ready; suspend scales the judges to 0 with the trainer; a judge
removed from spec.judges (an edit of the suspended job) loses its Deployment and Service, and the
last one the NetworkPolicy; the resumed job runs without them. A running job refuses the edit."""
from __future__ import annotations

import copy

from grpojob.api import parse
from grpojob_operator import children, judges
from grpojob_operator import names as n
from grpojob_operator.rbac import allows
from tests.helpers.k8s_schema import validate_all

from .cluster import eventually
from .conftest import NS, job_manifest, job_path
from .kmock_shim import DEPLOYMENTS, GRPOJOBS, NETWORKPOLICIES, SERVICES
from .test_operator import calls_made, cond, kids, status, without_server_fields

JUDGES = [{"name": "words", "model": "/models/rm", "volumeClaim": "rm", "cpu": "1", "memory": "2Gi"},
          {"name": "style", "model": "/models/style", "volumeClaim": "style", "replicas": 2, "cpu": "1",
           "memory": "2Gi"}]
REWARDS = [{"judge": "words"}, {"judge": "style", "weight": 0.5}]
JOB = "jud"


def manifest(judges_=JUDGES, rewards=REWARDS):
    return job_manifest(JOB, rewards=copy.deepcopy(rewards), judges=copy.deepcopy(judges_))


def rendered(emu, m, scale=None) -> dict:
    uid = emu.get_obj(GRPOJOBS, NS, JOB)["metadata"]["uid"]
    extra = {"scale": scale} if scale is not None else {}
    return {children.key(o): o for o in children.build(parse(m), namespace=NS, image="registry.test/grpojob:test",
                                                      owner=children.owner_reference(JOB, uid), **extra)}


def judge_kids(emu) -> list[tuple[str, str]]:
    return sorted(k for k in kids(emu, JOB) if "judge" in k[1])


def judge_replicas(emu) -> dict[str, int]:
    return {j: emu.get_obj(DEPLOYMENTS, NS, judges.name(JOB, j))["spec"]["replicas"]
            for j in ("words", "style") if emu.get_obj(DEPLOYMENTS, NS, judges.name(JOB, j))}


def judge_ready(emu) -> tuple[str, str, str]:
    c = cond(emu, JOB, "JudgeReady")
    return c.get("status"), c.get("reason"), c.get("message")


async def test_the_operator_runs_suspends_and_removes_judges(emulator, cluster, operator, trainer):
    await cluster.create(job_path(), manifest())
    trainer.set(NS, JOB, phase="running", totalSteps=20)
    await eventually(lambda: cond(emulator, JOB, "Created").get("status") == "True", what="Created")

    # Exactly the rendered children, the judges' among them, owned by the job.
    want = rendered(emulator, manifest())
    have = kids(emulator, JOB)
    assert sorted(have) == sorted(want)
    for key, obj in want.items():
        assert without_server_fields(have[key]) == obj, f"{key} differs from the rendering"
    assert judge_kids(emulator) == [("Deployment", "jud-judge-style"), ("Deployment", "jud-judge-words"),
                                    ("NetworkPolicy", "jud-judge"), ("Service", "jud-judge-style"),
                                    ("Service", "jud-judge-words")]
    assert validate_all(have.values()) == len(have)  # kubernetes-validate --strict
    assert judge_replicas(emulator) == {"words": 1, "style": 2}

    # The Deployment controller makes 1 + 2 judge pods; trainer and rollout pods run, the judges load.
    await eventually(lambda: len(cluster.pods(NS, JOB, judges.ROLE)) == 3, what="3 judge pods")
    await eventually(lambda: len(cluster.pods(NS, JOB, "trainer")) == 2 and len(cluster.pods(NS, JOB, "rollout")) == 2,
                     what="trainer and rollout pods")
    await cluster.run_pods(NS, JOB, "trainer")
    await cluster.run_pods(NS, JOB, "rollout")
    for pod in cluster.pods(NS, JOB, judges.ROLE):  # started, their model not loaded yet: /readyz fails
        await cluster.set_pod(NS, pod["metadata"]["name"], ready=False)
    await eventually(lambda: judge_ready(emulator) == ("False", "Waiting", "0/3 judge pods ready"),
                     what="JudgeReady False")
    words_pod = next(p["metadata"]["name"] for p in cluster.pods(NS, JOB, judges.ROLE)
                     if p["metadata"]["labels"][judges.LABEL_JUDGE] == "words")
    await cluster.set_pod(NS, words_pod)
    await eventually(lambda: judge_ready(emulator) == ("False", "Waiting", "1/3 judge pods ready"),
                     what="one judge pod ready")
    await cluster.run_pods(NS, JOB, judges.ROLE)
    await eventually(lambda: judge_ready(emulator) == ("True", "AllReady", "3/3 judge pods ready"),
                     what="JudgeReady True")
    await eventually(lambda: status(emulator, JOB).get("phase") == "Running", what="Running")

    # A running job keeps its judges: the edit is refused, nothing is deleted.
    await cluster.patch(job_path(NS, JOB), {"spec": {"judges": JUDGES[:1], "rewards": REWARDS[:1]}})
    await eventually(lambda: cond(emulator, JOB, "InvalidSpec").get("status") == "True", what="edit refused")
    assert "spec.judges" in cond(emulator, JOB, "InvalidSpec")["message"]
    assert judge_replicas(emulator) == {"words": 1, "style": 2}
    await cluster.patch(job_path(NS, JOB), {"spec": {"judges": JUDGES, "rewards": REWARDS}})  # reverted
    await eventually(lambda: cond(emulator, JOB, "InvalidSpec").get("status") == "False", what="edit reverted")

    # Suspend: the trainer checkpoints, then every workload, the judges too, goes to 0.
    await cluster.patch(job_path(NS, JOB), {"spec": {"runPolicy": {"suspend": True}}})
    await eventually(lambda: (NS, JOB) in trainer.suspends, what="POST /suspend")
    assert judge_replicas(emulator) == {"words": 1, "style": 2}, "the judges stop after the checkpoint, not before"
    await cluster.set_pod(NS, f"{n.trainer_name(JOB)}-0", restarts=1, last_exit={"exitCode": 0, "reason": "Completed"})
    trainer.set(NS, JOB, phase="suspended", lastCheckpointStep=9)
    await eventually(lambda: status(emulator, JOB).get("phase") == "Suspended", what="Suspended")
    assert judge_replicas(emulator) == {"words": 0, "style": 0}
    await eventually(lambda: not cluster.pods(NS, JOB, judges.ROLE), what="judge pods gone")
    await eventually(lambda: judge_ready(emulator)[:2] == ("False", "ScaledDown"), what="JudgeReady ScaledDown")

    # The suspended job takes the edit: the judge 'style' leaves; its Deployment and Service go, the policy stays.
    deletes = len(emulator.requests_for(DEPLOYMENTS, "delete"))
    await cluster.patch(job_path(NS, JOB), {"spec": {"judges": JUDGES[:1], "rewards": REWARDS[:1]}})
    await eventually(lambda: judge_kids(emulator) == [("Deployment", "jud-judge-words"), ("NetworkPolicy", "jud-judge"),
                                                      ("Service", "jud-judge-words")], what="style's children deleted")
    assert [r.name for r in emulator.requests_for(DEPLOYMENTS, "delete")[deletes:]] == ["jud-judge-style"]
    assert [r.name for r in emulator.requests_for(SERVICES, "delete")] == ["jud-judge-style"]

    # The last judge leaves (a rule-based reward instead): its children and the judges' NetworkPolicy go.
    await cluster.patch(job_path(NS, JOB), {"spec": {"judges": [], "rewards": [{"name": "exact_match"}]}})
    await eventually(lambda: judge_kids(emulator) == [], what="every judge child deleted")
    assert [r.name for r in emulator.requests_for(NETWORKPOLICIES, "delete")] == ["jud-judge"]
    assert emulator.get_obj(NETWORKPOLICIES, NS, n.policy_name(JOB, "trainer")) is not None  # the others stay

    # Resumed: the job's children are exactly the rendering of a job without judges.
    trainer.set(NS, JOB, phase="running", step=9)
    await cluster.patch(job_path(NS, JOB), {"spec": {"runPolicy": {"suspend": False}}})
    plain = job_manifest(JOB, rewards=[{"name": "exact_match"}], judges=[])
    await eventually(lambda: sorted(kids(emulator, JOB)) == sorted(rendered(emulator, plain)), what="children")
    await eventually(lambda: len(cluster.pods(NS, JOB)) == 4, what="trainer and rollout pods again")
    await cluster.run_pods(NS, JOB)
    await eventually(lambda: status(emulator, JOB).get("phase") == "Running", what="Running again")
    assert not cluster.pods(NS, JOB, judges.ROLE)
    assert cond(emulator, JOB, "JudgeReady") == {}  # a job without judges has no such condition
    assert len(emulator.requests_for(DEPLOYMENTS, "delete")) == deletes + 2  # each judge's Deployment once
    used = calls_made(emulator)
    assert {("", "services", "delete"), ("apps", "deployments", "delete")} <= used
    assert [u for u in used if not allows(*u)] == []  # every call the chart's RBAC grants
