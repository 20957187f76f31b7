"""spec.mode service: the training API served on trainer rank 0 in place of the loop (app), the
computation every rank runs for each call (ops), its wire (wire) and the policy versions it has
issued (versions)."""
