"""A lone trainer that is SIGKILLed while one of its checkpoints is being written (the shards'
writer kills the process before it writes a byte of the checkpoint of step KILL_STEP):

    python -m tests.trainer.ckpt_worker MODEL_DIR CHECKPOINT_DIR KILL_STEP
"""
import os
import signal
import sys

from torch.distributed.checkpoint import FileSystemWriter

from grpojob.leader.build import build
from tests.trainer.conftest import make_job


def main(model_dir: str, ckpt_dir: str, kill_step: int) -> None:
    write = FileSystemWriter.write_data

    def dying_write(self, plan, planner):
        if f"step-{kill_step:06d}" in str(self.path):
            print(f"killing myself while writing the checkpoint of step {kill_step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        return write(self, plan, planner)
    FileSystemWriter.write_data = dying_write
    job = make_job(model_dir, training={"steps": 4}, checkpoint={"everySteps": 1, "keepLast": 2})
    build(job, checkpoint_dir=ckpt_dir).run()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
