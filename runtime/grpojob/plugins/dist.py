"""The distributed helpers a custom trainer uses inside its hooks (every rank runs them: each is
collective, call it the same number of times on every rank). `env` is the trainer's `self.env`."""
from grpojob.learner.dist import (DistEnv, all_max, all_sum, barrier, broadcast_object, gather_objects,
                                  scatter_objects, unwrap)

__all__ = ["DistEnv", "all_max", "all_sum", "barrier", "broadcast_object", "gather_objects", "scatter_objects",
           "unwrap"]
