"""The GRPOTrainer hooks a plug-in overrides: per-token advantages and fields from prepare_batch
reach the right tokens of packed micro-batches (packed or not), token_logprobs scores sequences as
compute_logprobs does, and loss_fn's own numbers come out as token means."""
from __future__ import annotations

import math

import pytest
import torch

from grpojob.learner.packing import pack
from grpojob.learner.trainer import GRPOTrainer

from .conftest import make_job
from .test_packing import _seqs


def _with_token_signals(seqs):
    for i, s in enumerate(seqs):
        s.token_advantages = [100.0 * i + k for k in range(len(s.completion_ids))]
        s.fields["r"] = [-(100.0 * i + k) for k in range(len(s.completion_ids))]
    return seqs


@pytest.mark.parametrize("share", [True, False])
def test_token_advantages_and_fields_reach_their_tokens(share):
    seqs = _with_token_signals(_seqs(4, 3))
    seen = set()
    for mb in pack(seqs, budget=64, row_tokens=32, share_prompts=share):
        for j in range(len(mb.targets)):
            i, k = mb.seqs[mb.seq_index[j]], int(mb.token_pos[j])
            assert mb.targets[j].item() == seqs[i].completion_ids[k] and seqs[i].loss_mask[k] == 1
            assert mb.advantages[j].item() == 100.0 * i + k and mb.token_field("r")[j].item() == -(100.0 * i + k)
            seen.add((i, k))
    assert seen == {(i, k) for i, s in enumerate(seqs) for k, m in enumerate(s.loss_mask) if m}


def test_a_field_on_some_sequences_only_is_refused():
    seqs = _seqs(2, 2)
    seqs[0].fields["r"] = [0.0] * len(seqs[0].completion_ids)
    with pytest.raises(ValueError, match="fields\\['r'\\] is set on some sequences"):
        pack(seqs, budget=4096)


def test_has_signal_reads_the_trained_token_advantages():
    s = _seqs(1, 1)[0]
    s.advantage, s.token_advantages = 1.0, [0.0] * len(s.completion_ids)
    assert not s.has_signal
    s.token_advantages[-1] = 0.5
    assert s.has_signal


class ExtraLoss(GRPOTrainer):
    def loss_fn(self, logp, mb):
        loss, terms = super().loss_fn(logp, mb)
        terms.extra = {"two": torch.full_like(logp, 2.0).detach(), "logp": logp.detach()}
        return loss, terms


def test_token_logprobs_and_loss_extras(tiny_dir):
    trainer = ExtraLoss(make_job(tiny_dir))
    assert not trainer.skips_zero_advantage()  # a custom loss_fn: every sequence is trained
    seqs = _seqs(3, 2)
    for s in seqs:
        s.prompt_ids = [t % 100 + 3 for t in s.prompt_ids]
        s.completion_ids = [t % 100 + 3 for t in s.completion_ids]
    scored = trainer.token_logprobs(trainer.policy, seqs)
    (mb,) = pack(seqs, budget=4096, pad_id=trainer.pad_id)
    logp = trainer.compute_logprobs(trainer.policy, mb, False)[0].detach()
    for j in range(len(mb.targets)):
        assert scored[mb.seqs[mb.seq_index[j]]][int(mb.token_pos[j])] == pytest.approx(float(logp[j]), abs=1e-5)
    assert all(math.isnan(lp) == (m == 0) for s, lps in zip(seqs, scored) for lp, m in zip(lps, s.loss_mask))

    from grpojob.learner.batch import Prepared

    for s in seqs:
        s.coef = 1.0 / sum(x.n_trained for x in seqs)
    stats = trainer.optimize(Prepared(seqs=seqs, stats={}))
    assert stats["extra"]["two"] == pytest.approx(2.0)  # token means over the step
    assert stats["extra"]["logp"] == pytest.approx(float(logp.mean()), abs=1e-5)
