"""The job's side: TRL's environment, unchanged, as a rollout workflow (spec.rollout.workflow)."""
from grpojob.integrations.trl_env import environment_workflow
from words_env import WordsEnv

Workflow = environment_workflow(WordsEnv, max_turns=2)
