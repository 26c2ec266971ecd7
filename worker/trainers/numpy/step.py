"""One NumPy optimizer step: grad_accum micro-batches through the hand-written model, then the update."""

from __future__ import annotations

import numpy as np

from worker.trainers.numpy.model import GPT
from worker.trainers.numpy.optim import FlatParams, make_optimizer
from worker.trainers.params import Arch


class Trainer:
    """The NumPy counterpart of worker/trainers/jax/model.Trainer (same constructor and step)."""

    def __init__(self, arch: Arch, params: dict[str, np.ndarray], optimizer: str, lr: float, batch: int,
                 seed: int = 0, seq_len: int | None = None):
        self.arch = arch
        self.flat = FlatParams(params)
        self.model = GPT(arch, batch, seq_len)
        self._eval_models: dict[int, GPT] = {}
        self.optimizer = make_optimizer(optimizer, self.flat, lr)
        # dropout's own stream: the data order and the init do not depend on how much dropout drew
        self.rng = np.random.default_rng([seed, 1]) if arch.dropout > 0 else None

    def step(self, xs: np.ndarray, ys: np.ndarray) -> float:
        """xs, ys: (grad_accum, B, T) token ids. Returns the mean loss of the micro-batches."""
        self.flat.zero_grad()
        accum = len(xs)
        total = 0.0
        for x, y in zip(xs, ys):
            total += self.model.loss_and_grads(self.flat.params, self.flat.grads, x, y, self.rng, 1.0 / accum)
        self.optimizer.step()
        return total / accum

    def eval_loss(self, xs: np.ndarray, ys: np.ndarray) -> float:
        """Mean loss of (N, T) held-out windows, forward only, no dropout (a model per window count:
        the attention's buffers are sized by it)."""
        model = self._eval_models.get(len(xs))
        if model is None:
            model = self._eval_models[len(xs)] = GPT(self.arch, len(xs), xs.shape[1])
        return model.loss(self.flat.params, xs, ys)

    @property
    def params(self) -> dict[str, np.ndarray]:
        return self.flat.params
