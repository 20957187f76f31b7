"""spec.rollout.autoscale in `grpojob run` at unit level: the local scaler reads the trainer's step rows
from metrics.jsonl and starts or stops rollout server processes (fakes here: no process runs; the
pure rule's own cases are in tests/api/test_autoscale.py, a real run in test_autoscale_run.py)."""
from __future__ import annotations

import json
import signal
from pathlib import Path

from grpojob.api.autoscale import AutoscaleSpec, ScaleRule
from grpojob.local.autoscaler import DECISIONS_FILE, LocalAutoscaler, another_server
from grpojob.local.processes import Child
from grpojob.plan import ENV_REPLICA_ID, ENV_ROLLOUT_PORT

SPEC = AutoscaleSpec(min_replicas=1, max_replicas=3, scale_up=ScaleRule(steps=2, cooldown_seconds=30, max_change=1),
                     scale_down=ScaleRule(steps=1, cooldown_seconds=0, max_change=1))


class FakeServer(Child):
    def start(self) -> None:
        self.events.append(("start", self.name))

    def signal(self, sig: int) -> None:
        self.events.append((signal.Signals(sig).name, self.name))


def server(events, index: int, tmp_path: Path) -> FakeServer:
    c = FakeServer(f"rollout-{index}", ["grpojob", "rollout"], {ENV_REPLICA_ID: f"rollout-{index}",
                                                                ENV_ROLLOUT_PORT: "1", "KEEP": "x"},
                   tmp_path / "logs" / f"rollout-{index}.log")
    c.events = events
    return c


def write(run_dir: Path, *rows) -> None:
    with open(run_dir / "metrics.jsonl", "a") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def row(step, wait, idle, total=10.0):
    return {"step": step, "wait_seconds": wait, "step_seconds": total, "rollout_idle_fraction": idle,
            "groups_in_flight": 2, "policy_staleness": 0.0}


def test_up_after_two_steps_then_cooldown_then_down(tmp_path):
    events: list = []
    now = [100.0]
    made = []

    def make(template, index):
        c = another_server(template, index)
        fake = server(events, index, tmp_path)
        fake.env = c.env
        made.append(fake)
        return fake

    notes: list[str] = []
    scaler = LocalAutoscaler(SPEC, tmp_path, [server(events, 0, tmp_path)], make=make, note=notes.append,
                             clock=lambda: now[0])
    # the start-up step, then the step times a trial compares with (3: tests/api/test_autoscale.py)
    write(tmp_path, row(1, 8.0, 0.0), row(2, 8.0, 0.0), row(3, 8.0, 0.0))
    assert scaler.poll() == ([], []) and events == []
    # a half-written line is left for the next look; an evaluation's row is not a step
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"kind": "evaluation", "step": 3}) + "\n" + json.dumps(row(4, 8.0, 0.0))[:20])
    assert scaler.poll() == ([], [])
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write(json.dumps(row(4, 8.0, 0.0))[20:] + "\n")
    started, stopped = scaler.poll()
    assert [c.name for c in started] == ["rollout-1"] and stopped == [] and events == [("start", "rollout-1")]
    new = made[0]
    assert new.env[ENV_REPLICA_ID] == "rollout-1" and new.env["KEEP"] == "x"
    assert new.env[ENV_ROLLOUT_PORT] != "1", "a port of its own"
    assert notes[0].startswith("autoscale: ScaleUp: 1 -> 2 rollout servers: the trainer waits for groups over 20%")

    # 2 servers: 6 s a step, not 10 (step 5 left out: partly generated before); the trainer still waits
    write(tmp_path, row(5, 4.8, 0.0, 6.0), row(6, 4.8, 0.0, 6.0))  # within scaleUp.cooldownSeconds 30
    now[0] = 110.0
    assert scaler.poll() == ([], []) and scaler.state.replicas == 2
    now[0] = 131.0
    write(tmp_path, row(7, 4.8, 0.0, 6.0), row(8, 4.8, 0.0, 6.0), row(9, 4.8, 0.0, 6.0))  # it paid (+67%): on
    assert [c.name for c in scaler.poll()[0]] == ["rollout-2"]
    assert notes[1].startswith("autoscale: ScaleUpKept: the 1 -> 2 scale-up paid: 2 servers made a step 6.00 s against "
                               "10.00 s with 1 (+67% steps a second")

    write(tmp_path, row(10, 0.0, 0.9))  # idle: one step, no cool-down, one at a time: the newest goes
    started, stopped = scaler.poll()
    assert started == [] and [c.name for c in stopped] == ["rollout-2"] and events[-1] == ("SIGTERM", "rollout-2")
    write(tmp_path, row(11, 0.0, 0.9), row(12, 0.0, 0.9))
    assert [c.name for c in scaler.poll()[1]] == ["rollout-1"]  # then 1: minReplicas, and it stays
    assert [c.name for c in scaler.servers] == ["rollout-0"]
    write(tmp_path, row(13, 0.0, 0.9))
    assert scaler.poll() == ([], [])

    log = [json.loads(line) for line in (tmp_path / DECISIONS_FILE).read_text().splitlines()]
    assert [(d["step"], d["reason"], d["replicas"], d["started"], d["stopped"]) for d in log] == [
        (4, "ScaleUp", 2, ["rollout-1"], []), (8, "ScaleUpKept", 2, [], []), (9, "ScaleUp", 3, ["rollout-2"], []),
        (10, "ScaleDown", 2, [], ["rollout-2"]), (11, "ScaleDown", 1, [], ["rollout-1"])]


def test_a_scale_up_that_gave_nothing_stops_the_new_server_and_says_so(tmp_path):
    events: list = []
    notes: list[str] = []
    now = [100.0]
    spec = AutoscaleSpec(min_replicas=1, max_replicas=3, scale_up={"steps": 1, "cooldownSeconds": 0, "maxChange": 1,
                                                                   "minGain": 0.1, "backoffSeconds": 60})
    scaler = LocalAutoscaler(spec, tmp_path, [server(events, 0, tmp_path)], note=notes.append, clock=lambda: now[0],
                             make=lambda template, index: server(events, index, tmp_path))

    def steps(*rows):
        write(tmp_path, *({**r, "rollouts": [{"replica": f"rollout-{i}"} for i in range(n)]} for r, n in rows))
        return scaler.poll()

    assert steps((row(1, 4.0, 0.0, 5.0), 1)) == ([], [])  # the first step (start-up) is no step time to compare
    assert steps((row(2, 1.6, 0.0, 2.0), 1), (row(3, 1.6, 0.0, 2.0), 1)) == ([], [])
    assert [c.name for c in steps((row(4, 1.6, 0.0, 2.0), 1))[0]] == ["rollout-1"]
    # rollout-1 joins at step 6 (left out); steps 7-9 take 2.5 s against 2 s before: the servers share the cores
    assert steps((row(5, 1.6, 0.0, 2.0), 1), (row(6, 2.0, 0.0, 2.5), 2), (row(7, 2.0, 0.0, 2.5), 2),
                 (row(8, 2.0, 0.0, 2.5), 2)) == ([], [])
    started, stopped = steps((row(9, 2.0, 0.0, 2.5), 2))
    assert started == [] and [c.name for c in stopped] == ["rollout-1"] and events[-1] == ("SIGTERM", "rollout-1")
    assert notes[-1].startswith("autoscale: ScaleUpNoGain: 2 -> 1 rollout servers: 2 servers made a step 2.50 s "
                                "against 2.00 s with 1 (-20% steps a second; scaleUp.minGain 10%)")
    now[0] = 150.0  # the trainer waits as much as ever, but within the back-off: no server
    assert steps(*((row(k, 1.6, 0.0, 2.0), 1) for k in range(10, 14))) == ([], [])
    now[0] = 170.0
    assert [c.name for c in steps((row(14, 1.6, 0.0, 2.0), 1))[0]] == ["rollout-2"]  # then it tries again


def test_a_resumed_run_reads_only_new_steps(tmp_path):
    events: list = []
    write(tmp_path, row(1, 8.0, 0.0), row(2, 8.0, 0.0), row(3, 8.0, 0.0))
    scaler = LocalAutoscaler(SPEC, tmp_path, [server(events, 0, tmp_path)], note=lambda _: None)
    assert scaler.poll() == ([], [])
    assert scaler.state.last_step == -1
