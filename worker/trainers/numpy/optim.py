"""AdamW and SGD with momentum in NumPy, by torch's update rules (torch.optim.AdamW / SGD).

The trainers share one learning rate and hyperparameters per optimizer name (the torch trainer's
make_optimizer): AdamW betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on every >= 2-D array and none
on the LayerNorm gains; SGD momentum 0.9, no dampening, no weight decay.

All parameters live in one flat float32 buffer (and the gradients in another), each named array a
view into it: the update is a handful of passes over one buffer, as torch's fused/foreach kernels
are, not a Python loop of small operations per tensor.
"""

from __future__ import annotations

import numpy as np

from worker.trainers.params import is_gain

ADAMW_BETAS = (0.9, 0.95)
ADAMW_EPS = 1e-8
ADAMW_WEIGHT_DECAY = 0.1
SGD_MOMENTUM = 0.9


class FlatParams:
    """Named arrays that are views into one flat buffer, and a gradient buffer of the same layout."""

    def __init__(self, arrays: dict[str, np.ndarray]):
        total = sum(a.size for a in arrays.values())
        self.flat = np.empty(total, np.float32)
        self.grad_flat = np.zeros(total, np.float32)
        self.params: dict[str, np.ndarray] = {}
        self.grads: dict[str, np.ndarray] = {}
        self.slices: dict[str, slice] = {}
        start = 0
        for name, a in arrays.items():
            sl = slice(start, start + a.size)
            self.slices[name] = sl
            self.params[name] = self.flat[sl].reshape(a.shape)
            self.params[name][...] = a
            self.grads[name] = self.grad_flat[sl].reshape(a.shape)
            start += a.size

    def zero_grad(self) -> None:
        self.grad_flat.fill(0.0)

    def decay_mask(self) -> np.ndarray:
        """1.0 where weight decay applies (>= 2-D arrays), 0.0 on the gains."""
        mask = np.ones_like(self.flat)
        for name, sl in self.slices.items():
            if is_gain(name) or self.params[name].ndim < 2:
                mask[sl] = 0.0
        return mask


class AdamW:
    """torch.optim.AdamW: p *= 1 - lr wd; m, v moving averages; p -= lr / (1 - b1^t) * m /
    (sqrt(v) / sqrt(1 - b2^t) + eps)."""

    def __init__(self, flat: FlatParams, lr: float, betas=ADAMW_BETAS, eps=ADAMW_EPS,
                 weight_decay=ADAMW_WEIGHT_DECAY):
        self.flat, self.betas, self.eps, self.weight_decay = flat, betas, eps, weight_decay
        self.m = np.zeros_like(flat.flat)
        self.v = np.zeros_like(flat.flat)
        self.t = 0
        self._mask = flat.decay_mask()
        self._tmp = np.empty_like(flat.flat)
        self.set_lr(lr)

    def set_lr(self, lr: float) -> None:
        self.lr = lr
        # the decay factor per element: 1 - lr * wd on matrices, 1 on gains; one multiply per step
        self.decay = 1.0 - lr * self.weight_decay * self._mask

    def step(self) -> None:
        p, g, m, v, tmp = self.flat.flat, self.flat.grad_flat, self.m, self.v, self._tmp
        b1, b2 = self.betas
        self.t += 1
        p *= self.decay
        m *= np.float32(b1)
        np.multiply(g, np.float32(1 - b1), out=tmp)
        m += tmp
        v *= np.float32(b2)
        np.square(g, out=tmp)
        tmp *= np.float32(1 - b2)
        v += tmp
        bias1 = 1 - b1 ** self.t
        bias2 = 1 - b2 ** self.t
        np.sqrt(v, out=tmp)
        tmp *= np.float32(1 / np.sqrt(bias2))
        tmp += np.float32(self.eps)
        np.divide(m, tmp, out=tmp)
        tmp *= np.float32(self.lr / bias1)
        p -= tmp


class SGD:
    """torch.optim.SGD with momentum: buf = g on the first step, then momentum * buf + g; p -= lr buf."""

    def __init__(self, flat: FlatParams, lr: float, momentum: float = SGD_MOMENTUM):
        self.flat, self.lr, self.momentum = flat, lr, momentum
        self.buf: np.ndarray | None = None
        self._tmp = np.empty_like(flat.flat)

    def set_lr(self, lr: float) -> None:
        self.lr = lr

    def step(self) -> None:
        g = self.flat.grad_flat
        if self.momentum == 0.0:
            np.multiply(g, np.float32(self.lr), out=self._tmp)
        else:
            if self.buf is None:
                self.buf = g.copy()
            else:
                self.buf *= np.float32(self.momentum)
                self.buf += g
            np.multiply(self.buf, np.float32(self.lr), out=self._tmp)
        self.flat.flat -= self._tmp


def make_optimizer(name: str, flat: FlatParams, lr: float):
    if name == "sgd":
        return SGD(flat, lr)
    if name == "adamw":
        return AdamW(flat, lr)
    raise ValueError(f"optimizer {name!r}: the NumPy trainer knows adamw and sgd")
