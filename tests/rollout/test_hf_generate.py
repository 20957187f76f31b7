"""The hf decoder (hf_generate over hf_attention) against transformers' own generate, under
whatever transformers is installed: greedy tokens and log-probs, seeded sampling, grouped KV heads
read in place, sliding-window layers, and the models it refuses at load (tiny float32 CPU models)."""
from __future__ import annotations

import pytest
import torch

from grpojob.rollout import hf_generate
from grpojob.contracts.rollout import SamplingParams

from .harness import PROMPTS, greedy, load_model

pytestmark = pytest.mark.contract  # what we use of transformers: every CI dependency set runs it


def _greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens)


def _random_model(config_cls, model_cls, **dims):
    torch.manual_seed(0)
    base = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2)
    return model_cls(config_cls(**{**base, **dims})).eval()


def test_generate_equals_transformers_greedy_batched(tiny_dir, tokenizer, monkeypatch):
    monkeypatch.setattr(hf_generate, "PREFILL_TOKENS", 8)  # prompts prefilled in several packed chunks
    monkeypatch.setattr(hf_generate, "PREFILL_TOKENS_CPU", 8)
    reference = load_model(tiny_dir)
    prompts = [tokenizer.encode(p) for p in PROMPTS]
    assert len({len(p) for p in prompts}) > 1
    # 4 prompts x 3 completions in 5 slots: rows wait, join and leave; n > 1 copies a prompt's KV
    model = load_model(tiny_dir)
    out = hf_generate.generate(model, prompts, 3, _greedy(14), eos_token_id=tokenizer.eos_token_id, max_batch=5)
    for p, group in zip(prompts, out):
        ids, logprobs = greedy(reference, tokenizer, p, 14)
        for c in group:
            assert c.prompt_ids == p and c.completion_ids == ids
            assert c.logprobs == pytest.approx(logprobs, abs=1e-5)
    # the decoder's attention left the model's ordinary forwards (transformers' generate) as they were
    (ids, logprobs), (ref_ids, ref_logprobs) = (greedy(m, tokenizer, prompts[2], 14) for m in (model, reference))
    assert ids == ref_ids and logprobs == pytest.approx(ref_logprobs, abs=1e-6)


def test_generate_samples_a_seeded_prompt_the_same_alone_and_amid_others(tiny_dir, tokenizer):
    model = load_model(tiny_dir)
    prompts = [tokenizer.encode(p) for p in PROMPTS]
    sampling = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=16, seed=41)
    (alone,) = hf_generate.generate(model, prompts[1:2], 3, sampling, eos_token_id=None)
    # prompt j is seeded seed + j: prompts[1] gets 41 again, between two others, in fewer slots than rows
    amid = hf_generate.generate(model, prompts[:3], 3, SamplingParams(temperature=1.0, top_p=0.9, max_tokens=16,
                                                                      seed=40), eos_token_id=None, max_batch=4)[1]
    assert [c.completion_ids for c in alone] == [c.completion_ids for c in amid]
    for a, b in zip(alone, amid):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
    assert len({tuple(c.completion_ids) for c in alone}) == 3  # the n completions differ from each other
    (other,) = hf_generate.generate(model, prompts[1:2], 3, SamplingParams(temperature=1.0, top_p=0.9, max_tokens=16,
                                                                           seed=42), eos_token_id=None)
    assert [c.completion_ids for c in other] != [c.completion_ids for c in alone]


def test_decode_reads_the_grouped_kv_heads_in_place(tiny_dir, monkeypatch):
    """The tiny model groups 2 query heads per KV head. A decode step attends over the slot
    buffers themselves, KV heads as stored: no copy of the cache per step (transformers' sdpa
    repeats the KV heads into a full copy whenever a mask is given), on any device."""
    model = load_model(tiny_dir)
    config = model.config
    assert config.num_attention_heads > config.num_key_value_heads
    dec = hf_generate.Decoder(model, slots=4, max_len=64, eos_token_id=None)
    dec.admit([hf_generate.request_rows(0, [5, 6, 7, 8], 3, _greedy(10), [0, 1, 2])], 0)
    stored = {b.untyped_storage().data_ptr() for kv in dec.cache.kv.values() for b in kv}
    assert len(stored) == 2 * config.num_hidden_layers
    read = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(query, key, value, *args, **kwargs):
        read.append((key.untyped_storage().data_ptr(), value.untyped_storage().data_ptr(), key.shape[1]))
        return sdpa(query, key, value, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    for _ in range(4):
        dec.step(0)
    assert len(read) == 4 * config.num_hidden_layers
    assert all(k in stored and v in stored and heads == config.num_key_value_heads for k, v, heads in read)


def test_sliding_window_layers_see_only_their_window():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    # layer 0 full attention, layer 1 a window of 4 positions
    windowed = _random_model(Qwen2Config, Qwen2ForCausalLM, num_hidden_layers=2, use_sliding_window=True,
                             sliding_window=4, max_window_layers=1)
    assert windowed.config.layer_types == ["full_attention", "sliding_attention"]
    full = _random_model(Qwen2Config, Qwen2ForCausalLM, num_hidden_layers=2)
    full.load_state_dict(windowed.state_dict())
    prompts = [[3, 9, 27, 81, 50, 7], [11, 12, 13, 14, 15, 16, 17, 18, 19]]
    ids = torch.tensor(prompts[1])[None]
    with torch.no_grad():
        apart = full(ids).logits[0, -1] - windowed(ids).logits[0, -1]
    assert apart.abs().max() > 1e-3  # the window changes what the model computes
    reference = _random_model(Qwen2Config, Qwen2ForCausalLM, num_hidden_layers=2, use_sliding_window=True,
                              sliding_window=4, max_window_layers=1)
    out = hf_generate.generate(windowed, prompts, 2, _greedy(12), eos_token_id=None, max_batch=3)
    for p, group in zip(prompts, out):
        ids, logprobs = _transformers_greedy(reference, p, 12)
        for c in group:
            assert c.completion_ids == ids and c.logprobs == pytest.approx(logprobs, abs=1e-5)


def _transformers_greedy(model, prompt, max_tokens):
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=max_tokens, output_logits=True, return_dict_in_generate=True,
                             pad_token_id=0, eos_token_id=None)
    new = out.sequences[0, len(prompt):]
    lp = torch.log_softmax(torch.stack(out.logits, 1)[0].float(), -1).gather(-1, new[:, None]).squeeze(-1)
    return new.tolist(), lp.tolist()


def test_models_the_decoder_cannot_run_are_refused_at_load():
    from transformers import Gemma2Config, Gemma2ForCausalLM, Lfm2Config, Lfm2ForCausalLM

    capped = _random_model(Gemma2Config, Gemma2ForCausalLM, num_hidden_layers=1, head_dim=8)
    with pytest.raises(ValueError, match=r"cannot run Gemma2ForCausalLM .*soft-capping \(softcap=50.0\)"):
        hf_generate.Decoder(capped, slots=2, max_len=16, eos_token_id=None)
    hybrid = _random_model(Lfm2Config, Lfm2ForCausalLM, num_hidden_layers=3,
                           layer_types=["conv", "full_attention", "conv"])
    with pytest.raises(ValueError, match="cannot run Lfm2ForCausalLM .*2 of its 3 layers do not attend"):
        hf_generate.Decoder(hybrid, slots=2, max_len=16, eos_token_id=None)
