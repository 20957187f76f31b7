"""Moved in 0.2: grpojob.trainer.trainer is grpojob.learner.trainer (removed in 0.3; CHANGELOG.md).
Use grpojob.plugins."""
import grpojob.learner.trainer as _moved
from grpojob.deprecation import forward

forward(__name__, _moved, "grpojob.plugins")
