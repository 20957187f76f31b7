"""Moved in 0.2: grpojob.trainer.record is grpojob.leader.record (removed in 0.3; CHANGELOG.md).
Use grpojob.plugins."""
import grpojob.leader.record as _moved
from grpojob.deprecation import forward

forward(__name__, _moved, "grpojob.plugins")
