"""Two gloo ranks under torchrun serve as one trainer: rank 0 takes the HTTP calls and broadcasts
each to rank 1, both compute their share (rank 1 with fewer micro-batches here, so it runs a dummy
one), and a forward_backward + optim_step ends where one rank alone does; a bad call in between is
refused and both keep serving; a suspend stops both after a checkpoint."""
from __future__ import annotations

import urllib.request

import pytest

from grpojob import auth
from grpojob.client import AdamParams, Datum, ModelInput, ServiceClient
from grpojob.api.service import ForwardBackwardInput
from grpojob.plan import Placement, roles
from grpojob.service.ops import ServiceOps
from grpojob.learner.trainer import GRPOTrainer
from tests.trainer.conftest import make_job, procs  # noqa: F401 - the fixture
from tests.trainer.test_main import _env

pytestmark = pytest.mark.slow
OVER = dict(mode="service", training={"microBatchTokens": 40})


def _data() -> list[Datum]:
    out = []
    for k in range(3):  # 24 tokens each: two never share a 40-token micro-batch
        tokens = [(7 * k + 3 * i) % 500 + 3 for i in range(25)]
        out.append(Datum(model_input=ModelInput.from_ints(tokens[:-1]),
                         loss_fn_inputs={"target_tokens": tokens[1:], "logprobs": [-6.0] * 24,
                                         "advantages": [0.0] * 12 + [1.0 - k] * 12}))
    return out


def _one_rank(tiny_dir) -> tuple[float, float, list[list[float]]]:
    ops = ServiceOps(GRPOTrainer(make_job(tiny_dir, **OVER)))
    _, fb = ops.forward_backward(ForwardBackwardInput(data=_data(), loss_fn="ppo"), backward=True)
    step = ops.optim_step(AdamParams(learning_rate=1e-2))
    after, _ = ops.forward_backward(ForwardBackwardInput(data=_data(), loss_fn="ppo"), backward=False)
    return fb["loss:sum"], step["grad_norm"], after


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_ranks_serve_as_one_trainer(tiny_dir, tmp_path, procs, strategy):
    job = make_job(tiny_dir, **{**OVER, "training": {**OVER["training"], "strategy": strategy}},
                   trainer={"processesPerReplica": 2})
    env, port = _env(job, tmp_path)
    cmd = roles(job, Placement("h", "c", "k", "r", token_file="t"))[0].command
    proc = procs(cmd, env, tmp_path / "torchrun.log")
    client = ServiceClient(f"http://127.0.0.1:{port}", auth.Auth.from_env(env).token)
    try:
        assert client.wait_ready(timeout=240).ranks == 2, proc.tail()
        training = client.create_training_client()
        fb = training.forward_backward(_data(), "ppo").result()
        bad = Datum(model_input=ModelInput.from_ints([5] * 60), loss_fn_inputs={"target_tokens": [5] * 60})
        with pytest.raises(Exception, match="more than training.microBatchTokens"):
            training.forward(data=[bad], loss_fn="cross_entropy").result()
        step = training.optim_step(AdamParams(learning_rate=1e-2)).result()
        after = training.forward(_data(), "ppo").result()
        assert training.save_weights_for_sampler().result().policy_version == 1
        saved = training.save_state().result()
    finally:
        client.close()
    loss, grad_norm, expected = _one_rank(tiny_dir)
    assert fb.metrics["loss:sum"] == pytest.approx(loss, rel=1e-5)
    assert step.metrics["grad_norm"] == pytest.approx(grad_norm, rel=1e-4)  # the global sum's gradient, not a mean
    for got, want in zip((o["logprobs"].data for o in after.loss_fn_outputs), expected):
        assert got == pytest.approx(want, abs=2e-5)
    assert saved.step == 1 and saved.path.endswith("step-000001")
    # suspend over HTTP (torchrun itself exits non-zero on SIGTERM): both ranks leave together
    urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/suspend", method="POST", data=b"",
                                                  headers=auth.Auth.from_env(env).headers()), timeout=10).close()
    assert proc.wait() == 0, proc.tail()
    assert "training service stopped" in proc.tail(20000)
