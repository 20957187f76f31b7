"""A delta push over a collective path (sync.inband): per bucket a head (a header and room for a
payload), then the bucket whole, nothing, or the changes that did not fit in it; the servers get
the command before the trainer has compared anything."""
from __future__ import annotations

import datetime
import threading

import pytest
import torch
from torch.distributed import ProcessGroupGloo, TCPStore

from grpojob.sync import buckets as bk
from grpojob.sync import delta as dl
from grpojob.sync import group as grp
from grpojob.sync import inband
from grpojob.sync.protocol import Deadline, WeightSyncError
from grpojob.sync.stream import TensorStream

from ..rollout.harness import wait_for
from .test_delta import Trainer, agents, bitwise_equal, in_sync, publisher  # noqa: F401 - agents: a fixture


def two_ranks():
    """Rank 0 and rank 1 of one real gloo group, in this process."""
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    span = datetime.timedelta(seconds=30)
    pgs = [None, None]

    def make(rank):
        pgs[rank] = ProcessGroupGloo(TCPStore("127.0.0.1", store.port, is_master=False), rank, 2, span)
    threads = [threading.Thread(target=make, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return store, pgs


@pytest.mark.parametrize("inline, messages", [
    ([8] * 4, 4 + 1 + 0 + 1 + 1),  # bare headers (what a receiver without the command's sizes reads)
    ([8, 8, 4104, 4104], 4 + 1),  # both payloads inside their heads
    ([8, 8, 8 + 16 + 6, 8 + 16 + 23], 4 + 1 + 1),  # bucket 2's just fits (12 + 4 padding + 6), bucket 3's not
])
def test_each_bucket_arrives_whole_unchanged_or_changed_as_its_header_says(inline, messages):
    layout = bk.plan([(f"w{i}", (256,), torch.bfloat16) for i in range(3)] + [("f", (64,), torch.float64)], 512)
    assert [b.dtype for b in layout.buckets] == ["bfloat16"] * 3 + ["float64"]
    g = torch.Generator().manual_seed(0)
    old = [torch.randn(b.numel, generator=g).to(bk.torch_dtype(b.dtype)) for b in layout.buckets]
    new = [t.clone() for t in old]
    new[0] += 1  # goes whole
    changed = {2: torch.tensor([0, 7, 255]), 3: torch.tensor([1, 30, 63])}  # 3 int32 positions, then float64s
    for i, at in changed.items():
        new[i][at] = -new[i][at] - 3
    counts = [None, 0, 3, 3]
    arena = [torch.empty(b.numel, dtype=bk.torch_dtype(b.dtype)) for b in dl.arena_layout(layout).buckets]
    for i, at in changed.items():
        arena[2 * i][:len(at)] = at.to(arena[2 * i].dtype)
        arena[2 * i + 1][:len(at)] = new[i][at]
    store, (pg0, pg1) = two_ranks()
    received = [t.clone() for t in old]
    sender = grp.Transfer(pg0, inband.sent(layout, counts, new, arena, ready=lambda i: None, inline=inline))
    receiver = grp.Transfer(pg1, inband.received(layout, received, inline if inline != [8] * 4 else None))
    for t in (sender, receiver):
        t.wait(lambda: None, Deadline(30), "push")
    assert all(torch.equal(dl.bits(r), dl.bits(n)) for r, n in zip(received, new))
    assert len(sender.works) == len(receiver.works) == messages  # heads, whole, payloads that did not fit
    fig = dl.figures(layout, counts, inline)
    assert fig["sent_bytes"] == sum(inline) + layout.buckets[0].nbytes + sum(
        p for p, head in ((16 + 6, inline[2]), (16 + 24, inline[3])) if 8 + p > head)


def test_heads_have_room_for_a_quarter_more_than_the_last_push_changed():
    layout = bk.plan([("a", (1 << 22,), torch.bfloat16), ("b", (1 << 10,), torch.bfloat16)], 1 << 23)
    big, small = layout.buckets  # 8 MiB, 2 KiB
    first = inband.inline_sizes(layout, None)  # 1/1024 of the values, in 4 KiB steps, at most 1/64 of the bucket
    assert first == [8 + 32768, 8 + 4096]  # 4096 changes and a quarter more: 30 KiB
    assert inband.HEADER + inband.payload_bytes(big, 5120) <= first[0]
    after = inband.inline_sizes(layout, [1000, None])
    assert after[0] == 8 + 8192 and inband.HEADER + inband.payload_bytes(big, 1250) <= after[0]
    assert inband.inline_sizes(layout, [10**6, 0]) == [8 + big.nbytes // 64, 8]  # unchanged: a bare header


def test_a_header_past_its_bucket_is_a_clear_error():
    layout = bk.plan([("w", (16,), torch.float32)], 1 << 20)
    store, (pg0, pg1) = two_ranks()
    receiver = grp.Transfer(pg1, inband.received(layout, [torch.zeros(16)]))
    sent = pg0.broadcast([bk.wire(torch.tensor([17]))])  # what no trainer of ours sends
    with pytest.raises(WeightSyncError, match="push: a delta header says 17 values of a bucket of 16 changed"):
        receiver.wait(lambda: None, Deadline(30), "push")
    sent.wait()


def test_the_servers_get_a_collective_delta_push_before_the_trainer_has_compared(agents):  # noqa: F811 - the fixture
    """The command goes out first and the sizes follow in band: while the trainer still produces
    the first tensor of the push, every server has already started receiving it."""
    trainer = Trainer(5)
    with publisher("gloo") as pub:
        a, b = agents(pub, "a"), agents(pub, "b")
        wait_for(lambda: in_sync(pub, a, b), 20, "registration")
        for version in (1, 2, 3):  # whole, probe, then deltas
            trainer.step(1e-4)
            pub.push(trainer.serving().items(), version=version)
        trainer.step(1e-4)
        view = trainer.serving()
        seen = []

        def fetch(name):
            if not seen:  # the first tensor: the servers already hold the command
                seen.append(wait_for(lambda: len(a.sink.bases) == len(b.sink.bases) == 4, 10, "the command"))
            return view[name]
        stream = TensorStream([(n, tuple(t.shape), t.dtype) for n, t in view.items()], fetch, track=False)
        stats = pub.push(stream, version=4)
        assert a.sink.bases[-1] is not None and stats["delta"]["delta_buckets"] > 0
        assert bitwise_equal(a.sink, view) and bitwise_equal(b.sink, view)

