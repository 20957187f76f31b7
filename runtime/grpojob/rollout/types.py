"""Moved in 0.2: grpojob.rollout.types is grpojob.contracts.rollout (removed in 0.3; CHANGELOG.md).
Use grpojob.plugins."""
import grpojob.contracts.rollout as _moved
from grpojob.deprecation import forward

forward(__name__, _moved, "grpojob.plugins")
