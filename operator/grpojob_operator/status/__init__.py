"""What a job's pods and its trainer's report mean: phase, conditions, progress, and what to do
next, as pure functions, split by concern: conditions and events (conditions), what was seen
(observe), the trainer's report (progress), pods ready (readiness), suspending (suspend), and the
phase that ties them together (lifecycle.decide)."""
from .conditions import Event, initial_status, iso, parse_status, parse_time, transitions
from .lifecycle import Decision, decide, with_children, with_suspend_request
from .observe import Observation, PodView, count_restarts

__all__ = ["Decision", "Event", "Observation", "PodView", "count_restarts", "decide", "initial_status", "iso",
           "parse_status", "parse_time", "transitions", "with_children", "with_suspend_request"]
