"""The worker: the claim loop, system knobs, the machine probe and the training child."""
