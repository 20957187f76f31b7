"""A learner that breaks, for the failure tests: the real GRPOTrainer, plugged in by reference
(`spec.trainer.class: path/to/faulty_trainers.py:Class`, the user-code path), that raises once in
the middle of a run. No product code knows about it."""
from __future__ import annotations

from pathlib import Path

from grpojob.learner.trainer import GRPOTrainer, TrainerError


class CrashesOnceAtStep3(GRPOTrainer):
    """Step 3 raises the first time (the file at args.marker remembers it); the restart resumes."""

    def step_training(self, groups):
        marker = Path(self.args["marker"])
        if self.step + 1 == 3 and not marker.exists():
            marker.touch()
            raise RuntimeError("injected: trainer crash at step 3")
        return super().step_training(groups)


class RefusesItsArgs(GRPOTrainer):
    """A learner that checks spec.trainer.args at start, as a user's trainer class would."""

    def __init__(self, job, env=None):
        super().__init__(job, env)
        if not isinstance(self.args.get("warmup_steps"), int):
            raise TrainerError(f"spec.trainer.args.warmup_steps: must be an integer, not "
                               f"{self.args.get('warmup_steps')!r}")


class CrashesAtEveryStep1(GRPOTrainer):
    """Step 1 raises at every start: the run ends after its restarts, with this traceback."""

    def step_training(self, groups):
        raise RuntimeError("injected: trainer crash at every step 1")
