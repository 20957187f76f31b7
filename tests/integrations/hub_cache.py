"""An offline Hugging Face `datasets` cache holding a dataset under a Hub name (e.g. "openai/gsm8k",
config "main"), built from rows of the test's: what `load_dataset(name, config, split=...)` reads with
HF_DATASETS_OFFLINE set, the Hub itself being out of reach here. The files are written by `datasets`'
own json builder, then filed where its cache lookup (`packaged_modules/cache`) finds a Hub dataset."""
from __future__ import annotations

import json
import shutil
from pathlib import Path


def hub_cache(root: Path, repo_id: str, config: str, rows: list[dict], split: str = "train") -> Path:
    """Write `rows` as `repo_id`'s `config`/`split` into the cache directory `root` (returned)."""
    from datasets.packaged_modules.json.json import Json

    name = repo_id.split("/")[-1]
    root.mkdir(parents=True, exist_ok=True)
    src = root / "src.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    builder = Json(cache_dir=str(root / "build"), dataset_name=name, data_files={split: str(src)})
    builder.download_and_prepare()
    built = Path(builder.cache_dir)
    dest = root / repo_id.replace("/", "___") / config / built.name / built.parent.name.rsplit("-", 1)[-1]
    shutil.copytree(built, dest)
    info = json.loads((dest / "dataset_info.json").read_text())
    info["config_name"] = config
    (dest / "dataset_info.json").write_text(json.dumps(info))
    shutil.rmtree(root / "build")
    src.unlink()
    return root


def offline(monkeypatch, root: Path) -> None:
    """This process and its children read `datasets` from `root` only (no Hub)."""
    for k, v in {"HF_DATASETS_CACHE": str(root), "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}.items():
        monkeypatch.setenv(k, v)
    import datasets.config
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", Path(root))
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
