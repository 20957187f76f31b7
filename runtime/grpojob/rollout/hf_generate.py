"""Sampling with a transformers causal LM, continuously batched: completions with their log-probs.

`Decoder` keeps a static KV cache of `slots` rows (hf_attention.Slots, outside transformers: the
model gets no cache, its attention function writes and reads the slots); each row is one
completion at its own position, so rows join and leave between decode steps and no row is ever
left-padded. New prompts are prefilled together in one packed row (a block-diagonal causal
mask), each prompt once for all n completions of its request (its KV is copied to the other n-1
slots). A decode step (hf_decode_step) feeds every active row's last token at its own position
and attends over the row's cached keys only (a [rows, 1, 1, kv] mask); its inputs stay on the
device, it reads back one tensor, and on CUDA it replays as a graph per bucket of rows. Used by
the `hf` rollout engine (hf_engine) and by `generate` below (in-process sampling: tests).

Log-probs follow the Completion contract: log softmax(raw logits / temperature) of each sampled
token over the full vocabulary. Sampling noise is per row (hf_sampling): completion i of a
request seeded s gets the same tokens whatever else shares the batch.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import torch
from torch import Tensor

from grpojob.rollout import hf_attention, hf_sampling
from grpojob.contracts.rollout import Completion, SamplingParams
from grpojob.rollout.hf_decode_step import DecodeStep

# Prompt tokens prefilled together at most. The packed mask is O(tokens^2): every pair of tokens is
# scored, a sequence's own pairs only kept. On the CPU that waste is the prefill (an agent's 30 chat
# prompts of 300 tokens: 0.62 s at 4096, 0.20 s at 1024); a GPU is launch-bound, fewer calls win.
PREFILL_TOKENS = 4096
PREFILL_TOKENS_CPU = 1024


@dataclass
class Row:
    """One completion being generated."""
    request: Any  # whoever asked (the engine's request, or generate()'s prompt index)
    index: int  # which of the request's n completions
    prompt: list[int]
    sampling: SamplingParams
    key: int  # sampling noise key (hf_sampling.row_key)
    version: int  # policy version of the weights that produced its first token
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: Optional[list[int]] = None  # per token, once a weight swap landed mid-row
    finish: Optional[str] = None

    @property
    def position(self) -> int:  # of the last sampled token (the next decode input)
        return len(self.prompt) + len(self.tokens) - 1

    def add(self, token: int, logprob: float, version: int, eos: Optional[int], limit: int) -> None:
        if self.versions is None and version != self.version:
            self.versions = [self.version] * len(self.tokens)
        self.tokens.append(token)
        self.logprobs.append(logprob)
        if self.versions is not None:
            self.versions.append(version)
        if token == eos:
            self.finish = "stop"
        elif len(self.tokens) >= self.sampling.max_tokens or self.position >= limit:  # no room to feed it
            self.finish = "length"

    def completion(self) -> Completion:
        return Completion(prompt_ids=list(self.prompt), completion_ids=list(self.tokens),
                          logprobs=list(self.logprobs),
                          policy_version=min(self.versions) if self.versions else self.version,
                          finish_reason=self.finish or "length", versions=self.versions)


class Decoder:
    """Active rows live in slots 0..len(rows)-1 (a finished row's slot is taken by the last row)."""

    def __init__(self, model, *, slots: int, max_len: int, eos_token_id: Optional[int],
                 graphs: Optional[bool] = None, compiled: Optional[bool] = None):
        hf_attention.install(model)
        self.model = model
        self.decoder = model.base_model
        self.head = model.get_output_embeddings()
        self.device = next(model.parameters()).device
        self.cache = hf_attention.Slots(slots, max_len)
        self.eos = eos_token_id
        self.rows: list[Row] = []
        self._first_prefill(model)
        self.steps = DecodeStep(self.decoder, self.head, self.cache, self.device, graphs=graphs, compiled=compiled)

    def _first_prefill(self, model) -> None:
        """Prefill one token into slot 0 (taken over by the first row admitted): allocates every
        layer's slots now, and refuses here, at load, a model this decoder cannot run right."""
        name = f"{type(model).__name__} ({model.config.name_or_path or model.config.model_type})"
        try:
            with torch.inference_mode():
                self._prefill([[0]], [0])
        except hf_attention.Unsupported as e:
            raise ValueError(f"the hf engine cannot run {name}: {e}") from None
        layers = model.config.get_text_config().num_hidden_layers
        if len(self.cache.kv) < layers:  # recurrent or linear-attention layers keep a state of their own
            raise ValueError(f"the hf engine cannot run {name}: {layers - len(self.cache.kv)} of its {layers} "
                             f"layers do not attend through transformers' attention interface")

    @property
    def free(self) -> int:
        return self.cache.slots - len(self.rows)

    def _budget(self) -> int:
        """Prompt tokens per prefill pass on this decoder's device (read at call: tests lower it)."""
        return PREFILL_TOKENS_CPU if self.device.type == "cpu" else PREFILL_TOKENS

    # ---- model calls -------------------------------------------------------------------------
    def _prefill(self, seqs: list[list[int]], slots: list[int]) -> Tensor:
        """Write the KV of each token sequence into its slot (positions from 0); returns the
        hidden state of each sequence's last token [len(seqs), H]."""
        lengths = [len(s) for s in seqs]
        total = sum(lengths)
        dev = self.device
        ids = torch.tensor([t for s in seqs for t in s], device=dev)[None]
        pos = torch.cat([torch.arange(n, device=dev) for n in lengths])
        seg = torch.repeat_interleave(torch.arange(len(seqs), device=dev), torch.tensor(lengths, device=dev))
        slot = torch.repeat_interleave(torch.tensor(slots, device=dev), torch.tensor(lengths, device=dev))
        q = torch.arange(total, device=dev)
        mask = (seg[:, None] == seg[None, :]) & (q[:, None] >= q[None, :])
        step = hf_attention.Step(self.cache, pos, mask[None, None], slot=slot)
        out = self.decoder(input_ids=ids, position_ids=pos[None], attention_mask=step.mask, use_cache=False,
                           **{hf_attention.KWARG: step})
        last = torch.tensor(lengths, device=dev).cumsum(0) - 1
        return out.last_hidden_state[0, last]

    def _logits(self, hidden: Tensor) -> Tensor:
        return self.head(hidden).float()

    def _sample(self, rows: list[Row], logits: Tensor, version: int) -> None:
        """The first token of newly admitted rows (the decode step samples the others)."""
        dev = logits.device
        s = [r.sampling for r in rows]
        tokens, logps = hf_sampling.sample_rows(
            logits, torch.tensor([x.temperature for x in s], device=dev, dtype=torch.float32),
            torch.tensor([x.top_p for x in s], device=dev, dtype=torch.float32),
            torch.tensor([x.top_k for x in s], device=dev, dtype=torch.long),
            torch.tensor([r.key for r in rows], device=dev, dtype=torch.long),
            torch.tensor([len(r.tokens) for r in rows], device=dev, dtype=torch.long), *hf_sampling.flags(s))
        self._add(rows, *torch.stack([tokens.double(), logps.double()]).tolist(), version)

    def _add(self, rows: list[Row], tokens: list[float], logps: list[float], version: int) -> None:
        eos, limit = self.eos, self.cache.max_len
        for r, t, lp in zip(rows, tokens, logps):
            r.add(int(t), lp, version, eos, limit)

    # ---- scheduling --------------------------------------------------------------------------
    @torch.inference_mode()
    def admit(self, groups: list[list[Row]], version: int) -> list[Row]:
        """Start groups of rows, each group sharing one prompt (one prefill per group); returns
        the rows that finished on their first token."""
        first = len(self.rows)
        slots, seqs, at = [], [], first
        for g in groups:
            slots.append(at)
            seqs.append(g[0].prompt)
            at += len(g)
        if at > self.cache.slots:
            raise ValueError(f"{at - first} rows do not fit the {self.free} free slots")
        with self.steps.prefill_threads():
            hidden = torch.cat([self._prefill(seqs[i:j], slots[i:j])
                                for i, j in _chunks([len(q) for q in seqs], self._budget())])
        fan = [(s, d, len(g[0].prompt)) for g, s in zip(groups, slots) for d in range(s + 1, s + len(g))]
        if fan:  # each prompt's KV to the other n-1 slots of its request, every group at once
            self.cache.copy_many([f[0] for f in fan], [f[1] for f in fan], max(f[2] for f in fan))
        logits = self._logits(hidden).repeat_interleave(torch.tensor([len(g) for g in groups],
                                                                     device=hidden.device), dim=0)
        rows = [r for g in groups for r in g]
        for r in rows:
            r.version = version
        self._sample(rows, logits, version)
        self.steps.state.write(first, rows)
        self.rows.extend(rows)
        return self._retire()

    @torch.inference_mode()
    def step(self, version: int) -> list[Row]:
        """One decode step of every active row; returns the rows that finished."""
        if not self.rows:
            return []
        self._add(self.rows, *self.steps(self.rows), version)
        return self._retire()

    @torch.inference_mode()
    def recompute(self) -> None:
        """Rebuild every active row's KV with the weights loaded now (after a weight swap): the
        prompt and the tokens so far except the last, which the next step feeds."""
        seqs = [r.prompt + r.tokens[:-1] for r in self.rows]
        with self.steps.prefill_threads():
            for i, j in _chunks([len(q) for q in seqs], self._budget()):
                self._prefill(seqs[i:j], list(range(i, j)))

    def release(self) -> int:
        """Free every layer's KV slots (the engine sleeps); the rows in flight keep their tokens.
        Returns the bytes freed."""
        freed = sum(b.numel() * b.element_size() for kv in self.cache.kv.values() for b in kv)
        self.steps.reset()  # its graphs read the buffers freed here
        self.cache.kv.clear()
        return freed

    def restore(self) -> None:
        """After `release`: slots come back as the next forward writes them (hf_attention.Slots
        allocates on first use); the rows in flight get theirs recomputed now."""
        if self.rows:
            self.recompute()

    @torch.inference_mode()  # a moved row's KV is copied: the buffers are inference tensors
    def drop(self, keep) -> list[Row]:
        """Remove the rows for which keep(row) is false (e.g. cancelled requests)."""
        for r in self.rows:
            if not keep(r):
                r.finish = r.finish or "abort"
        return self._retire()

    def _retire(self) -> list[Row]:
        """Take the finished rows out; the survivors in slots past the new row count move into the
        freed slots below it (the last survivor into the first hole, as one row at a time would),
        every move at once: one gather and one scatter a KV buffer. Moving them one by one copied a
        survivor's KV per hole, and a step where every row finished (all at maxTokens) moved each row
        into the hole it was about to leave: 31 copies of 60 buffers for 32 rows of SmolLM2, 1.3-2.3 s
        of a 10 s generation on 2 busy cores."""
        done = [r for r in self.rows if r.finish is not None]
        if not done:
            return done
        n = len(self.rows) - len(done)
        holes = [i for i, r in enumerate(self.rows[:n]) if r.finish is not None]
        movers = [i for i in range(len(self.rows) - 1, n - 1, -1) if self.rows[i].finish is None]
        if movers:  # as many survivors past n as holes below it
            self.cache.copy_many(movers, holes, max(self.rows[i].position for i in movers))
            self.steps.state.move_many(movers, holes)
            for src, dst in zip(movers, holes):
                self.rows[dst] = self.rows[src]
        self.steps.state.clear_from(n, len(self.rows))
        del self.rows[n:]
        return done


def _chunks(lengths: list[int], budget: int) -> list[tuple[int, int]]:
    """Consecutive [i, j) runs of sequences totalling at most `budget` tokens (or one sequence)."""
    out, start, size = [], 0, 0
    for k, n in enumerate(lengths):
        if k > start and size + n > budget:
            out.append((start, k))
            start, size = k, 0
        size += n
    if lengths:
        out.append((start, len(lengths)))
    return out


def request_rows(request: Any, prompt: Sequence[int], n: int, sampling: SamplingParams, keys: Sequence[int],
                 first: int = 0) -> list[Row]:
    return [Row(request, first + i, list(prompt), sampling, keys[i], 0) for i in range(n)]


def noise_keys(sampling: SamplingParams, n: int, generator: Optional[torch.Generator] = None) -> list[int]:
    """Row keys of a request's n completions: from (seed, i) when seeded, else random."""
    if sampling.seed is not None:
        return [hf_sampling.row_key(sampling.seed, i) for i in range(n)]
    return torch.randint(0, 1 << 32, (n,), generator=generator).tolist()


def generate(model, prompts: Sequence[Sequence[int]], n: int, sampling: SamplingParams, *,
             eos_token_id: Optional[int], pad_token_id: Optional[int] = None, policy_version: int = 0,
             max_batch: int = 256) -> list[list[Completion]]:
    """Sample `n` completions for each prompt; returns one list of n completions per prompt. A
    completion that stopped on EOS keeps the EOS token (the policy must learn to stop). Prompt j
    is seeded sampling.seed + j when a seed is given; without one the noise comes from torch's
    global RNG. pad_token_id is accepted for callers of the padded implementation; rows are
    never padded."""
    if not prompts:
        return []
    limit = max(len(p) for p in prompts) + sampling.max_tokens
    dec = Decoder(model, slots=max(1, min(max_batch, len(prompts) * n)), max_len=limit,
                  eos_token_id=eos_token_id)
    waiting: list[list[Row]] = []
    for j, p in enumerate(prompts):
        s = sampling if sampling.seed is None else SamplingParams(
            sampling.temperature, sampling.top_p, sampling.top_k, sampling.max_tokens, sampling.seed + j)
        waiting.append(request_rows(j, p, n, s, noise_keys(s, n)))
    done: dict[tuple[int, int], Row] = {}
    while waiting or dec.rows:
        groups, free = [], dec.free
        while waiting and free:
            rows = waiting[0]
            take, rest = rows[:free], rows[free:]
            groups.append(take)
            free -= len(take)
            if rest:
                waiting[0] = rest
            else:
                waiting.pop(0)
        finished = dec.admit(groups, policy_version) if groups else []
        finished += dec.step(policy_version)
        done.update({(r.request, r.index): r for r in finished})
    return [[done[(j, i)].completion() for i in range(n)] for j in range(len(prompts))]
