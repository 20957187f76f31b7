"""Moved in 0.2: grpojob.trainer.batch is grpojob.learner.batch (removed in 0.3; CHANGELOG.md).
Use grpojob.plugins."""
import grpojob.learner.batch as _moved
from grpojob.deprecation import forward

forward(__name__, _moved, "grpojob.plugins")
