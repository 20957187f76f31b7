"""The trajectory API (Atropos style): environments, separate processes that generate through the
rollout servers' OpenAI endpoint, register with the trainer leader and submit scored groups; the
RolloutManager mixes them into training steps under the same staleness bound as its own groups.

- wire.py: the JSON bodies, validated with pydantic (field paths in every refusal);
- queue.py: registrations and queued groups, on the manager's event loop;
- api.py: the HTTP handlers on the trainer leader's port (which asks every request for the job's token).

See docs/environments.md.
"""
