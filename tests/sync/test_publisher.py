"""WeightPublisher and SyncAgent over a real TCPStore and real gloo groups: delivery, late joins,
trainer restarts, the checkpoint backend, peers that die or hang mid-broadcast; the shm path
between two processes, and backends that cannot reach a server."""
from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pytest
import torch

from grpojob.api.spec import WeightSyncSpec
from grpojob.sync.agent import SyncAgent
from grpojob.sync.placement import PlacementError
from grpojob.sync.protocol import DISK
from grpojob.sync.publisher import WeightPublisher

from ..rollout.harness import free_port, wait_for
from .peer import SHAPES, TOKEN, digest, reap, spawn, weights
from .sinks import TensorSink

pytestmark = pytest.mark.serial  # its slow tests are timing-sensitive: CI runs them alone


@pytest.fixture
def sync():
    return WeightSyncSpec(timeout_seconds=20, bucket_size_mb=1)


def publisher(sync, port=0, **kw) -> WeightPublisher:
    return WeightPublisher(sync, host="127.0.0.1", port=port, token=TOKEN, **kw)


@pytest.fixture
def agents():
    started = []

    def start(addr, replica, sink=None, **kw):
        sink = sink or TensorSink(SHAPES)
        a = SyncAgent(sink, addr, token=kw.pop("token", TOKEN), replica=replica, url=f"http://{replica}:1",
                      model_dir=kw.pop("model_dir", "x"), heartbeat_seconds=0.2, **kw).start()
        started.append(a)
        return a
    yield start
    for a in started:
        a.stop()


def _equal(sink, named) -> bool:
    return all(torch.equal(sink.tensors[n].cpu(), t) for n, t in named.items())


def test_push_reaches_every_server_and_they_report_ready(sync, agents):
    with publisher(sync, heartbeat_timeout=3) as pub:
        a, b = agents(f"127.0.0.1:{pub.port}", "a"), agents(f"127.0.0.1:{pub.port}", "b")
        wait_for(lambda: len(pub.rollout_addresses()) == 2 and a.ready() and b.ready(), 20, "registration")
        assert sorted(pub.rollout_addresses()) == ["http://a:1", "http://b:1"]  # version 0: the model dir
        for version in (1, 2):
            w = weights(version)
            stats = pub.push(w.items(), version=version)
            assert stats["servers"] == 2 and stats["dropped"] == [] and stats["buckets"] == 4
            assert stats["bytes"] == sum(t.numel() * 4 for t in w.values())
            assert sorted(stats["paths"]["gloo"]) == ["a", "b"] and stats["backend"] == "gloo"  # CPU to CPU
            assert _equal(a.sink, w) and _equal(b.sink, w)
            assert a.held[0] == b.held[0] == version and a.ready() and b.ready()
        assert [s["in_sync"] for s in pub.servers()] == [True, True]
        assert pub.backend_in_use() == "gloo"


def test_push_without_servers_is_kept_for_the_ones_that_come_later(sync, agents):
    with publisher(sync, heartbeat_timeout=3) as pub:
        w = weights(7)
        stats = pub.push(w.items(), version=3)
        assert stats["servers"] == 0 and stats["backend"] is None and pub.backend_in_use() is None
        late = agents(f"127.0.0.1:{pub.port}", "late")
        wait_for(lambda: late.ready() and pub.rollout_addresses() == ["http://late:1"], 20,
                 "the late server to catch up")
        assert _equal(late.sink, w) and late.held[0] == 3


def test_a_server_outlives_a_trainer_restart(sync, agents, tiny_dir):
    from grpojob.sync.tensorfiles import iter_dir

    port = free_port()
    disk = dict(iter_dir(tiny_dir))
    sink = TensorSink({n: t.shape for n, t in disk.items()})
    pub = publisher(sync, port, heartbeat_timeout=3)
    a = agents(f"127.0.0.1:{port}", "a", sink=sink, model_dir=str(tiny_dir))
    try:
        wait_for(a.ready, 20, "registration")
        pushed = {n: t + 1 for n, t in disk.items()}
        pub.push(pushed.items(), version=5)
        assert _equal(sink, pushed)
    finally:
        pub.close()
    wait_for(lambda: not a.ready(), 20, "the agent to notice the trainer is gone")
    assert "waiting for the trainer's weight-sync store" in a.not_ready_reason()

    # A fresh trainer (no checkpoint): version 0 is the model directory again, so the server,
    # which holds the old trainer's version 5, reloads it before it is ready.
    with publisher(sync, port, heartbeat_timeout=3) as pub2:
        wait_for(lambda: a.ready() and pub2.rollout_addresses() == ["http://a:1"], 30,
                 "re-registration with the new trainer")
        assert a.held == (0, DISK) and _equal(sink, disk)

    # A resuming trainer: nothing is current until it pushes the resumed weights.
    with publisher(sync, port, heartbeat_timeout=3, initial_version=None) as pub3:
        wait_for(lambda: len(pub3.servers()) == 1 and a.accepted, 30, "re-registration")
        assert not a.ready() and pub3.rollout_addresses() == []
        assert "not published a version yet" in a.not_ready_reason()
        resumed = {n: t * 2 for n, t in disk.items()}
        assert pub3.push(resumed.items(), version=40)["servers"] == 1
        assert a.ready() and a.held[0] == 40 and _equal(sink, resumed)


def test_checkpoint_backend_moves_weights_through_files(sync, agents, tmp_path):
    ckpt = sync.model_copy(update={"backend": "checkpoint"})
    with publisher(ckpt, checkpoint_dir=str(tmp_path), heartbeat_timeout=3) as pub:
        a = agents(f"127.0.0.1:{pub.port}", "a", checkpoint_dir=str(tmp_path))
        wait_for(a.ready, 20, "registration")
        for version in (1, 2, 3, 4):
            stats = pub.push(weights(version).items(), version=version)
            assert stats["servers"] == 1 and stats["backend"] == "checkpoint"
            assert stats["paths"] == {"checkpoint": ["a"]}
        assert _equal(a.sink, weights(4))
        kept = sorted(p.name for p in (tmp_path / "rollout-weights").iterdir())
        assert kept == ["v000000002", "v000000003", "v000000004"]
        late = agents(f"127.0.0.1:{pub.port}", "late", checkpoint_dir=str(tmp_path))
        wait_for(late.ready, 20, "the late server to load the newest version")
        assert _equal(late.sink, weights(4))


def test_a_server_that_cannot_load_is_named_and_dropped(sync, agents, caplog):
    with publisher(sync, heartbeat_timeout=3) as pub:
        ok = agents(f"127.0.0.1:{pub.port}", "ok")
        bad = agents(f"127.0.0.1:{pub.port}", "bad", sink=TensorSink({n: (3,) for n in SHAPES}))
        wait_for(lambda: ok.ready() and bad.ready(), 20, "registration")
        with caplog.at_level(logging.ERROR, logger="grpojob.sync"):
            stats = pub.push(weights(1).items(), version=1)
        assert stats["servers"] == 1 and stats["dropped"] == ["bad"]
        assert "rollout server 'bad' (http://bad:1) failed to load version 1" in caplog.text
        assert "does not fit this model" in bad.last_error
        assert pub.rollout_addresses() == ["http://ok:1"]


@pytest.mark.slow
def test_servers_that_die_or_hang_mid_broadcast_are_named_and_the_push_completes(sync, agents, caplog, tmp_path):
    """One server is SIGKILLed and one is SIGSTOPped while the buckets are in flight: the push
    names both, drops them and completes on the survivor (well within the 20 s timeout)."""
    with publisher(sync, heartbeat_timeout=2) as pub:
        addr = f"127.0.0.1:{pub.port}"
        survivor = agents(addr, "survivor")
        victims = [spawn("receiver", addr, name, mode, log_path=tmp_path / f"{name}.log")
                   for name, mode in (("crashes", "die"), ("hangs", "hang"))]
        try:
            wait_for(lambda: len(pub.rollout_addresses()) == 3, 60, "three servers")
            w = weights(1)
            start = time.monotonic()
            with caplog.at_level(logging.WARNING, logger="grpojob.sync"):
                stats = pub.push(w.items(), version=1)
            elapsed = time.monotonic() - start
            assert sorted(stats["dropped"]) == ["crashes", "hangs"] and stats["servers"] == 1
            assert elapsed < sync.timeout_seconds
            assert _equal(survivor.sink, w) and survivor.ready()
            assert pub.rollout_addresses() == ["http://survivor:1"]
            for name in ("crashes", "hangs"):
                assert f"rollout server '{name}' (http://{name})" in caplog.text
            assert "sent no heartbeat" in caplog.text
        finally:
            for v in victims:
                reap(v)


@pytest.mark.slow
def test_a_trainer_that_dies_mid_broadcast_fails_the_receivers_fast(agents, tmp_path):
    port_file = tmp_path / "port"
    trainer = spawn("publisher", str(port_file), "2", log_path=tmp_path / "trainer.log")
    try:
        port = int(wait_for(lambda: port_file.exists() and port_file.read_text(), 60, "the trainer's store",
                            proc=trainer))
        rx = [agents(f"127.0.0.1:{port}", f"r{i}") for i in range(2)]
        wait_for(lambda: all(a.held[0] == 1 for a in rx), 60, "version 1")
        trainer.wait(60)  # it kills itself in the middle of pushing version 2
        died = time.monotonic()
        wait_for(lambda: all(a.last_error for a in rx), 20, "the receivers to fail")
        assert time.monotonic() - died < 20  # the weightSync timeout of the job
        for a in rx:
            assert f"receiving weights version 2 from the trainer at 127.0.0.1:{port}" in a.last_error
            assert a.held[0] == 1 and _equal(a.sink, weights(1))  # a failed push never half-loads
        wait_for(lambda: not any(a.ready() for a in rx), 20, "not ready")
        assert "waiting for the trainer's weight-sync store" in rx[0].not_ready_reason()
    finally:
        reap(trainer)


def test_shm_moves_weights_to_another_process_without_a_collective(sync, tmp_path):
    """The same-host path for real: a receiver in another process reads the pushed buckets from
    /dev/shm (what CUDA IPC does on one GPU, here on the CPU)."""
    out = tmp_path / "loaded.json"
    with publisher(sync.model_copy(update={"backend": "shm"}), heartbeat_timeout=5) as pub:
        peer = spawn("serve", f"127.0.0.1:{pub.port}", "shm-peer", "cpu", str(out), log_path=tmp_path / "peer.log")
        try:
            wait_for(lambda: pub.rollout_addresses() == ["http://shm-peer"], 60, "the peer", proc=peer)
            assert pub.servers()[0]["routes"] == ["shm"] and pub.backend_in_use() == "shm"
            segments = set()
            for version in (1, 2):
                w = weights(version)
                stats = pub.push(w.items(), version=version)
                assert stats["servers"] == 1 and stats["paths"] == {"shm": ["shm-peer"]}
                assert json.loads(out.read_text()) == {"version": version, "digest": digest(w)}
                segments |= {p.name for p in Path("/dev/shm").glob(f"grpojob-{pub.run}-*.weights")}
            assert len(segments) == 1  # one segment, repacked for the second version
        finally:
            reap(peer)
    assert not list(Path("/dev/shm").glob(f"grpojob-{pub.run}*"))  # segment and probe are gone


def test_a_server_the_explicit_backend_cannot_reach_is_refused_and_told_why(sync, agents):
    """backend shm, and a server that cannot read the trainer's /dev/shm (here: the probe file is
    gone, as it would be on another host): refused at registration, named on both sides."""
    with publisher(sync.model_copy(update={"backend": "shm"}), heartbeat_timeout=3) as pub:
        Path(pub._probe["path"]).unlink()
        a = agents(f"127.0.0.1:{pub.port}", "far")
        wait_for(lambda: a.refused, 20, "the refusal")
        assert "spec.weightSync.backend: shm needs the trainer's host" in a.refused
        assert a.not_ready_reason().startswith("the trainer refused this server: spec.weightSync.backend")
        assert "far" in pub.refused() and pub.rollout_addresses() == [] and pub.servers() == []
        assert pub.push(weights(1).items(), version=1)["servers"] == 0
        time.sleep(1.0)
        assert not a.ready() and a.held[0] == 0


@pytest.mark.parametrize("backend", ["nccl", "cuda-ipc"])
def test_a_gpu_backend_on_a_cpu_trainer_is_refused_before_the_store_opens(sync, backend):
    with pytest.raises(PlacementError, match=f"spec.weightSync.backend: {backend} needs the trainer on a GPU"):
        publisher(sync.model_copy(update={"backend": backend}), device="cpu")


def test_a_full_dev_shm_fails_the_push_clearly_and_the_servers_go_on(sync, agents, monkeypatch):
    """/dev/shm without room (acted out: this machine's has room) is a setup error that reaches the
    trainer; the servers skip the command that never came and take the next push."""
    from grpojob.sync import handoff

    with publisher(sync.model_copy(update={"backend": "shm"}), heartbeat_timeout=3) as pub:
        a = agents(f"127.0.0.1:{pub.port}", "a")
        wait_for(a.ready, 20, "registration")
        real = handoff.ShmSegment.__init__

        def full(self, path, layout):
            raise handoff.ShmFull(f"weightSync.backend shm: no room for 4 MiB in {path.parent}")
        monkeypatch.setattr(handoff.ShmSegment, "__init__", full)
        with pytest.raises(handoff.ShmFull, match="no room"):
            pub.push(weights(1).items(), version=1)
        monkeypatch.setattr(handoff.ShmSegment, "__init__", real)
        assert pub.push(weights(2).items(), version=2)["servers"] == 1
        assert a.held[0] == 2 and _equal(a.sink, weights(2)) and a.ready()


@pytest.mark.parametrize("backend", ["gloo", "shm", "checkpoint"])
def test_a_stream_is_pushed_bucket_by_bucket_without_holding_the_weights(sync, agents, tmp_path, backend):
    """What a trainer pushes: a TensorStream whose every tensor is a fresh copy made when it is
    asked for (as DTensor.full_tensor() gathers one from the shards). The publisher packs them
    bucket by bucket, in the stream's order, and drops each bucket's tensors once packed: the
    stream's own count of live produced tensors never exceeds one bucket (plus one tensor)."""
    from grpojob.sync.stream import TensorStream

    one = sync.model_copy(update={"backend": backend})
    kw = {"checkpoint_dir": str(tmp_path)} if backend == "checkpoint" else {}
    with publisher(one, heartbeat_timeout=3, **kw) as pub:
        a = agents(f"127.0.0.1:{pub.port}", "a", **kw)
        wait_for(a.ready, 20, "registration")
        for version in (1, 2):
            w = weights(version)
            asked = []

            def fetch(name, w=w, asked=asked):
                asked.append(name)
                return w[name].clone()
            stream = TensorStream([(n, t.shape, t.dtype) for n, t in w.items()], fetch)
            stats = pub.push(stream, version=version)
            assert stats["servers"] == 1 and stream.exhausted and asked == list(w)
            assert _equal(a.sink, w) and a.held[0] == version
            bucket = 2**20  # sync's bucketSizeMb; 16 tensors of 256 KiB: 4 buckets of 4
            tensor = 256 * 256 * 4
            assert stats["buckets"] == 4 and stats["bytes"] == 16 * tensor
            assert stats["gathered_peak_bytes"] <= bucket + tensor, stats
            assert 1 <= stats["gathered_peak_tensors"] <= 5
            assert stream.live_tensors == 0 and stream.live_bytes == 0


def test_a_stream_is_announced_and_taken_in_dtype_groups():
    """Mixed dtypes: the stream orders its specs by dtype (first appearance), the order the
    layout's buckets take, and refuses to be taken out of that order."""
    from grpojob.sync import buckets as bk
    from grpojob.sync.stream import TensorStream

    named = {"a": torch.zeros(4), "step": torch.zeros((), dtype=torch.int64), "b": torch.ones(4)}
    stream = TensorStream.of(named.items())
    assert [n for n, _, _ in stream.specs] == ["a", "b", "step"]
    assert bk.plan(stream.specs, 1 << 20).names == ["a", "b", "step"]
    with pytest.raises(RuntimeError, match="asked for 'b', next is a"):
        stream.take("b")
    assert [n for n, _ in stream] == ["a", "b", "step"] and stream.exhausted


def test_a_server_that_leaves_is_dropped_at_once_and_the_next_push_goes_on_without_it(sync, agents, caplog):
    """SyncAgent.leave (a rollout server scaled down): the publisher drops it at its next scan, long
    before its heartbeats would run out (heartbeat_timeout 60 here), so the push after it neither
    names it nor waits for it; the agent does not register again."""
    caplog.set_level(logging.INFO, logger="grpojob.sync")
    with publisher(sync, heartbeat_timeout=60) as pub:
        a, b = agents(f"127.0.0.1:{pub.port}", "a"), agents(f"127.0.0.1:{pub.port}", "b")
        wait_for(lambda: len(pub.rollout_addresses()) == 2 and a.ready() and b.ready(), 20, "registration")
        b.leave("scaled down")
        wait_for(lambda: pub.rollout_addresses() == ["http://a:1"], 5, "the publisher dropping b")
        stats = pub.push(weights(1).items(), version=1)
        assert stats["servers"] == 1 and stats["dropped"] == [] and stats["paths"]["gloo"] == ["a"]
        assert _equal(a.sink, weights(1)) and b.held[0] == 0
        time.sleep(1.0)  # (a registration again would show within a scan of 0.25 s)
        assert [s["replica"] for s in pub.servers()] == ["a"]
    assert any("'b'" in r.getMessage() and "left the weight-sync group (scaled down)" in r.getMessage()
               for r in caplog.records), caplog.text
    assert not any("sent no heartbeat" in r.getMessage() for r in caplog.records)
