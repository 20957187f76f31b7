"""The highest policy version the training service ever handed out, kept beside the checkpoints.

A policy version names one set of weights. The service issues one at every optim_step and at a
load_state that goes back in time; a checkpoint records the version of its weights, but versions
issued after the last checkpoint (a kill between optim_step and the next save, a Ctrl-C after a
load_state) would be issued again, for other weights, by a service that resumes from it. So the
highest version issued is written next to the checkpoints before the call that issued it answers,
and a resumed service goes on after it: a version is never handed out twice, across restarts,
load_state, suspend/resume and pod restarts (the file is on the checkpoint volume).
"""
from __future__ import annotations

import os
from pathlib import Path

from grpojob.learner import dist

FILE = "issued-policy-version"


class IssuedVersions:
    def __init__(self, root: Path, env: dist.DistEnv):
        self.path, self.env = Path(root) / FILE, env
        highest = 0
        if env.is_leader and self.path.exists():
            highest = int(self.path.read_text().strip() or 0)
        self.highest = int(dist.broadcast_object(highest, env))  # every rank issues the same numbers

    def issue(self, current: int) -> int:
        """The next version after `current` and after every version issued before (recorded)."""
        version = max(current, self.highest) + 1
        self.highest = version
        if self.env.is_leader:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(f".{FILE}.tmp")
            tmp.write_text(f"{version}\n")
            os.replace(tmp, self.path)  # atomic: a kill leaves the old number or the new one
        return version

    def resumed(self, version: int) -> int:
        """The version of weights resumed at `version`: kept, unless a later one was issued since
        (then the weights are labelled anew, after it: versions stay increasing for the samplers)."""
        return version if version >= self.highest else self.issue(version)
