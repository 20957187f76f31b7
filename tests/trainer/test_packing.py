"""Packing, attention backends and memory-lean log-probs: packed rows give the log-probs (and
gradients) of unpacked sequences, whatever the backend, layout or bucketing."""
import copy

import pytest
import torch

from grpojob.learner import attention
from grpojob.learner import logprobs as lp_mod
from grpojob.learner import sizing
from grpojob.learner.logprobs import PolicyLogprobs, linear_logprobs, token_logprobs
from grpojob.learner.packing import TrainSeq, dummy, pack, plan
from grpojob.learner.spans import BUCKET_MIN
from grpojob.learner.sizing import for_device


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


@pytest.mark.parametrize("bias", [False, True])
def test_tiled_logprobs_match_log_softmax_values_entropy_and_gradients(model, bias):
    g = torch.Generator().manual_seed(1)
    head = copy.deepcopy(model.get_output_embeddings())
    if bias:
        head.bias = torch.nn.Parameter(torch.randn(head.out_features, generator=g))
    hidden = torch.randn(50, model.config.hidden_size, generator=g, requires_grad=True)
    targets = torch.randint(0, model.config.vocab_size, (50,), generator=g)
    weights = torch.randn(50, generator=g)  # a loss that weighs tokens differently
    logits = head(hidden) / 0.7
    want = torch.log_softmax(logits, -1).gather(-1, targets[:, None]).squeeze(-1)
    want_ent = -(torch.softmax(logits, -1) * torch.log_softmax(logits, -1)).sum(-1)
    params = [hidden, *head.parameters()]
    want_grads = torch.autograd.grad((want * weights).sum(), params)
    # one tile (torch's log_softmax); tiles of 7 tokens x 100 vocabulary entries recomputed in backward
    for tile, vocab_chunk in ((1 << 24, 1 << 15), (700, 100)):
        got, ent = token_logprobs(head, hidden, targets, temperature=0.7, entropy=True, tile=tile,
                                  vocab_chunk=vocab_chunk)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ent, want_ent.detach(), atol=1e-5, rtol=1e-5)
        for a, b in zip(torch.autograd.grad((got * weights).sum(), params), want_grads):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def _logit_tiles(monkeypatch) -> list[int]:
    """The size of every logits tile the output layer computes from now on."""
    seen: list[int] = []
    inner = lp_mod._logits

    def spy(*args):
        z = inner(*args)
        seen.append(z.numel())
        return z
    monkeypatch.setattr(lp_mod, "_logits", spy)
    return seen


def test_tiles_bound_the_logits_whatever_the_vocabulary(monkeypatch):
    """Qwen's 151,936-entry vocabulary: no [tokens, vocab] logits, forward or backward; every
    logit tile goes through _logits and stays within TILE_ELEMENTS."""
    seen = _logit_tiles(monkeypatch)
    g = torch.Generator().manual_seed(0)
    vocab, n = 151_936, 300
    weight = (torch.randn(vocab, 16, generator=g) * 0.1).requires_grad_()
    hidden = torch.randn(n, 16, generator=g, requires_grad=True)
    targets = torch.randint(0, vocab, (n,), generator=g)
    logp, _ = linear_logprobs(hidden, weight, None, targets, tile=1 << 20)
    logp.sum().backward()
    assert seen and max(seen) <= 1 << 20 < n * vocab
    assert len(seen) > 2 * -(-vocab // lp_mod.VOCAB_CHUNK)  # forward and backward both tiled
    with torch.no_grad():
        want = torch.log_softmax(hidden @ weight.t(), -1).gather(-1, targets[:, None]).squeeze(-1)
    torch.testing.assert_close(logp, want, atol=1e-5, rtol=1e-5)


def test_logits_that_fit_one_tile_are_computed_once_whatever_the_vocabulary(monkeypatch):
    """SmolLM2's 49,152 entries exceed a vocabulary chunk, yet 40 tokens' logits fit one tile: one
    [tokens, vocab] pass, none recomputed in backward, and the same values and gradients."""
    seen = _logit_tiles(monkeypatch)
    g = torch.Generator().manual_seed(0)
    vocab, n = 49_152, 40
    assert vocab > lp_mod.VOCAB_CHUNK
    weight = (torch.randn(vocab, 16, generator=g) * 0.1).requires_grad_()
    hidden = torch.randn(n, 16, generator=g, requires_grad=True)
    targets = torch.randint(0, vocab, (n,), generator=g)
    logp, _ = linear_logprobs(hidden, weight, None, targets, tile=sizing.head_tile(None))
    grads = torch.autograd.grad(logp.sum(), [hidden, weight])
    assert seen == [n * vocab]
    want = torch.log_softmax(hidden @ weight.t(), -1).gather(-1, targets[:, None]).squeeze(-1)
    torch.testing.assert_close(logp, want, atol=1e-5, rtol=1e-5)
    for a, b in zip(grads, torch.autograd.grad(want.sum(), [hidden, weight])):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def _backend_model(model, backend):
    m = copy.deepcopy(model)
    attention.install(m, backend)
    return m


@pytest.mark.parametrize("backend,row_tokens,bucket", [("segments", 4096, False), ("segments", 32, True),
                                                       ("sdpa", 4096, True), ("flex", 4096, True)])
def test_every_attention_backend_gives_the_unpacked_logprobs(model, backend, row_tokens, bucket):
    """segments and sdpa also train (their gradients equal sdpa's on 256-token rows); flex runs
    forward only on CPU (torch has no flex backward on CPU; the gpu tests cover it)."""
    seqs = _seqs()
    ref = _reference(model, seqs)
    m = _backend_model(model, backend)
    policy = PolicyLogprobs(m)
    train = backend != "flex"
    cap = max(row_tokens, max(s.n_inputs for s in seqs))  # a row's capacity
    for mb in pack(seqs, budget=4096, row_tokens=row_tokens, bucket=bucket):
        if bucket:  # few distinct shapes: powers of two, or the capacity itself
            rows, width = mb.shape
            assert rows & (rows - 1) == 0 and width in {BUCKET_MIN << k for k in range(6)} | {cap}
        with torch.set_grad_enabled(train):
            logp, _ = policy(**mb.inputs(torch.device("cpu"), backend))
        if train:
            (logp * mb.advantages).sum().backward()
        for local, i in enumerate(mb.seqs):
            torch.testing.assert_close(logp[mb.seq_index == local].detach(), ref[i], atol=2e-5, rtol=1e-5)
    if train:
        want = _backend_model(model, "sdpa")
        for mb in pack(seqs, budget=4096, row_tokens=256):
            logp, _ = PolicyLogprobs(want)(mb.input_ids, mb.position_ids, mb.attention_mask, mb.token_index, mb.targets)
            (logp * mb.advantages).sum().backward()
        for (name, a), b in zip(m.named_parameters(), want.parameters()):
            torch.testing.assert_close(a.grad, b.grad, atol=1e-4, rtol=1e-4,
                                       msg=lambda msg, name=name: f"{name}: {msg}")


def test_cpu_shape_is_one_unpadded_row_per_micro_batch(model):
    shape = for_device(torch.device("cpu"), model)
    assert shape.attention == "segments" and shape.compute_dtype is None and shape.compile is None
    assert for_device(torch.device("cpu"), torch.nn.Linear(2000, 1000)).compile == "dynamic"  # 2M parameters
    seqs = _seqs(n_groups=6, group=4)
    mbs = shape.pack(seqs, 64, pad_id=0)
    assert all(mb.shape[0] == 1 and mb.shape[1] == mb.n_tokens <= 64 for mb in mbs)


def test_dummy_micro_batch_trains_nothing(model):
    policy = PolicyLogprobs(model)
    mb = dummy(0)
    logp, _ = policy(mb.input_ids, mb.position_ids, mb.attention_mask, mb.token_index, mb.targets)
    assert logp.shape == (1,) and mb.coef.sum() == 0 and mb.is_dummy


@pytest.mark.slow
def test_compiled_cpu_layers_train_like_eager_layers(model):
    """The big-model CPU shape: layers compiled with dynamic lengths (graph broken at the segments
    attention) give eager's log-probs and gradients, micro-batch after micro-batch of new lengths."""
    from grpojob.learner.sizing import TrainShape

    shape = TrainShape(attention="segments", row_tokens=None, bucket=False, compute_dtype=None, compile="dynamic")
    eager, compiled = _backend_model(model, "segments"), copy.deepcopy(model)
    fast = PolicyLogprobs(compiled, shape)
    for seed in range(3):
        for mb in shape.pack(_seqs(3, 3, seed=seed), 64, pad_id=0):
            for m, policy in ((eager, PolicyLogprobs(eager)), (compiled, fast)):
                logp, _ = policy(**mb.inputs(torch.device("cpu"), "segments"))
                (logp * mb.advantages).sum().backward()
                mb.extra[id(m)] = logp.detach()
            torch.testing.assert_close(mb.extra[id(compiled)], mb.extra[id(eager)], atol=1e-5, rtol=1e-5)
    for (name, a), b in zip(compiled.named_parameters(), eager.parameters()):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-4, rtol=1e-4, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.slow
def test_the_cuda_shape_traced_on_cpu_gives_the_unpacked_logprobs(model):
    """What the GPU runs, as far as the CPU can: bucketed rows, a flex BlockMask, layers compiled
    for dynamic widths (flex inside the graph). Forward only: torch has no flex backward on CPU."""
    from grpojob.learner.sizing import TrainShape

    shape = TrainShape(attention="flex", row_tokens=None, bucket=True, compute_dtype=None, compile="dynamic")
    policy = PolicyLogprobs(copy.deepcopy(model), shape)
    seqs = _seqs()
    ref = _reference(model, seqs)
    with torch.no_grad():
        for mb in shape.pack(seqs, 256, pad_id=0):
            assert mb.shape[0] == 1 and mb.shape[1] % 128 == 0
            logp, _ = policy(**mb.inputs(torch.device("cpu"), "flex"))
            for local, i in enumerate(mb.seqs):
                torch.testing.assert_close(logp[mb.seq_index == local], ref[i], atol=2e-5, rtol=1e-5)
