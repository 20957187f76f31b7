"""Sampling with a transformers causal LM: completions with their log-probs.

Used by the `hf` rollout engine and by in-process generation in tests. Log-probs follow the
Completion contract: log softmax(raw logits / temperature) of each sampled token, full vocabulary.
"""
from __future__ import annotations

from typing import Sequence

import torch

from .types import Completion, SamplingParams


@torch.no_grad()
def generate(model, prompts: Sequence[Sequence[int]], n: int, sampling: SamplingParams, *,
             eos_token_id: int, pad_token_id: int, policy_version: int = 0,
             max_batch: int = 256) -> list[list[Completion]]:
    """Sample `n` completions for each prompt; returns one list of n completions per prompt.
    A completion that stopped on EOS keeps the EOS token (the policy must learn to stop)."""
    out: list[list[Completion]] = []
    per_chunk = max(1, max_batch // max(n, 1))
    for i in range(0, len(prompts), per_chunk):
        out.extend(_generate_chunk(model, prompts[i:i + per_chunk], n, sampling, eos_token_id,
                                   pad_token_id, policy_version))
    return out


def _generate_chunk(model, prompts, n, sampling, eos_token_id, pad_token_id, policy_version):
    device = next(model.parameters()).device
    rows = [list(p) for p in prompts for _ in range(n)]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long, device=device)
    mask = torch.zeros_like(ids)
    for j, r in enumerate(rows):  # left padding: every row's next token is at the same column
        ids[j, width - len(r):] = torch.tensor(r, device=device)
        mask[j, width - len(r):] = 1
    greedy = sampling.temperature == 0
    if sampling.seed is not None:
        torch.manual_seed(sampling.seed)
    kwargs = dict(do_sample=not greedy, max_new_tokens=sampling.max_tokens, eos_token_id=eos_token_id,
                  pad_token_id=pad_token_id, return_dict_in_generate=True, output_logits=True)
    if not greedy:
        kwargs.update(temperature=sampling.temperature, top_p=sampling.top_p,
                      top_k=sampling.top_k if sampling.top_k > 0 else 0)
    res = model.generate(input_ids=ids, attention_mask=mask, **kwargs)
    new = res.sequences[:, width:]
    logits = torch.stack(res.logits, dim=1).float()  # [rows, steps, vocab], raw
    if not greedy:
        logits = logits / sampling.temperature
    lp = torch.log_softmax(logits, dim=-1).gather(-1, new[:, :logits.shape[1]].unsqueeze(-1)).squeeze(-1)
    groups: list[list[Completion]] = []
    for j, prompt in enumerate(rows):
        toks = new[j].tolist()
        stop = toks.index(eos_token_id) + 1 if eos_token_id in toks else None
        toks = toks[:stop] if stop else toks
        completion = Completion(prompt_ids=prompt, completion_ids=toks, logprobs=lp[j, :len(toks)].tolist(),
                                policy_version=policy_version,
                                finish_reason="stop" if stop else "length")
        if j % n == 0:
            groups.append([])
        groups[-1].append(completion)
    return groups
