"""The training service's computation, run by every rank with the same request (spec.mode service):

    forward_backward: this rank's datums (i % world == rank) packed into micro-batches, the
        trainer's own log-probs (GRPOTrainer.compute_logprobs on the wrapped policy), Tinker's
        per-token loss from grpojob.algorithms.losses summed over tokens, backward. Gradients
        accumulate over calls until optim_step (DDP / FSDP reduce them at each call's last
        micro-batch, as the trainer's own step does).
    optim_step: the call's learning rate (and betas, eps, weight decay when given) into the
        optimizer, gradient clipping, one step; step and policy version + 1.

A datum is a span of its own in a packed row: it attends to its own earlier tokens only, and every
position i is scored against target_tokens[i].
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch
from torch import Tensor
from torch.distributed.tensor import DTensor

from grpojob.algorithms import losses
from grpojob.api.service import CLIPPED, AdamParams, ForwardBackwardInput
from grpojob.learner import dist, packing
from grpojob.learner.packing import MicroBatch, dummy
from grpojob.service.wire import Refused
from grpojob.learner.trainer import GRPOTrainer

# (datum index, model_input tokens, target_tokens, the other per-token loss inputs)
Item = tuple[int, list[int], list[int], dict[str, list[float]]]


@dataclass
class Packed:
    mb: MicroBatch
    datums: list[int]  # index of each datum, in token order
    lengths: list[int]
    inputs: dict[str, Tensor]  # per token [N]: the loss inputs other than target_tokens


def pack(items: Sequence[Item], budget: int, row_tokens: int, pad_id: int = 0, bucket: bool = False) -> list[Packed]:
    """Micro-batches holding every datum once (first-fit decreasing rows, as packing.plan lays
    out the trainer's own sequences); `bucket` pads shapes to powers of two (compiled kernels)."""
    if not items:
        return []
    lengths = [len(tokens) for _, tokens, _, _ in items]
    names = sorted(items[0][3])
    cap = packing.row_capacity(max(lengths), budget, row_tokens)
    out = []
    for layout in packing.plan(lengths, budget, row_tokens):
        width = max(sum(lengths[k] for k in row) for row in layout)
        rows, width = ((packing.bucket_size(len(layout), max(1, budget // cap)),
                        packing.bucket_size(width, cap, packing.BUCKET_MIN)) if bucket else (len(layout), width))
        ids = torch.full((rows, width), pad_id, dtype=torch.long)
        pos = torch.zeros((rows, width), dtype=torch.long)
        spans, token_index, targets, seq_index, order, lens = [], [], [], [], [], []
        values: dict[str, list[float]] = {k: [] for k in names}
        for r in range(rows):
            at = 0
            for k in layout[r] if r < len(layout) else []:
                index, tokens, target, inputs = items[k]
                n = len(tokens)
                ids[r, at:at + n] = torch.tensor(tokens)
                pos[r, at:at + n] = torch.arange(n)
                spans.append((r, at, 0, at, n))
                token_index.extend(range(r * width + at, r * width + at + n))
                targets.extend(target)
                seq_index.extend([len(order)] * n)
                for name in names:
                    values[name].extend(inputs[name])
                order.append(index)
                lens.append(n)
                at += n
            if at < width:  # tail padding: a span of its own
                pos[r, at:] = torch.arange(width - at)
                spans.append((r, at, 0, at, width - at))
        zeros = torch.zeros(len(token_index), dtype=torch.float32)
        mb = MicroBatch(input_ids=ids, position_ids=pos, spans=torch.tensor(spans, dtype=torch.long),
                        token_index=torch.tensor(token_index, dtype=torch.long),
                        targets=torch.tensor(targets, dtype=torch.long),
                        seq_index=torch.tensor(seq_index, dtype=torch.long), advantages=zeros, coef=zeros,
                        rollout_logp=zeros, seqs=order, n_tokens=sum(lens))
        out.append(Packed(mb, order, lens, {k: torch.tensor(v, dtype=torch.float32) for k, v in values.items()}))
    return out


def token_loss(req: ForwardBackwardInput, logp: Tensor, inputs: dict[str, Tensor]) -> tuple[Tensor, Optional[Tensor]]:
    """(per-token loss [N], clipped [N] or None) of Tinker's `req.loss_fn`, from our losses."""
    if req.loss_fn == "cross_entropy":
        return losses.nll_loss(logp, inputs.get("weights", torch.ones_like(logp))), None
    log_ratio = logp - inputs["logprobs"]  # against the policy that sampled
    if req.loss_fn == "importance_sampling":
        return losses.importance_sampling_loss(log_ratio, inputs["advantages"]), None
    if req.loss_fn == "dro":
        return losses.dro_loss(logp, log_ratio, inputs["advantages"], req.config("beta")), None
    low, high = req.config("clip_low_threshold"), req.config("clip_high_threshold")
    if req.loss_fn == "cispo":
        return losses.cispo_loss(logp, log_ratio, inputs["advantages"], low, high)
    return losses.ppo_clip_loss(log_ratio, inputs["advantages"], 1.0 - low, high - 1.0)


class ServiceOps:
    def __init__(self, trainer: GRPOTrainer, issue: Optional[Callable[[int], int]] = None):
        """`issue(current)`: the next policy version (the service's IssuedVersions.issue: never one
        handed out before); default current + 1."""
        self.tr = trainer
        self.issue = issue or (lambda v: v + 1)
        self.pending = 0  # forward_backward calls whose gradients no optim_step has used yet

    def forward_backward(self, req: ForwardBackwardInput, backward: bool) -> tuple[Optional[list[list[float]]],
                                                                                   dict[str, float]]:
        """(every datum's log-probs on rank 0, None elsewhere; the call's metrics). Collective."""
        tr, env = self.tr, self.tr.env
        mine: list[Item] = [(i, d.model_input.to_ints(), d.inputs("target_tokens"),
                             {k: d.inputs(k) for k in d.loss_fn_inputs if k != "target_tokens"})
                            for i, d in enumerate(req.data) if i % env.world == env.rank]
        budget = tr.spec.training.micro_batch_tokens
        packed: list[Optional[Packed]] = list(pack(mine, budget, tr.shape.row_tokens or budget, tr.pad_id,
                                                   tr.shape.bucket))
        n_mb = int(dist.all_max(torch.tensor([len(packed)]), env).item())
        packed += [None] * (n_mb - len(packed))  # every rank makes the same collective calls
        sums = torch.zeros(3, dtype=torch.float64)  # loss, tokens, clipped tokens
        logprobs: dict[int, list[float]] = {}
        with torch.enable_grad() if backward else torch.no_grad():
            for i, p in enumerate(packed):
                with dist.no_grad_sync(tr.policy, skip=not backward or i < n_mb - 1):
                    logp = tr.compute_logprobs(tr.policy, p.mb if p else dummy(tr.pad_id), False)[0]
                    clipped = None
                    if p is None:
                        loss = logp.sum() * 0.0  # connected to the graph: DDP / FSDP hooks still fire
                    else:
                        per_token, clipped = token_loss(req, logp, {k: v.to(logp.device) for k, v in p.inputs.items()})
                        loss = per_token.sum()
                    if backward:
                        # DDP / FSDP average gradients over ranks; the loss is a global sum: scale back up
                        (loss * env.world).backward()
                if p is not None:
                    sums += torch.tensor([float(loss.detach()), float(logp.numel()),
                                          float(clipped.sum()) if clipped is not None else 0.0], dtype=torch.float64)
                    flat = logp.detach().float().cpu().tolist()
                    at = 0
                    for index, n in zip(p.datums, p.lengths):
                        logprobs[index] = flat[at:at + n]
                        at += n
        sums = dist.all_sum(sums, env)
        if backward:
            self.pending += 1
        metrics = {"loss:sum": float(sums[0]), "tokens:sum": float(sums[1])}
        if req.loss_fn in CLIPPED:
            metrics["clip_fraction:mean"] = float(sums[2]) / max(float(sums[1]), 1.0)
        shares = dist.gather_objects(logprobs, env)
        if shares is None:
            return None, metrics
        merged = {k: v for share in shares for k, v in share.items()}
        return [merged[i] for i in range(len(req.data))], metrics

    def optim_step(self, p: AdamParams) -> dict[str, float]:
        """One optimizer step with the call's settings. Collective."""
        tr = self.tr
        if self.pending == 0:
            raise Refused(409, "no gradients to step with: call forward_backward first (optim_step uses the "
                          "gradients accumulated since the previous optim_step)", "no-gradients")
        for g in tr.optimizer.param_groups:
            g["lr"] = p.learning_rate
            if "betas" in g:
                b1, b2 = g["betas"]
                g["betas"] = (b1 if p.beta1 is None else p.beta1, b2 if p.beta2 is None else p.beta2)
            for key, value in (("eps", p.eps), ("weight_decay", p.weight_decay)):
                if value is not None and key in g:
                    g[key] = value
        clip = tr.spec.training.grad_clip if p.grad_clip_norm is None else p.grad_clip_norm
        params = [q for q in tr.policy.parameters() if q.requires_grad]
        gn = torch.nn.utils.clip_grad_norm_(params, clip or float("inf"))
        grad_norm = float(gn.full_tensor() if isinstance(gn, DTensor) else gn)
        self.pending = 0
        if not math.isfinite(grad_norm):
            tr.optimizer.zero_grad(set_to_none=True)
            raise Refused(422, f"non-finite gradient norm ({grad_norm}): no step taken and the accumulated "
                          f"gradients were dropped; check the advantages and logprobs sent", "non-finite")
        tr.optimizer.step()
        tr.optimizer.zero_grad(set_to_none=True)
        tr.step += 1
        tr.version = self.issue(tr.version)
        return {"grad_norm": grad_norm, "learning_rate": p.learning_rate, "step": float(tr.step),
                "policy_version": float(tr.version)}
