"""A trainer rank for the distributed tests, started by torchrun: the real Trainer with the
in-process source sampling each prompt with its own seed (so completions do not depend on how
prompts are sharded), then the final model in $GRPOJOB_RUN_DIR/final-model."""
import logging
import sys

from grpojob import config
from grpojob.trainer import dist
from grpojob.trainer.loop import Trainer
from grpojob.trainer.sources import InProcessSource


def main() -> int:
    logging.basicConfig(level=logging.INFO)
    job = config.load()
    env = dist.init(timeout_seconds=120)
    try:
        tr = Trainer(job, env=env, source=lambda t: InProcessSource.for_trainer(t, per_prompt_seed=True))
        print(f"rank {env.rank}/{env.world} strategy {tr.strategy}", flush=True)
        tr.run()
    finally:
        dist.shutdown(env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
