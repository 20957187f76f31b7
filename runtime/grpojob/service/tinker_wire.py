"""Tinker's binary wire as the training service takes it (service.tinker_api): the protobuf
messages of the `tinker` SDK (its generated module tinker.proto.tinker_public_pb2, from the
`tinker` extra; nothing of it is copied here), turned into grpojob.api.service's models and back.
No torch.

    forward_backward request   application/x-protobuf, zstd when the client config says so
    forward_backward answer    ForwardBackwardOutput: one ArrayRecord, `logprobs` per datum
    sample answer              SampleResponse: tokens int32, logprobs float32, prompt logprobs
"""
from __future__ import annotations

import math
from typing import Any, Optional

import numpy as np
from pydantic import ValidationError

from grpojob.api.service import ForwardBackwardInput
from grpojob.leader.trajectories.wire import describe
from grpojob.service.wire import Limits, Refused, check_limits

def pb() -> Any:
    """The SDK's generated protobuf module (ImportError without the `tinker` extra)."""
    from tinker.proto import tinker_public_pb2
    return tinker_public_pb2


def _tensor(t: Any, where: str) -> dict[str, Any]:
    """A loss input as grpojob.api.service.TensorData's fields (1-D dense float32 or int64)."""
    p = pb()
    if t.WhichOneof("encoding") == "sparse_csr":
        raise Refused(400, f"{where}: sparse tensors are not supported (send it dense)")
    kinds = {p.DTYPE_FLOAT32: (np.float32, "float32"), p.DTYPE_INT64: (np.int64, "int64")}
    if t.dtype not in kinds:
        raise Refused(400, f"{where}: dtype {p.DType.Name(t.dtype)} is not taken (float32 or int64)")
    np_dtype, name = kinds[t.dtype]
    values = np.frombuffer(t.dense, dtype=np_dtype).tolist()
    return {"data": values, "dtype": name, "shape": list(t.shape) or None}


def _config(msg: Any) -> Optional[dict[str, float]]:
    """loss_fn_config: the v2 map when the client wrote it (numbers only), else the legacy one."""
    if msg.loss_fn_config_v2:
        out = {}
        for k, v in msg.loss_fn_config_v2.items():
            if v.WhichOneof("value") != "number":
                raise Refused(400, f"loss_fn_config.{k}: a text value; the losses take numbers only")
            out[k] = v.number
        return out
    return dict(msg.loss_fn_config) or None


def decode_forward_backward(body: bytes, encoding: Optional[str], limits: Limits
                            ) -> tuple[str, ForwardBackwardInput, bool]:
    """(model_id, the call as grpojob.api.service validates it, forward_only) of a protobuf
    ForwardBackwardRequest; Refused (400) naming what is wrong."""
    if encoding == "zstd":
        import zstandard
        try:
            body = zstandard.ZstdDecompressor().decompressobj().decompress(body)
        except zstandard.ZstdError as e:
            raise Refused(400, f"body: not zstd ({e})") from None
    elif encoding not in (None, "", "identity"):
        raise Refused(400, f"Content-Encoding {encoding}: only zstd is taken")
    msg = pb().ForwardBackwardRequest()
    try:
        msg.ParseFromString(body)
    except Exception as e:  # noqa: BLE001 - protobuf's DecodeError and its kin
        raise Refused(400, f"body: not a tinker ForwardBackwardRequest ({e})") from None
    data = []
    for i, d in enumerate(msg.data):
        tokens: list[int] = []
        for j, chunk in enumerate(d.model_input):
            kind = chunk.WhichOneof("chunk")
            if kind != "encoded_text":
                raise Refused(400, f"data[{i}].model_input.chunks[{j}]: {kind} chunks are not supported "
                              f"(text tokens only)")
            tokens += np.frombuffer(chunk.encoded_text.tokens, dtype=np.int32).tolist()
        inputs = {k: _tensor(t, f"data[{i}].loss_fn_inputs.{k}") for k, t in d.loss_fn_inputs.items()}
        data.append({"model_input": {"chunks": [{"type": "encoded_text", "tokens": tokens}]},
                     "loss_fn_inputs": inputs})
    try:
        req = ForwardBackwardInput.model_validate({"data": data, "loss_fn": msg.loss_fn,
                                                   "loss_fn_config": _config(msg)})
    except ValidationError as e:
        raise Refused(400, describe(e)) from None
    check_limits(req, limits)
    return msg.model_id, req, msg.forward_only


def encode_forward_backward(result: dict[str, Any]) -> bytes:
    """The training service's forward/forward_backward answer as a protobuf ForwardBackwardOutput."""
    p = pb()
    out = p.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord")
    for k, v in result.get("metrics", {}).items():
        out.metrics[k] = float(v)
    datums = result.get("loss_fn_outputs") or []
    if datums:
        record = out.loss_fn_outputs.add()
        record.num_datums = len(datums)
        for name in datums[0]:
            arrays = [np.asarray(d[name]["data"], dtype=np.float32) for d in datums]
            offsets = np.concatenate([[0], np.cumsum([a.nbytes for a in arrays])]).astype(np.int64)
            field = record.fields[name]
            field.data = b"".join(a.tobytes() for a in arrays)
            field.offsets = offsets.tobytes()
            field.dtype = p.DTYPE_FLOAT32
    return out.SerializeToString()


def encode_sample(sequences: list[tuple[list[int], list[float], str]], prompt_logprobs: Optional[list[float]]
                  ) -> bytes:
    """(tokens, logprobs, stop reason "stop" | "length") per sequence, and the prompt's logprobs
    (NaN where none), as a protobuf SampleResponse."""
    p = pb()
    reasons = {"stop": p.STOP_REASON_STOP, "length": p.STOP_REASON_LENGTH}
    out = p.SampleResponse()
    for tokens, logprobs, reason in sequences:
        out.sequences.add(stop_reason=reasons[reason], tokens=np.asarray(tokens, dtype=np.int32).tobytes(),
                          logprobs=np.asarray(logprobs, dtype=np.float32).tobytes())
    if prompt_logprobs is not None:
        out.prompt_logprobs = np.asarray(prompt_logprobs, dtype=np.float32).tobytes()
    return out.SerializeToString()


def with_last_n(logprobs: list[float], last_n: Optional[int]) -> list[float]:
    """Prompt logprobs with only the last `last_n` scored (NaN before), as prompt_logprobs_last_n asks."""
    if last_n is None:
        return logprobs
    return [math.nan] * (len(logprobs) - last_n) + logprobs[len(logprobs) - last_n:]
