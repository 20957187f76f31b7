"""Evaluation during training (spec.evaluation, docs/evaluation.md): a held-out dataset generated
on the rollout servers through the trainer's own pipeline after every few weight pushes and at the
end, scored with spec.rewards; mean rewards and pass@k go to metrics.jsonl, /status, Prometheus,
the trackers and the job's status.

- scores.py: pass@k (Chen et al. 2021) and the evaluation's record (pure Python);
- evaluator.py: the evaluator on the rollout manager's loop, and rank 0's handle for the loop.
"""
from grpojob.leader.evaluation.scores import KIND, EvalRecord, pass_at_k, summarise

__all__ = ["KIND", "EvalRecord", "pass_at_k", "summarise"]
