"""The plug-in contracts and the rollout types, apart from the spec (grpojob.api): what a plug-in
implements or receives, with no torch and no other grpojob import, so every process can use them.

- rollout.py: samples, completions, groups, sampling parameters; the workflow, generator, scorer
  and prompt-stream protocols;
- protocols.py: the rollout engine, the weight sink, callbacks, dataset classes, reward signatures.

Plug-ins import these names from grpojob.plugins (the public surface), not from here.
"""
