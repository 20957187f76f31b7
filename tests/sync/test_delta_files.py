"""Delta versions on files (backend checkpoint with weightSync.delta, `sync.filepush`): a server
whose engine declares `delta_files` and holds the previous version reads only what changed, and
after any number of versions holds the trainer's serving view bit for bit; a server that joins
late, restarts, missed a version or holds another base gets the version whole; an engine that
does not declare it gets every version whole, as before."""
from __future__ import annotations

import pytest
import torch

from grpojob.api.spec import WeightSyncSpec
from grpojob.rollout.engine import applies_file_deltas
from grpojob.sync import files, tensorfiles
from grpojob.sync.agent import SyncAgent
from grpojob.sync.publisher import WeightPublisher

from ..rollout.harness import wait_for
from .peer import SHAPES, TOKEN
from .sinks import DeltaFileSink, TensorSink
from .test_delta import Trainer, bitwise_equal, in_sync


@pytest.fixture
def agents(tmp_path):
    started = []

    def start(pub, replica, sink=None):
        sink = sink or DeltaFileSink(SHAPES)
        a = SyncAgent(sink, f"127.0.0.1:{pub.port}", token=TOKEN, replica=replica, url=f"http://{replica}:1",
                      model_dir="x", checkpoint_dir=str(tmp_path), heartbeat_seconds=0.2,
                      delta_files=applies_file_deltas(type(sink))).start()
        started.append(a)
        return a
    yield start
    for a in started:
        a.stop()


def publisher(root, delta: bool = True) -> WeightPublisher:
    sync = WeightSyncSpec(timeout_seconds=20, bucket_size_mb=1, backend="checkpoint", delta=delta)
    return WeightPublisher(sync, host="127.0.0.1", port=0, token=TOKEN, heartbeat_timeout=3, checkpoint_dir=str(root))


def dirs(root) -> list[str]:
    return sorted(p.name for p in (root / files.SUBDIR).iterdir())


def test_twenty_delta_versions_on_files_leave_every_server_bit_identical(agents, tmp_path):
    trainer = Trainer(5)
    with publisher(tmp_path) as pub:
        a, b = agents(pub, "a"), agents(pub, "b")
        wait_for(lambda: in_sync(pub, a, b), 20, "registration")
        for version in range(1, 21):
            trainer.step(3e-2 if version % 7 == 0 else 1e-4)  # every 7th step changes most values
            view = trainer.serving()
            stats = pub.push(view.items(), version=version)
            assert stats["servers"] == 2 and stats["backend"] == "checkpoint" and stats["dropped"] == []
            assert bitwise_equal(a.sink, view) and bitwise_equal(b.sink, view), f"version {version}"
            d = stats["delta"]
            if version > 1 and d["delta_buckets"] == stats["buckets"]:  # only what changed was written
                assert d["sent_bytes"] < d["dense_bytes"] / 2
                written = (tmp_path / files.SUBDIR / f"v{version:09d}-delta" / "delta.safetensors").stat().st_size
                assert written < stats["bytes"] / 2
        assert a.sink.kinds[0] == "whole" and "delta" in a.sink.kinds[1:] and a.sink.kinds == b.sink.kinds
        assert dirs(tmp_path)[-1] == "v000000020-delta"
        assert len({n[:10] for n in dirs(tmp_path)}) == files.KEEP  # the newest versions, whole or delta


def test_an_engine_without_delta_files_gets_every_version_whole_and_the_trainer_keeps_no_copy(agents, tmp_path):
    trainer = Trainer(6)
    with publisher(tmp_path) as pub:
        a = agents(pub, "a", TensorSink(SHAPES))
        wait_for(lambda: in_sync(pub, a), 20, "registration")
        for version in (1, 2, 3):
            trainer.step(1e-4)
            view = trainer.serving()
            stats = pub.push(view.items(), version=version)
            assert bitwise_equal(a.sink, view) and stats["delta"]["delta_buckets"] == 0
        assert dirs(tmp_path) == ["v000000001", "v000000002", "v000000003"]
        assert pub.delivery.retained.filled == set() and not pub.delivery.retained.media  # written from the stream


def test_a_late_joiner_a_restarted_server_and_one_that_missed_a_version_load_it_whole_first(agents, tmp_path):
    trainer = Trainer(7)
    with publisher(tmp_path) as pub:
        a = agents(pub, "a")
        wait_for(lambda: in_sync(pub, a), 20, "registration")
        for version in (1, 2, 3):
            trainer.step(1e-4)
            pub.push(trainer.serving().items(), version=version)
        assert a.sink.kinds == ["whole", "delta", "delta"] and dirs(tmp_path)[-1] == "v000000003-delta"
        late = agents(pub, "late")  # version 3 exists only as a delta: written whole from the trainer's copy
        wait_for(lambda: in_sync(pub, a, late), 20, "the late joiner to catch up")
        assert late.sink.kinds == ["whole"] and "v000000003" in dirs(tmp_path)
        assert bitwise_equal(late.sink, trainer.serving())

        late.sink.fail_next = True  # late misses version 4: dropped, it registers again
        trainer.step(1e-4)
        stats = pub.push(trainer.serving().items(), version=4)
        assert stats["dropped"] == ["late"]
        wait_for(lambda: in_sync(pub, a, late), 20, "late to be brought back")
        a.leave("restarting")  # the same replica comes back: a new process, nothing kept
        wait_for(lambda: len(pub.servers()) == 1, 20, "the publisher to drop the old one")
        restarted = agents(pub, "a")
        wait_for(lambda: in_sync(pub, restarted, late), 20, "the restarted server to catch up")
        trainer.step(1e-4)
        view = trainer.serving()
        stats = pub.push(view.items(), version=5)
        assert stats["servers"] == 2 and stats["delta"]["delta_buckets"] > 0
        assert late.sink.kinds[-2:] == ["whole", "delta"] and restarted.sink.kinds == ["whole", "delta"]
        assert bitwise_equal(late.sink, view) and bitwise_equal(restarted.sink, view)


def test_a_delta_on_files_is_never_applied_to_another_base(agents, tmp_path):
    """The agent's own check: a server holding other weights refuses the delta, and gets the
    version whole in the same push, without being dropped."""
    trainer = Trainer(8)
    with publisher(tmp_path) as pub:
        a = agents(pub, "a")
        wait_for(lambda: in_sync(pub, a), 20, "registration")
        trainer.step(1e-4)
        pub.push(trainer.serving().items(), version=1)
        a.held = (7, "another-run:7")  # it holds something the trainer does not know
        trainer.step(1e-4)
        view = trainer.serving()
        stats = pub.push(view.items(), version=2)
        assert "delta against" in a.last_error and "another-run:7" in a.last_error
        assert stats["servers"] == 1 and stats["dropped"] == [] and a.sink.kinds == ["whole", "whole"]
        assert bitwise_equal(a.sink, view) and a.ready()


def test_delta_off_writes_every_version_whole(agents, tmp_path):
    trainer = Trainer(9)
    with publisher(tmp_path, delta=False) as pub:
        a = agents(pub, "a")
        wait_for(lambda: in_sync(pub, a), 20, "registration")
        for version in (1, 2):
            trainer.step(1e-4)
            view = trainer.serving()
            stats = pub.push(view.items(), version=version)
            assert stats["delta"] is None and bitwise_equal(a.sink, view)
        assert a.sink.kinds == ["whole", "whole"] and dirs(tmp_path) == ["v000000001", "v000000002"]


def test_a_delta_directory_reads_back_what_was_written(tmp_path):
    pos = torch.tensor([0, 5, 7])
    val = torch.tensor([1.5, -0.0, 3.0], dtype=torch.bfloat16)
    whole = torch.arange(6, dtype=torch.bfloat16).reshape(2, 3)
    rel, nbytes = files.save_delta(tmp_path, 3, "run:2", {"a": (pos, val), "b": None}, {"b": whole}.__getitem__)
    d = files.read_delta(tmp_path / rel)
    assert d.base == "run:2" and set(d.changes) == {"a", "b"} and d.changes["b"] is None
    assert torch.equal(d.changes["a"][0], pos) and torch.equal(d.changes["a"][1].view(torch.int16), val.view(torch.int16))
    assert torch.equal(d.whole["b"], whole) and nbytes == 3 * 4 + 3 * 2 + 6 * 2
    with pytest.raises(ValueError, match="delta version"):  # a plain loader refuses it by name
        list(tensorfiles.iter_dir(tmp_path / rel))
