"""The learner's own failure: one that already says what and where (no traceback needed)."""


class TrainerError(RuntimeError):
    """A failure that already says what and where (no traceback needed)."""
