"""Adapters that run other libraries' and frameworks' code unchanged in a GRPOJob.

One module per library (`atropos.py`, `verifiers.py`, `skyrl_gym.py`, `trl_env.py`, `areal.py`,
`verl.py`, `cosmos.py`, `art.py`, ...). A spec names an adapter's classes or functions by reference
(`grpojob.integrations.areal:Workflow`), so a job that uses none imports none of these libraries.
Adapters import only the public surface (`grpojob.plugins`, `grpojob.contracts`, `grpojob.client`)
and the documented HTTP APIs: pyproject's import-linter contracts keep it so. The shared part (a
library's episodes -> our groups, with exact tokens, masks and versions) lives in `episodes.py`.
"""
