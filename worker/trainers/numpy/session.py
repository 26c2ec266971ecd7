"""The NumPy training child's framework half: what it cannot run, how it trains one step, what it
read back and saves. The request/result protocol and the timed loop are the harness's;
the training around the Session is worker/trainers/session.py's.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from worker.trainers.numpy import runtime
from worker.trainers.numpy.step import Trainer
from worker.trainers.params import Arch, init_params, save_params
from worker.trainers import session as shared
from worker.trainers.session import torch_only

NAME = "numpy"


def unsupported(config: dict) -> str | None:
    """Why this trainer cannot run the config as asked (a recorded skip), or None."""
    if config["precision"] != "fp32":
        return f"numpy trains in fp32 only (precision={config['precision']}: NumPy has no bf16 GEMM)"
    if config["compile"] != "eager":
        return f"numpy has no compiler (compile={config['compile']})"
    return torch_only(config, NAME)


class Session(shared.Session):
    """One run: the model from the shared init (or a saved one), its optimizer, and the step."""

    framework = NAME

    def __init__(self, config: dict, lr: float, params: dict[str, np.ndarray] | None = None):
        runtime.apply_in_child(config)
        self.config = config
        self.arch = Arch.from_config(config)
        self.trainer = Trainer(self.arch, init_params(config) if params is None else params, config["optimizer"],
                               lr, config["batch_size"], config["seed"])
        self.lr = lr
        self.applied = {"lr": lr, "lr_schedule": config.get("lr_schedule", "constant"), "param_dtype": "float32",
                        "attention_layout": _layout_text(self.arch)}

    def set_lr(self, factor: float) -> None:
        """lr_schedule: the next steps' learning rate, factor x the peak (harness.timed_loop)."""
        self.trainer.optimizer.set_lr(self.lr * factor)

    def eval_loss(self, inputs: np.ndarray, targets: np.ndarray) -> float:
        """The mean loss of held-out windows, without dropout or an update (harness.evaluate)."""
        return self.trainer.eval_loss(inputs, targets)

    def step(self, micro_batches) -> float:
        """One optimizer step over [(inputs, targets), ...] NumPy micro-batches; the mean loss."""
        xs = np.stack([x for x, _ in micro_batches])
        ys = np.stack([y for _, y in micro_batches])
        return self.trainer.step(xs, ys)

    @staticmethod
    def sync(loss) -> float:
        return float(loss)  # NumPy is synchronous: the step has finished when it returns

    def params(self) -> dict[str, np.ndarray]:
        return dict(self.trainer.params)

    def read_back(self) -> dict:
        return self.applied | {"lr_last": self.trainer.optimizer.lr} | runtime.read_back()

    @staticmethod
    def gemm_format() -> str:
        from worker.trainers.numpy import blas

        return f"fp32 GEMMs ({blas.active.name} sgemm)"

    @staticmethod
    def build_info() -> dict:
        return runtime.build_info()

    def save(self, folder: Path) -> Path:
        return save_params(self.params(), folder)


def _layout_text(arch: Arch) -> str:
    from worker.trainers.masks import block_layout

    layout = block_layout(arch.attention, arch.seq_len, arch.window)
    return (f"{arch.attention}: {layout.n_blocks} block(s) of {layout.block} queries x {layout.keys} keys "
            f"({layout.pairs()} pairs per head)")
