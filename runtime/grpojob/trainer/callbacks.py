"""Moved in 0.2: grpojob.trainer.callbacks is grpojob.leader.callbacks (removed in 0.3; CHANGELOG.md).
Use grpojob.plugins."""
import grpojob.leader.callbacks as _moved
from grpojob.deprecation import forward

forward(__name__, _moved, "grpojob.plugins")
