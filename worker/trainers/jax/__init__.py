"""The JAX trainer: `python -m worker.trainers.jax` (worker/trainers/session.py around session.py's
Session) trains the model of model.py: a pure loss function and a training step jax.jit compiles whole.

PRELOAD is what this trainer's fork server imports once before forking children. Importing jax starts
no XLA client: that happens at the first computation, in the forked child, after its affinity is set
(XLA sizes its pool from it, see runtime.py). No torch: a JAX child never carries torch's OpenMP.
"""

PRELOAD = ("numpy", "jax", "jax.numpy", "optax", "tokenizers", "worker.data", "worker.trainers.harness",
           "worker.trainers.session", "worker.trainers.jax.model", "worker.trainers.jax.runtime")
