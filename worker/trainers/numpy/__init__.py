"""The NumPy trainer: `python -m worker.trainers.numpy` (worker/trainers/session.py around
session.py's Session) trains the model by hand: forward and backward (model.py), optimizers (optim.py).

PRELOAD is what this trainer's fork server imports once before forking children: no torch, no jax.
"""

PRELOAD = ("numpy", "threadpoolctl", "tokenizers", "worker.data", "worker.trainers.harness",
           "worker.trainers.session", "worker.trainers.numpy.model", "worker.trainers.numpy.step",
           "worker.trainers.numpy.runtime")
