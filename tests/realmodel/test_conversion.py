"""The GGUF file as the model folder every process loads: what the conversion writes, that it is made
once (the cache), and that `grpojob run` hands its processes the folder, for spec.model.path as a user
writes it and for the runtime image's path where the image is not."""
from __future__ import annotations

import json
import time

import yaml
from safetensors import safe_open

from grpojob import gguf_model
from grpojob.cli import main as cli
from grpojob.local import image_models
from grpojob.local.prepare import prepare

from ..api.test_model_file import EXAMPLE
from .conftest import SOURCE


def test_the_folder_holds_the_model_its_tokenizer_and_chat_template(smollm2_dir, smollm2_tokenizer):
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in config
    assert (config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == (30, 576, 49152)
    assert config["tie_word_embeddings"] is True
    with safe_open(str(smollm2_dir / "model.safetensors"), "pt") as f:
        names = list(f.keys())
        assert len(names) == 272 and {str(f.get_slice(n).get_dtype()) for n in names} == {"BF16"}
    assert smollm2_tokenizer.eos_token == "<|im_end|>" and "<|im_start|>" in smollm2_tokenizer.chat_template
    assert smollm2_tokenizer.tokenize("123") == ["1", "2", "3"]  # digits one per token, as the GGUF says


def test_a_second_request_finds_the_cached_folder(smollm2_dir, capsys):
    t0 = time.monotonic()
    again = gguf_model.folder(SOURCE, "auto", echo=print)
    assert again == smollm2_dir and time.monotonic() - t0 < 10  # the file's hash, no conversion
    assert "converting" not in capsys.readouterr().out
    assert cli(["model", "convert", SOURCE]) == 0 and capsys.readouterr().out.strip() == str(smollm2_dir)


def test_grpojob_run_gives_its_processes_the_folder(smollm2_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for path in (SOURCE, *image_models.CONVERTED):  # as a user writes it; the image's path, absent here
        doc = yaml.safe_load(EXAMPLE.read_text())
        doc["metadata"].pop("annotations", None)
        doc["spec"]["model"]["path"] = path
        (tmp_path / "job.yaml").write_text(yaml.safe_dump(doc))
        job, where = prepare(str(tmp_path / "job.yaml"), [], str(tmp_path / "run"), None, open("/dev/null", "w"))
        assert job.spec.model.path == str(smollm2_dir)
        assert json.loads((where / "grpojob.json").read_text())["spec"]["model"]["path"] == str(smollm2_dir)
