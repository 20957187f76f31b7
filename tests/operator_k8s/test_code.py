"""spec.code on a cluster: the user's modules mounted and on PYTHONPATH in every pod, pip
requirements installed by an init container into an emptyDir, an image per role; and a plug-in
that does not load fails the job with its reason and the runtime's own words, instead of a crash
loop. Every rendered object passes kubernetes-validate --strict and PodSecurity restricted."""
from __future__ import annotations

import copy
from datetime import datetime, timezone

import pytest

from grpojob import plan
from grpojob.api import parse, plugins
from grpojob.api.operations import CODE_DIR
from grpojob.api.status import TrainerStatus
from grpojob_operator import children, pods
from grpojob_operator import names as n
from grpojob_operator.status import Observation, PodView, decide, initial_status
from grpojob_operator.views import pod_view
from tests.helpers.k8s_schema import validate_all
from tests.helpers.pod_security import restricted

from .conftest import job_manifest

NOW = datetime(2026, 11, 23, 12, 0, tzinfo=timezone.utc)
PIP = ["my-rewards==1.2", "numpy<3"]


def pods_of(manifest: dict) -> dict[str, dict]:
    kids = children.build(parse(manifest), namespace="ml")
    validate_all(kids)
    return {o["spec"]["template"]["metadata"]["labels"][n.LABEL_ROLE]: o["spec"]["template"]["spec"]
            for o in kids if o["kind"] in ("StatefulSet", "Deployment")}


def env_of(c: dict) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}


def test_config_map_modules_and_pip_requirements_reach_every_pod_exactly():
    """Trainer, rollout and environment pods alike (an environment imports the job's modules too)."""
    manifest = job_manifest("j", code={"configMap": "my-plugins", "pip": PIP, "pipArgs": ["--no-index"]},
                            trainer={"class": "my_trainer:Trainer", "image": "me/trainer:2"},
                            rollout={"image": "me/rollout:2"},
                            environments=[{"name": "arith", "command": ["python", "-m", "arith_env"],
                                           "image": "me/environment:2"}])
    rendered = pods_of(manifest)
    assert set(rendered) == {"trainer", "rollout", "environment"}
    for role, pod in rendered.items():
        assert restricted(pod) == [], role
        main, = pod["containers"]
        init, = pod["initContainers"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = {m["name"]: m for m in main["volumeMounts"]}
        assert volumes["grpojob-code"] == {"name": "grpojob-code", "configMap": {"name": "my-plugins"}}
        assert volumes["grpojob-site"] == {"name": "grpojob-site", "emptyDir": {}}
        assert mounts["grpojob-code"] == {"name": "grpojob-code", "mountPath": CODE_DIR, "readOnly": True}
        assert mounts["grpojob-site"] == {"name": "grpojob-site", "mountPath": n.SITE_DIR}
        env = env_of(main)
        assert env["PYTHONPATH"] == f"{CODE_DIR}:{n.SITE_DIR}"
        assert env[plan.ENV_CODE_DIR] == CODE_DIR and env[plan.ENV_SITE_DIR] == n.SITE_DIR
        # The init container: the plan's setup command, in the main container's image, environment,
        # mounts and security context (the root filesystem stays read-only: pip writes the emptyDir).
        assert init == {"name": "install-code", "command": ["grpojob", "install-code"], "image": f"me/{role}:2",
                        "imagePullPolicy": "IfNotPresent", "env": main["env"],
                        "volumeMounts": main["volumeMounts"], "securityContext": main["securityContext"]}
        assert main["securityContext"]["readOnlyRootFilesystem"] is True
        assert main["image"] == f"me/{role}:2"


def test_a_volume_of_code_keeps_its_name_and_no_pip_means_no_init_container():
    volume = {"name": "code", "persistentVolumeClaim": {"claimName": "rl-code", "readOnly": True}}
    manifest = job_manifest("j", code={"volume": volume}, environments=[{"name": "e", "command": ["e"]}])
    for pod in pods_of(manifest).values():
        assert "initContainers" not in pod
        assert volume in pod["volumes"]
        assert {"name": "code", "mountPath": CODE_DIR, "readOnly": True} in pod["containers"][0]["volumeMounts"]
        env = env_of(pod["containers"][0])
        assert env["PYTHONPATH"] == CODE_DIR and plan.ENV_SITE_DIR not in env


def test_no_code_renders_no_trace_of_it():
    for pod in pods_of(job_manifest("j", environments=[{"name": "e", "command": ["e"]}])).values():
        assert "initContainers" not in pod
        assert not {"PYTHONPATH", plan.ENV_CODE_DIR} & set(env_of(pod["containers"][0]))
        assert not any(v["name"] in (pods.CODE_VOLUME, pods.SITE_VOLUME) for v in pod["volumes"])


def test_a_users_pythonpath_replaces_the_plans():
    manifest = job_manifest("j", code={"configMap": "c"}, trainer={"env": [{"name": "PYTHONPATH", "value": "/x"}]})
    assert env_of(pods_of(manifest)["trainer"]["containers"][0])["PYTHONPATH"] == "/x"


@pytest.mark.parametrize("code,path,words", [
    ({"configMap": "a", "volume": {"name": "v", "emptyDir": {}}}, "spec.code.volume", "not both"),
    ({"volume": {"name": "grpojob-x", "emptyDir": {}}}, "spec.code.volume.name", "reserved"),
    ({"volume": {"name": "v", "configMap": {"nam": "x"}}}, "spec.code.volume.configMap", "unknown field")])
def test_bad_code_is_refused_with_its_field_path(code, path, words):
    from grpojob.api import check

    job, errors = check(job_manifest("j", code=code))
    assert job is None and any(e.path.startswith(path) and words in e.message for e in errors), errors


def test_a_code_volume_named_like_a_workload_volume_is_refused():
    from grpojob.api import check

    _, errors = check(job_manifest("j", code={"volume": {"name": "data", "emptyDir": {}}},
                                   trainer={"volumes": [{"name": "data", "emptyDir": {}}]}))
    assert [str(e) for e in errors] == ["spec.code.volume.name: 'data' is also a volume of spec.trainer.volumes"]


# ---- a plug-in that does not load ---------------------------------------------------------------
IMPORT = plugins.failure_message(
    plugins.IMPORT_FAILED, ["spec.trainer.class: cannot import module 'my_trainer': No module named 'my_trainer'"])


def _crashed_pod(message: str, init: bool = False) -> dict:
    """A pod's status as the kubelet reports a container that wrote a termination message and exited 1."""
    statuses = [{"name": "install-code" if init else "trainer", "restartCount": 1,
                 "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "message": message}},
                 "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]
    status = {"phase": "Pending" if init else "Running",
              "initContainerStatuses" if init else "containerStatuses": statuses}
    meta = {"name": "j-trainer-0", "uid": "u0", "namespace": "ml",
            "labels": {n.LABEL_JOB: "j", n.LABEL_ROLE: "trainer"}}
    return pod_view(meta, status)[1]


@pytest.mark.parametrize("init,reason", [(False, plugins.IMPORT_FAILED), (True, plugins.INSTALL_FAILED)])
def test_a_plugin_that_does_not_load_fails_the_job_at_once_with_its_reason(init, reason):
    job = parse(job_manifest("j", trainer={"class": "my_trainer:Trainer"}))
    message = IMPORT if not init else plugins.failure_message(
        plugins.INSTALL_FAILED, ["spec.code.pip: pip install failed (exit 1): No matching distribution"])
    pod = _crashed_pod(message, init=init)
    d = decide(job, initial_status(NOW), Observation(now=NOW, trainer_pods=[pod]))
    failed = next(c for c in d.status.conditions if c.type == "Failed")
    assert d.status.phase == "Failed" and failed.status == "True" and failed.reason == reason
    field = "spec.code.pip" if init else "spec.trainer.class"
    assert d.status.message.startswith(f"j-trainer-0: {field}: ") and field in failed.message
    assert d.scale == children.Scale(0, 0)  # no crash loop left running
    assert d.status.restarts <= 1 <= job.spec.run_policy.backoff_limit  # not the backoff limit's doing


def test_an_environment_pod_whose_pip_install_fails_fails_the_job_too():
    """Environment pods run the same install-code init container (spec.code reaches them too)."""
    job = parse(job_manifest("j", code={"pip": PIP}, environments=[{"name": "e", "command": ["e"]}]))
    message = plugins.failure_message(plugins.INSTALL_FAILED, ["spec.code.pip: pip install failed (exit 1)"])
    status = {"phase": "Pending", "initContainerStatuses": [{"name": "install-code", "restartCount": 1, "lastState": {
        "terminated": {"exitCode": 1, "reason": "Error", "message": message}}}]}
    meta = {"name": "j-env-e-abc12", "uid": "e0", "labels": {n.LABEL_JOB: "j", n.LABEL_ROLE: plan.ENVIRONMENT_ROLE}}
    _, env_pod = pod_view(meta, status)
    d = decide(job, initial_status(NOW), Observation(now=NOW, environment_pods=[env_pod]))
    assert d.status.phase == "Failed" and d.status.message.startswith("j-env-e-abc12: spec.code.pip: ")
    assert next(c for c in d.status.conditions if c.type == "Failed").reason == plugins.INSTALL_FAILED


def test_the_trainers_status_names_the_failure_too():
    job = parse(job_manifest("j", trainer={"class": "my_trainer:Trainer"}))
    running = PodView(name="j-trainer-0", uid="u0", role="trainer", phase="Running")
    t = TrainerStatus(phase="failed", message=IMPORT)
    d = decide(job, initial_status(NOW), Observation(now=NOW, trainer_pods=[running], trainer=t))
    assert d.status.phase == "Failed"
    assert next(c for c in d.status.conditions if c.type == "Failed").reason == plugins.IMPORT_FAILED


def test_an_ordinary_crash_still_counts_against_the_backoff_limit():
    job = parse(job_manifest("j"))
    pod = _crashed_pod("RuntimeError: CUDA out of memory")
    d = decide(job, initial_status(NOW), Observation(now=NOW, trainer_pods=[pod]))
    assert d.status.phase != "Failed" and d.status.restarts == 1
    assert pod.failure is None and "CUDA out of memory" in pod.message


def test_a_trainers_completion_and_a_rollout_engines_failure_are_read_from_termination_messages(tmp_path,
                                                                                                 monkeypatch):
    """The runtime writes them (grpojob.failures), the pod view reads them: the trainer's final step
    from state or lastState (a restarted container's), the engine's error from a rollout's."""
    from grpojob import failures

    log = tmp_path / "termination-log"
    log.write_text("")
    monkeypatch.setattr(failures, "TERMINATION_LOG", log)
    failures.report_completed(20, 20)
    pod = _crashed_pod(log.read_text())
    assert pod.completed_step == 20 and pod.failure is None and pod.engine_failure is None
    meta = {"name": "j-rollout-x", "uid": "r0", "labels": {n.LABEL_JOB: "j", n.LABEL_ROLE: "rollout"}}
    broken = plugins.failure_message(plugins.ENGINE_FAILED, ["CUDA error: out of memory"])
    for state in ("state", "lastState"):
        status = {"phase": "Running", "containerStatuses": [
            {"name": "rollout", "restartCount": 1, state: {"terminated": {"exitCode": 1, "message": broken}}}]}
        _, view = pod_view(meta, status)
        assert view.engine_failure == "CUDA error: out of memory" and view.failure is None, state
        assert view.completed_step is None  # a rollout's message never completes the job
    assert plugins.parse_completion("Completed\nstep x/3") is None and plugins.parse_engine_failure("Completed") is None


def test_the_runtime_writes_what_the_operator_reads(tmp_path, monkeypatch):
    """grpojob.failures.report writes the termination message the pod view parses."""
    from grpojob import failures
    from grpojob.api import FieldError

    log = tmp_path / "termination-log"
    log.write_text("")
    monkeypatch.setattr(failures, "TERMINATION_LOG", log)
    failures.report(plugins.IMPORT_FAILED, [FieldError("spec.rollout.backend", "cannot import module 'eng'")])
    pod = _crashed_pod(log.read_text())
    assert pod.failure == (plugins.IMPORT_FAILED, "spec.rollout.backend: cannot import module 'eng'")
    assert copy.deepcopy(pod) == pod


def test_a_trainer_that_refuses_its_spec_at_start_fails_the_job_at_once_with_its_own_error(tmp_path, monkeypatch):
    """The trainer writes its exception as the container's termination message (the kubelet's
    /dev/termination-log): StartRefused fails the job at once (no crash loop), TrainerFailed is a
    crash that counts against the backoff limit; both show the exception, not torchrun's words."""
    from grpojob import failures
    from grpojob.learner.trainer import TrainerError

    log = tmp_path / "termination-log"
    log.write_text("")
    monkeypatch.setattr(failures, "TERMINATION_LOG", log)
    job = parse(job_manifest("j"))
    failures.report_exception(TrainerError("spec.trainer.args.warmup: must be an integer"), permanent=True)
    pod = _crashed_pod(log.read_text())
    d = decide(job, initial_status(NOW), Observation(now=NOW, trainer_pods=[pod]))
    failed = next(c for c in d.status.conditions if c.type == "Failed")
    assert d.status.phase == "Failed" and failed.reason == plugins.START_REFUSED
    assert "trainer rank 0: TrainerError: spec.trainer.args.warmup: must be an integer" in failed.message
    assert d.scale == children.Scale(0, 0)
    log.write_text("")
    failures.report_exception(RuntimeError("CUDA error: an illegal memory access"), permanent=False)
    pod = _crashed_pod(log.read_text())
    d = decide(job, initial_status(NOW), Observation(now=NOW, trainer_pods=[pod]))
    assert d.status.phase != "Failed" and d.status.restarts == 1 and pod.failure is None
    assert "TrainerFailed" in pod.message and "CUDA error: an illegal memory access" in pod.message
