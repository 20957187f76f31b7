"""NexRL's custom trainer, ported: `_prepare_batch` over the whole batch with token-level rewards,
a KL penalty folded into the reward, and custom advantages.

NexRL loads a trainer class from a file path and a class name (custom_trainer_module_path,
custom_trainer_class_name); here `trainer: {class: kl_reward_trainer.py:KLRewardTrainer}`. Its
prepare_batch:

1. takes the default batch (sequences with their shaped reward, aggregation weights, statistics);
2. scores every sequence under a frozen reference policy (build_reference + token_logprobs);
3. builds token-level rewards: r_t = -klCoef * (log pi_rollout(y_t) - log pi_ref(y_t)), plus the
   sequence's reward on its last trained token (NexRL's `token_level_scores` with its KL pattern);
4. sets per-token advantages: the return-to-go G_t = sum_{k >= t} r_k minus the group's mean
   return G_0 (a REINFORCE baseline per prompt), in place of GRPO's per-sequence advantage;
5. keeps the token rewards as a per-token field (its loss_fn logs their mean) and reports the
   batch's KL, KL penalty and return in the step record's `extra`.

The KL is in the reward, so algorithm.klBeta must stay 0 (no second KL term in the loss).
"""
from __future__ import annotations

from collections import defaultdict

import torch

from grpojob.plugins import GRPOTrainer, TrainerError, dist


class KLRewardTrainer(GRPOTrainer):
    def __init__(self, job, env=None):
        super().__init__(job, env)
        if self.spec.algorithm.kl_beta > 0:
            raise TrainerError("spec.algorithm.klBeta: must be 0 with KLRewardTrainer (the KL is in the reward)")
        self.kl_coef = float(self.args.get("klCoef", 0.05))
        self.kl_ref = self.build_reference()

    def prepare_batch(self, groups):
        prep = super().prepare_batch(groups)
        ref = self.token_logprobs(self.kl_ref, prep.seqs)
        returns = defaultdict(list)
        kl_sum = penalty_sum = ret_sum = 0.0
        n_tok = 0
        for seq, ref_lp in zip(prep.seqs, ref):
            kl = [lp - r if m else 0.0 for lp, r, m in zip(seq.rollout_logprobs, ref_lp, seq.loss_mask)]
            rewards = [-self.kl_coef * k for k in kl]
            last = max(t for t, m in enumerate(seq.loss_mask) if m)
            rewards[last] += seq.reward
            to_go, acc = [0.0] * len(rewards), 0.0
            for t in reversed(range(len(rewards))):
                acc += rewards[t]
                to_go[t] = acc
            seq.fields["token_reward"] = rewards
            seq.token_advantages = to_go  # made relative to the group's baseline below
            returns[seq.group].append(to_go[0])
            kl_sum += sum(kl)
            penalty_sum += self.kl_coef * sum(kl)
            ret_sum += to_go[0]
            n_tok += seq.n_trained
        baseline = {g: sum(v) / len(v) for g, v in returns.items()}
        for seq in prep.seqs:
            seq.token_advantages = [g - baseline[seq.group] for g in seq.token_advantages]
        tot = dist.all_sum(torch.tensor([kl_sum, n_tok, penalty_sum, ret_sum, len(prep.seqs)],
                                        dtype=torch.float64), self.env).tolist()
        n_seqs = tot[4] or 1.0
        prep.extra = {"kl_in_reward": tot[0] / (tot[1] or 1.0), "kl_penalty_mean": tot[2] / n_seqs,
                      "return_mean": tot[3] / n_seqs}
        return prep

    def loss_fn(self, logp, mb):
        loss, terms = super().loss_fn(logp, mb)
        terms.extra = {"token_reward": mb.token_field("token_reward").to(logp.device)}
        return loss, terms
