"""The hf engine's sampler (hf_sampling): it draws from softmax(logits / temperature) after top-k /
top-p, its log-probs are the full distribution's, and a row's draw depends on its key and token
index only (not on the batch around it)."""
from __future__ import annotations

import pytest
import torch

from grpojob.rollout import hf_sampling

LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0])


def _draw(rows: int, temperature=1.0, top_p=1.0, top_k=-1, logits=LOGITS, step=0):
    x = logits.expand(rows, -1).contiguous()
    return hf_sampling.sample(x, torch.full((rows,), float(temperature)), torch.full((rows,), float(top_p)),
                              torch.full((rows,), top_k, dtype=torch.long), torch.arange(rows, dtype=torch.long) * 7919,
                              torch.full((rows,), step, dtype=torch.long))


def _freq(tokens: torch.Tensor) -> torch.Tensor:
    return torch.bincount(tokens, minlength=len(LOGITS)).float() / len(tokens)


def test_draws_follow_the_tempered_distribution_and_report_its_logprobs():
    n = 40_000  # the standard error of a frequency is at most 0.0025
    for temperature in (1.0, 0.5, 2.0):
        tokens, logps = _draw(n, temperature=temperature)
        want = torch.softmax(LOGITS / temperature, 0)
        assert torch.allclose(_freq(tokens), want, atol=0.012), (temperature, _freq(tokens), want)
        assert torch.allclose(logps, torch.log(want)[tokens], atol=1e-5)


def test_top_k_and_top_p_keep_only_their_tokens_and_renormalise():
    n = 40_000
    tokens, logps = _draw(n, top_k=2)
    p = torch.softmax(LOGITS, 0)
    assert set(tokens.tolist()) == {0, 1}
    assert abs(_freq(tokens)[0] - p[0] / (p[0] + p[1])) < 0.012
    assert torch.allclose(logps, torch.log(p)[tokens], atol=1e-5)  # the full distribution's log-prob
    tokens, _ = _draw(n, top_p=0.7)  # p = .53 .20 .12 .07 .03: the nucleus is the first two (reaching .73)
    assert set(tokens.tolist()) == {0, 1}


def test_greedy_rows_take_the_argmax_beside_sampled_rows():
    x = torch.stack([LOGITS, LOGITS.flip(0)])
    tokens, logps = hf_sampling.sample(x, torch.tensor([0.0, 1.0]), torch.ones(2), torch.full((2,), -1),
                                       torch.tensor([1, 2]), torch.zeros(2, dtype=torch.long))
    assert tokens[0] == 0
    assert logps[0] == torch.log_softmax(LOGITS, 0)[0]


def test_a_rows_draw_depends_on_its_key_and_step_only():
    vocab = 151_936  # the real vocabulary: the CDF over it still resolves
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(8, vocab, generator=g) * 3
    keys = torch.tensor([hf_sampling.row_key(1234, i) for i in range(8)])
    args = (torch.ones(8), torch.ones(8), torch.full((8,), -1), keys)
    alone, _ = hf_sampling.sample(logits, *args, torch.full((8,), 3, dtype=torch.long))
    order = torch.randperm(8, generator=g)
    shuffled, _ = hf_sampling.sample(logits[order], *(a[order] for a in args), torch.full((8,), 3, dtype=torch.long))
    assert torch.equal(shuffled, alone[order])
    single, _ = hf_sampling.sample(logits[2:3], *(a[2:3] for a in args), torch.tensor([3]))
    assert single.item() == alone[2].item()
    later, _ = hf_sampling.sample(logits, *args, torch.full((8,), 4, dtype=torch.long))
    assert not torch.equal(later, alone)  # the next token's uniform differs


def test_a_rows_draw_does_not_depend_on_which_sampling_work_its_batch_needs():
    """The decode step skips the filter, the temperature or the greedy pick when no row of its
    batch needs them (hf_sampling.flags): each row draws the same token alone, in a batch that
    needs all three, and with every flag on."""
    from grpojob.contracts.rollout import SamplingParams

    g = torch.Generator().manual_seed(1)
    params = [SamplingParams(), SamplingParams(temperature=0.0), SamplingParams(top_p=0.6),
              SamplingParams(temperature=0.7, top_k=3), SamplingParams(temperature=1.5)]
    logits = torch.randn(len(params), 50, generator=g) * 2
    temperature = torch.tensor([p.temperature for p in params])
    top_p = torch.tensor([p.top_p for p in params])
    top_k = torch.tensor([p.top_k for p in params])
    keys = torch.tensor([hf_sampling.row_key(9, i) for i in range(len(params))])
    steps = torch.full((len(params),), 4, dtype=torch.long)
    assert hf_sampling.flags(params) == (True, True, True)
    everything = hf_sampling.sample_rows(logits, temperature, top_p, top_k, keys, steps, True, True, True)
    for i, p in enumerate(params):
        one = slice(i, i + 1)
        alone = hf_sampling.sample_rows(logits[one], temperature[one], top_p[one], top_k[one], keys[one], steps[one],
                                        *hf_sampling.flags([p]))
        assert alone[0].item() == everything[0][i].item(), p
        assert alone[1].item() == pytest.approx(everything[1][i].item(), abs=1e-6)
    assert everything[0][1] == logits[1].argmax()  # the greedy row
