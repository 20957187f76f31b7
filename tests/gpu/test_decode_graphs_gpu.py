"""The hf decoder's CUDA graphs (hf_decode_step) on a GPU: captured per bucket, replayed with the
same tokens as the same decoder run eagerly, through rows joining and leaving and an in-place
weight swap. Skipped without CUDA (tests/conftest.py)."""
from __future__ import annotations

import pytest
import torch

from grpojob.contracts.rollout import SamplingParams
from grpojob.rollout import hf_generate

from ..rollout.harness import load_model, perturb


def _generate(model, graphs: bool, swap=None):
    dec = hf_generate.Decoder(model, slots=8, max_len=96, eos_token_id=None, graphs=graphs)
    rows = []
    for i, (n, sp) in enumerate([(3, SamplingParams(temperature=1.0, max_tokens=20, seed=1)),
                                 (2, SamplingParams(temperature=0.0, max_tokens=9)),
                                 (2, SamplingParams(temperature=0.8, top_p=0.9, top_k=20, max_tokens=14, seed=2))]):
        rows.append(hf_generate.request_rows(i, [5 + i, 6, 7, 8 + i], n, sp, hf_generate.noise_keys(sp, n)))
    done = {(r.request, r.index): r for r in dec.admit(rows[:2], 0)}
    steps = 0
    while dec.rows:
        done.update({(r.request, r.index): r for r in dec.step(0)})
        steps += 1
        if steps == 4:  # a request joins mid-way
            done.update({(r.request, r.index): r for r in dec.admit(rows[2:], 0)})
        if steps == 6 and swap is not None:  # weights copied in place, as hf_engine._swap does
            with torch.no_grad():
                for p, q in zip(model.parameters(), swap.parameters()):
                    p.copy_(q)
            dec.recompute()
    return dec, [done[k].tokens for k in sorted(done)], [done[k].logprobs for k in sorted(done)]


@pytest.mark.gpu
def test_decode_graphs_replay_what_the_eager_step_computes(tiny_dir):
    base = load_model(tiny_dir).to("cuda")  # float32: exact token comparisons (tests/gpu/test_rollout_gpu.py)
    other = perturb(load_model(tiny_dir), seed=5).to("cuda")
    eager_model = load_model(tiny_dir).to("cuda")
    dec, tokens, logps = _generate(base, graphs=True, swap=other)
    assert dec.steps.graphs and dec.steps._captured, "the capture failed: the decoder fell back to eager"
    _, eager_tokens, eager_logps = _generate(eager_model, graphs=False, swap=other)
    assert tokens == eager_tokens
    for a, b in zip(logps, eager_logps):
        assert a == pytest.approx(b, abs=1e-4)
