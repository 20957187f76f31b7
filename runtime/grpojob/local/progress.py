"""The live view of a local run: a progress bar fed by the trainer's metrics.jsonl, and the
reward/KL curves (and the evaluation's, spec.evaluation) drawn at the end."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

from grpojob.checkpoint import objects

EVALUATION = "evaluation"  # the `kind` of an evaluation's row (grpojob.leader.evaluation.KIND); steps have none


def _rows(path: Path) -> list[dict[str, Any]]:
    """Complete JSON lines of metrics.jsonl (a line being written is skipped)."""
    if not path.exists():
        return []
    out: list[dict[str, Any]] = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def _replayed(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A step recorded again (a trainer that crashed and resumed from an earlier checkpoint)
    replaces the rows from that step on."""
    out: list[dict[str, Any]] = []
    for row in rows:
        step = row.get("step")
        while out and step is not None and out[-1].get("step") is not None and out[-1]["step"] >= step:
            out.pop()
        out.append(row)
    return out


def read_records(path: Path) -> list[dict[str, Any]]:
    """The training steps' rows of metrics.jsonl."""
    return _replayed([r for r in _rows(path) if r.get("kind") is None])


def read_evaluations(path: Path) -> list[dict[str, Any]]:
    """The evaluations' rows of metrics.jsonl (spec.evaluation), in the order they ended (one
    evaluated again after a resume replaces the later ones)."""
    return _replayed([r for r in _rows(path) if r.get("kind") == EVALUATION])


def newest_checkpoint(root: str | Path) -> Optional[str | Path]:
    """The newest complete checkpoint (what a resume starts from), in a directory or a store."""
    found = objects.committed(root)
    return found[-1][1] if found else None


def _fmt(record: dict[str, Any]) -> dict[str, str]:
    out = {}
    for key, label, fmt in (("reward_mean", "reward", "{:.3f}"), ("kl", "kl", "{:.4f}"),
                            ("tokens_per_second", "tok/s", "{:.0f}"),
                            # the pipeline: versions behind, trainer wait, generation idle, groups ahead
                            ("policy_staleness", "stale", "{:.2f}"), ("wait_seconds", "wait", "{:.2f}s"),
                            ("rollout_idle_fraction", "idle", "{:.0%}"), ("groups_in_flight", "ahead", "{}")):
        if record.get(key) is not None:
            out[label] = fmt.format(record[key])
    if record.get("groups_from_environments"):  # groups submitted by environments (trajectory API)
        out["env"] = str(record["groups_from_environments"])
    stages = record.get("stage_seconds") or {}
    if stages:
        out["stages"] = " ".join(f"{k[:3]}={v:.2f}s" for k, v in stages.items())
    for key, label in (("stage_host_peak_bytes", "host"), ("stage_device_peak_bytes", "gpu")):
        peaks = record.get(key) or {}  # peak memory per stage, in GiB
        if peaks:
            out[label] = " ".join(f"{k[:3]}={v / 2**30:.2f}G" for k, v in peaks.items())
    return out


class JsonlTail:
    """The whole lines appended to a JSON-lines file since the last call (a line still being written
    waits in the buffer), from the file's end at construction (a resumed run: new lines only)."""

    def __init__(self, path: Path):
        self.path = path
        self.offset = path.stat().st_size if path.exists() else 0
        self.buffer = ""

    def lines(self) -> list[str]:
        if not self.path.exists():
            return []
        with open(self.path) as f:
            f.seek(self.offset)
            chunk = f.read()
        self.offset += len(chunk.encode())
        self.buffer += chunk
        *lines, self.buffer = self.buffer.split("\n")
        return lines


class Progress:
    def __init__(self, metrics: Path, total: int, enabled: bool = True, out=None):
        self.metrics, self.total, self.enabled, self.out = metrics, total, enabled, out
        self.tail = JsonlTail(metrics)  # resumed runs: only new steps
        self.bar = None
        self.last_step = len(read_records(metrics))
        self.evaluation: dict[str, str] = {}  # the last evaluation's numbers, shown beside each step's

    def _new_records(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.tail.lines() if line.strip()]

    def update(self) -> None:
        for record in self._new_records():
            if record.get("kind") == EVALUATION:
                self.evaluation = {"eval": f"{record.get('reward_mean') or 0.0:.3f}@{record.get('step')}"}
                continue
            step = int(record.get("step", self.last_step + 1))
            if self.enabled:
                if self.bar is None:
                    from tqdm import tqdm

                    self.bar = tqdm(total=self.total, initial=self.last_step, unit="step", file=self.out,
                                    dynamic_ncols=True)
                self.bar.update(max(0, step - self.last_step))
                self.bar.set_postfix({**_fmt(record), **self.evaluation}, refresh=True)
            elif self.out is not None:
                shown = {**_fmt(record), **self.evaluation}
                print(f"step {step}/{self.total} " + " ".join(f"{k}={v}" for k, v in shown.items()),
                      file=self.out, flush=True)
            self.last_step = step
            failed = (record.get("extra") or {}).get("checkpoint_failed")
            if failed:
                self.note(f"step {step}: {failed}")

    def note(self, text: str) -> None:
        """A message for the user, above the bar when there is one."""
        if self.bar is not None:
            self.bar.write(text, file=self.out)
        elif self.out is not None:
            print(text, file=self.out, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def plot(records: list[dict[str, Any]], path: Path, evaluations: Optional[list[dict[str, Any]]] = None) -> None:
    """The training reward (and KL) by step; beside it the evaluation's mean reward on the held-out
    prompts at the steps it evaluated."""
    from matplotlib.figure import Figure  # no pyplot: no global state, so a thread may draw it

    steps = [r.get("step") for r in records]
    fig = Figure(figsize=(7, 4))
    ax = fig.subplots()
    ax.plot(steps, [r.get("reward_mean") for r in records], label="training reward", color="tab:blue")
    evaluated = sorted((e["step"], e["reward_mean"]) for e in evaluations or () if e.get("reward_mean") is not None)
    if evaluated:
        ax.plot(*zip(*evaluated), label="evaluation reward (held out)", color="tab:green", marker="o")
    ax.set_xlabel("step")
    ax.set_ylabel("reward")
    lines = ax.get_legend_handles_labels()
    if any(r.get("kl") is not None for r in records):
        ax2 = ax.twinx()
        ax2.plot(steps, [r.get("kl") for r in records], label="kl", color="tab:red", alpha=0.6)
        ax2.set_ylabel("kl")
        more = ax2.get_legend_handles_labels()
        lines = (lines[0] + more[0], lines[1] + more[1])
    if evaluated:
        ax.legend(*lines, loc="best", fontsize="small")
    ax.set_title("grpojob: reward" + (", evaluation" if evaluated else "") + " and KL")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
