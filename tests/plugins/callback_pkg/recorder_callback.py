"""A user callback shipped as a pip package (spec.code.pip): it records what the trainer tells it."""
import json
import os
from pathlib import Path

from grpojob import Callback


class Recorder(Callback):
    def __init__(self):
        self.out = Path(os.environ["GRPOJOB_RUN_DIR"]) / "callback.jsonl"

    def _write(self, doc):
        with open(self.out, "a") as f:
            f.write(json.dumps(doc) + "\n")

    def on_step_end(self, record):
        self._write({"event": "step", "step": record.step, "loss": record.loss})

    def on_checkpoint(self, step, path):
        self._write({"event": "checkpoint", "step": step, "path": str(path)})
