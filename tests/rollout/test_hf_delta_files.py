"""The hf engine's side of delta versions on files (`hf_requests.delta_swap` and `write`): a delta
applies only onto the weights it was taken against, names only the model's tensors with positions
inside them, and lands bit for bit, also in a parameter that is not contiguous."""
from __future__ import annotations

import pytest
import torch

from grpojob.rollout.hf_requests import Swap, delta_swap, write
from grpojob.sync import files


@pytest.fixture
def params():
    g = torch.Generator().manual_seed(0)
    return {"w": torch.randn(4, 6, generator=g), "t": torch.randn(6, 4, generator=g).t(), "b": torch.randn(3, generator=g)}


def save(root, changes, whole=None, base="run:1"):
    rel, _ = files.save_delta(root, 2, base, changes, (whole or {}).__getitem__)
    return str(root / rel)


def test_a_delta_lands_bit_for_bit_in_contiguous_and_strided_parameters(params, tmp_path):
    assert not params["t"].is_contiguous()  # a transposed view: written through a flat copy
    want = {n: p.clone() for n, p in params.items()}
    changes = {}
    for n, pos in (("w", [0, 7, 23]), ("t", [1, 2, 19])):
        pos = torch.tensor(pos)
        val = torch.randn(len(pos))
        flat = want[n].reshape(-1).clone()  # row-major positions, as the trainer flattens its tensor
        flat[pos] = val
        want[n] = flat.view(want[n].shape)
        changes[n] = (pos, val)
    changes["b"] = None
    want["b"] = torch.tensor([1.0, 2.0, 3.0])
    named, got = delta_swap(save(tmp_path, changes, {"b": want["b"]}), params, "run:1", 2)
    written = write(params, Swap(named, 2, "run:2", changes=got))
    assert written == 3 + 3 + 3
    for n in params:
        assert torch.equal(params[n], want[n]), n


def test_a_delta_against_other_weights_or_outside_the_model_is_refused(params, tmp_path):
    ok = {"w": (torch.tensor([1]), torch.tensor([0.5]))}
    with pytest.raises(ValueError, match="a delta against weights run:1; the engine holds run:9"):
        delta_swap(save(tmp_path / "a", ok), params, "run:9", 2)
    with pytest.raises(ValueError, match="tensors the model lacks: \\['nope'\\]"):
        delta_swap(save(tmp_path / "b", {"nope": (torch.tensor([0]), torch.tensor([1.0]))}), params, "run:1", 2)
    with pytest.raises(ValueError, match="positions of w lie outside its 24 values"):
        delta_swap(save(tmp_path / "c", {"w": (torch.tensor([24]), torch.tensor([1.0]))}), params, "run:1", 2)
    with pytest.raises(ValueError, match="shape"):
        delta_swap(save(tmp_path / "d", {"b": None}, {"b": torch.zeros(4)}), params, "run:1", 2)
