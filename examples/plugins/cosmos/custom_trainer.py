"""cosmos-rl's custom GRPO trainer, ported: a GRPOTrainer subclass with its own loss_fn.

cosmos-rl registers `CustomGRPOTrainer(GRPOTrainer)` as `train_policy.trainer_type`; here the
spec names the class: `trainer: {class: custom_trainer.py:CustomGRPOTrainer}` (a file in
spec.code's directory). Its loss is GRPO's clipped policy loss plus an entropy bonus on the sampled
tokens (-log p of a sampled token is an unbiased estimate of the policy's entropy at that step):

    loss = sum_t coef_t * (pg_t - beta * (-logp_t))

with beta = trainer.args.entropyBonus. It returns, as cosmos-rl's loss_fn does, the scalar to
backpropagate and the per-token parts for logging (LossTerms: the policy loss, clip, importance
weights, KL), and adds its own per-token numbers in `terms.extra`: the step record shows their
token means as extra.pg_loss and extra.entropy_bonus, and record.loss = pg_loss - entropy_bonus
under token-mean aggregation.
"""
from __future__ import annotations

from grpojob.plugins import GRPOTrainer


class CustomGRPOTrainer(GRPOTrainer):
    def loss_fn(self, logp, mb):
        loss, terms = super().loss_fn(logp, mb)  # GRPO: the scalar and its per-token parts
        beta = float(self.args.get("entropyBonus", 0.01))
        bonus = beta * -logp  # per token [N]; a gradient that raises the entropy of the sampled tokens
        loss = loss - (bonus * mb.coef.to(logp.device)).sum()
        terms.extra = {"pg_loss": terms.loss.detach(), "entropy_bonus": bonus.detach()}
        return loss, terms
