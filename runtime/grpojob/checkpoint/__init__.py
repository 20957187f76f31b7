"""Checkpoints: each trainer rank writes its own shards with torch.distributed.checkpoint (DCP),
asynchronously, into a temporary directory that is renamed into place once whole.

- `layout`: the directory layout, completeness, the atomic commit, `latest` and keepLast (no torch).
- `manager`: CheckpointManager (save, wait, load: collective), find_latest.
- `legacy`: the full-state layout written before (a Hugging Face model/ + trainer_state.pt), loaded as is.
- `export`: a checkpoint to a Hugging Face model directory, tensor by tensor (`grpojob export`).
"""
from grpojob.checkpoint.layout import (HF_DIR, LATEST, SHARDS, STATE_FILE, STEP_DIR, is_complete, latest, list_checkpoints,  # noqa: F401
                     prune, step_dir)
