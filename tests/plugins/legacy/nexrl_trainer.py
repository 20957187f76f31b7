"""A NexRL-style trainer as written from the 0.1 docs (grpojob.trainer.dist, grpojob.trainer.trainer):
it must load unchanged."""
import torch

from grpojob import GRPOTrainer
from grpojob.trainer import dist
from grpojob.trainer.batch import Prepared
from grpojob.trainer.trainer import TrainerError


class SummingTrainer(GRPOTrainer):
    def prepare_batch(self, groups) -> Prepared:
        prep = super().prepare_batch(groups)
        prep.extra["seqs_total"] = float(self.total(len(prep.seqs), self.env))
        return prep

    @staticmethod
    def total(n: int, env) -> float:
        """Every rank's count summed (the custom part: dist.all_sum of the old path)."""
        if n < 0:
            raise TrainerError("a negative count")
        return float(dist.all_sum(torch.tensor([float(n)]), env)[0])
