"""Packing and memory-lean log-probs: packed rows give the log-probs of unpacked sequences."""
import pytest
import torch

from grpojob.trainer import logprobs as lp_mod
from grpojob.trainer.logprobs import PolicyLogprobs, token_logprobs
from grpojob.trainer.packing import TrainSeq, dummy, pack, plan


@pytest.fixture(scope="module")
def model(tiny_dir):
    from transformers import AutoModelForCausalLM
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(tiny_dir, attn_implementation="sdpa").eval()


def _seqs(n_groups=4, group=3, seed=0):
    """Groups of completions sharing a prompt (as a step has them), lengths 1..8, some loss masks
    with holes (e.g. tool tokens in a multi-turn completion)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n_groups):
        prompt = torch.randint(3, 500, (int(torch.randint(1, 12, (1,), generator=g)),), generator=g).tolist()
        for k in range(group):
            c = int(torch.randint(1, 9, (1,), generator=g))
            mask = [1] * c
            if c > 2 and k == 1:
                mask[1] = 0
            out.append(TrainSeq(prompt_ids=prompt, completion_ids=torch.randint(3, 500, (c,), generator=g).tolist(),
                                loss_mask=mask, rollout_logprobs=[-1.0] * c, advantage=float(len(out))))
    return out


def test_plan_places_every_sequence_once_within_budget():
    lengths = [30, 5, 17, 17, 64, 1, 9, 40]
    mbs = plan(lengths, budget=128, row_tokens=64)
    flat = [i for mb in mbs for row in mb for i in row]
    assert sorted(flat) == list(range(len(lengths)))
    for mb in mbs:
        assert all(sum(lengths[i] for i in row) <= 64 for row in mb)
        assert len(mb) * 64 <= 128
    assert plan(lengths, budget=128, row_tokens=64) == mbs  # deterministic
    assert plan([], 128) == []
    with pytest.raises(ValueError, match="microBatchTokens"):
        plan([200], budget=128)


def test_shared_prompt_units_positions_and_mask():
    seqs = _seqs(2, 3)
    (mb,) = pack(seqs, budget=4096)
    p0 = len(seqs[0].prompt_ids)
    # one unit per group: the prompt once, then each completion's inputs
    per_group = [len(seqs[g].prompt_ids) + sum(len(s.completion_ids) - 1 for s in seqs[g:g + 3]) for g in (0, 3)]
    assert mb.n_tokens == sum(per_group)
    assert mb.n_tokens < sum(s.n_inputs for s in seqs)
    for k in range(len(mb.targets)):
        s = seqs[mb.seqs[mb.seq_index[k]]]
        assert mb.targets[k].item() in s.completion_ids and mb.advantages[k].item() == s.advantage
    row = mb.position_ids[0].tolist()
    assert row[:p0] == list(range(p0))
    n1 = len(seqs[0].completion_ids) - 1
    assert row[p0:p0 + n1] == list(range(p0, p0 + n1))  # completion positions continue from the prompt
    if n1 and len(seqs[1].completion_ids) > 1:
        second = p0 + n1
        assert row[second] == p0  # the next completion restarts right after the prompt
        m = mb.attention_mask[0, 0]
        assert m[second, :p0].all() and not m[second, p0:second].any()  # sees the prompt, not completion 1
    assert len(mb.targets) == sum(s.n_trained for s in seqs)


def _reference(model, seqs):
    """Each sequence alone, full log_softmax: the obvious (memory-hungry) way."""
    out = []
    for s in seqs:
        ids = torch.tensor([s.prompt_ids + s.completion_ids])
        logits = model(input_ids=ids, use_cache=False).logits[0, :-1].float()
        lps = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None]).squeeze(-1)
        comp = lps[len(s.prompt_ids) - 1:]
        out.append(torch.stack([comp[j] for j, m in enumerate(s.loss_mask) if m]))
    return out


@pytest.mark.parametrize("budget,row_tokens,share", [(4096, 256, True), (64, 32, True), (4096, 16, True),
                                                     (64, 32, False)])
def test_packed_logprobs_equal_unpacked(model, budget, row_tokens, share):
    seqs = _seqs()
    policy = PolicyLogprobs(model)
    ref = _reference(model, seqs)
    mbs = pack(seqs, budget=budget, row_tokens=row_tokens, share_prompts=share)
    assert len(mbs) >= 1
    seen = set()
    for mb in mbs:
        with torch.no_grad():
            logp, _ = policy(mb.input_ids, mb.position_ids, mb.attention_mask, mb.token_index, mb.targets)
        for local, i in enumerate(mb.seqs):
            torch.testing.assert_close(logp[mb.seq_index == local], ref[i], atol=2e-5, rtol=1e-5)
            seen.add(i)
    assert seen == set(range(len(seqs)))


def test_position_ids_alone_separate_packed_sequences(model):
    """Without an explicit mask, transformers derives the block-diagonal mask from position ids
    restarting at 0 (rows of whole sequences)."""
    seqs = _seqs()
    ref = _reference(model, seqs)
    (mb,) = pack(seqs, budget=4096, share_prompts=False)
    with torch.no_grad():
        logp, _ = PolicyLogprobs(model)(mb.input_ids, mb.position_ids, None, mb.token_index, mb.targets)
    for local, i in enumerate(mb.seqs):
        torch.testing.assert_close(logp[mb.seq_index == local], ref[i], atol=2e-5, rtol=1e-5)


def test_chunked_logprobs_match_log_softmax_with_and_without_recompute(model, monkeypatch):
    g = torch.Generator().manual_seed(1)
    head = model.get_output_embeddings()
    hidden = torch.randn(50, model.config.hidden_size, generator=g)
    targets = torch.randint(0, model.config.vocab_size, (50,), generator=g)
    logits = head(hidden) / 0.7
    want = torch.log_softmax(logits, -1).gather(-1, targets[:, None]).squeeze(-1)
    probs = torch.softmax(logits, -1)
    want_ent = -(probs * torch.log_softmax(logits, -1)).sum(-1)
    want.sum().backward()
    want_grad = head.weight.grad.clone()
    head.weight.grad = None
    for recompute in (False, True):
        monkeypatch.setattr(lp_mod, "RECOMPUTE_ELEMENTS", 0 if recompute else 1 << 40)
        got, ent = token_logprobs(head, hidden, targets, temperature=0.7, entropy=True, chunk=16)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ent, want_ent, atol=1e-5, rtol=1e-5)
        got.sum().backward()
        torch.testing.assert_close(head.weight.grad, want_grad, atol=1e-5, rtol=1e-5)
        head.weight.grad = None


def test_dummy_micro_batch_trains_nothing(model):
    policy = PolicyLogprobs(model)
    mb = dummy(0)
    logp, _ = policy(mb.input_ids, mb.position_ids, mb.attention_mask, mb.token_index, mb.targets)
    assert logp.shape == (1,) and mb.coef.sum() == 0 and mb.is_dummy
