"""What the client refuses before anything is sent (grpojob.client's Tinker-shaped types): the same
field paths the service would name, and nothing silently changed on the way."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from grpojob.client import AdamParams, Datum, ModelInput, TensorData


def test_a_float_token_id_is_refused_never_truncated():
    with pytest.raises(ValidationError, match=r"data\[1\]: 2.7 is not an integer \(dtype int64\)"):
        TensorData.from_list([5, 2.7], "int64")
    with pytest.raises(ValidationError, match=r"loss_fn_inputs.target_tokens\n  data\[1\]: 2.7 is not an integer"):
        Datum(model_input=ModelInput.from_ints([5, 6, 7]), loss_fn_inputs={"target_tokens": [6, 2.7, 8]})
    assert TensorData.from_list([5, 7], "int64").data == [5, 7]


def test_a_plain_lists_error_names_its_input():
    with pytest.raises(ValidationError) as e:
        Datum(model_input=ModelInput.from_ints([5, 6, 7]), loss_fn_inputs={"advantages": [0.0, float("nan"), 1.0]})
    (err,) = e.value.errors()
    assert err["loc"] == ("loss_fn_inputs", "advantages") and err["msg"] == "data[1]: nan is not a finite number"
    d = Datum(model_input=ModelInput.from_ints([5, 6, 7]), loss_fn_inputs={"advantages": [0, 1, 2]})
    assert d.loss_fn_inputs["advantages"] == TensorData(data=[0.0, 1.0, 2.0], dtype="float32", shape=[3])


def test_adam_params_default_to_tinkers_and_none_keeps_the_optimizers():
    assert AdamParams().model_dump() == {"learning_rate": 1e-4, "beta1": 0.9, "beta2": 0.95, "eps": 1e-12,
                                         "weight_decay": 0.0, "grad_clip_norm": 0.0}
    assert AdamParams(learning_rate=1e-3, beta2=None, grad_clip_norm=None).beta2 is None


def test_tensor_data_to_and_from_numpy_and_torch():
    ints = TensorData.from_numpy(np.array([5, 6], dtype=np.int32))
    assert (ints.dtype, ints.data, ints.to_numpy().dtype) == ("int64", [5, 6], np.int64)
    floats = TensorData.from_torch(torch.tensor([0.5, -1.0], dtype=torch.float64))
    assert floats.dtype == "float32" and floats.to_torch().tolist() == [0.5, -1.0]
    assert floats.to_torch().dtype == torch.float32
    with pytest.raises(ValueError, match="2-D array: only 1-D"):
        TensorData.from_numpy(np.zeros((2, 2)))
    with pytest.raises(ValidationError, match="nan is not a finite number"):
        TensorData.from_numpy(np.array([1.0, np.nan]))
