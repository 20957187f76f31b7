"""Moved in 0.2: grpojob.trainer.dist is grpojob.learner.dist (removed in 0.3; CHANGELOG.md).
Use grpojob.plugins.dist."""
import grpojob.learner.dist as _moved
from grpojob.deprecation import forward

forward(__name__, _moved, "grpojob.plugins.dist")
