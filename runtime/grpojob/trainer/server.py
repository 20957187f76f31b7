"""Moved in 0.2: grpojob.trainer.server is grpojob.leader.server (removed in 0.3; CHANGELOG.md).
Use grpojob.leader.server (internal, no plug-in API)."""
import grpojob.leader.server as _moved
from grpojob.deprecation import forward

forward(__name__, _moved, "grpojob.leader.server (internal, no plug-in API)")
