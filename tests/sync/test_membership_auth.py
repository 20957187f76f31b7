"""Weight-sync membership is authenticated by the job's token (issue 15): processes without it are
refused at registration, logged with the address they declare, and never receive a tensor, while
the job's own servers keep receiving pushes; what the store still shows such a process, and what
it cannot do with it (forge commands, replay a registration, hold back the registrations)."""
from __future__ import annotations

import json
import logging
import time

import pytest

from grpojob.api.spec import WeightSyncSpec
from grpojob.sync import membership, protocol
from grpojob.sync.credentials import Credentials, Forged
from grpojob.sync.publisher import WeightPublisher

from ..rollout.harness import wait_for
from .peer import SHAPES, TOKEN, digest, reap, spawn, weights
from .test_publisher import _equal, agents  # noqa: F401 - the agents fixture

pytestmark = pytest.mark.serial  # its slow tests are timing-sensitive: CI runs them alone


@pytest.fixture
def pub():
    with WeightPublisher(WeightSyncSpec(timeout_seconds=20, bucket_size_mb=1), host="127.0.0.1", port=0,
                         token=TOKEN, heartbeat_timeout=3) as p:
        yield p


def test_credentials_bind_proofs_and_seals_to_the_token_the_incarnation_and_the_key():
    a, b = Credentials(TOKEN, "run-1"), Credentials(TOKEN, "run-2")
    doc = {"instance": "x-1", "url": "http://x:1", "version": 0}
    proof = a.proven(doc, a.prove(doc))
    assert proof and not b.proven(doc, a.prove(doc)), "a proof is for one trainer incarnation"
    assert not Credentials("other", "run-1").proven(doc, a.prove(doc))
    assert not a.proven({**doc, "url": "http://attacker:1"}, a.prove(doc)), "the proof covers every field"
    assert not a.proven(doc, None) and not a.proven(doc, 12)
    assert a.space != b.space and a.space != Credentials("other", "run-1").space
    assert TOKEN not in a.space and TOKEN not in a.seal(a.key("cmd", 1), {"kind": "noop"}) and TOKEN not in repr(a)
    sealed = a.seal(a.key("cmd", 1), {"kind": "noop"})
    assert a.unseal(a.key("cmd", 1), sealed) == {"kind": "noop"}
    with pytest.raises(Forged, match="not sealed with the job's token"):
        a.unseal(a.key("cmd", 2), sealed)  # moved to another key
    with pytest.raises(Forged):
        Credentials("other", "run-1").unseal(a.key("cmd", 1), sealed)
    with pytest.raises(Forged, match="not a sealed value"):
        a.unseal(a.key("cmd", 1), json.dumps({"kind": "load"}))


@pytest.mark.slow
def test_rogues_without_the_token_are_refused_logged_and_get_no_tensor(pub, tmp_path, caplog):
    """A rogue process with a wrong token (a real SyncAgent) and one with none (a hand-written
    registration) beside a real server in its own process: both refused and logged with the
    address they declare, told only "unauthorized", never a tensor; the real server gets both
    pushes, byte for byte."""
    addr = f"127.0.0.1:{pub.port}"
    outs = {name: tmp_path / f"{name}.json" for name in ("real", "rogue-wrong", "rogue-none")}
    caplog.set_level(logging.INFO, logger="grpojob.sync")
    procs = [spawn("serve", addr, "real", "cpu", str(outs["real"]), log_path=tmp_path / "real.log"),
             spawn("rogue", addr, "rogue-wrong", "wrong-token", str(outs["rogue-wrong"]),
                   log_path=tmp_path / "rogue-wrong.log"),
             spawn("rogue", addr, "rogue-none", "no-token", str(outs["rogue-none"]),
                   log_path=tmp_path / "rogue-none.log")]
    try:
        wait_for(lambda: pub.rollout_addresses() == ["http://real"] and len(pub.refused()) == 2, 60,
                 "the real server's registration and both refusals", proc=procs[0])
        for version in (1, 2):
            w = weights(version)
            stats = pub.push(w.items(), version=version)
            assert stats["servers"] == 1 and stats["paths"] == {"gloo": ["real"]}
            assert json.loads(outs["real"].read_text()) == {"version": version, "digest": digest(w)}
        assert [s["replica"] for s in pub.servers()] == ["real"]
        for name, why in (("rogue-wrong", "its proof was not made with the job's token"),
                          ("rogue-none", "the registration carries no proof of the job's token")):
            assert (f"rollout server '{name}' (declares http://{name}.attacker.example:8000) is refused: "
                    f"unauthorized: {why}") in caplog.text
            wait_for(lambda n=name: f"rogue {n}: refused: unauthorized\n" in (tmp_path / f"{n}.log").read_text(),
                     10, f"{name} told")
            assert not outs[name].exists(), f"{name} received weights"
        assert TOKEN not in caplog.text
    finally:
        for p in procs:
            reap(p)


def test_what_the_store_shows_a_rogue_and_what_it_cannot_do_with_it(pub, agents, caplog):  # noqa: F811
    """TCPStore authenticates nobody: a client lists every key, the private ones included (the
    NetworkPolicy is what keeps other pods away from it). Knowing the names is not enough: a
    forged command, a forged `current` and a replayed registration are ignored or refused, and
    the server keeps taking the real pushes."""
    a = agents(f"127.0.0.1:{pub.port}", "a")
    wait_for(a.ready, 20, "registration")
    rogue = protocol.connect(f"127.0.0.1:{pub.port}")
    keys = rogue.list_keys()
    space = pub.creds.space
    assert protocol.door("run") in keys and any(k.startswith(f"grpojob/{space}/") for k in keys)

    # A forged load command addressed to the server, and a forged current version.
    k = rogue.add(protocol.key(space, "cmd", "n"), 1)
    caplog.set_level(logging.ERROR, logger="grpojob.sync")
    rogue.set(protocol.key(space, "cmd", k), json.dumps(
        {"seq": k, "kind": "load", "version": 99, "weights": "evil", "path": None, "targets": [a.instance]}))
    wait_for(lambda: f"replica a: ignored {protocol.key(space, 'cmd', k)}: not a sealed value" in caplog.text,
             10, "the forged command to be ignored")
    rogue.set(protocol.key(space, "current"), json.dumps({"version": 99, "weights": "evil"}))
    time.sleep(0.5)
    assert a.held == (0, protocol.DISK) and a.last_error is None and a.ready(), "the forgeries took effect"

    # A copy of the server's own registration (it carries a valid proof) is refused as a replay.
    n = rogue.add(protocol.door("reg", "n"), 0)
    mine = next(json.loads(rogue.get(protocol.door("reg", i))) for i in range(1, n + 1)
                if json.loads(rogue.get(protocol.door("reg", i)))["instance"] == a.instance)
    i = rogue.add(protocol.door("reg", "n"), 1)
    rogue.set(protocol.door("reg", i), json.dumps({**mine, "url": "http://attacker:1"}))
    j = rogue.add(protocol.door("reg", "n"), 1)
    rogue.set(protocol.door("reg", j), json.dumps(mine))
    wait_for(lambda: "registered before (a replayed registration)" in caplog.text, 10, "the replay refused")
    assert "its proof was not made with the job's token" in caplog.text  # the altered copy
    assert [s["replica"] for s in pub.servers()] == ["a"]

    w = weights(3)
    assert pub.push(w.items(), version=3)["servers"] == 1
    assert _equal(a.sink, w) and a.held[0] == 3 and a.ready()
    assert set(SHAPES) == set(a.sink.tensors)


def test_a_client_that_only_takes_registration_numbers_holds_back_nobody(pub, agents, monkeypatch):  # noqa: F811
    monkeypatch.setattr(membership, "EMPTY_SLOT_SECONDS", 0.5)
    rogue = protocol.connect(f"127.0.0.1:{pub.port}")
    rogue.add(protocol.door("reg", "n"), 1_000_000)
    start = time.monotonic()
    a = agents(f"127.0.0.1:{pub.port}", "a")
    wait_for(lambda: a.accepted and pub.rollout_addresses() == ["http://a:1"], 20, "registration past the gap")
    assert time.monotonic() - start < 10
