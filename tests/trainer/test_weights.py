"""The trainer's weights as a stream: Hugging Face names, tied weights once, the serving dtype,
and packed into buckets one bucket at a time (the gathered or converted tensors alive at once
never exceed a bucket and one tensor)."""
import torch

from grpojob.sync import buckets as bk
from grpojob.learner.trainer import GRPOTrainer

from .conftest import make_job


def test_the_weight_stream_is_packed_bucket_by_bucket(tiny_dir):
    tr = GRPOTrainer(make_job(tiny_dir))
    stream = tr.weight_stream(torch.bfloat16)
    names = [n for n, _, _ in stream.specs]
    assert names == list(tr.model.state_dict()) and all(dt == torch.bfloat16 for _, _, dt in stream.specs)
    bucket = 64 * 1024
    layout = bk.plan(stream.specs, bucket)
    assert len(layout.buckets) > 4
    packer = bk.Packer(layout, stream, {"host": [bk.allocate(b) for b in layout.buckets]})
    packer.finish()
    assert stream.exhausted and packer.done and stream.live_tensors == 0
    largest = max(t.numel() * 2 for t in tr.model.state_dict().values())
    assert 0 < stream.peak_bytes <= bucket + largest, (stream.peak_bytes, bucket, largest)
    packed = {n: t for b, buf in zip(layout.buckets, packer.media["host"]) for n, t in bk.unpack(b, buf)}
    for n, p in tr.model.state_dict().items():
        assert torch.equal(packed[n], p.to(torch.bfloat16)), n


def test_tied_weights_are_streamed_once_and_the_master_dtype_is_not_copied(tiny_tied_dir):
    tr = GRPOTrainer(make_job(tiny_tied_dir))
    stream = tr.weight_stream()
    names = [n for n, _, _ in stream.specs]
    assert "lm_head.weight" not in names and "model.embed_tokens.weight" in names
    assert len(names) == len(tr.model.state_dict()) - 1
    for name, t in stream:  # the parameters themselves: nothing gathered or converted to count
        assert t.data_ptr() == tr.model.state_dict()[name].data_ptr()
    assert stream.peak_bytes == 0
