"""PacedTrainer: GRPOTrainer whose update of each step also takes `trainer.args.secondsPerStep`, the
training time of a model worth training, without burning CPU (examples/plugins/paced/autoscale-paced.yaml).

The tiny model trains a step in milliseconds: next to it, even fast generation looks slow, and a
job that would idle its rollout servers on a GPU cluster (training the longer part of each step)
cannot be rehearsed on a laptop. With the paced engine (paced_engine.py) this sets both sides of a
step: generation by its pace per completion, training by this.

    trainer:
      class: paced_trainer.py:PacedTrainer     # with code.localPath: examples/plugins/paced
      args: {secondsPerStep: 0.8}
"""
from __future__ import annotations

import time

from grpojob.plugins import GRPOTrainer


class PacedTrainer(GRPOTrainer):
    def optimize(self, prep):
        time.sleep(float(self.args.get("secondsPerStep", 0.0)))
        return super().optimize(prep)
