"""A local run's ports: outside the range the kernel hands to outgoing connections (a source port
taken between choosing and listening failed CI with EADDRINUSE), and never twice."""
import socket

from grpojob.local.processes import _ephemeral_range, free_port


def test_ports_are_distinct_below_the_ephemeral_range_and_listenable():
    low, _ = _ephemeral_range()
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
    assert all(p < low for p in ports)
    for p in ports[:5]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))
            s.listen()


def test_a_port_in_use_is_not_chosen(monkeypatch):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        taken = busy.getsockname()[1]
        busy.listen()
        picks = iter([taken, *range(20000, 20200)])
        monkeypatch.setattr("grpojob.local.processes._ephemeral_range", lambda: (65535, 65535))
        monkeypatch.setattr("random.Random.randrange", lambda self, a, b: next(picks))
        assert free_port() != taken
