"""Moved in 0.2: grpojob.evaluation is grpojob.leader.evaluation (removed in 0.3; CHANGELOG.md).
A callback's EvalRecord: import it from grpojob.plugins."""
import grpojob.leader.evaluation as _moved
from grpojob.deprecation import forward

forward(__name__, _moved, "grpojob.plugins (EvalRecord)", submodules=("evaluator", "scores"))
