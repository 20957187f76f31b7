"""The trainer process (`grpojob trainer`, one per torchrun rank): main.main builds the rank's
learner (grpojob.learner) and, by spec.mode, runs the training loop (grpojob.leader) or serves the
training API (grpojob.service). This module imports nothing heavy."""
