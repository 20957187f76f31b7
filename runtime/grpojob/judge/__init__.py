"""A judge server (spec.judges): a frozen reward model behind HTTP, its own process role."""
