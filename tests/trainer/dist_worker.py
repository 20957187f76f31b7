"""A trainer rank for the distributed tests, started by torchrun: the real trainer assembly with
the in-process engine on rank 0 (it generates the global batch with per-sample seeds, so the
groups do not depend on the world size), then the final model in $GRPOJOB_RUN_DIR/final-model."""
import logging

from grpojob import config, lifeline
from grpojob.learner import dist
from grpojob.leader.build import build


def main() -> int:
    logging.basicConfig(level=logging.INFO)
    job = config.load()
    env = dist.init(timeout_seconds=120)
    try:
        run = build(job, env=env)
        print(f"rank {env.rank}/{env.world} strategy {run.trainer.strategy}", flush=True)
        run.run()
    finally:
        dist.shutdown(env)
    return 0


if __name__ == "__main__":
    lifeline.exit_now(main())  # as `grpojob trainer` ends (trainer.main.process)
