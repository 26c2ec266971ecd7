"""The JAX trainer: the model as a pure loss function and a jit-able training step (model.py)."""
