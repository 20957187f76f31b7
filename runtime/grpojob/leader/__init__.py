"""The trainer process's driver: the step loop every rank runs, and what trainer rank 0 alone runs
with it (the rollout manager and pipeline, workflows, the weight publisher's wiring, evaluation,
the trajectory API, the HTTP endpoint with /status and /metrics). Submodules import torch."""
