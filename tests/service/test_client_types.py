"""What the client refuses before anything is sent (grpojob.client's Tinker-shaped types): the same
field paths the service would name, and nothing silently changed on the way."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from grpojob.client import Datum, ModelInput, TensorData


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
