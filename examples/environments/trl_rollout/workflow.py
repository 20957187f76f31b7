# the one line that runs TRL's rollout_func as a grpojob workflow (spec.rollout.workflow: workflow.py:Workflow)
from grpojob.integrations.trl_rollout import rollout_func_workflow
from rollouts import rollout_func

Workflow = rollout_func_workflow(rollout_func)
