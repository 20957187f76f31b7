"""Plug-in references and their checks: `module:attr` and `path/to/file.py:attr`, every kind
checked for what it must be, errors that name the spec field, and the core staying torch-free."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from grpojob.api import check, parse, plugins
from grpojob.api.validate import check_plugins
from grpojob.cli import main as cli

BASE = {"model": {"path": "/m"}, "dataset": {"factory": "toy"}, "rewards": [{"name": "toy"}]}


def job(**spec):
    return parse({"apiVersion": "grpojob.io/v1alpha1", "kind": "GRPOJob", "metadata": {"name": "p"},
                  "spec": {**BASE, **spec}})


@pytest.fixture
def code(tmp_path, monkeypatch):
    """A code directory with user modules (what spec.code mounts), put in GRPOJOB_CODE_DIR."""
    (tmp_path / "my_trainers.py").write_text(textwrap.dedent('''
        from grpojob import GRPOTrainer

        class Good(GRPOTrainer):
            def loss_fn(self, logp, mb, scale=1.0):
                return super().loss_fn(logp, mb)

        class BadHook(GRPOTrainer):
            def loss_fn(self, logp):
                return logp.sum(), None

        class NotATrainer:
            pass
    '''))
    (tmp_path / "broken.py").write_text("import not_installed_anywhere\n")
    (tmp_path / "engines.py").write_text(textwrap.dedent('''
        class NoSync:
            backend = "x"
            async def start(self): ...
            async def generate(self, prompt_ids, n, sampling): ...
            def load_info(self): ...
            def endpoints(self): ...
            def receive_push(self, cmd, store_addr, instance): ...
            def load_dir(self, path, version, weights): ...
            def errored(self): ...
            async def close(self): ...

        class GlooOnly(NoSync):
            weight_sync = ("auto", "gloo")

        class Sleeps(NoSync):
            weight_sync = ("auto", "shm")
            sleep_mode = True
            async def sleep(self, level): ...
            async def wake(self): ...

        class SaysItSleeps(NoSync):
            weight_sync = ("auto", "shm")
            sleep_mode = True

        class ReadsDeltas(GlooOnly):
            delta_files = True

        class SaysItReadsDeltas(GlooOnly):
            delta_files = "yes"
    '''))
    monkeypatch.setenv(plugins.CODE_DIR_ENV, str(tmp_path))
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_reference_forms_are_told_apart_and_checked():
    assert plugins.check_name("trainer", "pkg.mod:Cls") is None
    assert plugins.check_name("trainer", "sub/dir/my_trainer.py:Cls") is None
    assert plugins.is_file_reference("sub/dir/my_trainer.py:Cls") and not plugins.is_file_reference("a.b:C")
    assert "unknown engine 'sglang'" in plugins.check_name("engine", "sglang")
    assert plugins.check_name("engine", "hf") is None
    assert "not a valid" in plugins.check_name("callback", "a b:C")
    _, errors = check({"apiVersion": "grpojob.io/v1alpha1", "kind": "GRPOJob",
                       "spec": {**BASE, "trainer": {"class": "Trainer"}}})
    assert [str(e) for e in errors] == ["spec.trainer.class: unknown trainer 'Trainer': use 'module:attr' or "
                                        "'path/to/file.py:attr'"]


def test_a_file_reference_loads_once_relative_to_the_code_dir(code, tmp_path, monkeypatch):
    monkeypatch.chdir("/")
    a = plugins.resolve("my_trainers.py:Good")
    assert a is plugins.resolve(f"{code}/my_trainers.py:Good")  # one module per file: the same class
    assert a.__module__.startswith("grpojob_user.my_trainers_")
    with pytest.raises(ImportError, match="no such file"):
        plugins.resolve("missing.py:X")
    with pytest.raises(AttributeError, match="has no attribute 'Nope'"):
        plugins.resolve("my_trainers.py:Nope")


@pytest.mark.parametrize("ref,words", [
    ("my_trainers:Good", None),
    ("my_trainers.py:Good", None),
    ("my_trainers:NotATrainer", "is not a subclass of grpojob.GRPOTrainer"),
    ("my_trainers:BadHook", "overrides the hook loss_fn with signature (self, logp); it must accept"),
    ("broken:Trainer", "No module named 'not_installed_anywhere'"),
    ("my_trainers:Missing", "has no attribute 'Missing'")])
def test_trainer_class_errors_name_the_field(code, ref, words):
    errors = check_plugins(job(trainer={"class": ref}))
    if words is None:
        assert errors == []
    else:
        assert len(errors) == 1 and errors[0].path == "spec.trainer.class" and words in errors[0].message, errors


def test_every_kind_is_checked_for_what_it_must_be(code):
    refs = {"rollout": {"backend": "engines:NoSync", "workflow": "my_trainers:Good"},
            "algorithm": {"name": "my_trainers:Good"},
            "monitoring": {"callbacks": ["my_trainers:NotATrainer"]},
            "dataset": {"class": "my_trainers:Good"}}
    got = {e.path: e.message for e in check_plugins(job(**refs))}
    assert "must declare weight_sync" in got["spec.rollout.backend"]
    assert "has no `async def run" in got["spec.rollout.workflow"]
    assert "not a subclass of grpojob.algorithms.Algorithm" in got["spec.algorithm.name"]
    assert "lacks on_step_end and on_checkpoint" in got["spec.monitoring.callbacks[0]"]
    assert ("lacks __len__, __getitem__, reference_answer or query_reference_answer or get_reference_answer"
            in got["spec.dataset.class"])


def test_an_engine_declares_the_weight_sync_it_receives(code):
    assert check_plugins(job(rollout={"backend": "engines:GlooOnly"})) == []
    errors = check_plugins(job(rollout={"backend": "engines:GlooOnly"}, weightSync={"backend": "nccl"}))
    assert [str(e) for e in errors] == ["spec.weightSync.backend: nccl: the engine engines:GlooOnly receives "
                                        "auto, gloo (its weight_sync)"]
    from grpojob.rollout import engine

    with pytest.raises(ValueError, match="spec.weightSync.backend: shm"):
        spec = job(rollout={"backend": "engines:GlooOnly"}, weightSync={"backend": "shm"}).spec
        engine.build("engines:GlooOnly", spec)
    assert engine.weight_sync("hf") == ("auto", "cuda-ipc", "shm", "gloo", "checkpoint")


def test_a_colocated_engine_must_declare_sleep_mode(code):
    """spec.placement colocated puts the engine to sleep while the trainer trains."""
    colocated = dict(placement="colocated", trainer={"replicas": 1}, rollout={"replicas": 1})
    assert check_plugins(job(**{**colocated, "rollout": {"replicas": 1, "backend": "engines:Sleeps"}})) == []
    errors = check_plugins(job(**{**colocated, "rollout": {"replicas": 1, "backend": "engines:GlooOnly"}}))
    assert [(e.path, e.message) for e in errors] == [("spec.rollout.backend", "'engines:GlooOnly' has no sleep mode "
                                                      "(sleep_mode = True, async sleep and wake), which "
                                                      "spec.placement colocated needs")]
    errors = check_plugins(job(rollout={"backend": "engines:SaysItSleeps"}))
    assert "declares sleep_mode, and must define sleep and wake" in errors[0].message
    from grpojob.rollout import engine

    with pytest.raises(ValueError, match="spec.rollout.backend: the engine engines:GlooOnly has no sleep mode"):
        engine.build("engines:GlooOnly", job(**{**colocated, "rollout": {"replicas": 1,
                                                                        "backend": "engines:GlooOnly"}}).spec)


def test_an_engine_that_declares_delta_files_gets_them_and_a_wrong_declaration_is_named(code):
    """delta_files = True: the rollout server registers it, and the trainer writes it delta versions
    on backend checkpoint (tests/sync/test_delta_files.py); anything but a bool is refused."""
    from grpojob.rollout import engine

    assert engine.applies_file_deltas(plugins.resolve("engines:ReadsDeltas"))
    assert not engine.applies_file_deltas(plugins.resolve("engines:GlooOnly"))
    assert engine.applies_file_deltas(engine.engine_class("hf"))
    assert check_plugins(job(rollout={"backend": "engines:ReadsDeltas"})) == []
    errors = check_plugins(job(rollout={"backend": "engines:SaysItReadsDeltas"}))
    assert "declares delta_files, which must be True" in errors[0].message


def test_grpojob_validate_imports_every_plugin_and_names_the_field(code, tmp_path, capsys):
    path = tmp_path / "job.yaml"
    path.write_text(textwrap.dedent('''
        apiVersion: grpojob.io/v1alpha1
        kind: GRPOJob
        metadata: {name: p}
        spec:
          model: {path: /m}
          dataset: {factory: toy}
          rewards: [{name: toy}, {name: "broken:score"}]
          trainer: {class: "my_trainers.py:Good"}
    '''))
    assert cli(["validate", str(path)]) == 1
    err = capsys.readouterr().err
    assert "spec.rewards[1].name: cannot import module 'broken'" in err and "spec.trainer.class" not in err
    assert cli(["validate", str(path), "--no-resolve"]) == 0


def test_importing_grpojob_stays_torch_free_and_exports_the_trainer_lazily():
    probe = ("import sys, grpojob, grpojob.api, grpojob.plan, grpojob.code, grpojob.failures\n"
             "assert 'torch' not in sys.modules, 'torch imported'\n"
             "from grpojob import GRPOTrainer\n"
             "assert 'torch' in sys.modules and GRPOTrainer.__name__ == 'GRPOTrainer'\n")
    subprocess.run([sys.executable, "-c", probe], check=True)


def test_install_code_installs_once_and_a_failure_names_the_field(tmp_path):
    from grpojob.code import InstallError, install

    pkg = Path(__file__).resolve().parent / "callback_pkg"
    j = job(code={"pip": [str(pkg)], "pipArgs": ["--no-index", "--no-build-isolation"]})
    lines: list[str] = []
    assert install(j.spec.code, tmp_path / "site", echo=lines.append) is True
    assert (tmp_path / "site" / "recorder_callback.py").exists()
    assert install(j.spec.code, tmp_path / "site", echo=lines.append) is False  # same requirements: nothing to do
    bad = job(code={"pip": ["surely-no-such-package-grpojob==9"], "pipArgs": ["--no-index"]})
    with pytest.raises(InstallError, match="pip install failed \\(exit 1\\):.*surely-no-such-package"):
        install(bad.spec.code, tmp_path / "site2", echo=lambda _: None)
