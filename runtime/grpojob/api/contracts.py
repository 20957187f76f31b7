"""Moved in 0.2: grpojob.api.contracts is grpojob.contracts.protocols (removed in 0.3; CHANGELOG.md).
Use grpojob.plugins."""
import grpojob.contracts.protocols as _moved
from grpojob.deprecation import forward

forward(__name__, _moved, "grpojob.plugins")
