"""Moved in 0.2: grpojob.trajectories is grpojob.leader.trajectories (removed in 0.3; CHANGELOG.md).
Environments use the trajectory API over HTTP (docs/environments.md), not this package."""
import grpojob.leader.trajectories as _moved
from grpojob.deprecation import forward

forward(__name__, _moved, "grpojob.leader.trajectories (internal: environments use its HTTP API)",
        submodules=("api", "queue", "sessions", "wire"))
