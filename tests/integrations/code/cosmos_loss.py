"""A user's cosmos-rl loss_fn, written as cosmos-rl's GRPO trainer calls one (its signature and
return value): the PPO-clipped policy loss, token-mean over the step's tokens (normalization_counts).
Every call is recorded in CALLS (the test reads them: the job runs in the test's process)."""
import torch

CALLS = []


def loss_fn(current_token_logps, old_per_token_logps, ref_per_token_logps, current_advantages, cu_seqlens, config,
            logprob_masks, dp_group=None, ddp_comm=None, rollout_per_token_logps=None, normalization_counts=None,
            **kwargs):
    lengths = cu_seqlens[1:] - cu_seqlens[:-1]
    assert logprob_masks.sum(1).tolist() == lengths.tolist() and current_advantages.shape == current_token_logps.shape
    ratio = torch.exp(current_token_logps - old_per_token_logps)
    tp = config.train.train_policy
    clipped = torch.clamp(ratio, 1 - tp.epsilon_low, 1 + tp.epsilon_high)
    per_token = -torch.min(ratio * current_advantages, clipped * current_advantages)
    loss = per_token.sum() / normalization_counts["tokens"]
    CALLS.append({"tokens": int(current_token_logps.numel()), "sequences": int(lengths.numel()),
                  "loss": float(loss.detach()), "adv_const": bool(all(
                      torch.unique(current_advantages[a:b]).numel() == 1 for a, b in zip(cu_seqlens[:-1], cu_seqlens[1:])))})
    return loss, loss.detach(), torch.zeros(())
