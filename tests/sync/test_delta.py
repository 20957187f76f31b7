"""Delta pushes (sync.delta): after any number of pushes every receiver holds the trainer's
serving view bit for bit; a server that joined late, restarted or missed a version gets a dense
base first, and a delta is never applied to another base."""
from __future__ import annotations

import pytest
import torch

from grpojob.api.spec import WeightSyncSpec
from grpojob.sync import buckets as bk
from grpojob.sync import delta as dl
from grpojob.sync.agent import SyncAgent
from grpojob.sync.publisher import WeightPublisher
from grpojob.sync.stream import TensorStream

from ..rollout.harness import wait_for
from .peer import SHAPES, TOKEN
from .sinks import TensorSink


class Trainer:
    """fp32 master weights, a real AdamW step between pushes, and the bf16 serving view it pushes."""

    def __init__(self, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.params = {n: torch.nn.Parameter(torch.randn(s, generator=g)) for n, s in SHAPES.items()}
        self.opt = torch.optim.AdamW(self.params.values(), lr=1e-4, weight_decay=0.0)

    def step(self, lr: float) -> None:
        for group in self.opt.param_groups:
            group["lr"] = lr
        loss = sum((p * torch.randn_like(p)).sum() for p in self.params.values())
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()

    def serving(self) -> dict[str, torch.Tensor]:
        return {n: p.detach().to(torch.bfloat16) for n, p in self.params.items()}


class RecordingSink(TensorSink):
    """Records, per push it received, the delta base the command named (None: sent whole)."""

    def __init__(self):
        super().__init__(SHAPES)
        self.bases: list = []
        self.fail_next = False

    def receive_push(self, cmd, store_addr, instance):
        self.bases.append((cmd.get("delta") or {}).get("base"))
        super().receive_push(cmd, store_addr, instance)
        if self.fail_next:  # after the transfer: the engine failed to load what arrived
            self.fail_next = False
            raise ValueError("this server failed to load a push (the test's doing)")


def bitwise_equal(sink: TensorSink, named: dict[str, torch.Tensor]) -> bool:
    return all(sink.tensors[n].dtype == t.dtype and torch.equal(dl.bits(sink.tensors[n].reshape(-1)),
                                                               dl.bits(t.reshape(-1))) for n, t in named.items())


@pytest.fixture
def agents():
    started = []

    def start(pub, replica, sink=None):
        a = SyncAgent(sink or RecordingSink(), f"127.0.0.1:{pub.port}", token=TOKEN, replica=replica,
                      url=f"http://{replica}:1", model_dir="x", heartbeat_seconds=0.2).start()
        started.append(a)
        return a
    yield start
    for a in started:
        a.stop()


def publisher(backend: str = "auto", delta: bool = True) -> WeightPublisher:
    sync = WeightSyncSpec(timeout_seconds=20, bucket_size_mb=1, backend=backend, delta=delta)
    return WeightPublisher(sync, host="127.0.0.1", port=0, token=TOKEN, heartbeat_timeout=3)


def in_sync(pub, *agents) -> bool:
    return len(pub.rollout_addresses()) == len(agents) and all(a.ready() for a in agents)


@pytest.mark.parametrize("backend", ["gloo", "shm"])
def test_twenty_delta_pushes_leave_every_receiver_bit_identical(backend, agents):
    trainer = Trainer()
    with publisher(backend) as pub:
        a, b = agents(pub, "a"), agents(pub, "b")
        wait_for(lambda: in_sync(pub, a, b), 20, "registration")
        kinds = set()
        for version in range(1, 21):
            trainer.step(3e-2 if version % 7 == 0 else 1e-4)  # every 7th step changes most values
            view = trainer.serving()
            stats = pub.push(view.items(), version=version)
            assert stats["servers"] == 2 and stats["backend"] == backend
            assert bitwise_equal(a.sink, view) and bitwise_equal(b.sink, view), f"version {version}"
            d = stats["delta"]
            kinds.add("delta" if d["delta_buckets"] else "dense")
            if version > 1 and d["delta_buckets"] == stats["buckets"]:
                assert d["sent_bytes"] < d["dense_bytes"] / 2
        assert kinds == {"delta", "dense"}  # both ways were taken, per bucket
        assert a.sink.bases[0] is None and a.sink.bases[1] is not None  # the first push is whole


WAYS = pytest.mark.parametrize("host", [True, False], ids=["host-numpy", "device-torch-way-on-cpu"])


@WAYS
def test_bits_decide_not_values(monkeypatch, host):
    """-0.0 against +0.0 and two NaN payloads are equal as floats but not as bits: they travel."""
    monkeypatch.setattr(dl, "CAP_DIVISOR", 4)  # 2 changes of 8 fit a delta
    layout = bk.plan([("w", (8,), torch.bfloat16)], 1 << 20)
    old = torch.tensor([0.0, 1.0, float("nan"), 2.0, 3.0, 4.0, 5.0, 6.0], dtype=torch.bfloat16)
    new = old.clone()
    new[0] = -0.0
    new.view(torch.int16)[2] = old.view(torch.int16)[2] | 1  # another NaN payload
    base = [old.clone()]
    arena = [torch.empty(b.numel, dtype=bk.torch_dtype(b.dtype)) for b in dl.arena_layout(layout).buckets]
    packer = dl.DeltaPacker(layout, TensorStream.of([("w", new)]), {"host": base}, base="host", based={"host"},
                            arenas={"host": arena}, host=host)
    packer.finish()
    assert packer.counts == [2] and arena[0][:2].tolist() == [0, 2]
    received = [old.clone()]
    dl.apply(packer.counts, received, arena)
    assert torch.equal(received[0].view(torch.int16), new.view(torch.int16))
    assert torch.equal(base[0].view(torch.int16), new.view(torch.int16))  # the trainer's base moved on too


def test_a_late_joiner_and_a_restarted_receiver_get_a_dense_base_first(agents):
    trainer = Trainer(1)
    with publisher() as pub:
        a = agents(pub, "a")
        wait_for(lambda: in_sync(pub, a), 20, "registration")
        for version in (1, 2, 3):
            trainer.step(1e-4)
            pub.push(trainer.serving().items(), version=version)
        late = agents(pub, "late")
        wait_for(lambda: in_sync(pub, a, late), 20, "the late joiner to catch up")
        assert late.sink.bases == [None]  # brought to version 3 whole
        trainer.step(1e-4)
        view = trainer.serving()
        pub.push(view.items(), version=4)
        assert late.sink.bases[-1] is not None and bitwise_equal(late.sink, view) and bitwise_equal(a.sink, view)

        a.leave("restarting")  # the same replica comes back: a new process, nothing kept
        wait_for(lambda: len(pub.servers()) == 1, 20, "the publisher to drop the old one")
        restarted = agents(pub, "a")
        wait_for(lambda: in_sync(pub, restarted, late), 20, "the restarted receiver to catch up")
        trainer.step(1e-4)
        view = trainer.serving()
        pub.push(view.items(), version=5)
        assert restarted.sink.bases == [None, pub.delivery.retained.base.weights]
        assert bitwise_equal(restarted.sink, view) and bitwise_equal(late.sink, view)


def test_a_receiver_that_missed_a_version_gets_it_whole(agents):
    trainer = Trainer(2)
    with publisher() as pub:
        a, b = agents(pub, "a"), agents(pub, "b")
        wait_for(lambda: in_sync(pub, a, b), 20, "registration")
        for version in (1, 2):
            trainer.step(1e-4)
            pub.push(trainer.serving().items(), version=version)
        b.sink.fail_next = True  # b misses version 3: dropped, it registers again
        trainer.step(1e-4)
        stats = pub.push(trainer.serving().items(), version=3)
        assert stats["dropped"] == ["b"]
        wait_for(lambda: in_sync(pub, a, b), 20, "b to be brought back")
        for version in (4, 5):
            trainer.step(1e-4)
            view = trainer.serving()
            pub.push(view.items(), version=version)
            assert bitwise_equal(a.sink, view) and bitwise_equal(b.sink, view)
        assert b.sink.bases[-3] is None  # the catch-up after the missed version was whole


def test_a_delta_is_never_applied_to_another_base(agents):
    """The receiver's own check: buffers holding another version refuse a delta, and the push is
    retried whole."""
    trainer = Trainer(3)
    with publisher() as pub:
        a = agents(pub, "a")
        wait_for(lambda: in_sync(pub, a), 20, "registration")
        trainer.step(1e-4)
        pub.push(trainer.serving().items(), version=1)
        a.sink._rx._held = "another-run:7"  # its buffers hold something the trainer does not know
        trainer.step(1e-4)
        base = pub.delivery.retained.weights
        stats = pub.push(trainer.serving().items(), version=2)
        assert "a delta against" in a.last_error and "another-run:7" in a.last_error
        assert stats["servers"] == 1 and stats["dropped"] == [] and a.sink.bases[-2:] == [base, None]
        assert bitwise_equal(a.sink, trainer.serving()) and a.ready()


def test_delta_off_sends_every_byte(agents):
    trainer = Trainer(4)
    with publisher(delta=False) as pub:
        a = agents(pub, "a")
        wait_for(lambda: in_sync(pub, a), 20, "registration")
        for version in (1, 2):
            trainer.step(1e-4)
            view = trainer.serving()
            stats = pub.push(view.items(), version=version)
            assert stats["delta"] is None and bitwise_equal(a.sink, view)
        assert a.sink.bases == [None, None]


@WAYS
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16, torch.uint8])
def test_both_ways_find_every_differing_bit_pattern_and_go_whole_past_the_capacity(host, dtype):
    """The comparison a GPU trainer runs (torch, the bucket at once) and the host's (numpy, tensor
    by tensor, 8-byte words first): every position whose bits differ, across tensors of one bucket,
    words with several changes and ragged tails included; past the arena's capacity the bucket goes
    whole. Either way every medium ends holding the new bits and the receiver's copy matches."""
    g = torch.Generator().manual_seed(0)
    sizes = {"a": 1003, "b": 517, "c": 64, "d": 128}  # c and d lie on whole 8-byte words
    olds = {n: (torch.rand(k, generator=g) * 200).to(dtype) for n, k in sizes.items()}
    layout = bk.plan([(n, (k,), dtype) for n, k in sizes.items()], 1 << 20)
    assert len(layout.buckets) == 1
    flips = {"a": [0, 1, 2, 3, 17, 500, 1000, 1002], "b": [5, 516], "c": [63], "d": [0, 1, 2, 3, 64, 127]}

    def push(flip: dict[str, list[int]]):
        news = {n: t.clone() for n, t in olds.items()}
        for n, at in flip.items():
            dl.bits(news[n])[torch.tensor(at)] ^= 1  # the lowest bit: no float tolerance would see it
        base = [torch.cat([olds[n] for n in sizes])]
        arena = [torch.empty(b.numel, dtype=bk.torch_dtype(b.dtype)) for b in dl.arena_layout(layout).buckets]
        packer = dl.DeltaPacker(layout, TensorStream.of(list(news.items())), {"host": base}, base="host",
                                based={"host"}, arenas={"host": arena}, host=host)
        packer.finish()
        want = torch.cat([news[n] for n in sizes])
        assert torch.equal(dl.bits(base[0]), dl.bits(want))
        received = [torch.cat([olds[n] for n in sizes])]
        dl.copy_handoff(packer.counts, received, base, arena)
        assert torch.equal(dl.bits(received[0]), dl.bits(want))
        return packer.counts, arena

    counts, arena = push(flips)
    offsets = {"a": 0, "b": 1003, "c": 1520, "d": 1584}
    expected = sorted(offsets[n] + i for n, at in flips.items() for i in at)
    assert counts == [len(expected)] and sorted(arena[0][:len(expected)].tolist()) == expected
    many = {"a": list(range(0, 1003, 4))}  # 251 changes > 1712 // 8 = 214: the bucket goes whole
    assert push(many)[0] == [None]
    assert push({})[0] == [0]


def test_by_tensor_names_each_changed_tensor_with_its_own_positions():
    """What an engine holding the base writes (sync.delta.by_tensor): per changed tensor its flat
    positions and values, in whatever order the bucket's changes came (odd tensors' last); a bucket
    that arrived whole names all its tensors whole; unchanged tensors are absent."""
    layout = bk.plan([("a", (3, 5), torch.bfloat16), ("b", (7,), torch.bfloat16), ("c", (4,), torch.bfloat16),
                      ("d", (9,), torch.float32)], 1 << 20)
    assert len(layout.buckets) == 2
    off = {e.name: e.offset for e in layout.buckets[0].entries}
    pos = torch.tensor([off["c"] + 3, off["a"] + 14, off["a"] + 0, off["c"] + 1])
    val = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.bfloat16)
    out = dl.by_tensor(layout, [(pos, val), None])
    assert sorted(out) == ["a", "c", "d"] and out["d"] is None
    assert out["a"][0].tolist() == [14, 0] and out["a"][1].tolist() == [2.0, 3.0]
    assert out["c"][0].tolist() == [3, 1] and out["c"][1].tolist() == [1.0, 4.0]
    only = dl.by_tensor(layout, [(pos[:0], val[:0]), (torch.tensor([8]), torch.tensor([5.0]))])
    assert list(only) == ["d"] and only["d"][0].tolist() == [8] and only["d"][1].tolist() == [5.0]
