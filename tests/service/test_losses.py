"""The training service's losses are the trainer's own: on identical inputs, forward_backward gives
the trainer's log-probs and, for importance_sampling and ppo, the loss and the gradients of the
trainer's GRPO step (decoupled PPO at epoch 0: pi_old is the current policy, the behaviour weight
pi_old / pi_sampler corrects for the sampler); cross_entropy is the weighted NLL of those log-probs.
The per-token functions themselves are checked against hand-computed values."""
from __future__ import annotations

import math
import random

import pytest
import torch

from grpojob.algorithms import losses
from grpojob.api.service import Datum, ForwardBackwardInput, ModelInput
from grpojob.learner.packing import TrainSeq
from grpojob.service.ops import ServiceOps, token_loss
from grpojob.learner.trainer import GRPOTrainer
from tests.trainer.conftest import make_job


def test_the_per_token_losses_by_hand():
    logp = torch.tensor([-1.0, -2.0, -0.2])
    q = torch.tensor([-1.0, -2.5, -0.5])
    adv = torch.tensor([1.0, -2.0, 0.5])
    inputs = {"logprobs": q, "advantages": adv, "weights": torch.tensor([1.0, 0.0, 2.0])}
    data = [Datum(model_input=ModelInput.from_ints([1, 2, 3]), loss_fn_inputs={"target_tokens": [2, 3, 4]})]
    ratio = [math.exp(a - b) for a, b in zip(logp.tolist(), q.tolist())]  # 1, e^0.5, e^0.3

    ce, _ = token_loss(ForwardBackwardInput(data=data, loss_fn="cross_entropy"), logp, inputs)
    assert ce.tolist() == pytest.approx([1.0, 0.0, 0.4])
    is_, _ = token_loss(ForwardBackwardInput(data=_with(data, "importance_sampling"), loss_fn="importance_sampling"),
                        logp, inputs)
    assert is_.tolist() == pytest.approx([-1.0, 2.0 * ratio[1], -0.5 * ratio[2]])
    ppo, clipped = token_loss(ForwardBackwardInput(data=_with(data, "ppo"), loss_fn="ppo"), logp, inputs)
    # -min(A r, A clip(r, 0.8, 1.2)): r = 1.65 with A < 0 keeps the unclipped side; r = 1.35 with A > 0 the clip
    assert ppo.tolist() == pytest.approx([-1.0, 2.0 * ratio[1], -0.5 * 1.2])
    assert clipped.tolist() == [0.0, 0.0, 1.0]
    assert losses.importance_sampling_loss(torch.tensor([0.0]), torch.tensor([3.0])).item() == -3.0


def _with(data, loss_fn):
    d = data[0]
    extra = {"logprobs": [0.0] * 3, "advantages": [0.0] * 3}
    return [Datum(model_input=d.model_input, loss_fn_inputs={"target_tokens": d.inputs("target_tokens"), **extra})]


@pytest.fixture(scope="module")
def trainer(tiny_dir):
    return GRPOTrainer(make_job(tiny_dir, mode="service"))


def _seqs(trainer) -> list[TrainSeq]:
    rng = random.Random(0)
    seqs = []
    for g in range(3):  # groups of 2 completions sharing a prompt, as the trainer packs them
        prompt = [rng.randrange(3, 500) for _ in range(4 + g)]
        for _ in range(2):
            completion = [rng.randrange(3, 500) for _ in range(3 + rng.randrange(3))]
            seqs.append(TrainSeq(prompt, completion, [1] * len(completion), [0.0] * len(completion),
                                 advantage=rng.uniform(-1.5, 1.5), coef=1.0, group=g))
    current = trainer.token_logprobs(trainer.policy, seqs)
    for s, lp in zip(seqs, current):  # a sampler a little off the trainer: ratios within PPO's clip range
        s.rollout_logprobs = [x + rng.uniform(-0.05, 0.05) for x in lp]
    return seqs


def _grads(trainer) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in trainer.policy.named_parameters() if p.grad is not None}


def _datum(s: TrainSeq, advantage: bool = True) -> Datum:
    full, p = s.prompt_ids + s.completion_ids, len(s.prompt_ids)
    pad = [0.0] * (p - 1)
    inputs = {"target_tokens": full[1:], "logprobs": pad + s.rollout_logprobs,
              "advantages": pad + [s.advantage] * len(s.completion_ids)}
    return Datum(model_input=ModelInput.from_ints(full[:-1]), loss_fn_inputs=inputs)


def _compare(trainer, loss_fn: str, rtol: float, atol: float, grads_by_norm: bool = False) -> None:
    """grads_by_norm (bf16 compute): each gradient as a whole, ||got - expected|| <= rtol ||expected||;
    elementwise tolerances fail on the many near-zero entries bf16 rounds differently (the embedding's
    rows above all), while a wrong mask or loss is off by the gradient's whole size."""
    seqs = _seqs(trainer)
    # The trainer's own step (GRPOTrainer.optimize's epoch 0), with coefficient 1: a sum over tokens.
    trainer.optimizer.zero_grad(set_to_none=True)
    trainer_loss = 0.0
    for mb in trainer.shape.pack(seqs, trainer.spec.training.micro_batch_tokens, trainer.pad_id):
        logp, _ = trainer.compute_logprobs(trainer.policy, mb, False)
        mb.old_logp = logp.detach()
        loss, terms = trainer.loss_fn(logp, mb)
        assert terms.clipped.sum() == 0 and 0.9 < float(terms.is_weight.min()) <= float(terms.is_weight.max()) < 1.1
        loss.backward()
        trainer_loss += float(loss.detach())
    expected = _grads(trainer)

    trainer.optimizer.zero_grad(set_to_none=True)
    req = ForwardBackwardInput(data=[_datum(s) for s in seqs], loss_fn=loss_fn)
    logprobs, metrics = ServiceOps(trainer).forward_backward(req, backward=True)
    got = _grads(trainer)
    trainer.optimizer.zero_grad(set_to_none=True)

    assert metrics["loss:sum"] == pytest.approx(trainer_loss, rel=rtol, abs=atol)
    assert metrics["tokens:sum"] == sum(len(s.prompt_ids) + len(s.completion_ids) - 1 for s in seqs)
    assert expected.keys() == got.keys() and max(float(g.abs().max()) for g in expected.values()) > 1e-4
    if grads_by_norm:
        errors = {n: float((got[n] - expected[n]).float().norm() / expected[n].float().norm().clamp_min(1e-12))
                  for n in expected}
        assert max(errors.values()) <= rtol, {n: round(e, 4) for n, e in errors.items() if e > rtol}
    else:
        for name in expected:
            torch.testing.assert_close(got[name], expected[name], rtol=rtol, atol=atol, msg=name)
    # the outputs: the trainer's log-probs of every target, the completions' among them
    for s, lp, own in zip(seqs, logprobs, trainer.token_logprobs(trainer.policy, seqs)):
        assert len(lp) == len(s.prompt_ids) + len(s.completion_ids) - 1
        assert lp[len(s.prompt_ids) - 1:] == pytest.approx(own, rel=rtol, abs=max(atol, 1e-5))


@pytest.mark.parametrize("loss_fn", ["importance_sampling", "ppo"])
def test_policy_losses_and_gradients_match_the_trainers_step(trainer, loss_fn):
    _compare(trainer, loss_fn, rtol=1e-4, atol=1e-6)


@pytest.mark.gpu
def test_on_cuda_with_its_bucketed_shapes_and_bf16_compute(tiny_dir):
    """The CUDA shape (flex attention, bucketed micro-batches, bf16 autocast): each side packs its
    own way, so bf16 rounding differs a little."""
    from grpojob.learner import dist

    trainer = GRPOTrainer(make_job(tiny_dir, mode="service"), dist.DistEnv(device=torch.device("cuda", 0)))
    assert trainer.shape.bucket
    for loss_fn in ("importance_sampling", "ppo"):
        _compare(trainer, loss_fn, rtol=3e-2, atol=1e-4, grads_by_norm=True)


def test_cross_entropy_is_the_weighted_nll_of_the_trainers_logprobs(trainer):
    seqs = _seqs(trainer)
    data = []
    for s in seqs:
        d = _datum(s)
        n = d.model_input.length
        weights = [0.0] * (len(s.prompt_ids) - 1) + [1.0] * len(s.completion_ids)
        data.append(Datum(model_input=d.model_input,
                          loss_fn_inputs={"target_tokens": d.inputs("target_tokens"), "weights": weights[:n]}))
    ops = ServiceOps(trainer)
    logprobs, metrics = ops.forward_backward(ForwardBackwardInput(data=data, loss_fn="cross_entropy"), backward=False)
    own = trainer.token_logprobs(trainer.policy, seqs)
    assert metrics["loss:sum"] == pytest.approx(-sum(sum(lp) for lp in own), rel=1e-5)
    assert ops.pending == 0 and all(p.grad is None for p in trainer.policy.parameters())  # forward only
