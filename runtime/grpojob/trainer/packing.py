"""Moved in 0.2: grpojob.trainer.packing is grpojob.learner.packing (removed in 0.3; CHANGELOG.md).
Use grpojob.plugins."""
import grpojob.learner.packing as _moved
from grpojob.deprecation import forward

forward(__name__, _moved, "grpojob.plugins")
