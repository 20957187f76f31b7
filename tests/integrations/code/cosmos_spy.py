"""A reward in cosmos-rl's signature that scores nothing (the test gives it weight 0) and records what
cosmos-rl's reward functions are given in a GRPOJob: the completion, the dataset class's reference
answer and the rendered prompt. The job runs in the test's process, which reads CALLS."""
CALLS = []


def spy(to_be_evaluated, reference, *args, prompt=None, **kwargs):
    CALLS.append({"completion": to_be_evaluated, "reference": reference, "prompt": prompt})
    return 0.0
