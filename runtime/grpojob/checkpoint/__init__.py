"""Checkpoints: each trainer rank writes its own shards with torch.distributed.checkpoint (DCP),
asynchronously, into a temporary directory that is renamed into place once whole, or into an
object store where a commit marker makes one whole.

- `layout`: the directory layout, completeness, the atomic commit, `latest` and keepLast (no torch).
- `manager`: CheckpointManager (save, wait, load: collective), find_latest.
- `places`: a directory or an object store, as the manager writes to and reads from them.
- `pods`: a claim per trainer pod (ReadWriteOnce): found at start, each rank its own DCP checkpoint, a two-phase commit.
- `objects`: the layout in an object store (s3://, gs://, az://): commit marker, keepLast (no torch).
- `store_dcp`: DCP's storage on an object store (obstore), every rank its own shards.
- `storage`: what a checkpoint's storage refused and the fix; the probe write at start (no torch).
- `legacy`: the full-state layout written before (a Hugging Face model/ + trainer_state.pt), loaded as is.
- `export`: a checkpoint to a Hugging Face model directory, tensor by tensor (`grpojob export`).
"""
from grpojob.checkpoint.layout import (HF_DIR, LATEST, SHARDS, STATE_FILE, STEP_DIR, is_complete, latest, list_checkpoints,  # noqa: F401
                     prune, step_dir)
