"""spec.rollout.autoscale with the real kopf operator against the kmock emulator: the trainer (acted
out by the TrainerStub) reports its steps' wait for groups and its servers' idle share on /status;
the operator patches the rollout Deployment's replicas, says so in an Event (RolloutScaled), in
status.autoscale and status.rollout.desired, and in its metrics. The Deployment controller is acted
out by the test's Cluster (it makes the pods of the new count)."""
from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from grpojob.api import parse
from grpojob_operator import children
from grpojob_operator import names as n
from grpojob_operator.children import Scale

from .cluster import eventually
from .conftest import NS, job_manifest, job_path
from .kmock_shim import DEPLOYMENTS, EVENTS, GRPOJOBS, STATEFULSETS
from .test_operator import running, status, without_server_fields

AUTOSCALE = {"minReplicas": 1, "maxReplicas": 3, "targetWaitFraction": 0.2, "targetIdleFraction": 0.5,
             "scaleUp": {"steps": 2, "cooldownSeconds": 0, "maxChange": 2},
             "scaleDown": {"steps": 2, "cooldownSeconds": 0, "maxChange": 1}}


def step(trainer, job: str, number: int, wait: float, idle: float, total: float = 10.0) -> None:
    """The trainer finished step `number`: it waited `wait` of `total` seconds for groups."""
    trainer.set(NS, job, phase="running", step=number, policyVersion=number, pipeline={
        "step": number, "waitSeconds": wait, "stepSeconds": total, "waitFraction": wait / total,
        "rolloutIdleFraction": idle, "groupsInFlight": 1})


def scaled_events(emu, job: str) -> list[str]:
    return [e["message"] for e in emu.live(EVENTS, NS)
            if e.get("involvedObject", {}).get("name") == job and e.get("reason") == "RolloutScaled"]


def deployment_patches(emu, job: str) -> list[dict]:
    return [r.data for r in emu.requests_for(DEPLOYMENTS, "update")
            if (r.data or {}).get("metadata", {}).get("name") == n.rollout_name(job)]


def gauges(operator, job: str) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{operator.controller.metrics.port}/metrics", timeout=5).read()
    return {s.name: s.value for f in text_string_to_metric_families(text.decode()) for s in f.samples
            if s.labels.get("job") == job}


def deployment(emu, job: str) -> dict:
    return emu.get_obj(DEPLOYMENTS, NS, n.rollout_name(job))


async def test_the_operator_scales_rollouts_up_on_the_trainers_wait_and_down_on_idle(emulator, cluster, operator,
                                                                                    trainer):
    await running(emulator, cluster, trainer, "auto", rollout={"replicas": 1, "autoscale": AUTOSCALE})
    before = deployment(emulator, "auto")
    assert before["spec"]["replicas"] == 1
    sts_patches = len(emulator.requests_for(STATEFULSETS, "update"))
    patches = len(deployment_patches(emulator, "auto"))

    # Step 1 waits 8 of 10 s: one step of two asks for more, nothing moves yet.
    step(trainer, "auto", 1, wait=8.0, idle=0.0)
    await eventually(lambda: status(emulator, "auto").get("autoscale", {}).get("lastStep") == 1, what="step 1 seen")
    st = status(emulator, "auto")["autoscale"]
    assert (st["replicas"], st["reason"], st["direction"], st["streak"]) == (1, "Waiting", "up", 1)
    assert deployment(emulator, "auto")["spec"]["replicas"] == 1 and not scaled_events(emulator, "auto")

    # Steps 2 and 3 ask too, but a scale-up is a trial measured over 3 steps, and as many before it are
    # needed to compare with (step 1 paid the start-up): measuring.
    for number in (2, 3):
        step(trainer, "auto", number, wait=8.0, idle=0.0)
        await eventually(lambda k=number: status(emulator, "auto")["autoscale"]["lastStep"] == k, what=f"step {number}")
        assert status(emulator, "auto")["autoscale"]["reason"] == "Measuring"
    assert deployment(emulator, "auto")["spec"]["replicas"] == 1

    # Step 4 too: 1 * 8 * 0.8 / (0.2 * 2) = 16 servers would do; maxReplicas 3 (and maxChange 2) caps it.
    step(trainer, "auto", 4, wait=8.0, idle=0.0)
    await eventually(lambda: deployment(emulator, "auto")["spec"]["replicas"] == 3, what="scaled up to 3")
    (patch,) = deployment_patches(emulator, "auto")[patches:]
    # exactly the Deployment the children render at 3 replicas (a merge patch of the whole manifest;
    # the emulator's shim stamps resourceVersion and generation into what it recorded)
    uid = emulator.get_obj(GRPOJOBS, NS, "auto")["metadata"]["uid"]
    job = parse(job_manifest("auto", rollout={"replicas": 1, "autoscale": AUTOSCALE}))
    rendered = next(o for o in children.build(job, namespace=NS, image=operator.cfg.image, scale=Scale(2, 3),
                                              owner=children.owner_reference("auto", uid))
                    if children.key(o) == ("Deployment", n.rollout_name("auto")))
    assert without_server_fields(patch) == {k: v for k, v in rendered.items() if k not in ("apiVersion", "kind")}
    assert patch["spec"]["replicas"] == 3
    assert patch["spec"]["template"] == before["spec"]["template"], "the pods' template must not change"
    assert len(emulator.requests_for(STATEFULSETS, "update")) == sts_patches, "the trainer was touched"
    await eventually(lambda: scaled_events(emulator, "auto"), what="RolloutScaled event")
    assert scaled_events(emulator, "auto") == [
        "ScaleUp: 1 -> 3 rollout servers: the trainer waits for groups over 20% of its step for 4 steps (step 4, "
        "trainer waited 80% of the step for groups (8.00/10.00 s), rollout servers idle 0%, 1 groups in flight)"]
    await eventually(lambda: status(emulator, "auto")["rollout"]["desired"] == 3, what="status.rollout.desired 3")
    st = status(emulator, "auto")["autoscale"]
    assert (st["replicas"], st["reason"], st["waitFraction"], st["idleFraction"]) == (3, "ScaleUp", 0.8, 0.0)
    assert st["lastScaleTime"]
    # the Deployment controller makes the third pod, the kubelet runs them all
    await eventually(lambda: len(cluster.pods(NS, "auto", "rollout")) == 3, what="3 rollout pods")
    await cluster.run_pods(NS, "auto")
    await eventually(lambda: status(emulator, "auto")["rollout"]["ready"] == 3, what="3 rollout pods ready")
    # the gauges follow the status it just wrote
    await eventually(lambda: gauges(operator, "auto")["grpojob_job_rollout_ready"] == 3, what="ready gauge 3")
    g = gauges(operator, "auto")
    assert (g["grpojob_job_rollout_desired"], g["grpojob_job_rollout_ready"]) == (3, 3)
    assert g["grpojob_job_autoscale_wait_fraction"] == 0.8 and g["grpojob_job_autoscale_idle_fraction"] == 0.0

    # Generation became fast: the servers idle 90% and the trainer does not wait. Two such steps:
    # down by maxChange 1 (busy ceil(3 * 0.1 / 0.5) = 1 would allow more).
    step(trainer, "auto", 5, wait=0.0, idle=0.9)
    await eventually(lambda: status(emulator, "auto")["autoscale"]["lastStep"] == 5, what="step 5 seen")
    assert deployment(emulator, "auto")["spec"]["replicas"] == 3
    step(trainer, "auto", 6, wait=0.0, idle=0.9)
    await eventually(lambda: deployment(emulator, "auto")["spec"]["replicas"] == 2, what="scaled down to 2")
    await eventually(lambda: len(scaled_events(emulator, "auto")) == 2, what="second RolloutScaled event")
    assert scaled_events(emulator, "auto")[1].startswith(
        "ScaleDown: 3 -> 2 rollout servers: rollout servers idle over 50% of the step for 2 steps (step 6")
    assert [p["spec"]["replicas"] for p in deployment_patches(emulator, "auto")[patches:]] == [3, 2]

    # The job's next looks change nothing: the reconcile renders the autoscaler's number.
    await eventually(lambda: status(emulator, "auto")["autoscale"]["reason"] == "NoNewStep", what="quiet looks")
    assert [p["spec"]["replicas"] for p in deployment_patches(emulator, "auto")[patches:]] == [3, 2]
    assert status(emulator, "auto")["phase"] == "Running"


async def test_new_bounds_apply_on_a_running_job(emulator, cluster, operator, trainer):
    await running(emulator, cluster, trainer, "bounds", rollout={"replicas": 2, "autoscale": AUTOSCALE})
    await eventually(lambda: status(emulator, "bounds").get("autoscale", {}).get("replicas") == 2, what="autoscaler on")
    # An edit of a running job (rollout.replicas must stay within the bounds: it moves too).
    await cluster.patch(job_path(NS, "bounds"), {"spec": {"rollout": {"replicas": 1, "autoscale": {"maxReplicas": 1}}}})
    await eventually(lambda: deployment(emulator, "bounds")["spec"]["replicas"] == 1, what="clamped to 1")
    await eventually(lambda: scaled_events(emulator, "bounds"), what="RolloutScaled event")
    assert scaled_events(emulator, "bounds") == [
        "Bounds: 2 replicas are outside minReplicas..maxReplicas (1..1)"]
    assert status(emulator, "bounds")["phase"] == "Running"
    assert status(emulator, "bounds")["autoscale"]["replicas"] == 1


def test_a_volcano_gang_counts_the_rollouts_it_never_goes_below():
    job = parse(job_manifest("g", rollout={"replicas": 3, "autoscale": {**AUTOSCALE, "minReplicas": 2}},
                             scheduling={"gang": "volcano"}))
    (group,) = [o for o in children.build(job, namespace=NS) if o["kind"] == "PodGroup"]
    assert group["spec"]["minMember"] == 2 + 2  # trainer.replicas 2 + minReplicas 2 (not replicas 3)


def paced(trainer, job: str, number: int, seconds: float, servers: int) -> None:
    """Step `number` took `seconds`, the trainer waiting 80% of it, with `servers` rollout servers registered."""
    trainer.set(NS, job, phase="running", step=number, policyVersion=number,
                rollouts=[{"replica": f"{n.rollout_name(job)}-{i}"} for i in range(servers)], pipeline={
                    "step": number, "waitSeconds": 0.8 * seconds, "stepSeconds": seconds, "waitFraction": 0.8,
                    "rolloutIdleFraction": 0.0, "groupsInFlight": 1})


def events_of(emu, job: str, reason: str) -> list[dict]:
    return [e for e in emu.live(EVENTS, NS)
            if e.get("involvedObject", {}).get("name") == job and e.get("reason") == reason]


async def test_a_scale_up_that_brought_no_gain_is_undone_with_a_scale_up_no_gain_event(emulator, cluster, operator,
                                                                                        trainer):
    """Issue #44 on the real operator: the trainer keeps waiting (CPU-bound servers share the cores), so
    the autoscaler tries a second server; steps get no faster with it, so the operator scales back,
    says why in a Warning Event and status.autoscale, and backs off."""
    spec = {"replicas": 1, "autoscale": {"minReplicas": 1, "maxReplicas": 3, "targetWaitFraction": 0.2,
                                         "scaleUp": {"steps": 1, "cooldownSeconds": 0, "maxChange": 1,
                                                     "minGain": 0.1, "backoffSeconds": 120}}}
    await running(emulator, cluster, trainer, "nogain", rollout=spec)
    paced(trainer, "nogain", 1, 5.0, 1)  # the first step: nothing to compare yet
    await eventually(lambda: status(emulator, "nogain").get("autoscale", {}).get("lastStep") == 1, what="step 1")
    for number in (2, 3, 4):  # a trial's 3 steps before
        paced(trainer, "nogain", number, 2.0, 1)
        await eventually(lambda k=number: status(emulator, "nogain")["autoscale"]["lastStep"] == k, what=f"step {number}")
    await eventually(lambda: deployment(emulator, "nogain")["spec"]["replicas"] == 2, what="the trial: 2 servers")
    # (the Deployment is patched before the status is written: wait for the status too)
    await eventually(lambda: status(emulator, "nogain")["autoscale"]["reason"] == "ScaleUp", what="status ScaleUp")
    st = status(emulator, "nogain")["autoscale"]
    assert (st["reason"], st["trialFrom"], st["beforeSeconds"]) == ("ScaleUp", 1, 2.0)
    # the second server registers; its steps are slower than the one server's 2.0 s
    for number, seconds, servers in ((5, 2.0, 1), (6, 2.5, 2), (7, 2.6, 2), (8, 2.5, 2), (9, 2.7, 2)):
        paced(trainer, "nogain", number, seconds, servers)
        await eventually(lambda k=number: status(emulator, "nogain")["autoscale"]["lastStep"] == k, what=f"step {number}")
    await eventually(lambda: deployment(emulator, "nogain")["spec"]["replicas"] == 1, what="scaled back to 1")
    await eventually(lambda: events_of(emulator, "nogain", "ScaleUpNoGain"), what="ScaleUpNoGain event")
    (event,) = events_of(emulator, "nogain", "ScaleUpNoGain")
    assert event["type"] == "Warning"
    assert event["message"].startswith("2 -> 1 rollout servers: 2 servers made a step 2.60 s against 2.00 s with 1 "
                                       "(-23% steps a second; scaleUp.minGain 10%)"), event["message"]
    st = status(emulator, "nogain")["autoscale"]
    assert (st["replicas"], st["reason"], st["backoffSeconds"]) == (1, "ScaleUpNoGain", 120.0)
    await eventually(lambda: status(emulator, "nogain")["rollout"]["desired"] == 1, what="status.rollout.desired 1")
    # the trainer still waits: no new scale-up while backing off
    paced(trainer, "nogain", 10, 2.0, 1)
    await eventually(lambda: status(emulator, "nogain")["autoscale"]["reason"] == "BackingOff", what="backing off")
    assert [p["spec"]["replicas"] for p in deployment_patches(emulator, "nogain")] == [2, 1]
    assert status(emulator, "nogain")["phase"] == "Running"
